"""`tupe evaluate --lengths --extend-positions pi|ntk|yarn`: rope's rescaled inverse frequencies and attention
factor equal transformers' own `ROPE_INIT_FUNCTIONS` (linear, dynamic, yarn) for the same scale, the evaluated copy
uses them (and nothing else changes), and the methods are refused by name where they do not apply."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tupe.data.corpus import resolve_corpus
from tupe.errors import TupeError
from tupe.evaluation.evaluate import load_eval_model
from tupe.evaluation.lengths import at_length, evaluate_lengths, rope_frequencies

from .conftest import save_tupe

FAST = dict(bootstrap=20, pppl_tokens=0, progress=False)


def _transformers(
    method: str, head_dim: int, base: float, scale: float, train: int
) -> tuple[torch.Tensor, float]:
    """The oracle: transformers' own function for the method, given a config that says the same scale.

    PI is `linear` with factor s; YaRN is `yarn` with factor s over `original_max_position_embeddings` T; NTK-aware
    scaling at length L = s T is `dynamic` at `seq_len` L with factor 1 over `max_position_embeddings` T (its base
    `b ((1 * L / T) - 0)^(d/(d-2))` = `b s^(d/(d-2))`)."""
    rope_type = {"pi": "linear", "ntk": "dynamic", "yarn": "yarn"}[method]
    params = {"rope_type": rope_type, "rope_theta": base, "factor": 1.0 if method == "ntk" else scale}
    if method == "yarn":
        params["original_max_position_embeddings"] = train
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=train,
        rope_parameters=params,
    )
    seq_len = round(scale * train) if method == "ntk" else None
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)


@pytest.mark.parametrize("method", ["pi", "ntk", "yarn"])
@pytest.mark.parametrize(
    ("head_dim", "base", "train", "length"),
    [(8, 10000.0, 32, 64), (16, 10000.0, 128, 1024), (64, 10000.0, 128, 512), (64, 500000.0, 512, 4096)],
)
def test_rope_frequencies_equal_transformers(method, head_dim, base, train, length):
    scale = length / train
    inv_freq, factor = rope_frequencies(method, head_dim, base, scale, train)
    ref_freq, ref_factor = _transformers(method, head_dim, base, scale, train)
    assert inv_freq.shape == (head_dim // 2,) and inv_freq.dtype == torch.float32
    torch.testing.assert_close(inv_freq, ref_freq.float(), rtol=2e-6, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12)
    if method == "yarn":
        assert factor == pytest.approx(0.1 * math.log(scale) + 1)  # the paper's temperature
    else:
        assert factor == 1.0
    trained = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    assert not torch.allclose(inv_freq.double(), trained)  # a change the test can see


def test_at_or_below_the_training_length_nothing_changes():
    for method in ("pi", "ntk", "yarn"):
        inv_freq, factor = rope_frequencies(method, 16, 10000.0, 1.0, 128)
        torch.testing.assert_close(
            inv_freq, 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
        )
        assert factor == 1.0
    with pytest.raises(TupeError, match="must be one of pi, ntk, yarn, got 'interpolate'"):
        rope_frequencies("interpolate", 16, 10000.0, 2.0, 128)


@pytest.mark.parametrize("method", ["pi", "ntk", "yarn"])
def test_the_evaluated_rope_copy_rotates_by_the_scaled_frequencies(tmp_path, tokenizer, method):
    m = load_eval_model(save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=32))
    longer, note = at_length(m, 128, method)
    assert (
        longer is not m and longer.max_length == 128 and note == f"rotary {method}, scale 4 over 32 positions"
    )
    before, after = m.model.state_dict(), longer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # weights untouched
    inv_freq, factor = rope_frequencies(method, m.model.config.head_dim, m.model.config.rope_theta, 4.0, 32)
    cos, sin = longer.model.tupe.positional(128).rotary  # (n, d)
    angles = torch.outer(torch.arange(128, dtype=torch.float32), inv_freq)
    torch.testing.assert_close(cos[:, : inv_freq.numel()], angles.cos() * factor)
    torch.testing.assert_close(sin[:, inv_freq.numel() :], angles.sin() * factor)
    assert m.model.tupe.positional.scaled_frequencies is None  # the loaded model is not changed
    same, none_note = at_length(m, 32, method)  # at the training length: the model as trained
    assert same is m and none_note is None


def test_rotary_methods_are_refused_by_name_where_they_do_not_apply(tmp_path, tokenizer, text_file):
    table = load_eval_model(save_tupe(tmp_path / "tupe-a", tokenizer, "tupe-a", max_len=32))
    alibi = load_eval_model(save_tupe(tmp_path / "alibi", tokenizer, "alibi", max_len=32))
    rope = load_eval_model(save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=32))
    assert at_length(table, 64, "yarn") == (
        None,
        "no positions beyond 32 (--extend-positions extends the table: yarn applies to rotary schemes only)",
    )
    runs, note = at_length(alibi, 64, "ntk")
    assert (
        runs is not None and note == "--extend-positions ntk applies to rotary schemes only: run unextended"
    )
    corpus = resolve_corpus([str(text_file)])
    with pytest.raises(
        TupeError, match=r"--extend-positions pi applies to rotary schemes \(rope\) only, and no --model"
    ):
        evaluate_lengths([table, alibi], corpus, [32, 64], extend="pi", log=lambda m: None)
    from tupe.evaluation.evaluate import Settings

    result = evaluate_lengths(
        [rope, table], corpus, [32, 64], Settings(**FAST), extend="yarn", log=lambda m: None
    )
    extended = {(e["model"], e["length"]): e["extended"] for e in result["by_length"]}
    assert extended == {
        (rope.name, 32): None,
        (rope.name, 64): "yarn",
        (table.name, 32): None,
        (table.name, 64): None,
    }
    assert [e["evaluated"] for e in result["by_length"]] == [True, True, True, False]
