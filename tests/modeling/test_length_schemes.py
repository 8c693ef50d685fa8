"""fire, kerple-log, kerple-power: each bias against a naive per-pair formula (tests/modeling/reference.py), KERPLE's
clamping as its reference code does it, FIRE's causal option against the causal reference, every kernel that takes
a content-free term, and lengths beyond max_position_embeddings (no table)."""

from __future__ import annotations

import math

import pytest
import torch

from tupe import TupeForMaskedLM
from tupe.modeling.positional import SCHEMES

from ..helpers import tiny_config
from .reference import fire_bias, kerple_bias, length_scheme_bias

LENGTH_SCHEMES = ("fire", "kerple-log", "kerple-power")


def _model(scheme: str, **overrides) -> TupeForMaskedLM:
    torch.manual_seed(0)
    model = TupeForMaskedLM(tiny_config(scheme, num_attention_heads=4, **overrides)).eval()
    with torch.no_grad():
        for p in model.tupe.positional.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _naive(model: TupeForMaskedLM, n: int) -> torch.Tensor:
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    return torch.tensor(
        length_scheme_bias(model.config.position_scheme, model.config, sd, "tupe.", n), dtype=torch.float64
    )


@pytest.mark.parametrize("scheme", LENGTH_SCHEMES)
def test_bias_matches_naive_per_pair_formula(scheme):
    model = _model(scheme)
    if scheme.startswith("kerple"):  # out of range on both sides: the reference's clamps must apply
        with torch.no_grad():
            model.tupe.positional.bias_p[:2] = torch.tensor([-0.4, 3.1])
            model.tupe.positional.bias_a[:2] = torch.tensor([0.003, -1.0])
    expected = _naive(model, 17)  # read before the forward pass, which clamps the parameters in place
    torch.testing.assert_close(model.tupe.positional_logits(17).double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["kerple-log", "kerple-power"])
def test_kerple_clamps_its_parameters_in_place_with_an_identity_gradient(scheme):
    """As `ParallelKerpleLog/Power.forward` do (`self.bias_p.data = self.bias_p.data.clamp(...)`): the forward pass
    writes the clamped value into the parameter, which is then used as is, so the gradient is the kernel's
    derivative at the clamped value (no zero gradient below the clamp, unlike a differentiable clamp)."""
    model = _model(scheme)
    positional = model.tupe.positional
    with torch.no_grad():
        positional.bias_p.copy_(torch.tensor([-0.5, 0.7, 2.5, 1.2]))
        positional.bias_a.copy_(torch.tensor([0.4, -0.2, 0.9, 0.001]))
    bias = positional(6).content_free
    p_high = 2.0 if scheme == "kerple-power" else 2.5
    assert positional.bias_p.tolist() == pytest.approx([0.01, 0.7, p_high, 1.2])
    assert positional.bias_a.tolist() == pytest.approx([0.4, 0.01, 0.9, 0.01])
    bias.sum().backward()
    distance = (torch.arange(6.0)[None, :] - torch.arange(6.0)[:, None]).abs().double()
    p, a = (
        positional.bias_p.detach().double()[:, None, None],
        positional.bias_a.detach().double()[:, None, None],
    )
    if scheme == "kerple-log":  # d/dp -p log(1 + a d), d/da
        grad_p = -torch.log1p(a * distance)
        grad_a = -p * distance / (1 + a * distance)
    else:  # d/dp -a d^p = -a d^p log d (0 at d = 0), d/da = -d^p
        grad_p = torch.where(distance > 0, -a * distance**p * distance.log(), 0.0)
        grad_a = -(distance**p)
    torch.testing.assert_close(positional.bias_p.grad.double(), grad_p.sum((1, 2)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(positional.bias_a.grad.double(), grad_a.sum((1, 2)), atol=1e-5, rtol=1e-5)


def test_kerple_power_names_follow_the_reference():
    """`-bias_a |i - j|^bias_p`: bias_a the coefficient, bias_p the exponent (ParallelKerplePower's comment)."""
    model = _model("kerple-power")
    with torch.no_grad():
        model.tupe.positional.bias_p.fill_(0.5)
        model.tupe.positional.bias_a.fill_(3.0)
    bias = model.tupe.positional_logits(10)
    assert bias[0, 0, 9].item() == pytest.approx(-3.0 * 9**0.5, rel=1e-6)
    assert kerple_bias("kerple-power", 0.5, 3.0, 0, 9) == pytest.approx(-3.0 * 9**0.5)


def _causal_reference_bias(positional, n: int) -> torch.Tensor:
    """The FIRE class of mcleish7/arithmetic (cramming/architectures/embeddings.py), forward in eval mode (its
    positions are arange(n)), re-written from its equations in float64: relative distances `pos_i - pos_j`,
    threshold `|L_multiplier * init_L|`, normaliser `max(pos_i, threshold)` per query row, `log(|c x| + 1)` of
    both, their ratio with `eps` 1e-6 added to the normaliser, then the MLP. Returns (h, n, n)."""
    w = {k: v.detach().double() for k, v in positional.named_parameters()}
    positions = torch.arange(n, dtype=torch.float64)
    relative = positions[:, None] - positions[None, :]
    threshold = (w["threshold_multiplier"] * positional.threshold).abs()
    normalizer = torch.maximum(positions, threshold)[:, None]
    relative = torch.log((w["distance_scale"] * relative).abs() + 1)
    normalizer = torch.log((w["distance_scale"] * normalizer).abs() + 1)
    x = (relative / (normalizer + 1e-6))[..., None]
    hidden = torch.relu(x @ w["mlp_in_weight"].t() + w["mlp_in_bias"])
    return (hidden @ w["mlp_out_weight"].t() + w["mlp_out_bias"]).permute(2, 0, 1)


@pytest.mark.parametrize("threshold", [512.0, 4.0])  # L above every position, and below most of them
def test_fire_query_normalizer_reproduces_the_causal_reference_for_i_ge_j(threshold):
    model = _model("fire", fire_normalizer="query", fire_threshold=threshold)
    n = 23
    ours, reference = (
        model.tupe.positional_logits(n).double(),
        _causal_reference_bias(model.tupe.positional, n),
    )
    lower = torch.ones(n, n, dtype=torch.bool).tril()  # i >= j: what a causal model attends to
    torch.testing.assert_close(ours[:, lower], reference[:, lower], atol=1e-5, rtol=1e-5)
    # above the diagonal the reference drops the sign of i - j; the encoder's form keeps it
    assert not torch.allclose(ours[:, ~lower], reference[:, ~lower], atol=1e-3)


def test_fire_default_is_a_function_of_the_signed_offset_normalised_by_the_length():
    model = _model("fire", fire_threshold=4.0)  # L below the length: the normaliser is psi(N)
    for n in (7, 30):
        bias = model.tupe.positional_logits(n)
        for offset in range(-(n - 1), n):  # Toeplitz: one value per offset j - i
            diagonal = bias.diagonal(offset, dim1=1, dim2=2)
            torch.testing.assert_close(diagonal, diagonal[:, :1].expand_as(diagonal))
        assert not torch.allclose(bias, bias.transpose(1, 2), atol=1e-4)  # direction kept
    w = {k: v.detach().double() for k, v in model.tupe.positional.named_parameters()}
    # the same offset reads a different value at another length: N normalises (progressive interpolation)
    assert fire_bias(w, 4.0, 4, 3, 0, 7) != pytest.approx(fire_bias(w, 4.0, 4, 3, 0, 30))
    torch.testing.assert_close(
        model.tupe.positional_logits(30)[:, 3, 0].double(),
        torch.tensor(fire_bias(w, 4.0, 4, 3, 0, 30), dtype=torch.float64),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("scheme", LENGTH_SCHEMES)
def test_runs_beyond_max_position_embeddings(scheme):
    """No table: the term is defined at any length, and a model given a larger limit runs there unchanged."""
    model = _model(scheme)  # max_position_embeddings 40
    n = 3 * model.config.max_position_embeddings
    torch.testing.assert_close(
        model.tupe.positional(n).content_free.double(), _naive(model, n), atol=1e-5, rtol=1e-5
    )
    assert SCHEMES[scheme].report.position_table is None  # what `tupe evaluate --lengths` asks
    model.config.max_position_embeddings = n
    ids = torch.randint(5, 50, (2, n))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (2, n, model.config.vocab_size) and torch.isfinite(logits).all()


@pytest.mark.parametrize("scheme", LENGTH_SCHEMES)
def test_every_content_free_kernel_applies(scheme):
    """The kernels that take a content-free term; test_fast_paths.py compares sdpa and fused with eager
    (outputs and gradients, padded or not) for every registered scheme, these included."""
    assert {"eager", "sdpa", "fused", "flex"} <= set(SCHEMES[scheme].kernels())
    assert "fold" not in SCHEMES[scheme].kernels()  # not low-rank


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("scheme", LENGTH_SCHEMES)
def test_flex_kernel_matches_eager_forward(scheme):
    """flex_attention has no CPU backward; its forward is checked here, the GPU runs it compiled."""
    ids = torch.randint(5, 50, (3, 16))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    outs = {}
    for kernel in ("eager", "flex"):
        model = _model(scheme)
        model.set_attn_implementation(kernel)
        with torch.no_grad():
            outs[kernel] = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(outs["flex"], outs["eager"], atol=2e-5, rtol=1e-5)


def test_fire_refuses_an_unknown_normalizer():
    with pytest.raises(ValueError, match="fire_normalizer"):
        tiny_config("fire", fire_normalizer="position")


def test_fire_starts_at_the_reference_values():
    positional = TupeForMaskedLM(tiny_config("fire")).tupe.positional
    assert positional.distance_scale.item() == pytest.approx(0.1)
    assert positional.threshold_multiplier.item() == 1.0 and positional.threshold == 512.0
    assert positional.mlp_in_weight.shape == (32, 1) and positional.mlp_out_weight.shape == (2, 32)
    bound = 1 / math.sqrt(32)  # torch.nn.Linear's own initialisation, as the reference's MLP starts
    assert positional.mlp_out_weight.abs().max() <= bound and positional.mlp_out_weight.std() > bound / 4
