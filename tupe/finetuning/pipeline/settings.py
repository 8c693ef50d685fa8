"""The recipe `tupe glue` and `tupe finetune` share (`GridSettings`: everything that determines a fine-tuning
run's score apart from its learning rate and seed, and the fingerprint finished runs are reused by) and the flags
both commands have, worded alike: the grid and recipe (`add_grid_arguments`, read by `grid_settings`), the
checkpoint, output and machine flags (`add_run_arguments`) and the Trainer's step flags (`add_step_arguments`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from tupe.errors import TupeError

_S = TypeVar("_S", bound="GridSettings")
# settings that decide how a run computes, not what it learns: a finished run is reused whatever they were
# (--grad-accum splits the same global --batch-size into smaller forward passes: how, not what)
_MACHINE_SETTINGS = (
    "lrs", "seeds", "eval_batch_size", "gradient_checkpointing", "torch_compile", "grad_accum", "logging_steps",
    "eval_steps", "padding",
)  # fmt: skip
_FINGERPRINT_TAIL = ("max_train_samples", "max_eval_samples", "fp16", "bf16", "warmup_steps")


@dataclass
class GridSettings:
    """Everything that determines a fine-tuning run's score apart from its learning rate and seed: the recipe
    `tupe glue` (`GlueSettings`) and `tupe finetune` (`FinetuneSettings`) share, each command adding its own
    fields and defaults. The field order is that of the fingerprints in finished runs' result.json."""

    task: str
    lrs: list[float] | None = None  # None: the paper's grid, or the small-model grid below width 512
    seeds: list[int] = field(default_factory=list)
    epochs: float | None = None
    batch_size: int = 32
    eval_batch_size: int = 64
    max_seq_len: int | None = None  # None: the command's default for the model
    warmup_ratio: float | None = 0.06  # None when `warmup_steps` is given
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    lr_scheduler: str = "linear"
    dropout: float | None = 0.1  # the paper's fine-tuning dropout; None keeps the checkpoint's
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    fp16: bool = False
    bf16: bool = False
    warmup_steps: int | None = None  # instead of warmup_ratio
    gradient_checkpointing: bool = False
    torch_compile: bool = False
    grad_accum: int = 1  # forward passes per optimizer step; --batch-size stays the global batch
    max_steps: int | None = None  # instead of --epochs' steps (the Trainer's max_steps)
    logging_steps: int | None = None  # None: about 50 logs a run
    eval_steps: int | None = (
        None  # the validation loss every N steps (None: never, or each epoch with early stop)
    )
    # --padding: batches padded to their longest example instead of padding-free (`FlattenedBatches`); how a run
    # computes, not what it learns (the same losses and predictions to float rounding; dropout draws differ)
    padding: bool = False

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings a finished run must share with the current command to be reused (not the grid itself,
        nor how it computes), byte for byte as before the commands shared this class: a command's own fields
        before the subsets and precision, and `warmup_steps` only where given."""
        d = asdict(self)
        for key in _MACHINE_SETTINGS:
            d.pop(key)
        tail = {key: d.pop(key) for key in _FINGERPRINT_TAIL}
        if tail["warmup_steps"] is None:
            del tail["warmup_steps"]
        if d.get("max_steps") is None:  # only where given: runs finished before the flag existed are reused
            d.pop("max_steps", None)
        return d | tail

    def with_defaults(self: _S, default_lrs: Sequence[float], default_len: int, max_positions: int) -> _S:
        """A copy with the grid's defaults filled in and each value once ("2e-5,2e-5" is one learning rate), the
        length checked against the model's positions, and `warmup_steps` (where given) replacing the ratio."""
        out = replace(self)
        out.lrs = list(dict.fromkeys(float(x) for x in (default_lrs if self.lrs is None else self.lrs)))
        out.seeds = list(dict.fromkeys(int(x) for x in self.seeds))
        if self.max_seq_len is None:
            out.max_seq_len = min(default_len, max_positions)
        elif self.max_seq_len > max_positions:
            raise TupeError(
                f"--max-seq-len {self.max_seq_len} exceeds the model's max_position_embeddings {max_positions}"
            )
        if self.warmup_steps is not None:
            out.warmup_ratio = None
        return out


def add_grid_arguments(
    p: argparse.ArgumentParser,
    *,
    lrs_help: str,
    seeds_default: Sequence[int],
    epochs_default: float | None,
    epochs_help: str,
    max_seq_len_help: str,
) -> None:
    """The grid and recipe flags `tupe glue` and `tupe finetune` share, worded alike (each command words its
    defaults): learning rates, seeds, epochs, batch sizes, length, subsets, warm-up, weight decay, dropout."""
    from tupe import validators as V
    from tupe.training.flags import add_training_flags

    p.add_argument("--lrs", type=V.float_list(0.0), help=lrs_help)
    seeds = ",".join(map(str, seeds_default))
    p.add_argument("--seeds", type=V.seed_list, default=list(seeds_default), help=f"seeds (default {seeds})")
    add_training_flags(
        p,
        ["epochs", "batch_size"],
        defaults={"epochs": epochs_default, "batch_size": 32},
        helps={"epochs": epochs_help, "batch_size": "default 32"},
    )
    p.add_argument(
        "--eval-batch-size", type=V.positive_int, default=64, help="evaluation batch size (default 64)"
    )
    add_training_flags(p, ["max_seq_len"], helps={"max_seq_len": max_seq_len_help})
    p.add_argument(
        "--max-train-samples", type=V.positive_int, help="use a fixed random subset of the training set"
    )
    p.add_argument(
        "--max-eval-samples",
        type=V.positive_int,
        help="use a fixed random subset of each dev set (not comparable)",
    )
    add_training_flags(
        p,
        ["warmup_ratio", "warmup_steps", "lr_scheduler", "adam_beta1", "adam_beta2", "adam_epsilon",
         "max_grad_norm"],
        defaults={"lr_scheduler": "linear", "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-6,
                  "max_grad_norm": 1.0},
        helps={"warmup_ratio": "default 0.06", "warmup_steps": "instead of --warmup-ratio", "lr_scheduler":
               "default linear", "adam_beta1": "default 0.9, the paper's", "adam_beta2": "default 0.999, the "
               "paper's", "adam_epsilon": "default 1e-6", "max_grad_norm": "default 1.0"},
    )  # fmt: skip
    p.add_argument("--weight-decay", type=V.nonneg_float, default=0.01, help="default 0.01")
    p.add_argument(
        "--dropout",
        type=V.float_range(-1, 1, hi_open=True),
        default=0.1,
        help="hidden and attention dropout while fine-tuning (default the paper's 0.1; -1 keeps the checkpoint's)",
    )


def grid_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `add_grid_arguments` and `add_run_arguments` give, by the settings' field names."""
    from tupe.training.flags import precision_flags

    if args.warmup_ratio is not None and args.warmup_steps is not None:
        raise TupeError("--warmup-ratio and --warmup-steps say the same thing: give one")
    names = ("lrs", "seeds", "epochs", "batch_size", "eval_batch_size", "max_seq_len", "warmup_steps")
    names += ("lr_scheduler", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm")
    names += ("gradient_checkpointing", "torch_compile")
    if args.batch_size % args.grad_accum:
        raise TupeError(
            f"--batch-size {args.batch_size} is not divisible by --grad-accum {args.grad_accum}: --batch-size is the "
            "batch of one optimizer step, split into --grad-accum forward passes"
        )
    names += ("grad_accum", "max_steps", "logging_steps", "eval_steps", "padding")
    return {
        **{name: getattr(args, name) for name in names},
        "warmup_ratio": 0.06 if args.warmup_ratio is None else args.warmup_ratio,
        "weight_decay": args.weight_decay,
        "dropout": None if args.dropout < 0 else args.dropout,  # -1: the checkpoint's
        "max_train_samples": args.max_train_samples,
        "max_eval_samples": args.max_eval_samples,
        **precision_flags(args.precision),  # the settings' fp16 / bf16
    }


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The checkpoint, output and machine flags `tupe glue` and `tupe finetune` share."""
    from tupe import validators as V
    from tupe.training.flags import add_training_flags

    p.add_argument("--scheme", help="expected position scheme; an error if the checkpoint's differs")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the model directory)")
    p.add_argument(
        "--save-models", action="store_true", help="keep every run's fine-tuned model (runs/*/model)"
    )
    p.add_argument("--overwrite", action="store_true", help="discard runs in --out made with other settings")
    V.add_threads_progress(p, "progress bar")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    add_training_flags(p, ["precision"], defaults={"precision": "fp32"}, helps={"precision": "default fp32"})
    add_training_flags(p, ["gradient_checkpointing", "torch_compile"])
    add_step_arguments(p)


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The Trainer's step flags `tupe glue` and `tupe finetune` share, spelled as `tupe pretrain` spells them:
    --report-to, --grad-accum, --max-steps, --logging-steps, --eval-steps."""
    from tupe import validators as V
    from tupe.training.reporting import add_report_arguments

    add_report_arguments(p)
    p.add_argument(
        "--grad-accum",
        type=V.positive_int,
        default=1,
        help="gradient accumulation steps: --batch-size (the batch of one optimizer step) is split into this many "
        "forward passes, to fit memory; what a run learns stays the same (default 1)",
    )
    p.add_argument(
        "--padding",
        action="store_true",
        help="pad each batch to its longest example, as before padding-free batches; the default puts a batch's "
        "examples into one row, each at positions 0..m-1 with attention inside it (where the family's head and "
        "the model's attention kernel take documents in a row: else padded, said once)",
    )
    p.add_argument(
        "--max-steps",
        type=V.int_range(1, V.MAX_STEPS),
        help="optimizer steps per run, instead of --epochs' (the Trainer's max_steps)",
    )
    p.add_argument(
        "--logging-steps",
        type=V.positive_int,
        help="log the training loss every N steps (default: ~50 a run)",
    )
    p.add_argument(
        "--eval-steps",
        type=V.positive_int,
        help="compute the validation loss every N steps (to --report-to; the scores are still the end's)",
    )
