"""The `deberta` scheme against transformers' own DeBERTa-v2 (same weights, float64) and its building blocks."""

from __future__ import annotations

import pytest
import torch
from transformers import DebertaV2Config, DebertaV2ForMaskedLM, DebertaV2Model
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

from tupe import TupeForMaskedLM, TupeForSequenceClassification, TupeModel
from tupe.modeling.positional import log_bucket_position, skew

from .reference import deberta_bucket

# The released DeBERTa-v3 choices (microsoft/deberta-v3-base's config.json) at a tiny size; head dim 12 so that
# DeBERTa's float32 sqrt(3d) = 6 is exact and float64 comparisons can be tight. 8 buckets and 20 relative
# positions put sequences of 30 tokens in the log-bucketed and the clipped ranges.
V3 = dict(
    vocab_size=60,
    hidden_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=48,
    max_position_embeddings=64,
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    share_att_key=True,
    position_buckets=8,
    max_relative_positions=20,
    position_biased_input=False,
    norm_rel_ebd="layer_norm",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _deberta(cls=DebertaV2ForMaskedLM, **overrides):
    torch.manual_seed(0)
    model = cls(DebertaV2Config(**{**V3, **overrides})).double().eval()
    with torch.no_grad():  # non-trivial values everywhere (biases, LayerNorms, the relative embeddings)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _batch(padded: bool, n: int = 30):
    ids = torch.randint(4, 60, (3, n))
    mask = torch.ones(3, n, dtype=torch.long)
    if padded:
        mask[1, 20:] = 0
        mask[2, 7:] = 0
    return ids, mask


@pytest.mark.parametrize("legacy", [True, False])  # DebertaV2ForMaskedLM's two head layouts
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("kernel", ["eager", "sdpa", "fused"])
def test_from_deberta_matches_transformers_debertav2(tmp_path, legacy, padded, kernel):
    deberta = _deberta(legacy=legacy)
    deberta.save_pretrained(tmp_path)
    model = TupeForMaskedLM.from_deberta(deberta)
    assert model.config.position_scheme == "deberta" and model.dtype == torch.float64
    model.set_attn_implementation(kernel)
    if kernel == "fused":  # the training kernel: train mode (no dropout in this config) with gradients
        model.train()
    ids, mask = _batch(padded)
    expected = deberta(ids, attention_mask=mask, output_hidden_states=True)
    got = model(ids, attention_mask=mask, output_hidden_states=True)
    keep = mask.bool()  # DeBERTa also masks padded queries: padded rows' own states differ (docs/model.md)
    assert len(got.hidden_states) == len(expected.hidden_states) == 3
    for e, g in zip(expected.hidden_states, got.hidden_states):
        torch.testing.assert_close(g[keep], e[keep], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(got.logits[keep], expected.logits[keep], atol=1e-12, rtol=1e-12)
    # the folder loads the same way
    from_folder = TupeForMaskedLM.from_deberta(str(tmp_path)).eval()
    torch.testing.assert_close(from_folder(ids, attention_mask=mask).logits, got.logits, atol=1e-12, rtol=0)


def test_from_deberta_base_model_and_unbucketed_offsets():
    """DebertaV2Model -> TupeModel; `position_buckets=-1` (no log buckets, offsets clipped) converts too."""
    deberta = _deberta(DebertaV2Model, position_buckets=-1, max_relative_positions=12)
    model = TupeModel.from_deberta(deberta).eval()
    ids, mask = _batch(True)
    expected = deberta(ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    torch.testing.assert_close(
        model(ids, attention_mask=mask).last_hidden_state[keep], expected[keep], atol=1e-12, rtol=0
    )


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (dict(relative_attention=False), "relative_attention=False"),
        (dict(share_att_key=False), "share_att_key=False"),
        (dict(position_biased_input=True), "position_biased_input=True"),
        (dict(pos_att_type=["c2p"]), "pos_att_type"),
        (dict(norm_rel_ebd="none"), "norm_rel_ebd"),
        (dict(conv_kernel_size=3), "conv_kernel_size"),
        (dict(type_vocab_size=2), "type_vocab_size=2"),
    ],
)
def test_from_deberta_refuses_what_it_cannot_represent(overrides, reason):
    with pytest.raises(ValueError, match=f"cannot represent.*{reason}"):
        TupeForMaskedLM.from_deberta(_deberta(**overrides))


def test_from_deberta_refuses_heads_it_has_no_weights_for():
    with pytest.raises(ValueError, match="only TupeModel.*TupeForMaskedLM"):
        TupeForSequenceClassification.from_deberta(_deberta())


@pytest.mark.parametrize("buckets, max_position", [(256, 512), (8, 20), (64, 128), (32, 1000)])
def test_log_buckets_match_transformers_and_the_readme_formula(buckets, max_position):
    offsets = torch.arange(-3000, 3001)
    ours = log_bucket_position(offsets, buckets, max_position)
    theirs = make_log_bucket_position(offsets, buckets, max_position).long()
    assert torch.equal(ours, theirs)
    assert ours.tolist() == [deberta_bucket(int(o), buckets, max_position) for o in offsets]
    assert ours[offsets == max_position - 1].item() == buckets - 1  # the last offset before clipping


def test_skew_is_the_relative_gather():
    """skew(S)[a, c] = S[a, n - 1 - a + c], as the naive double loop (and the backward of the slice view)."""
    n = 7
    scores = torch.randn(2, 3, n, 2 * n - 1, dtype=torch.float64, requires_grad=True)
    naive = torch.stack(
        [torch.stack([scores[..., a, n - 1 - a + c] for c in range(n)], -1) for a in range(n)], -2
    )
    torch.testing.assert_close(skew(scores), naive, atol=0, rtol=0)
    weights = torch.randn(2, 3, n, n, dtype=torch.float64)
    (g,) = torch.autograd.grad((skew(scores) * weights).sum(), scores)
    (g_naive,) = torch.autograd.grad((naive * weights).sum(), scores)
    torch.testing.assert_close(g, g_naive, atol=0, rtol=0)
    assert skew(scores[..., :1, :1]).shape == (2, 3, 1, 1)


def test_relative_embeddings_are_shared_and_projected_by_each_layer():
    """One table for the encoder (no positional weight inside a layer); each layer's own W^Q, W^K project it."""
    model = TupeModel.from_deberta(_deberta(DebertaV2Model))
    assert not any("rel" in name for name, _ in model.layers.named_parameters())
    ctx = model.positional(9)
    # one vector per row read: 8 buckets give the 17 offsets of 9 tokens 13 rows (the log buckets share some)
    assert ctx.relative_embeddings.shape == (13, 24) and ctx.content_free is None
    q = k = torch.zeros(1, 2, 9, 12, dtype=torch.float64)
    # zero queries and keys: both terms vanish whatever the projections
    term = ctx.layer_term(ctx, q, k, model.layers[0].attention.project_positions)
    assert term.abs().max() == 0


@pytest.mark.parametrize("n", [3, 9, 30, 200])
def test_relative_table_has_each_row_read_once_in_offset_order(n):
    """`DisentangledPositions(n)`: the rows that the offsets read, each once, and each offset's row in it (None for
    one row per offset); gathered, the LayerNorm-ed rows of the offsets n - 1 .. -(n - 1)."""
    model = TupeModel.from_deberta(_deberta(DebertaV2Model))
    relative = model.positional.relative
    table, index = relative(n)
    offsets = torch.arange(n - 1, -n, -1)
    expected = relative.LayerNorm(relative.rel_embeddings(relative.rows(offsets)))
    assert table.shape[0] == relative.rows(offsets).unique().numel()
    torch.testing.assert_close(table if index is None else table[index], expected, atol=0, rtol=0)
    assert (index is None) == (table.shape[0] == 2 * n - 1)
    # the layout of a length is worked out once and kept: a second call reads the same index, and the table it
    # returns follows the weights as they change (only the integer layout is kept)
    with torch.no_grad():
        relative.rel_embeddings.weight.mul_(2)
    table2, index2 = relative(n)
    assert index2 is index
    expected2 = relative.LayerNorm(relative.rel_embeddings(relative.rows(offsets)))
    torch.testing.assert_close(table2 if index2 is None else table2[index2], expected2, atol=0, rtol=0)


def test_relative_scores_match_the_gather_formula_and_gradcheck():
    """`relative_scores` (the fused function) equals DeBERTa's gather formulation, with exact gradients."""
    from tupe.modeling.positional import relative_scores

    b, h, n, d = 2, 3, 6, 4
    q, k = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    qr, kr = (torch.randn(h, 2 * n - 1, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    slot = torch.tensor([[n - 1 - (i - j) for j in range(n)] for i in range(n)])  # offset i - j -> its slot
    c2p = torch.gather(q @ kr.transpose(-1, -2), -1, slot.expand(b, h, n, n))
    p2c = torch.gather(k @ qr.transpose(-1, -2), -1, slot.t().expand(b, h, n, n)).transpose(-1, -2)
    torch.testing.assert_close(relative_scores(q, k, qr, kr, 0.5), (c2p + p2c) * 0.5, atol=1e-13, rtol=0)
    assert torch.autograd.gradcheck(lambda *t: relative_scores(*t, 0.5), (q, k, qr, kr))


@pytest.mark.parametrize("n", [1, 2, 5, 64, 67])  # one block, and four blocks of unequal sizes
def test_relative_scores_in_row_blocks(n):
    from tupe.modeling.positional import relative_scores

    b, h, d = 2, 2, 3
    q, k = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    qr, kr = (torch.randn(h, 2 * n - 1, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    i = torch.arange(n)
    slot = n - 1 - (i[:, None] - i[None, :])  # [i, j] -> the slot of offset i - j
    naive = (q @ kr.transpose(-1, -2)).gather(-1, slot.expand(b, h, n, n))
    naive = naive + (k @ qr.transpose(-1, -2)).gather(-1, slot.t().expand(b, h, n, n)).transpose(-1, -2)
    got = relative_scores(q, k, qr, kr, 0.3)
    torch.testing.assert_close(got, naive * 0.3, atol=1e-12, rtol=0)
    weights = torch.randn(b, h, n, n, dtype=torch.float64)
    grads = torch.autograd.grad((got * weights).sum(), (q, k, qr, kr))
    expected = torch.autograd.grad((naive * 0.3 * weights).sum(), (q, k, qr, kr))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=0)
