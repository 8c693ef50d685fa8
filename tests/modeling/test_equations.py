"""Every scheme against the naive float64 implementation of the spec (tests/modeling/reference.py)."""

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

import tupe
from tupe import TupeForMaskedLM
from tupe.modeling.positional import relative_position_bucket

from ..helpers import tiny_config
from .reference import naive_forward, t5_bucket

SCHEMES = list(tupe.POSITION_SCHEMES)


def _perturb(model):
    """Random non-zero values everywhere (biases, LayerNorms, theta), so no term can hide behind an init of 0/1."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _inputs(n=12):
    ids = torch.randint(5, 50, (2, n))
    ids[:, 0] = 1  # [CLS]
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 4 :] = 0
    ids[1, n - 4 :] = 0
    return ids, mask


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_matches_naive_equations(scheme, implementation):
    model = _perturb(TupeForMaskedLM(tiny_config(scheme))).eval()
    model.config._attn_implementation = implementation
    ids, mask = _inputs()
    hiddens, attentions, mlm = naive_forward(model, ids, mask)
    out = model(
        ids, attention_mask=mask, output_hidden_states=True, output_attentions=(implementation == "eager")
    )
    for layer, expected in enumerate(hiddens):
        torch.testing.assert_close(out.hidden_states[layer + 1].double(), expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits.double(), mlm, atol=2e-4, rtol=1e-4)
    if implementation == "eager":
        for got, expected in zip(out.attentions, attentions):
            torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_positional_logits_match_naive_first_layer(scheme):
    """positional_logits == the first layer's logits minus its content part, per the spec's table."""
    model = _perturb(TupeForMaskedLM(tiny_config(scheme))).eval()
    bias = model.tupe.positional_logits(9)
    if scheme in ("bert-a", "bert-a-d", "rope"):
        assert bias is None
        return
    assert bias.shape == (2, 9, 9)
    # With identical tokens the content logits are constant per query, so the first layer's attention is the
    # softmax of the content-free term (exactly, for every scheme with such a term and no input positions).
    if scheme.startswith("tupe"):
        ids = torch.full((1, 9), 7)
        _, attentions, _ = naive_forward(model, ids)
        torch.testing.assert_close(torch.softmax(bias.double(), -1), attentions[0][0], atol=1e-6, rtol=1e-5)


def test_bucketing_matches_transformers_t5_for_every_offset():
    offsets = torch.arange(-600, 601)
    ours = relative_position_bucket(offsets, 32, 128)
    theirs = T5Attention._relative_position_bucket(
        offsets, bidirectional=True, num_buckets=32, max_distance=128
    )
    assert torch.equal(ours, theirs)
    assert [t5_bucket(int(o)) for o in offsets] == theirs.tolist()
    # every bucket is used except 16 ("positive offset 0"), none beyond 31 (index 32 is TUPE-R's [CLS] bucket)
    assert set(ours.tolist()) == set(range(32)) - {16}


def test_relative_bias_is_toeplitz_in_offsets():
    model = TupeForMaskedLM(
        tiny_config("bert-r", relative_attention_num_buckets=32, relative_attention_max_distance=128)
    )
    bias = model.tupe.positional_logits(30)
    table = model.tupe.positional.relative.bias.weight
    for i in range(30):
        for j in range(30):
            torch.testing.assert_close(bias[:, i, j], table[t5_bucket(j - i)])
