"""The model a pre-training run builds from its configuration: the one place that maps `--scheme` to a model.

A new kind of model (e.g. transformers' own `BertForMaskedLM` as a control) changes `SCHEMES`, `check_scheme`
and `build_model` only.
"""

from __future__ import annotations

from typing import Any

from tupe.errors import TupeError
from tupe.modeling import POSITION_SCHEMES

SCHEMES: tuple[str, ...] = POSITION_SCHEMES  # what --scheme accepts


def check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise TupeError(f"unknown scheme {scheme!r}; choose one of: {', '.join(SCHEMES)}")


def model_config(config: Any, values: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The model's config values for a run (`config`: a `PretrainConfig`, `values`: its resolved preset values);
    recorded in `tupe_run.json` as part of the run's identity."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=int(values["hidden_size"]),
        num_hidden_layers=int(values["num_hidden_layers"]),
        num_attention_heads=int(values["num_attention_heads"]),
        intermediate_size=int(values["intermediate_size"]),
        max_position_embeddings=int(values["max_length"]),
        position_scheme=config.scheme,
        hidden_dropout_prob=float(values["dropout"]),
        attention_probs_dropout_prob=float(values["dropout"]),
        sparse_prediction=not config.dense_prediction,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        mask_token_id=tokenizer.mask_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )


def build_model(config: Any, model_kwargs: dict[str, Any]):
    """A freshly initialised masked-LM model for the run (`config`: its `PretrainConfig`)."""
    from tupe.modeling import TupeConfig, TupeForMaskedLM

    check_scheme(config.scheme)
    mcfg = TupeConfig(**model_kwargs)
    if (
        config.attn_implementation == "eager"
    ):  # the reference kernel, saved with the model ("sdpa": the default)
        mcfg.attention_kernel = "eager"
    return TupeForMaskedLM(mcfg)
