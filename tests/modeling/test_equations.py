"""Every scheme against the naive float64 implementation of docs/model.md's equations (tests/modeling/reference.py)."""

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

import tupe
from tupe import TupeForMaskedLM
from tupe.modeling.positional import SCHEMES as SCHEME_CLASSES
from tupe.modeling.positional import alibi_slopes, relative_position_bucket

from ..helpers import tiny_config
from .reference import alibi_slopes as reference_slopes
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
    """positional_logits == the first layer's logits minus its content part, per docs/model.md's table of schemes."""
    model = _perturb(TupeForMaskedLM(tiny_config(scheme))).eval()
    bias = model.tupe.positional_logits(9)
    cls = SCHEME_CLASSES[scheme]
    if not cls.content_free:
        assert bias is None
        return
    assert bias.shape == (2, 9, 9)
    # With identical tokens the content logits are constant per query, so the first layer's attention is the
    # softmax of the content-free term (exactly, for every scheme with such a term and no input positions).
    if not cls.report.absolute_input:
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


@pytest.mark.parametrize("heads", [1, 2, 3, 6, 8, 12, 16, 24])
def test_alibi_slopes_follow_press_et_al(heads):
    """Geometric 2^(-8k/h) for powers of two; the interleaving rule of the paper's code otherwise."""
    torch.testing.assert_close(
        alibi_slopes(heads), torch.tensor(reference_slopes(heads), dtype=torch.float64)
    )
    if heads == 8:
        assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    if heads == 12:  # the first 8 of 8 heads, then every other of 16 heads' 2^(-k/2): k = 1, 3, 5, 7
        assert alibi_slopes(12)[8:].tolist() == pytest.approx([2 ** (-k / 2) for k in (1, 3, 5, 7)])


def test_alibi_bias_is_symmetric_distance_times_slope():
    model = TupeForMaskedLM(tiny_config("alibi", hidden_size=24, num_attention_heads=6))
    bias = model.tupe.positional_logits(17)
    slopes = reference_slopes(6)
    for h in range(6):
        for i in range(17):
            for j in range(17):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * abs(j - i), rel=1e-6)
    assert not list(model.tupe.positional.parameters())  # nothing learned


def test_alibi_with_a_head_count_that_is_not_a_power_of_two_matches_naive():
    model = _perturb(TupeForMaskedLM(tiny_config("alibi", hidden_size=18, num_attention_heads=3))).eval()
    ids, mask = _inputs()
    hiddens, _, mlm = naive_forward(model, ids, mask)
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    torch.testing.assert_close(out.hidden_states[-1].double(), hiddens[-1], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits.double(), mlm, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 16)])
def test_t5_bias_matches_transformers_compute_bias(buckets, max_distance):
    """The `t5` scheme's term is transformers' own bidirectional `T5Attention.compute_bias` given the same table."""
    from transformers import T5Config

    config = tiny_config(
        "t5",
        relative_attention_num_buckets=buckets,
        relative_attention_max_distance=max_distance,
        max_position_embeddings=300,
    )
    model = _perturb(TupeForMaskedLM(config)).eval()
    t5_config = T5Config(
        d_model=16,
        d_kv=8,
        num_heads=2,
        relative_attention_num_buckets=buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=False,
    )
    t5 = T5Attention(t5_config, has_relative_attention_bias=True).eval()
    with torch.no_grad():
        t5.relative_attention_bias.weight.copy_(model.tupe.positional.relative.bias.weight)
    for n in (1, 9, 300):
        torch.testing.assert_close(
            model.tupe.positional_logits(n)[None], t5.compute_bias(n, n), atol=0, rtol=0
        )
