"""The one fine-tuning pipeline of `tupe glue` and `tupe finetune`: a task family (`TaskFamily`: GLUE's tasks, or
a `tupe finetune` family) brings its data, head and metrics; everything else is here, once: the recipe
(`GridSettings`) and its flags, one run (a fresh task head on a pre-trained checkpoint, trained by the
`transformers` Trainer with the collator of `data_collator`: `train_run`), the learning-rate x seed grid around it
(`plan_grid`, `train_grid`), the summary over seeds (`summarize_grid`: mean or median, as the family's protocol asks)
and the results record (`GridResults`, written as results.json and read by `tupe report`), all joined by
`run_finetuning`.

A grid lives in one folder: each finished run writes `runs/lr<LR>_seed<S>/result.json` atomically and last, with
the fingerprint of everything that determines its score (settings, model weights, data), so the same command
started again skips the runs that finished and refuses a folder made with other settings.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from tupe.errors import TupeError
from tupe.io.files import atomic_write_json

if TYPE_CHECKING:
    from tupe.io.outputs import OutputFolder

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


def run_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}_seed{seed}"


def progress_callback(bar: Any, label: str) -> Any:
    """A Trainer callback advancing one bar over every optimisation step of the whole grid (so its ETA covers the
    grid), with the run and its last loss beside it."""
    from transformers import TrainerCallback

    class GridProgress(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            bar.update(1)

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "loss" in logs:
                bar.set_postfix_str(f"{label} loss={logs['loss']:.4f}", refresh=False)

    return GridProgress()


def finetune_training_arguments(
    settings: Any,
    lr: float,
    seed: int,
    work: Path,
    n_train: int,
    report_to: list[str] | None = None,
    push_to_hub: bool = False,
    hub_model_id: str | None = None,
    early_stopping: int | None = None,
) -> Any:  # noqa: ANN401 - transformers.TrainingArguments
    """The Trainer's arguments of one run: the settings' recipe (GLUE's: the paper's), --report-to, and
    --push-to-hub / --hub-model-id. `early_stopping` (a patience in epochs) evaluates the validation loss after
    every epoch and ends with the weights of the best epoch."""
    import torch
    from transformers import TrainingArguments

    from tupe.training.flags import checkpointing_argument
    from tupe.training.reporting import trainer_reporting

    stopping: dict[str, Any] = {"save_strategy": "no", "eval_strategy": "no"}
    eval_steps = getattr(settings, "eval_steps", None)
    if eval_steps and early_stopping:
        raise TupeError("--eval-steps and --early-stopping: early stopping evaluates once an epoch; give one")
    if eval_steps:
        stopping = {"save_strategy": "no", "eval_strategy": "steps", "eval_steps": eval_steps}
    if early_stopping:
        stopping = {
            "save_strategy": "epoch",
            "eval_strategy": "epoch",
            "load_best_model_at_end": True,
            "metric_for_best_model": "eval_loss",
            "greater_is_better": False,
            "save_total_limit": 1,
            "save_only_model": True,
        }
    accum = int(getattr(settings, "grad_accum", 1) or 1)
    max_steps = getattr(settings, "max_steps", None)
    logging_steps = getattr(settings, "logging_steps", None)
    return TrainingArguments(
        output_dir=str(work),
        per_device_train_batch_size=settings.batch_size // accum,
        gradient_accumulation_steps=accum,
        max_steps=max_steps if max_steps is not None else -1,
        per_device_eval_batch_size=settings.eval_batch_size,
        learning_rate=lr,
        num_train_epochs=settings.epochs,
        # --warmup-steps, or --warmup-ratio: a float < 1 is a ratio of the total steps
        warmup_steps=settings.warmup_steps if settings.warmup_steps is not None else settings.warmup_ratio,
        lr_scheduler_type=settings.lr_scheduler,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_epsilon=settings.adam_epsilon,
        max_grad_norm=settings.max_grad_norm,
        optim="adamw_torch",
        seed=seed,
        data_seed=seed,
        logging_strategy="steps",
        logging_steps=logging_steps or max(1, min(50, n_train // settings.batch_size)),
        # the Trainer's integrations (--report-to) and the Hub (--push-to-hub, --hub-model-id)
        **trainer_reporting(report_to or [], push_to_hub, hub_model_id),
        **stopping,
        disable_tqdm=True,
        fp16=settings.fp16,
        bf16=settings.bf16,
        **checkpointing_argument(settings.gradient_checkpointing),
        torch_compile=settings.torch_compile,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def load_head(model_class: Any, model_dir: str, seed: int, dropout: float | None, **kwargs: Any) -> Any:
    """The checkpoint with a fresh task head (initialised from `seed`), the fine-tuning dropout applied."""
    import transformers

    transformers.set_seed(seed)  # the new head's initialisation depends on the seed too
    if dropout is not None:  # the pre-training dropout may differ (the mini preset uses 0)
        kwargs["hidden_dropout_prob"] = dropout
        kwargs["attention_probs_dropout_prob"] = dropout
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "newly initialized head" is expected here
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.disable_progress_bar()  # one bar for the whole grid
    try:
        return model_class.from_pretrained(model_dir, ignore_mismatched_sizes=True, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:  # --no-progress / --quiet turned them off for the whole command
            transformers.logging.enable_progress_bar()


def make_trainer(
    model: Any,
    args: Any,
    train_ds: Any,
    collator: Any,
    tokenizer: Any,
    callbacks: list[Any],
    eval_ds: Any = None,
    early_stopping: int | None = None,
    logging_dir: Path | None = None,
    stopped_message: Callable[[], str] | None = None,
) -> Any:
    """The Trainer of one run, printing nothing of its own (the grid has one bar)."""
    from transformers import EarlyStoppingCallback, PrinterCallback

    from tupe.training.reporting import align_special_tokens, point_tensorboard

    align_special_tokens(model, tokenizer)
    if early_stopping:
        callbacks = [*callbacks, EarlyStoppingCallback(early_stopping_patience=early_stopping)]
    trainer = _trainer_class()(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds
        if early_stopping or str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"
        else None,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)
    if logging_dir is not None:
        # one TensorBoard run per (lr, seed): the loss curves; a failed write stops the grid in one line
        point_tensorboard(trainer, logging_dir, stopped_message or (lambda: "the run stopped"))
    return trainer


def trainer_used(trainer: Any) -> dict[str, Any]:
    """What the Trainer actually used (not just what was asked), so results can be audited."""
    a = trainer.args
    config = trainer.model.config
    used = {
        "learning_rate": a.learning_rate,
        "warmup_steps": a.get_warmup_steps(trainer.state.max_steps),
        "total_steps": trainer.state.max_steps,
        "lr_scheduler": str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)),
        "optimizer": str(getattr(a.optim, "value", a.optim)),
        "adam_betas": [a.adam_beta1, a.adam_beta2],
        "adam_epsilon": a.adam_epsilon,
        "weight_decay": a.weight_decay,
        "max_grad_norm": a.max_grad_norm,
        "train_batch_size": a.per_device_train_batch_size * max(1, a.n_gpu) * a.gradient_accumulation_steps,
        "gradient_accumulation_steps": a.gradient_accumulation_steps,
        "dropout": [config.hidden_dropout_prob, config.attention_probs_dropout_prob],
        "device": str(a.device),
    }
    if a.load_best_model_at_end:
        used["best_checkpoint"] = Path(trainer.state.best_model_checkpoint or "").name or None
    return used


def eval_logs(scores: dict[str, Any]) -> dict[str, float]:
    """A run's final scores as the Trainer logs evaluation metrics (run_ner's `eval_f1`, `eval_precision`, ...:
    TensorBoard shows them as eval/f1), on the scale results.json records them; GLUE's {split: {metric}} as
    `eval_<split>_<metric>`. An undefined score (None) is left out."""

    def number(v: Any) -> bool:  # noqa: ANN401
        return isinstance(v, int | float) and not isinstance(v, bool)

    out: dict[str, float] = {}
    for key, value in scores.items():
        if isinstance(value, dict):
            out.update({f"eval_{key}_{m}": float(v) for m, v in value.items() if number(v)})
        elif number(value):
            out[f"eval_{key}"] = float(value)
    return out


def loss_curve(trainer: Any) -> list[tuple[int, float]]:
    return [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]


def finish_run(trainer: Any, run_dir: Path, save_model: bool, redo: str) -> dict[str, Any]:
    """The end of one run, after its scores: the fine-tuned model saved in `run_dir/model` if asked (a full disk
    stops the grid in one line ending with `redo`, what happens to this run and how to go on), what the Trainer
    used, and its work folder `run_dir/trainer` removed. Returns what the Trainer used (`trainer_used`)."""
    from tupe.io.files import failed_writes_reported

    if save_model:
        # disk full: torch/safetensors report it in their own exception types
        with failed_writes_reported(run_dir / "model", redo):
            trainer.save_model(str(run_dir / "model"))
    used = trainer_used(trainer)
    shutil.rmtree(run_dir / "trainer", ignore_errors=True)
    return used


# ------------------------------------------------------------------------------------------------------- grid


def read_run_result(path: Path) -> dict | None:
    """A finished run's result.json, or None if it is not one (cut, garbage, wrong shape: the run is redone).
    A FIFO, a device or an absurdly large file is refused by name (a `TupeError`) instead of blocking."""
    from tupe.io.reading import RECORD_LIMIT, Refused, check_regular, read_json

    check_regular(path, "run result")
    try:
        r = read_json(path, "run result", RECORD_LIMIT)
    except Refused:
        raise
    except TupeError:
        return None
    lr, seed = r.get("lr"), r.get("seed")
    if (
        not isinstance(lr, float | int)
        or isinstance(lr, bool)
        or not isinstance(seed, int)
        or isinstance(seed, bool)
    ):
        return None
    return r


def finished_runs(
    out_dir: Path, fingerprint: dict, overwrite: bool, outputs: OutputFolder
) -> dict[tuple[float, int], dict]:
    """The finished runs in `out_dir/runs` made with the same fingerprint; a run made otherwise is an error
    (or, with `overwrite`, deleted through the folder's output policy)."""
    runs_dir = out_dir / "runs"
    done: dict[tuple[float, int], dict] = {}
    if not runs_dir.is_dir():
        return done
    for f in sorted(runs_dir.glob("*/result.json")):
        r = read_run_result(f)  # a FIFO or a huge file is refused by name
        if r is None:
            continue  # not finished (result.json is written last, atomically): redone
        if r.get("fingerprint") != fingerprint:
            if not overwrite:
                raise TupeError(
                    f"{f}: a run made with other settings, model or data is in {out_dir}; "
                    "use a new --out, or --overwrite to discard those runs"
                )
            outputs.remove(f.parent.relative_to(out_dir))
            continue
        done[(r["lr"], r["seed"])] = r
    return done


@dataclass
class Grid:
    """A grid in its folder: its (lr, seed) runs in order, those already finished there with the same
    fingerprint (settings, model weights, data), and the optimizer steps of one run."""

    out_dir: Path
    runs: list[tuple[float, int]]
    done: dict[tuple[float, int], dict]
    fingerprint: dict[str, Any]
    steps_per_run: int
    outputs: OutputFolder

    def describe(self, settings: GridSettings, n_train: int) -> str:
        """The line a command prints before it starts: the grid's size, what is done, each run's length in
        optimizer steps (--max-steps where given; --grad-accum forward passes make one step)."""
        per_epoch, total = optimizer_steps(settings, n_train)
        accum = max(1, int(settings.grad_accum or 1))
        length = (
            f"{total} steps a run (--max-steps; an epoch is {per_epoch})"
            if settings.max_steps is not None
            else f"{settings.epochs:g} epochs x {per_epoch} steps"
        )
        batch = f"batch {settings.batch_size}" + (
            f" = {accum} forward passes of {settings.batch_size // accum}" if accum > 1 else ""
        )
        return (
            f"grid: {len(settings.lrs or [])} lr x {len(settings.seeds)} seeds = {len(self.runs)} runs, "
            f"{sum(g in self.done for g in self.runs)} already done; {length} ({batch}, max length "
            f"{settings.max_seq_len})"
        )


def optimizer_steps(settings: GridSettings, n_train: int) -> tuple[int, int]:
    """(optimizer steps an epoch, optimizer steps a run) on `n_train` examples, as the Trainer counts them: batches
    of --batch-size / --grad-accum examples, --grad-accum of them a step (the last step of an epoch may have fewer),
    and --max-steps where given, else --epochs' steps."""
    accum = max(1, int(settings.grad_accum or 1))
    batches = math.ceil(n_train / max(1, settings.batch_size // accum))
    per_epoch = max(1, math.ceil(batches / accum))
    if settings.max_steps is not None:
        return per_epoch, int(settings.max_steps)
    return per_epoch, math.ceil(per_epoch * float(settings.epochs or 0))


def plan_grid(
    out_dir: Path,
    settings: GridSettings,
    n_train: int,
    weights_sha256: str,
    data_sha256: str,
    overwrite: bool,
    outputs: OutputFolder,
) -> Grid:
    """The grid of resolved `settings` on `n_train` training examples, with the runs that already finished in
    `out_dir` (a run made otherwise is an error, or with `overwrite` discarded: `finished_runs`)."""
    fingerprint = {
        "settings": settings.fingerprint_fields(),
        "model_weights_sha256": weights_sha256,
        "data_sha256": data_sha256,
    }
    done = finished_runs(out_dir, fingerprint, overwrite, outputs)
    runs = [(lr, seed) for lr in settings.lrs or [] for seed in settings.seeds]
    return Grid(out_dir, runs, done, fingerprint, optimizer_steps(settings, n_train)[1], outputs)


def train_grid(
    grid: Grid,
    run_one: Callable[[float, int, Path, list[Any]], dict],
    on_update: Callable[[list[dict]], None],
    desc: str,
    progress: bool,
    log: Callable[[str], None],
    describe: Callable[[dict], str],
) -> list[dict]:
    """Run every (lr, seed) of `grid` not done yet, in order, under one progress bar. Each finished run's
    `result.json` is written last and atomically; `on_update(runs)` is called before the first run and after
    each (it rewrites the grid's results). Returns every finished run, in grid order."""
    from tqdm.auto import tqdm

    out_dir, done, outputs, steps_per_run = grid.out_dir, grid.done, grid.outputs, grid.steps_per_run
    runs_dir = out_dir / "runs"
    todo = [g for g in grid.runs if g not in done]
    runs = [done[g] for g in grid.runs if g in done]
    out_dir.mkdir(parents=True, exist_ok=True)
    on_update(runs)
    if not todo:
        return runs
    bar = tqdm(
        total=steps_per_run * len(todo), desc=desc, unit="step", dynamic_ncols=True, disable=not progress
    )
    try:
        for k, (lr, seed) in enumerate(todo, 1):
            label = f"run {k}/{len(todo)} lr={lr:g} seed={seed}"
            bar.set_postfix_str(label)
            run_dir = runs_dir / run_name(lr, seed)
            if os.path.lexists(run_dir):  # an unfinished run from an interrupted grid; never through a link
                outputs.remove(run_dir.relative_to(out_dir))
            run_dir.mkdir(parents=True)
            start = bar.n
            r = run_one(lr, seed, run_dir, [progress_callback(bar, label)])
            bar.n = start + steps_per_run  # keep the ETA right if the Trainer's step count differed
            bar.refresh()
            r["fingerprint"] = grid.fingerprint
            atomic_write_json(
                run_dir / "result.json", r, indent=2, clean=True
            )  # last: marks the run finished
            runs.append(r)
            on_update(runs)
            line = f"lr={lr:g} seed={seed}: {describe(r)} ({r['seconds']:.0f} s)"
            bar.write(line) if progress else log(line)
    finally:
        bar.close()
    return runs


def hub_run_id(hub_model_id: str | None, out_dir: Path, lr: float, seed: int) -> str:
    """The Hub repository of one run's model: `--hub-model-id` (default: the --out folder's name) with the run's
    name appended, so the grid's runs do not overwrite one another: `me/tupe-a-rte-lr2e-05_seed1`."""
    base = hub_model_id or Path(out_dir).resolve().name
    return f"{base}-{run_name(lr, seed)}"


# ------------------------------------------------------------------------------------------------ task family


class TaskFamily:
    """What a task brings to the shared pipeline: its data (read and checked by its command before anything is
    written), its encoding, head and collator, how it scores a run and writes its predictions, and how its grid is
    summarised (`aggregate`: "mean" over seeds, or "median" where the paper's protocol asks for it, GLUE's).
    GLUE's tasks: tupe/glue/family.py; `tupe finetune`'s families: tupe/finetuning/family.py."""

    name: str  # results.json's `task`
    metrics: tuple[str, ...]  # the first picks the learning rate (unless `main_metric` says otherwise)
    aggregate: ClassVar[str] = "mean"  # a key of AGGREGATES
    # what the family writes at the top of --out beside results.json and runs/
    outputs: ClassVar[tuple[str, ...]] = ()
    card_kind: ClassVar[str] = "text-classification"  # the pipeline tag of a saved model's card

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    # -- the model
    def model_class(self) -> Any:
        """The head's class (an Auto class or a tupe class), loaded with `from_pretrained`."""
        raise NotImplementedError

    def model_kwargs(self) -> dict[str, Any]:
        """`from_pretrained`'s keyword arguments for the head (its labels)."""
        return {}

    def config_extras(self) -> dict[str, Any]:
        """Values set on the fine-tuned model's config (saved in its config.json), e.g. NER's pipeline
        aggregation strategy."""
        return {}

    def label_names(self) -> list[str] | None:
        return None

    # padding-free batches (`FlattenedBatches`: a batch's examples in one row, `position_ids` restarting at 0):
    # "sequence" where the head scores each example from its first token (one label per example), "token" where it
    # scores every token (a label per token), None where its loss or scores need each example in its own row (then
    # the batches are padded whatever --padding says)
    flattened: ClassVar[str | None] = "sequence"
    flattened_refusal: ClassVar[str] = ""  # why not, where `flattened` is None (said once in the log)

    def collator(self, tokenizer: Any) -> Any:
        """The family's padded batches, each padded to its longest sequence (read through `data_collator`)."""
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    # -- the data
    def data_fingerprint(self) -> str:
        """A hash of the exact examples, so resumed runs are known to be comparable (part of every run's
        fingerprint: it must not change for the same examples)."""
        raise NotImplementedError

    def encode(self, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
        """(the training `datasets.Dataset`, the evaluation sets by name); the first evaluation set gives the
        validation loss (--eval-steps, --early-stopping)."""
        raise NotImplementedError

    def introduce(self, model_dir: Path, info: Any, n_train: int) -> str:
        """The line a command prints before its grid: the examples, where they come from, the model."""
        raise NotImplementedError

    def data_summary(self) -> dict[str, Any]:
        """results.json's `data` (its `sha256` is added)."""
        return {}

    # -- scoring
    def evaluate(
        self, trainer: Any, evals: dict[str, Any], run_dir: Path
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """(the run's scores, its prediction files by evaluation set, relative to `run_dir`) after training."""
        raise NotImplementedError

    def main_score(self, scores: dict[str, Any]) -> float | None:
        """The number that picks the learning rate, from one run's scores."""
        return scores[self.main_metric]

    def describe_run(self, scores: dict[str, Any]) -> str:
        """One finished run, for the log."""
        return ", ".join(f"{m}={v:.4f}" if v is not None else f"{m}=nan" for m, v in scores.items())

    # -- results
    def protocol(self) -> str:
        """results.json's `protocol`: how the grid's scores were summarised."""
        return f"{self.aggregate} over seeds per learning rate; best learning rate by the {self.aggregate} main metric"

    def results_fields(self, summary: dict[str, Any], runs: list[dict]) -> dict[str, Any]:
        """The family's own fields of the results record (`GridResults`), from the grid's summary."""
        return {}

    def publish(self, out_dir: Path, results: GridResults, info: Any) -> None:
        """What the family writes beside results.json after each run (a model card, the best run's predictions)."""

    def write_run_card(
        self,
        folder: Path,
        info: Any,
        lr: float,
        seed: int,
        scores: dict[str, Any],
        trainer: dict[str, Any] | None = None,
    ) -> None:
        """README.md of one run's saved model (--save-models); `trainer`: what the Trainer used (`trainer_used`)."""

    def best_line(self, results: GridResults, out_dir: Path) -> str:
        best = results.best
        agg = self.aggregate
        return (
            f"best lr {best['lr']:g}: {agg} {self.main_metric} {best[f'main_{agg}']:.4f} over {best['n_seeds']} "
            f"seeds -> {out_dir / 'results.json'}"
        )


# ----------------------------------------------------------------------------------------------------- summary


def _median(values: Sequence[float | None]) -> float | None:
    """Median where a missing/NaN score (e.g. an undefined correlation) counts as the lowest."""
    import numpy as np

    if not values:
        return None
    arr = np.array([-np.inf if v is None or not math.isfinite(v) else v for v in values], dtype=np.float64)
    m = float(np.median(arr))
    return m if math.isfinite(m) else None


def _mean(values: Sequence[float | None]) -> float | None:
    """Mean; None if a score is undefined."""
    if not values or any(v is None for v in values):
        return None
    return statistics.fmean(values)  # type: ignore[arg-type]


def _stdev(values: Sequence[float | None]) -> float | None:
    """Sample standard deviation; None for one seed or an undefined score."""
    if len(values) < 2 or any(v is None for v in values):
        return None
    return statistics.stdev(values)  # type: ignore[arg-type]


# how the seeds of a learning rate are summarised: the mean (with its standard deviation), or the TUPE paper's
# median (GLUE)
AGGREGATES: dict[str, Callable[[Sequence[float | None]], float | None]] = {"mean": _mean, "median": _median}


def _aggregate_tree(fn: Callable[[Sequence[Any]], Any], trees: list[dict[str, Any]]) -> dict[str, Any]:
    """`fn` over the runs of every score the runs all have, nested as the scores are ({split: {metric}} for GLUE)."""
    out: dict[str, Any] = {}
    for key, value in trees[0].items():
        if not all(key in t for t in trees):
            continue
        values = [t[key] for t in trees]
        out[key] = _aggregate_tree(fn, values) if isinstance(value, dict) else fn(values)
    return out


def summarize_grid(
    runs: list[dict[str, Any]],
    lrs: Sequence[float],
    seeds: Sequence[int],
    aggregate: str,
    main_score: Callable[[dict[str, Any]], float | None],
) -> dict[str, Any]:
    """Per learning rate, the `aggregate` ("mean" or "median") over its seeds of every score (the mean with its
    standard deviation `std`), of the main score (`main_<aggregate>`) and the main scores themselves; the best
    learning rate by the aggregated main score (an undefined one never wins). Returns {"per_lr", "best"}."""
    if aggregate not in AGGREGATES:
        raise TupeError(f"unknown aggregate {aggregate!r} (known: {', '.join(AGGREGATES)})")
    fn = AGGREGATES[aggregate]
    per_lr: dict[str, Any] = {}
    for lr in lrs:
        mine = sorted((r for r in runs if r["lr"] == lr), key=lambda r: r["seed"])
        if not mine:
            continue
        mains = [main_score(r["scores"]) for r in mine]
        entry: dict[str, Any] = {
            "lr": lr,
            "seeds": [r["seed"] for r in mine],
            "n_seeds": len(mine),
            "complete": all(any(r["seed"] == s for r in mine) for s in seeds),
            "main_scores": mains,
            f"main_{aggregate}": fn(mains),
            aggregate: _aggregate_tree(fn, [r["scores"] for r in mine]),
        }
        if aggregate == "mean":
            entry["std"] = _aggregate_tree(_stdev, [r["scores"] for r in mine])
        entry["per_seed"] = {str(r["seed"]): r["scores"] for r in mine}
        per_lr[f"{lr:g}"] = entry
    ranked = [v for v in per_lr.values() if v[f"main_{aggregate}"] is not None]
    best = None
    if ranked:
        b = max(ranked, key=lambda v: v[f"main_{aggregate}"])
        keep = ("lr", "n_seeds", "seeds", f"main_{aggregate}", aggregate, "std")
        best = {k: b[k] for k in keep if k in b}
    return {"per_lr": per_lr, "best": best}


# ------------------------------------------------------------------------------------------------ the records

RESULTS_FORMAT = 1


@dataclass
class RunResult:
    """One finished run, written to `runs/<run>/result.json` with the grid's fingerprint (added by `train_grid`)."""

    lr: float
    seed: int
    scores: dict[str, Any]  # GLUE: {dev split: {metric: value}}; tupe finetune: {metric: value x 100}
    main: float | None
    predictions: dict[str, str]  # evaluation set -> its predictions file in the run's folder
    train_loss: float
    loss_curve: list[tuple[int, float]]
    steps: int
    epochs_trained: float
    trainer: dict[str, Any]  # what the Trainer used (`trainer_used`)
    train_seconds: float
    seconds: float  # training and evaluation


# optional fields of GridResults that a family leaves out of its results.json when it has none
_OPTIONAL = ("command", "main_split", "dev_splits", "scale", "columns", "best_run", "baseline", "per_seed")


@dataclass
class GridResults:
    """A grid's results.json, the same record for every task family, rewritten after every run and read by `tupe
    report` (`from_json`, which also reads the files written before the families shared it)."""

    task: str
    metrics: list[str]
    main_metric: str
    model: dict[str, Any]  # the checkpoint (`ModelInfo`)
    scheme: str
    pretrain_steps: int | None
    best: dict[str, Any] | None  # the best learning rate (`summarize_grid`)
    per_lr: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)  # every finished run, without its loss curve
    complete: bool = False  # whether every (lr, seed) of the grid has finished
    aggregate: str = "median"  # over seeds: "median" (GLUE, the paper's) or "mean"
    label_names: list[str] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    protocol: str = ""
    engine: dict[str, Any] = field(default_factory=dict)
    format: int = RESULTS_FORMAT
    command: str | None = None  # "finetune" for `tupe finetune`'s files; GLUE's have none
    # GLUE's: the split whose main metric picks the learning rate, and every dev split scored
    main_split: str | None = None
    dev_splits: list[str] | None = None
    # tupe finetune's: the scale of its scores, its `tupe report` columns ([column, metric]), the best learning
    # rate's mean of every metric (at the top level of the file) and its seeds' scores, the run whose predictions
    # are OUT/predictions.jsonl, a trivial predictor's scores
    scale: int | None = None
    columns: list[list[str]] | None = None
    headline: dict[str, float] = field(default_factory=dict)
    per_seed: dict[str, Any] | None = None
    best_run: str | None = None
    baseline: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """results.json: the fields by name (`headline`'s metrics at the top level), optional ones only if set."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "headline"}
        order = [
            "format",
            "command",
            "task",
            "metrics",
            "main_metric",
            "main_split",
            "dev_splits",
            "scale",
            "columns",
        ]
        out = {k: d.pop(k) for k in order}
        out.update(self.headline)
        out.update(d)
        return {k: v for k, v in out.items() if not (k in _OPTIONAL and v is None)}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: Path | str) -> GridResults:
        """The record of a results.json (any written by `tupe glue` or `tupe finetune`); one missing what every
        such file has is an error naming it."""
        for key in ("task", "model", "best", "scheme"):
            if key not in data:
                raise TupeError(
                    f"{where}: missing {key!r}; not a `tupe glue` or `tupe finetune` results.json"
                )
        names = {f.name for f in fields(cls)} - {"headline"}
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("metrics", [])
        known.setdefault("main_metric", "")
        known.setdefault("pretrain_steps", None)
        for key in ("per_lr", "data", "settings", "engine"):  # hand-edited to null: read as empty
            known[key] = known.get(key) or {}
        known["runs"] = known.get("runs") or []
        if "aggregate" not in data:  # written before the record named it
            known["aggregate"] = "mean" if data.get("command") == "finetune" else "median"
        headline = {k: v for k, v in data.items() if k not in names and isinstance(v, float | int)}
        return cls(**known, headline=headline)


# -------------------------------------------------------------------------------------------------- one run


def data_collator(family: TaskFamily, tokenizer: Any, padding_free: bool = False) -> Any:
    """The batches of every run of every family: the one place that decides how examples become a batch.
    `padding_free` (where `padding_free_refusal` has no objection): `FlattenedBatches`; else the family's padded
    batches."""
    return FlattenedBatches() if padding_free else family.collator(tokenizer)


@dataclass
class FlattenedBatches:
    """Padding-free batches: the examples of a batch concatenated into one row `input_ids` (1, T) with
    `position_ids` (1, T) restarting at 0 for each example, as `transformers.DataCollatorWithFlattening` writes
    them (its `input_ids` and `position_ids` are these; tests/training/test_padding_free.py checks), so a tupe model
    keeps attention inside each example and computes nothing on padding. Its labels do not fit a classifier:
    it replaces each example's first label with -100 (for a causal LM's shifted labels) and expects a list per
    example. Here a label per example (classification, regression) stays one per example, `labels` (examples,),
    which the sequence-classification head matches with each example's first token; a list per example (NER's
    per-token labels) is concatenated as it is, `labels` (1, T). No attention mask: there is no padding.

    Public (`from tupe import FlattenedBatches`): the Trainer's `data_collator` for padding-free classification
    with `TupeForSequenceClassification`, which pools each example's first token (docs/model.md, "Heads with
    documents", has the example); `tupe glue` and `tupe finetune` use it."""

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch

        if not features:
            raise ValueError("FlattenedBatches: an empty batch")
        ids: list[int] = []
        positions: list[int] = []
        for i, f in enumerate(features):
            row = f["input_ids"]
            row = row.tolist() if hasattr(row, "tolist") else list(row)
            if not row:
                raise ValueError(f"FlattenedBatches: example {i} of the batch has no tokens")
            ids += row
            positions += range(len(row))
        batch: dict[str, Any] = {
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "position_ids": torch.tensor([positions], dtype=torch.long),
        }
        key = "labels" if "labels" in features[0] else "label" if "label" in features[0] else None
        if key is not None:
            values = [f[key] for f in features]
            values = [v.tolist() if hasattr(v, "tolist") else v for v in values]
            if isinstance(values[0], list):  # a label per token
                batch["labels"] = torch.tensor([[x for v in values for x in v]], dtype=torch.long)
            else:  # a label per example: int64 class ids, float32 scores (regression)
                batch["labels"] = torch.tensor(
                    values, dtype=torch.float32 if isinstance(values[0], float) else torch.long
                )
        return batch


def unflattened(tensor: Any, starts: Any, pad: float = -100) -> Any:
    """A token-level output of a flattened row, (1, T, ...), back to one row per example (examples, longest,
    ...), padded with `pad` (what the Trainer pads batches with when it joins them); `starts` (T,) bool marks each
    example's first token. Anything else (a per-example output, a nested tuple of them) is returned as it is."""
    import torch

    if isinstance(tensor, tuple | list):
        return type(tensor)(unflattened(t, starts, pad) for t in tensor)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2 or tensor.shape[:2] != (1, starts.shape[0]):
        return tensor
    bounds = torch.nonzero(starts.to(tensor.device)).flatten().tolist() + [starts.shape[0]]
    pieces = [tensor[0, a:b] for a, b in zip(bounds, bounds[1:])]
    return torch.nn.utils.rnn.pad_sequence(pieces, batch_first=True, padding_value=pad)


def padding_free_refusal(family: TaskFamily, model: Any, examples: Sequence[dict[str, Any]]) -> str | None:
    """Why `family`'s runs on `model` cannot have padding-free batches, or None: the family's head needs padded
    rows (`TaskFamily.flattened`), or the model's attention kernel refuses documents in a row, in training or
    evaluation (tried on a padding-free batch of `examples`, a few training examples, without gradients)."""
    import torch

    if family.flattened is None:
        return family.flattened_refusal or f"the {family.name} head scores each example from its own row"
    if torch.cuda.device_count() > 1 and "LOCAL_RANK" not in os.environ:
        return "several GPUs in one process: the Trainer's DataParallel splits a batch by rows, and a padding-free batch is one row"
    from tupe.modeling.modeling_tupe import resolve_attention_kernel

    batch = FlattenedBatches()([{"input_ids": e["input_ids"]} for e in examples])

    was_training = model.training
    try:
        resolve_attention_kernel(model, training=True, grad=True, documents=True)
        model.eval()
        device = next(model.parameters()).device
        with torch.no_grad():
            model(**{k: v.to(device) for k, v in batch.items()})
    except ValueError as e:
        return str(e).split("\n")[0]
    finally:
        model.train(was_training)
    return None


def _trainer_class() -> Any:
    """transformers' Trainer, whose predictions of a padding-free batch are one row per example again (as those
    of a padded batch are), so the families score them as they score padded ones."""
    from transformers import Trainer

    class FinetuningTrainer(Trainer):
        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):  # type: ignore[override]
            loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            positions = inputs.get("position_ids")
            if positions is not None and positions.shape[0] == 1:
                starts = positions[0] == 0
                logits, labels = unflattened(logits, starts), unflattened(labels, starts)
            return loss, logits, labels

    return FinetuningTrainer


def check_finite_start(model: Any, train_ds: Any, collator: Any, model_dir: str) -> None:
    """Refuse a model whose weights or first-batch loss are not finite (NaN weights, a broken config): training it
    would "succeed" with loss 0.0 and majority-class scores."""
    import torch

    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise TupeError(
                f"{model_dir}: weight {name} is not finite (NaN or inf); refusing to fine-tune this model"
            )
    n = min(8, len(train_ds))
    if n == 0:
        return
    keep = ("input_ids", "attention_mask", "labels", "label")
    batch = collator([{k: v for k, v in train_ds[i].items() if k in keep} for i in range(n)])
    inputs = ("input_ids", "attention_mask", "position_ids", "labels")
    device = next(model.parameters()).device  # on a GPU the model is there already, the batch is not
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = model(**{k: v.to(device) for k, v in batch.items() if k in inputs}).loss
    model.train(was_training)
    if loss is not None and not torch.isfinite(loss):
        raise TupeError(
            f"{model_dir}: the loss on the first training batch is {loss.item()} (not finite): the model's weights "
            "or config are broken; refusing to fine-tune it"
        )


@dataclass
class GridOptions:
    """How a grid runs and what it keeps, the same for every family: the command's machine and output flags."""

    scheme: str | None = None  # the expected position scheme (--scheme)
    tokenizer_dir: str | None = None
    save_models: bool = False
    overwrite: bool = False
    progress: bool = True
    log: Callable[[str], None] = print
    report_to: list[str] = field(default_factory=list)
    push_to_hub: bool = False
    hub_model_id: str | None = None


@dataclass
class Checkpoint:
    """The pre-trained checkpoint of a grid: its folder (converted to bert-a if it was a BERT), what results record
    about it (`ModelInfo`) and its config."""

    path: Path
    info: Any
    config: Any


@dataclass
class GridJob:
    """Everything a run of the grid needs, built once by `run_finetuning`."""

    family: TaskFamily
    settings: GridSettings
    checkpoint: Checkpoint
    out_dir: Path
    options: GridOptions
    tokenizer: Any
    train: Any  # the training dataset
    evals: dict[str, Any]  # the evaluation datasets by name
    padding_free: bool | None = None  # decided by the first run (`padding_free_refusal`), the same for all


def _padding_free(job: GridJob, model: Any) -> bool:
    """Whether the grid's runs have padding-free batches (the default): where `padding_free_refusal` finds no
    reason against, tried on the first run's model; else the batches are padded and the log says why, once."""
    n = min(4, len(job.train))
    if n == 0:
        return False
    why = padding_free_refusal(job.family, model, [job.train[i] for i in range(n)])
    if why:
        job.options.log(f"padded batches (not padding-free): {why}")
    return why is None


def train_run(job: GridJob, lr: float, seed: int, run_dir: Path, callbacks: list[Any]) -> dict[str, Any]:
    """One (lr, seed) run: a fresh head on the checkpoint (initialised from the seed), trained, scored on every
    evaluation set (predictions written in `run_dir`), its model kept with --save-models. Returns its `RunResult`
    as a dict."""
    family, settings, opts = job.family, job.settings, job.options
    model = load_head(
        family.model_class(), str(job.checkpoint.path), seed, settings.dropout, **family.model_kwargs()
    )
    for key, value in family.config_extras().items():
        setattr(model.config, key, value)
    early_stopping = getattr(settings, "early_stopping", None)
    args = finetune_training_arguments(
        settings,
        lr,
        seed,
        run_dir / "trainer",
        len(job.train),
        opts.report_to,
        push_to_hub=opts.push_to_hub,
        hub_model_id=hub_run_id(opts.hub_model_id, job.out_dir, lr, seed) if opts.push_to_hub else None,
        early_stopping=early_stopping,
    )
    if job.padding_free is None:
        job.padding_free = not settings.padding and _padding_free(job, model)
    collator = data_collator(family, job.tokenizer, job.padding_free)
    trainer = make_trainer(
        model,
        args,
        job.train,
        collator,
        job.tokenizer,
        callbacks,
        # --eval-steps, --early-stopping: the validation loss on the first evaluation set
        eval_ds=next(iter(job.evals.values())),
        early_stopping=early_stopping,
        logging_dir=job.out_dir / "tensorboard" / run_name(lr, seed),
        stopped_message=lambda: (
            f"run lr={lr:g} seed={seed} stopped; the finished runs (their result.json) are kept: free "
            "space and rerun the same command"
        ),
    )
    check_finite_start(model, job.train, collator, str(job.checkpoint.path))
    t0 = time.time()
    out = trainer.train()
    train_seconds = time.time() - t0
    scores, predictions = family.evaluate(trainer, job.evals, run_dir)
    trainer.log(eval_logs(scores))  # to every --report-to integration (TensorBoard: eval/f1, ...)
    redo = (
        f"run lr={lr:g} seed={seed} has no result.json and is redone next time; the finished runs are kept: "
        "free space and rerun the same command"
    )
    used = finish_run(trainer, run_dir, opts.save_models, redo)
    used["batches"] = "padding-free" if job.padding_free else "padded"
    if opts.save_models:
        family.write_run_card(run_dir / "model", job.checkpoint.info, lr, seed, scores, trainer=used)
    return asdict(
        RunResult(
            lr=lr,
            seed=seed,
            scores=scores,
            main=family.main_score(scores),
            predictions=predictions,
            train_loss=float(out.training_loss),
            loss_curve=loss_curve(trainer),
            steps=int(trainer.state.global_step),
            epochs_trained=float(trainer.state.epoch or 0.0),
            trainer=used,
            train_seconds=round(train_seconds, 2),
            seconds=round(time.time() - t0, 2),
        )
    )


# --------------------------------------------------------------------------------------------- the pipeline


def open_checkpoint(
    model_dir: Path, out_dir: Path, outputs: OutputFolder, written: Sequence[str], options: GridOptions
) -> Checkpoint:
    """Claim what the grid writes at the top of `out_dir` (results.json, runs, what the family writes beside them:
    `written`, TensorBoard's folder; anything there the command did not write stops it here), convert a `transformers` BERT folder to bert-a there, and read the checkpoint."""
    from tupe.io.checkpoints import inspect_checkpoint

    tensorboard = ["tensorboard"] if "tensorboard" in options.report_to else []
    outputs.claim("results.json", *written, "runs", *tensorboard)
    model_dir = converted_if_bert(Path(model_dir), out_dir, options.tokenizer_dir, options.log, outputs)
    info, config = inspect_checkpoint(model_dir, options.scheme)
    return Checkpoint(model_dir, info, config)


def run_finetuning(
    family: TaskFamily,
    settings: GridSettings,
    checkpoint: Checkpoint,
    out_dir: Path,
    outputs: OutputFolder,
    options: GridOptions,
) -> GridResults:
    """The grid of `family` in `out_dir` (under the caller's lock, `settings` resolved): encode, plan (the runs
    finished there are kept), run what is left, and rewrite results.json after every run. Returns the results."""
    from tupe.io.checkpoints import load_tokenizer

    log = options.log
    tokenizer = load_tokenizer(
        options.tokenizer_dir or checkpoint.path,
        checkpoint.config,
        explicit=options.tokenizer_dir is not None,
    )
    train, evals = family.encode(tokenizer)
    info = checkpoint.info
    grid = plan_grid(
        out_dir,
        settings,
        len(train),
        info.weights_sha256,
        family.data_fingerprint(),
        options.overwrite,
        outputs,
    )
    log(family.introduce(checkpoint.path, info, len(train)))
    log(grid.describe(settings, len(train)))
    job = GridJob(family, settings, checkpoint, out_dir, options, tokenizer, train, evals)
    state: dict[str, GridResults] = {}

    def on_update(runs: list[dict]) -> None:
        results = grid_results(job, grid, runs)
        atomic_write_json(out_dir / "results.json", results.to_json(), indent=2, clean=True)
        family.publish(out_dir, results, info)
        state["results"] = results

    train_grid(
        grid,
        lambda lr, seed, run_dir, callbacks: train_run(job, lr, seed, run_dir, callbacks),
        on_update,
        f"{family.name} grid",
        options.progress,
        log,
        lambda r: family.describe_run(r["scores"]),
    )
    results = state["results"]
    if results.best is not None:
        log(family.best_line(results, out_dir))
    return results


def grid_results(job: GridJob, grid: Grid, runs: list[dict]) -> GridResults:
    """The results record of the runs finished so far."""
    family, info, settings = job.family, job.checkpoint.info, job.settings
    summary = summarize_grid(runs, settings.lrs or [], settings.seeds, family.aggregate, family.main_score)

    def listed(r: dict) -> dict:  # a run in results.json: its prediction files relative to --out
        out = {k: v for k, v in r.items() if k not in ("fingerprint", "loss_curve")}
        if "predictions" in r:
            out["predictions"] = {
                s: f"runs/{run_name(r['lr'], r['seed'])}/{p}" for s, p in r["predictions"].items()
            }
        return out

    return GridResults(
        task=family.name,
        metrics=list(family.metrics),
        main_metric=family.main_metric,
        model=asdict(info),
        scheme=info.scheme,
        pretrain_steps=info.pretrain_steps,
        best=summary["best"],
        per_lr=summary["per_lr"],
        runs=sorted((listed(r) for r in runs), key=lambda r: (r["lr"], r["seed"])),
        complete=all(g in {(r["lr"], r["seed"]) for r in runs} for g in grid.runs),
        aggregate=family.aggregate,
        label_names=family.label_names(),
        data={**family.data_summary(), "sha256": grid.fingerprint["data_sha256"]},
        settings=asdict(settings),
        protocol=family.protocol(),
        engine={"trainer": "transformers.Trainer", **_versions()},
        **family.results_fields(summary, runs),
    )


def _versions() -> dict[str, str]:
    import torch
    import transformers

    from tupe.runtime import tupe_version

    return {"tupe": tupe_version(), "transformers": transformers.__version__, "torch": torch.__version__}


def converted_if_bert(
    model_dir: Path,
    out_dir: Path,
    tokenizer_dir: str | None,
    log: Callable[[str], None],
    outputs: OutputFolder,
) -> Path:
    """A `transformers` BERT folder (BertForMaskedLM / BertModel) converted to `bert-a` in OUT/converted-bert-a
    (once; with its tokenizer), with a one-line notice; any other folder is returned as is."""
    from tupe.io.checkpoints import load_model, load_tokenizer
    from tupe.io.reading import CONFIG_LIMIT, read_json

    config_file = model_dir / "config.json"
    try:
        model_type = read_json(config_file, "model config", CONFIG_LIMIT).get("model_type")
    except TupeError:
        return model_dir  # inspect_checkpoint gives the one-line error
    if model_type != "bert":
        return model_dir
    outputs.claim("converted-bert-a", ".tmp-converted-bert-a")
    target = out_dir / "converted-bert-a"
    log(f"note: {model_dir} is a transformers BERT checkpoint; converted exactly to bert-a in {target}")
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    # the special-token ids are the tokenizer's (Google's vocabulary: [CLS] 101, ...), checked against it
    explicit = tokenizer_dir is not None
    tokenizer = load_tokenizer(tokenizer_dir if explicit else model_dir, explicit=explicit)
    model, _ = load_model(model_dir, tokenizer=tokenizer)
    tokenizer = load_tokenizer(tokenizer_dir if explicit else model_dir, model.config, explicit=explicit)
    staging = out_dir / ".tmp-converted-bert-a"
    outputs.remove(staging.name)
    try:
        model.save_pretrained(str(staging))
        if not explicit:
            tokenizer.save_pretrained(str(staging))
    except BaseException:
        outputs.remove(staging.name)  # a failed or interrupted conversion leaves no half-written copy
        raise
    outputs.remove(target.name)
    staging.rename(target)
    return target


@contextlib.contextmanager
def grid_folder(out_dir: Path, command: str) -> Iterator[None]:
    """`out_dir` under `command`'s lock (`folder_lock`). A refusal (`TupeError`) raised before any run of the grid
    has finished leaves the folder as the command found it: what it made there this time (the new top-level
    entries it owns, such as a half-made `.tmp-converted-bert-a`, its names added to `tupe_files.json`, that record
    itself if it made it) is removed, nothing else is touched, and a folder it created is removed once empty."""
    from tupe.io.files import folder_lock

    existed = out_dir.exists()
    try:
        with folder_lock(out_dir, command):
            before = {p.name for p in out_dir.iterdir()}
            try:
                yield
            except TupeError:
                if not any(out_dir.glob("runs/*/result.json")):
                    _forget_what_was_made(out_dir, command, before)
                raise
    except TupeError:
        if not existed:
            with contextlib.suppress(OSError):
                out_dir.rmdir()  # only if empty: the lock's own files go with the lock
        raise


def _forget_what_was_made(out_dir: Path, command: str, before: set[str]) -> None:
    """Remove the top-level entries of `out_dir` that `command` made since `before` (the names there then) and
    its new names in the folder's record of tupe's files (the record too, if it was not there before)."""
    from tupe.io.outputs import RECORD_NAME, OutputFolder, read_record, update_record

    outputs = OutputFolder(out_dir, command)
    for entry in sorted(out_dir.iterdir()):
        if entry.name not in before and outputs.owns(entry.name):
            outputs.remove(entry.name)
    if RECORD_NAME not in before:
        (out_dir / RECORD_NAME).unlink(missing_ok=True)
        return
    gone = [n for n, who in (read_record(out_dir) or {}).items() if who == command]
    gone = [n for n in gone if n not in before and not os.path.lexists(out_dir / n)]
    if gone:
        update_record(out_dir, drop=gone)


class _Stopped(KeyboardInterrupt):
    """SIGTERM turned into an interruption, so the grid stops the way Ctrl-C stops it."""


@contextlib.contextmanager
def stop_on_sigterm(out: str | Path, command: str) -> Iterator[None]:
    """SIGTERM (a scheduler's pre-emption) and Ctrl-C: say what was kept and how to continue, then exit 143 / 130."""
    import signal
    import threading

    def on_term(signum, frame):  # noqa: ANN001, ARG001
        raise _Stopped()

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        yield
    except KeyboardInterrupt as err:
        what = "SIGTERM" if isinstance(err, _Stopped) else "Ctrl-C"
        print(
            f"{command}: stopped by {what}; the finished runs are kept in {Path(out) / 'runs'} (results.json "
            "lists them) and the run in progress is discarded: run the same command again to continue",
            file=sys.stderr,
            flush=True,
        )
        if isinstance(err, _Stopped):
            raise SystemExit(143) from None
        raise  # the command line says "interrupted" and exits 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
