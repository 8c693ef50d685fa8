"""Fine-tuning machinery shared by `tupe glue` and `tupe finetune`: one run (a fresh task head on a pre-trained
checkpoint, trained by the `transformers` Trainer) and the learning-rate x seed grid around it.

A grid lives in one folder: each finished run writes `runs/lr<LR>_seed<S>/result.json` atomically and last, with
the fingerprint of everything that determines its score (settings, model weights, data), so the same command
started again skips the runs that finished and refuses a folder made with other settings. What a run trains (its
head, data and metrics) is the caller's: GLUE's sentence classification, or a `tupe finetune` task family.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tupe.errors import TupeError
from tupe.io.files import atomic_write_json

if TYPE_CHECKING:
    from tupe.io.outputs import OutputFolder

_S = TypeVar("_S", bound="GridSettings")
# settings that decide how a run computes, not what it learns: a finished run is reused whatever they were
# (--grad-accum splits the same global --batch-size into smaller forward passes: how, not what)
_MACHINE_SETTINGS = (
    "lrs", "seeds", "eval_batch_size", "gradient_checkpointing", "torch_compile", "grad_accum", "logging_steps",
    "eval_steps",
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
    names += ("grad_accum", "max_steps", "logging_steps", "eval_steps")
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


def training_arguments(
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
    from transformers import EarlyStoppingCallback, PrinterCallback, Trainer

    from tupe.training.reporting import align_special_tokens, point_tensorboard

    align_special_tokens(model, tokenizer)
    if early_stopping:
        callbacks = [*callbacks, EarlyStoppingCallback(early_stopping_patience=early_stopping)]
    trainer = Trainer(
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
        """The line a command prints before it starts: the grid's size, what is done, each run's length."""
        batches = math.ceil(n_train / settings.batch_size)
        return (
            f"grid: {len(settings.lrs or [])} lr x {len(settings.seeds)} seeds = {len(self.runs)} runs, "
            f"{sum(g in self.done for g in self.runs)} already done; {settings.epochs:g} epochs x {batches} steps "
            f"(batch {settings.batch_size}, max length {settings.max_seq_len})"
        )


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
    steps = int(math.ceil(math.ceil(n_train / settings.batch_size) * float(settings.epochs or 0)))
    return Grid(out_dir, runs, done, fingerprint, steps, outputs)


def run_grid(
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
