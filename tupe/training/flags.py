"""One flag vocabulary: the training settings that several commands have (`pretrain`, `compare`, `glue`,
`finetune`), defined once here so each is spelled, typed and explained the same way everywhere.

A command adds the ones it has with `add_training_flags(parser, names, defaults=..., dests=..., helps=...)`
(`types=...` where it narrows a range):
`dests` maps a setting to the command's own attribute name (pre-training keeps `max_length`), `defaults` and
`helps` say what the command's default is. Older spellings (`--clip`, `--adam-eps`, `--adam-betas B1,B2`, `--bf16`,
`--fp16`, `--max-length`) keep working as aliases that `--help` does not list.

Importing this module imports neither torch nor transformers (the parsers are built from it at start-up).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tupe import validators as V
from tupe.data.config import PACKINGS  # noqa: F401  (`--packing`'s values, re-exported)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# transformers' SchedulerType names that need no further argument (tests/training/test_flags.py checks them)
LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)
BATCH_SIZE_HELP = "global batch: sequences per optimizer step, over all processes and accumulation steps"


@dataclass(frozen=True)
class Flag:
    """A setting's one spelling, its hidden older spellings, and its argparse keyword arguments."""

    name: str
    aliases: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


FLAGS: dict[str, Flag] = {
    "batch_size": Flag("--batch-size", (), dict(type=V.positive_int, help=BATCH_SIZE_HELP)),
    "epochs": Flag("--epochs", (), dict(type=V.positive_float, help="passes over the training data")),
    "max_seq_len": Flag(
        "--max-seq-len",
        ("--max-length",),
        dict(type=V.int_range(2, V.MAX_LENGTH), metavar="N", help="tokens per sequence"),
    ),
    "warmup_ratio": Flag(
        "--warmup-ratio",
        (),
        dict(
            type=V.float_range(0, 1, hi_open=True), help="linear warm-up as a fraction of the training steps"
        ),
    ),
    "warmup_steps": Flag("--warmup-steps", (), dict(type=V.nonneg_int, help="linear warm-up steps")),
    "lr_scheduler": Flag(
        "--lr-scheduler",
        (),
        dict(choices=LR_SCHEDULERS, help="learning-rate schedule after warm-up, the Trainer's names"),
    ),
    "adam_beta1": Flag("--adam-beta1", (), dict(type=V.unit_interval, help="Adam beta1")),
    "adam_beta2": Flag("--adam-beta2", (), dict(type=V.unit_interval, help="Adam beta2")),
    "adam_epsilon": Flag("--adam-epsilon", ("--adam-eps",), dict(type=V.positive_float, help="Adam epsilon")),
    "max_grad_norm": Flag(
        "--max-grad-norm", ("--clip",), dict(type=V.nonneg_float, help="gradient clipping norm (0: none)")
    ),
    "precision": Flag(
        "--precision",
        (),
        dict(choices=PRECISIONS, help="auto: bf16 (or fp16) on GPUs, fp32 on CPU; bf16/fp16 need a GPU"),
    ),
    "gradient_checkpointing": Flag(
        "--gradient-checkpointing",
        (),
        dict(
            action="store_true", help="recompute activations in the backward pass: less memory, more compute"
        ),
    ),
    "torch_compile": Flag(
        "--torch-compile", (), dict(action="store_true", help="compile the model with torch.compile")
    ),
}


class _AdamBetas(argparse.Action):
    """`--adam-betas B1,B2` (older spelling): sets both betas."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001, ANN204
        try:
            betas = [float(x) for x in str(values).split(",")]
        except ValueError:
            betas = []
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            parser.error(
                f"argument {option_string}: must be two comma-separated numbers in [0, 1), got {values!r}"
            )
        setattr(namespace, self.metavar_dests[0], betas[0])
        setattr(namespace, self.metavar_dests[1], betas[1])


def add_training_flags(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    names: Iterable[str],
    defaults: dict[str, Any] | None = None,
    dests: dict[str, str] | None = None,
    helps: dict[str, str] | None = None,
    types: dict[str, Any] | None = None,
) -> None:
    """Add the flags of `names` (keys of `FLAGS`) with this command's defaults, attribute names and help (each
    help is the shared wording plus the command's own, e.g. its default), and their hidden aliases. `types`
    narrows a flag's range where the command needs more (`tupe analyze`: blocks of at least 4 tokens)."""
    defaults, dests, helps, types = defaults or {}, dests or {}, helps or {}, types or {}
    names = list(names)
    for name in names:
        flag = FLAGS[name]
        dest = dests.get(name, name)
        kwargs = dict(flag.kwargs, dest=dest)
        if name in types:
            kwargs["type"] = types[name]
        if name in defaults:
            kwargs["default"] = defaults[name]
        if name in helps:
            kwargs["help"] = f"{kwargs['help']} ({helps[name]})"
        p.add_argument(flag.name, **kwargs)
        hidden = {k: v for k, v in kwargs.items() if k != "help"} | {"default": argparse.SUPPRESS}
        for alias in flag.aliases:
            p.add_argument(alias, **hidden, help=argparse.SUPPRESS)
    if "precision" in names:
        dest = dests.get("precision", "precision")
        for const in ("bf16", "fp16"):
            p.add_argument(f"--{const}", dest=dest, action="store_const", const=const, help=argparse.SUPPRESS)
    if "adam_beta1" in names and "adam_beta2" in names:
        action = p.add_argument("--adam-betas", action=_AdamBetas, metavar="B1,B2", help=argparse.SUPPRESS)
        action.metavar_dests = (dests.get("adam_beta1", "adam_beta1"), dests.get("adam_beta2", "adam_beta2"))


def precision_flags(precision: str) -> dict[str, bool]:
    """The Trainer's `bf16` / `fp16` for a `--precision` value; bf16 or fp16 without a GPU is an error."""
    import torch

    from tupe.errors import TupeError

    if precision not in PRECISIONS:
        raise TupeError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    cuda = torch.cuda.is_available()
    if precision == "auto":
        if not cuda:
            return {"bf16": False, "fp16": False}
        return {"bf16": torch.cuda.is_bf16_supported(), "fp16": not torch.cuda.is_bf16_supported()}
    if precision in ("bf16", "fp16") and not cuda:
        raise TupeError(f"--precision {precision} needs a GPU here; use fp32 (the default on CPU)")
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def checkpointing_argument(enabled: bool) -> dict[str, bool]:
    """The TrainingArguments field that turns on activation (gradient) checkpointing: `activation_checkpointing` in
    the transformers releases that renamed it, `gradient_checkpointing` in those before (5.17 has only the old
    name: found on a lent GPU machine, where every `tupe pretrain` failed on the new one)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing": enabled
    }
