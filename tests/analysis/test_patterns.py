"""Per-head numbers and labels on hand-built content-free logit maps."""

from __future__ import annotations

import math

import pytest
import torch

from tupe.analysis import PatternThresholds, head_patterns, label_pattern, offset_profile
from tupe.modeling.positional import cls_reset

N = 40


def _offsets(n: int = N) -> torch.Tensor:
    i = torch.arange(n)
    return (i[None, :] - i[:, None]).double()  # [i, j] = j - i


def _maps() -> dict[str, torch.Tensor]:
    off = _offsets()
    return {
        "previous": torch.where(off == -1, 12.0, 0.0),
        "next": torch.where(off == 1, 12.0, 0.0),
        "local": -1.5 * off.abs(),
        "global": torch.zeros(N, N, dtype=torch.float64),
        "broad": -(off**2) / (2 * 4.0**2),  # Gaussian band, sigma 4 positions
    }


def test_hand_built_heads_get_their_labels():
    maps = _maps()
    logits = torch.stack(list(maps.values()))
    pats = head_patterns(logits)
    assert [p.label for p in pats] == list(maps)


def test_numbers_on_a_pure_previous_token_head():
    p = head_patterns(_maps()["previous"][None])[0]
    assert p.previous_mass > 0.99 and p.next_mass < 0.01
    assert p.expected_offset == pytest.approx(-1.0, abs=1e-3)
    assert p.local_mass > 0.99
    assert p.entropy < 0.05


def test_numbers_on_a_uniform_head():
    p = head_patterns(torch.zeros(1, N, N))[0]
    assert p.entropy == pytest.approx(1.0)
    assert p.expected_offset == pytest.approx(0.0, abs=1e-9)
    assert p.to_cls == pytest.approx(1 / N)
    assert p.from_cls_entropy == pytest.approx(1.0)
    assert p.from_cls_self == pytest.approx(1 / N)
    assert p.previous_mass == pytest.approx(1 / (N - 1))
    # a uniform row over the 39 body keys has 5 of them within +-2 (rows measured away from the edges)
    assert p.local_mass == pytest.approx(5 / (N - 1))
    assert p.self_mass == pytest.approx(1 / (N - 1))
    assert p.label == "global"


def test_cls_column_is_measured_separately_and_removed_from_the_body():
    """A head that sends most of its attention to [CLS] and the rest to the next token is 'next' with high
    to_cls: the [CLS] column does not blur the body pattern."""
    logits = torch.where(_offsets() == 1, 6.0, 0.0)
    theta = torch.tensor([[0.0, 9.0]], dtype=torch.float64)  # theta_1 (row 0), theta_2 (others -> [CLS])
    logits = cls_reset(logits[None], theta)
    p = head_patterns(logits)[0]
    assert p.to_cls > 0.5
    assert p.next_mass > 0.9
    assert p.label == "next"
    # row 0 is one constant (TUPE's theta_1): the [CLS] query attends uniformly
    assert p.from_cls_entropy == pytest.approx(1.0)


def test_expected_offset_sign_and_entropy_scale():
    off = _offsets()
    back = head_patterns((-(off + 3).abs() * 3.0)[None])[0]  # peaked three tokens back
    assert back.expected_offset < -2.0
    assert back.label == "broad"  # neither +-2 local nor uniform
    ent = head_patterns(torch.zeros(1, N, N))[0].entropy
    assert 0 <= back.entropy < ent


def test_thresholds_are_applied_in_order():
    base = dict(previous_mass=0.0, next_mass=0.0, local_mass=0.0, entropy=0.0)
    t = PatternThresholds()
    assert label_pattern(base | {"previous_mass": 0.45, "next_mass": 0.2, "local_mass": 0.9}) == "previous"
    assert label_pattern(base | {"previous_mass": 0.45, "next_mass": 0.3, "local_mass": 0.9}) == "local"
    assert label_pattern(base | {"entropy": t.global_entropy}) == "global"
    assert label_pattern(base | {"entropy": t.global_entropy - 0.01}) == "broad"
    assert label_pattern(base | {"next_mass": 0.5}, PatternThresholds(directional_mass=0.6)) == "broad"


def test_offset_profile():
    offsets, prof = offset_profile(_maps()["previous"][None], max_offset=3)
    assert offsets == [-3, -2, -1, 0, 1, 2, 3]
    assert prof[0, offsets.index(-1)] > 0.99
    uniform = offset_profile(torch.zeros(2, N, N), max_offset=2)[1]
    assert torch.allclose(uniform, torch.full_like(uniform, 1 / (N - 1)))


def test_rejects_bad_shapes():
    with pytest.raises(ValueError):
        head_patterns(torch.zeros(3, 3))
    assert math.isfinite(head_patterns(torch.zeros(1, 4, 4))[0].entropy)
