"""The model a pre-training run builds from its configuration: the one place that maps `--scheme` to a model.

Besides every positional scheme of `tupe.modeling`, `--scheme hf-bert` trains transformers' own `BertForMaskedLM`
at the same shape, on the same blocks, with the same recipe and Trainer: an independent control showing that the
`bert-a` curves are not an artefact of this project's model code.
"""

from __future__ import annotations

from typing import Any

from tupe.errors import TupeError
from tupe.modeling import POSITION_SCHEMES

HF_BERT = "hf-bert"  # transformers' own BertForMaskedLM, the independent control


def pretrain_schemes() -> tuple[str, ...]:
    """What `--scheme` accepts: every registered positional scheme (read now: schemes registered from outside the
    package count), then hf-bert."""
    return (*POSITION_SCHEMES, HF_BERT)


def check_scheme(scheme: str, attention_kernel: str | None = None, packing: str = "stream") -> None:
    """An unknown scheme, an `--attention-kernel` that cannot run it, or `--packing documents` with hf-bert (whose
    attention crosses documents whatever the position ids say), refused before any work."""
    schemes = pretrain_schemes()
    if scheme not in schemes:
        raise TupeError(f"unknown scheme {scheme!r}; choose one of: {', '.join(schemes)}")
    check_packing_for_scheme(scheme, packing)
    if attention_kernel is not None and scheme != HF_BERT:
        from tupe.modeling.kernel_registry import check_kernel_for_scheme
        from tupe.modeling.positional import scheme_class

        try:
            check_kernel_for_scheme(
                attention_kernel, scheme, scheme_class(scheme).terms, "--attention-kernel"
            )
        except ValueError as err:
            raise TupeError(str(err)) from None


def check_packing_for_scheme(scheme: str, packing: str) -> None:
    """`--packing documents` with hf-bert refused: its attention crosses documents whatever the position ids say."""
    if packing == "documents" and scheme == HF_BERT:
        raise TupeError(
            "--packing documents keeps attention inside each document, which hf-bert (transformers' "
            "BertForMaskedLM) cannot do: its attention crosses documents; use --packing stream for hf-bert"
        )


def model_config(model: Any, tokenizer: Any) -> dict[str, Any]:
    """The model's config values for a run (`model`: its `ModelConfig`); recorded in `tupe_run.json` as part of
    the run's identity."""
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=int(model.hidden_size),
        num_hidden_layers=int(model.num_hidden_layers),
        num_attention_heads=int(model.num_attention_heads),
        intermediate_size=int(model.intermediate_size),
        # --max-position-embeddings (at least the block length: `ResolvedConfig` checks), else the block length
        max_position_embeddings=int(model.max_position_embeddings),
        position_scheme=model.scheme,
        hidden_dropout_prob=float(model.dropout),
        attention_probs_dropout_prob=float(model.dropout),
        pad_token_id=tokenizer.pad_token_id,
    )
    if model.scheme == HF_BERT:
        # transformers' stock BERT at the same shape: learned absolute positions added to the input, token-type
        # embeddings (one type used), LayerNorm eps 1e-12, the MLM head on every position (its own code path)
        return dict(model_type="bert", **shape, sparse_prediction=False)
    return dict(
        **shape,
        sparse_prediction=not model.dense_prediction,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        mask_token_id=tokenizer.mask_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )


def build_model(config: Any, model_kwargs: dict[str, Any]):
    """A freshly initialised masked-LM model for the run (`config`: its `ModelConfig`, whose scheme and kernel
    `check_scheme` has checked) from its `model_config` values."""
    from tupe.modeling import TupeConfig, TupeForMaskedLM
    from tupe.modeling.kernel_registry import AUTO

    if config.scheme == HF_BERT:
        from transformers import BertConfig, BertForMaskedLM

        kwargs = {k: v for k, v in model_kwargs.items() if k != "model_type"}
        # transformers' own names (eager, sdpa, ...); "auto" is its default, which it refuses by that name
        attn = None if config.attention_kernel == AUTO else config.attention_kernel
        return BertForMaskedLM(BertConfig(**kwargs, attn_implementation=attn))
    # the kernel is saved with the model; one that cannot run the scheme is refused here, in one line
    return TupeForMaskedLM(TupeConfig(**model_kwargs, attn_implementation=config.attention_kernel or AUTO))
