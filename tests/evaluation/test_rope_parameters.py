"""RoPE scaling the transformers way (`rope_parameters`, and the legacy `rope_scaling`) on a saved rope model:
applied through transformers' `ROPE_INIT_FUNCTIONS`, saved and honoured after reload, equal to
`tupe evaluate --extend-positions` at the same factor, refused by name where it does not apply, never written to
config.json unapplied."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tupe import TupeConfig, TupeForMaskedLM
from tupe.data.corpus import resolve_corpus
from tupe.evaluation.evaluate import Settings, load_eval_model
from tupe.evaluation.lengths import at_length, evaluate_lengths

from .conftest import save_tupe

T = 32  # the saved model's max_position_embeddings (its training length)
YARN = {"rope_type": "yarn", "factor": 4.0}


@pytest.fixture
def rope_run(tmp_path, tokenizer):
    return save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=T)


def _ids(n: int) -> torch.Tensor:
    return torch.randint(5, 60, (2, n), generator=torch.Generator().manual_seed(n))


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model.eval()(ids).logits


def _llama(params: dict, head_dim: int, max_len: int) -> LlamaConfig:
    """transformers' own reading of the same `rope_parameters` (the oracle)."""
    return LlamaConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=max_len,
        rope_parameters=dict(params),
    )  # fmt: skip


LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.5, 2.0, 3.0, 4.0]}


@pytest.mark.parametrize(
    ("params", "extra", "length"),
    [
        ({"rope_type": "linear", "factor": 2.0}, {}, None),
        ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0}, {}, None),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}, {}, None),
        ({"rope_type": "dynamic", "factor": 2.0}, {}, 2 * T),  # per input length, beyond T
        ({**LONGROPE, "original_max_position_embeddings": T}, {"max_position_embeddings": 2 * T}, 2 * T),
    ],
)
def test_from_pretrained_applies_transformers_rope_init_functions(rope_run, params, extra, length):
    model = TupeForMaskedLM.from_pretrained(rope_run, rope_parameters=dict(params), **extra)
    rope, config = model.tupe.positional, model.config
    assert config.rope_parameters["rope_type"] == params["rope_type"]
    # transformers' reading: dynamic's reference length is its max_position_embeddings (tupe's: T, the original)
    oracle = {
        k: v for k, v in config.rope_parameters.items() if params["rope_type"] != "dynamic" or "orig" not in k
    }
    limit = T if params["rope_type"] == "dynamic" else config.max_position_embeddings
    want, want_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](
        _llama(oracle, config.head_dim, limit), None, seq_len=length
    )
    got, got_factor = rope.frequencies(length or T)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    assert got_factor == pytest.approx(want_factor)
    plain = TupeForMaskedLM.from_pretrained(rope_run, max_position_embeddings=config.max_position_embeddings)
    ids = _ids(length or T)
    assert not torch.allclose(_logits(model, ids), _logits(plain, ids))  # a change the logits show


def test_yarn_is_saved_honoured_after_reload_and_runs_beyond_the_training_length(rope_run, tmp_path):
    model = TupeForMaskedLM.from_pretrained(rope_run, rope_parameters=dict(YARN))
    # transformers' defaults: original_max_position_embeddings is the saved max_position_embeddings, and the
    # factor's length (4 x 32) becomes the model's limit
    assert model.config.rope_parameters == {
        **YARN,
        "rope_theta": 10000.0,
        "original_max_position_embeddings": T,
    }
    assert model.config.max_position_embeddings == 4 * T
    ids = _ids(4 * T)
    out = _logits(model, ids)
    assert torch.isfinite(out).all()
    model.save_pretrained(tmp_path / "yarn")
    saved = json.loads((tmp_path / "yarn" / "config.json").read_text())
    assert (
        saved["rope_parameters"] == model.config.rope_parameters and saved["max_position_embeddings"] == 4 * T
    )
    assert torch.equal(_logits(TupeForMaskedLM.from_pretrained(tmp_path / "yarn"), ids), out)
    # the same set on a config and loaded with config=, and the legacy key (rope_scaling, "type")
    config = AutoConfig.from_pretrained(rope_run)
    config.rope_parameters = dict(YARN)
    assert torch.equal(_logits(TupeForMaskedLM.from_pretrained(rope_run, config=config), ids), out)
    with pytest.warns(FutureWarning, match="rope_scaling"):
        legacy = TupeForMaskedLM.from_pretrained(rope_run, rope_scaling={"type": "yarn", "factor": 4.0})
    assert torch.equal(_logits(legacy, ids), out)
    built = TupeForMaskedLM(
        TupeConfig(**{**config.to_dict(), "rope_scaling": {"type": "yarn", "factor": 4.0}})
    )
    assert built.config.rope_parameters == model.config.rope_parameters


@pytest.mark.parametrize(
    ("method", "params", "extra"),
    [
        ("yarn", {"rope_type": "yarn", "factor": 4.0}, {}),
        ("pi", {"rope_type": "linear", "factor": 4.0}, {"max_position_embeddings": 4 * T}),
        # NTK-aware at length L = s T: transformers' dynamic with factor 1 over T
        (
            "ntk",
            {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": T},
            {"max_position_embeddings": 4 * T},
        ),
    ],
)
def test_equal_to_tupe_evaluate_extend_positions(rope_run, method, params, extra):
    extended, note = at_length(load_eval_model(rope_run), 4 * T, method)
    assert note == f"rotary {method}, scale 4 over {T} positions"
    model = TupeForMaskedLM.from_pretrained(rope_run, rope_parameters=dict(params), **extra)
    ids = _ids(4 * T)
    assert torch.equal(_logits(model, ids), _logits(extended.model, ids))


def test_evaluate_gives_a_saved_yarn_model_the_loss_of_extend_positions_yarn(rope_run, tmp_path, text_file):
    """The habit: YaRN set through rope_parameters and saved, evaluated at 4x the training length as it is, next
    to the original model evaluated there with --extend-positions yarn: the same loss, block for block."""
    TupeForMaskedLM.from_pretrained(rope_run, rope_parameters=dict(YARN)).save_pretrained(tmp_path / "yarn")
    (tmp_path / "yarn" / "tokenizer.json").write_bytes((rope_run / "tokenizer.json").read_bytes())
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (rope_run / name).is_file():
            (tmp_path / "yarn" / name).write_bytes((rope_run / name).read_bytes())
    models = [load_eval_model(rope_run), load_eval_model(tmp_path / "yarn")]
    result = evaluate_lengths(
        models, resolve_corpus([str(text_file)]), [4 * T], Settings(bootstrap=0, pppl_tokens=0, progress=False),
        extend="yarn", log=lambda m: None,
    )  # fmt: skip
    first, second = result["by_length"]
    assert first["extended"] == "yarn" and second["extended"] is None and first["blocks"] > 0
    assert first["loss"]["value"] == pytest.approx(second["loss"]["value"], rel=1e-6)


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")
def test_refused_by_name_where_it_does_not_apply(tmp_path, tokenizer):
    alibi = save_tupe(tmp_path / "alibi", tokenizer, "alibi", max_len=T)
    for kwargs in ({"rope_parameters": dict(YARN)}, {"rope_scaling": {"type": "linear", "factor": 2.0}}):
        with pytest.raises(ValueError, match="applies to the rope scheme only .* position_scheme 'alibi'"):
            TupeForMaskedLM.from_pretrained(alibi, **kwargs)
    with pytest.raises(ValueError, match="position_scheme 'tupe-a' has no rotation to scale"):
        TupeConfig(position_scheme="tupe-a", rope_parameters=dict(YARN))
    for bad, message in (
        ({"rope_type": "ntk-by-parts"}, "rope_type 'ntk-by-parts' is not one the rope scheme applies"),
        ({"rope_type": "linear"}, "rope_type 'linear' need factor"),
        ({"rope_type": "yarn", "factor": 0.5}, "factor must be a number >= 1, got 0.5"),
        ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, "rotates the whole head"),
        ("yarn", "must be a dict such as"),
    ):
        with pytest.raises(ValueError, match=message):
            TupeConfig(position_scheme="rope", rope_parameters=bad)


def test_never_written_to_config_json_unapplied(rope_run, tmp_path, tokenizer):
    model = TupeForMaskedLM.from_pretrained(rope_run)
    model.save_pretrained(tmp_path / "plain")
    assert "rope_parameters" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    model.config.rope_parameters = dict(YARN)  # after the model was built: not what it applies
    with pytest.raises(ValueError, match="changed after the model was built"):
        model.save_pretrained(tmp_path / "claimed")
    assert not (tmp_path / "claimed" / "config.json").exists()
    alibi = TupeForMaskedLM.from_pretrained(save_tupe(tmp_path / "alibi", tokenizer, "alibi", max_len=T))
    alibi.config.rope_parameters = dict(YARN)
    with pytest.raises(ValueError, match="position_scheme 'alibi'"):
        alibi.save_pretrained(tmp_path / "alibi-claimed")
    assert not (tmp_path / "alibi-claimed" / "config.json").exists()
