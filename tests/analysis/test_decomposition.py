"""The four terms of the first layer's logits must sum exactly to those logits, computed independently."""

from __future__ import annotations

import pytest
import torch

from tupe import TupeForMaskedLM
from tupe.analysis import TERMS, decompose, first_layer_terms
from tupe.analysis.loading import text_blocks
from tupe.errors import TupeError

from .conftest import make_text, randomise, tiny_config


def _model(scheme: str, seed: int = 0):
    torch.manual_seed(seed)
    model = TupeForMaskedLM(tiny_config(scheme))
    randomise(model, seed)
    return model.eval()


def _first_layer_logits_from_qkv(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits of layer 0 from the model's own fused QKV output (captured by a hook), in float32."""
    enc = model.tupe
    captured = {}
    handle = enc.layers[0].attention.qkv.register_forward_hook(lambda m, i, o: captured.setdefault("qkv", o))
    with torch.no_grad():
        model(ids)
    handle.remove()
    b, n = ids.shape
    h, d = enc.config.num_attention_heads, enc.config.head_dim
    q, k, _ = captured["qkv"].view(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
    ctx = enc.positional(n)
    if ctx.query_add is not None:
        q, k = q + ctx.query_add, k + ctx.key_add
    logits = q @ k.transpose(-1, -2) * ctx.logit_scale
    if ctx.content_free is not None:
        logits = logits + ctx.content_free
    return logits


@pytest.mark.parametrize("scheme", ["bert-a", "bert-r", "bert-a-d", "tupe-a", "tupe-r"])
def test_four_terms_sum_to_first_layer_logits(scheme):
    model = _model(scheme)
    ids = torch.randint(5, 300, (3, 20))
    ids[:, 0] = 1
    terms, direct64 = first_layer_terms(model, ids)
    assert set(terms) == set(TERMS)
    total = sum(terms.values())
    # against the model's own projections, per head and per example
    hooked = _first_layer_logits_from_qkv(model, ids).double()
    assert torch.allclose(total, hooked, atol=1e-4, rtol=1e-4), (total - hooked).abs().max()
    assert torch.allclose(total, direct64, atol=1e-10)
    # and against the eager attention probabilities the model itself outputs
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        probs = model(ids, output_attentions=True).attentions[0]
    assert torch.allclose(torch.softmax(total, -1).float(), probs, atol=1e-5)
    # no term is trivially zero
    for name in TERMS:
        assert terms[name].abs().max() > 1e-3, name


def test_four_terms_sum_to_transformers_bert_logits(bert_dir):
    """A transformers BERT saved to disk: compare with BertModel's own query/key on its embedding output."""
    from transformers import BertForMaskedLM

    bert = BertForMaskedLM.from_pretrained(bert_dir).eval()
    ours = TupeForMaskedLM.from_bert(bert_dir).eval()
    ids = torch.randint(5, 300, (2, 24))
    ids[:, 0] = 1
    terms, _ = first_layer_terms(ours, ids)
    total = sum(terms.values())
    with torch.no_grad():
        x = bert.bert.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        att = bert.bert.encoder.layer[0].attention.self
        h = bert.config.num_attention_heads
        d = bert.config.hidden_size // h
        q = att.query(x).view(2, 24, h, d).transpose(1, 2)
        k = att.key(x).view(2, 24, h, d).transpose(1, 2)
        logits = q @ k.transpose(-1, -2) / d**0.5
    assert torch.allclose(total.float(), logits, atol=1e-4, rtol=1e-4), (total.float() - logits).abs().max()


def test_decompose_averages_and_checks(tokenizer):
    model = _model("bert-a")
    blocks = text_blocks(make_text(), tokenizer, 24, max_blocks=5)
    assert blocks.shape == (5, 24)
    assert (blocks[:, 0] == 1).all() and (blocks[:, -1] == 2).all()
    dec = decompose(model, blocks, batch_size=2)
    assert dec.max_abs_error < 1e-9
    # batch mean over examples, per head; then mean over heads
    terms, logits = first_layer_terms(model.tupe, blocks)
    for name in TERMS:
        assert torch.allclose(dec.per_head[name], terms[name].mean(0).float(), atol=1e-5)
        assert torch.allclose(dec.mean[name], terms[name].mean((0, 1)).float(), atol=1e-5)
    assert torch.allclose(sum(dec.mean[t] for t in TERMS), dec.mean["total"], atol=1e-5)
    st = dec.stats
    expected = float(dec.mean["word_pos"].std(-1, unbiased=False).mean())
    assert st["word_pos"]["row_std"] == pytest.approx(expected, rel=1e-5)
    assert st["total"]["relative_row_std"] == pytest.approx(1.0)
    per_example = float(terms["pos_word"].std(-1, unbiased=False).mean())
    assert st["pos_word"]["row_std_per_example"] == pytest.approx(per_example, rel=1e-6)


def test_uniform_term_has_zero_row_std():
    """A model whose positions are all equal has position terms constant along each row (after averaging)."""
    model = _model("bert-a")
    with torch.no_grad():
        model.tupe.positional.embeddings.weight.zero_()
        model.tupe.layers[0].attention.qkv.bias.zero_()
        model.tupe.embeddings.LayerNorm.bias.zero_()
    ids = torch.randint(5, 300, (2, 16))
    terms, _ = first_layer_terms(model, ids)
    for name in ("word_pos", "pos_word", "pos_pos"):
        assert terms[name].abs().max() < 1e-12


def test_tupe_cross_terms_hold_only_the_biases():
    """TUPE's input has no positions: with zero biases the cross terms vanish and position->position is exactly
    the content-free term."""
    model = _model("tupe-a")
    with torch.no_grad():
        model.tupe.layers[0].attention.qkv.bias.zero_()
        model.tupe.embeddings.LayerNorm.bias.zero_()
    ids = torch.randint(5, 300, (2, 16))
    terms, _ = first_layer_terms(model, ids)
    assert terms["word_pos"].abs().max() < 1e-12 and terms["pos_word"].abs().max() < 1e-12
    with torch.no_grad():
        expected = model.tupe.positional_logits(16).double()
    assert torch.allclose(terms["pos_pos"], expected.expand_as(terms["pos_pos"]), atol=1e-6)


def test_split_refuses_rope():
    with pytest.raises(TupeError, match="no word/position split"):
        first_layer_terms(_model("rope"), torch.ones(1, 8, dtype=torch.long))
