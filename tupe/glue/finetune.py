"""Fine-tune a pre-trained `tupe` checkpoint on one GLUE task with the paper's protocol (Ke et al., ICLR 2021, Sec. 4.1 and Table 2; see docs/glue.md).

Grid: learning rates {2e-5, 3e-5, 4e-5, 5e-5} x 5 seeds, batch 32, 10 epochs (5 for MNLI, QQP, QNLI), linear
warm-up over 6% of the steps then linear decay, Adam (0.9, 0.999), eps 1e-6, weight decay 0.01, clip 1.0. A
learning rate's score is the median of its seeds' dev scores, and the best learning rate is reported. Training
runs on the `transformers` Trainer, like pre-training.

Each finished run writes `runs/lr<LR>_seed<S>/result.json` (atomically, last) and its dev predictions; an
interrupted grid started again with the same command skips the runs that finished. `results.json` is rewritten
after every run with all scores, the median per learning rate and the best one.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tupe import validators as V
from tupe.errors import TupeError
from tupe.glue.encoding import _load_data, _subsample, data_fingerprint, encode_split, to_dataset
from tupe.glue.protocol import (  # noqa: F401  (re-exported: other modules import them from here)
    _RUN_SUMMARY_KEYS,
    PAPER_LRS,
    PAPER_SEEDS,
    RESULTS_FORMAT,
    SMALL_MODEL_EPOCHS,
    SMALL_MODEL_LRS,
    SMALL_MODEL_WIDTH,
    GlueSettings,
    is_small_model,
    lr_key,
    run_name,
    summarize,
)
from tupe.glue.tasks import TASKS, Split, get_task
from tupe.glue.trainer import read_predictions, train_one  # noqa: F401  (train_one: tests wrap it here)
from tupe.io.checkpoints import inspect_checkpoint, load_tokenizer
from tupe.io.files import atomic_write_json, folder_lock
from tupe.io.outputs import OutputFolder
from tupe.io.reading import CONFIG_LIMIT, RESULTS_LIMIT, read_json, read_text
from tupe.runtime import console_log, hushed_libraries
from tupe.training.finetuning import add_grid_arguments, add_run_arguments, grid_settings, plan_grid
from tupe.training.finetuning import run_grid as run_grid_loop
from tupe.training.reporting import add_hub_arguments, parse_report_to


@dataclass
class GridResult:
    out_dir: Path
    results: dict[str, Any]


def run_grid(model_dir: str | Path, settings: GlueSettings, out_dir: str | Path, **kwargs: Any) -> GridResult:
    """Fine-tune every (lr, seed) of the grid that has not finished yet in `out_dir`, then summarise.

    Keyword arguments: data_dir, train_file, dev_files, scheme, tokenizer_dir, save_models, overwrite, log,
    report_to, progress, push_to_hub, hub_model_id.
    """
    with folder_lock(out_dir, "tupe glue"):
        return _run_grid(model_dir, settings, out_dir, **kwargs)


def _run_grid(
    model_dir: str | Path,
    settings: GlueSettings,
    out_dir: str | Path,
    data_dir: str | None = None,
    train_file: str | None = None,
    dev_files: Sequence[str] | None = None,
    scheme: str | None = None,
    tokenizer_dir: str | None = None,
    save_models: bool = False,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
    report_to: list[str] | None = None,
    progress: bool = True,
    push_to_hub: bool = False,
    hub_model_id: str | None = None,
) -> GridResult:

    task = get_task(settings.task)
    model_dir = Path(model_dir)
    out_dir = Path(out_dir)
    if push_to_hub and not save_models:
        raise TupeError("--push-to-hub pushes the fine-tuned models, which only --save-models keeps: add it")
    # what this grid writes at the top of --out; anything there that tupe glue did not write stops it here
    outputs = glue_outputs(out_dir)
    outputs.claim(
        "results.json", "README.md", "runs", *(["tensorboard"] if "tensorboard" in (report_to or []) else [])
    )
    model_dir = converted_if_bert(model_dir, out_dir, tokenizer_dir, log, outputs)
    info, config = inspect_checkpoint(model_dir, scheme)
    lrs_default, epochs_default = settings.lrs is None, settings.epochs is None
    settings = settings.resolved(task, config.max_position_embeddings, config.hidden_size)
    if is_small_model(config.hidden_size) and (lrs_default or epochs_default):
        log(
            f"small model (width {config.hidden_size} < {SMALL_MODEL_WIDTH}): the small-model defaults"
            + (f", learning rates {','.join(f'{x:g}' for x in settings.lrs)}" if lrs_default else "")
            + (f", {settings.epochs:g} epochs" if epochs_default else "")
            + " (the paper's 2e-5..5e-5 leave such a model at the majority class; --lrs/--epochs to change)"
        )
    if not settings.lrs or not settings.seeds:
        raise TupeError("the grid is empty: give at least one learning rate and one seed")
    tokenizer = load_tokenizer(tokenizer_dir or model_dir, config, explicit=tokenizer_dir is not None)

    data = _load_data(task, data_dir, train_file, dev_files)
    data.train = _subsample(data.train, settings.max_train_samples)
    data.dev = {k: _subsample(v, settings.max_eval_samples) for k, v in data.dev.items()}
    # Resume: reuse finished runs made with the same model, data and settings.
    n_train = len(data.train)
    grid = plan_grid(
        out_dir, settings, n_train, info.weights_sha256, data_fingerprint(data), overwrite, outputs
    )
    log(
        f"{task.name}: {n_train} train / "
        + ", ".join(f"{len(v)} {k}" for k, v in data.dev.items())
        + f" examples from {data.source}; model {model_dir} (scheme {info.scheme}, "
        f"pre-training steps {info.pretrain_steps if info.pretrain_steps is not None else 'unknown'})"
    )
    log(grid.describe(settings, n_train))

    train_enc = encode_split(tokenizer, data.train, settings.max_seq_len, task.is_regression)
    train_ds = to_dataset(train_enc, task.is_regression)
    dev: dict[str, tuple[Split, Any]] = {}
    dev_at_max = {}
    for name, split in data.dev.items():
        enc = encode_split(tokenizer, split, settings.max_seq_len, task.is_regression)
        dev[name] = (split, to_dataset(enc, task.is_regression))
        dev_at_max[name] = enc.at_max_length

    from tupe.runtime import tupe_version

    def write_summary(runs: list[dict]) -> dict:
        summary = summarize(task, runs, settings.lrs, settings.seeds)
        results = {
            "format": RESULTS_FORMAT,
            "task": task.name,
            "metrics": list(task.metrics),
            "main_metric": task.main_metric,
            "main_split": next(iter(task.hf_dev_splits)),
            "dev_splits": list(data.dev),
            "label_names": list(task.label_names),
            "model": asdict(info),
            "scheme": info.scheme,
            "pretrain_steps": info.pretrain_steps,
            "data": {
                "source": data.source,
                "train_examples": n_train,
                "dev_examples": {k: len(v) for k, v in data.dev.items()},
                "train_at_max_length": train_enc.at_max_length,
                "dev_at_max_length": dev_at_max,
                # what always predicting the most frequent dev label scores (accuracy), to read small models by
                "dev_majority_accuracy": {
                    k: None if task.is_regression else max(np.bincount(v.labels)) / len(v)
                    for k, v in data.dev.items()
                },
                "sha256": grid.fingerprint["data_sha256"],
            },
            "settings": asdict(settings),
            "protocol": "median over seeds per learning rate; best learning rate by the median main metric "
            "(TUPE paper, Table 2); scores are the dev scores after the last epoch",
            "engine": {"trainer": "transformers.Trainer", "tupe": tupe_version(), **_versions()},
            "complete": all(g in {(r["lr"], r["seed"]) for r in runs} for g in grid.runs),
            "runs": sorted(
                (
                    {k: r.get(k) for k in _RUN_SUMMARY_KEYS}
                    | {
                        "predictions": {
                            s: f"runs/{run_name(r['lr'], r['seed'])}/{p}" for s, p in r["predictions"].items()
                        }
                    }
                    for r in runs
                ),
                key=lambda r: (r["lr"], r["seed"]),
            ),
            **summary,
        }
        atomic_write_json(out_dir / "results.json", results, indent=2, clean=True)
        return results

    state: dict[str, Any] = {}

    def on_update(runs: list[dict]) -> None:
        state["results"] = write_summary(runs)
        if runs and save_models:
            r = runs[-1]
            _write_glue_card(
                out_dir / "runs" / run_name(r["lr"], r["seed"]) / "model",
                task,
                settings,
                state["results"],
                data.source,
                info,
                lr=r["lr"],
                seed=r["seed"],
            )
        if runs:
            _write_glue_card(out_dir, task, settings, state["results"], data.source, info)

    def run_one(lr: float, seed: int, run_dir: Path, callbacks: list[Any]) -> dict:
        return train_one(
            str(model_dir),
            task,
            settings,
            lr,
            seed,
            train_ds,
            dev,
            tokenizer,
            run_dir,
            callbacks,
            save_model=save_models,
            report_to=report_to,
            logging_dir=out_dir / "tensorboard" / run_name(lr, seed),
            push_to_hub=push_to_hub,
            hub_model_id=hub_run_id(hub_model_id, out_dir, lr, seed) if push_to_hub else None,
        )

    def describe(r: dict) -> str:
        return ", ".join(
            f"{split}/{m}={v:.4f}" if v is not None else f"{split}/{m}=nan"
            for split, ms in r["scores"].items()
            for m, v in ms.items()
        )

    run_grid_loop(grid, run_one, on_update, f"{task.name} grid", progress, log, describe)
    results = state["results"]
    _write_glue_card(out_dir, task, settings, results, data.source, info)
    best = results["best"]
    if best is not None:
        log(
            f"best lr {best['lr']:g}: median {task.main_metric} {best['main_median']:.4f} "
            f"over {best['n_seeds']} seeds -> {out_dir / 'results.json'}"
        )
    return GridResult(out_dir, results)


_GLUE_NAMES = {
    "results.json",
    "runs",
    "README.md",
    "tensorboard",
    "converted-bert-a",
    ".tmp-converted-bert-a",
}


def glue_outputs(out_dir: str | Path) -> OutputFolder:
    """The output policy of a `tupe glue` folder (tupe/io/outputs.py); a folder written before tupe kept a record
    is taken for a GLUE folder only if its results.json is one, and then only tupe glue's names are adopted."""
    return OutputFolder(out_dir, "tupe glue", legacy=_is_legacy_glue_output)


def _is_legacy_glue_output(path: Path) -> bool:
    if path.name not in _GLUE_NAMES:
        return False
    try:
        results = read_json(path.parent / "results.json", "GLUE results", RESULTS_LIMIT)
    except TupeError:
        return False
    if not {"format", "task", "runs", "settings"} <= set(results):
        return False
    if path.name == "README.md":  # tupe's model card, not a user's README
        try:
            card = read_text(path, CONFIG_LIMIT, "model card")
        except TupeError:
            return False
        return card.startswith("---\nlibrary_name: transformers") and "\n- tupe\n" in card
    return True


def hub_run_id(hub_model_id: str | None, out_dir: Path, lr: float, seed: int) -> str:
    """The Hub repository of one run's model: `--hub-model-id` (default: the --out folder's name) with the run's
    name appended, so the grid's runs do not overwrite one another: `me/tupe-a-rte-lr2e-05_seed1`."""
    base = hub_model_id or Path(out_dir).resolve().name
    return f"{base}-{run_name(lr, seed)}"


def converted_if_bert(
    model_dir: Path,
    out_dir: Path,
    tokenizer_dir: str | None,
    log: Callable,
    outputs: OutputFolder | None = None,
) -> Path:
    """A `transformers` BERT folder (BertForMaskedLM / BertModel) converted to `bert-a` in OUT/converted-bert-a
    (once; with its tokenizer), with a one-line notice; any other folder is returned as is."""
    from tupe.io.checkpoints import load_model

    config_file = model_dir / "config.json"
    try:
        model_type = read_json(config_file, "model config", CONFIG_LIMIT).get("model_type")
    except TupeError:
        return model_dir  # inspect_checkpoint gives the one-line error
    if model_type != "bert":
        return model_dir
    outputs = outputs or glue_outputs(out_dir)
    outputs.claim("converted-bert-a", ".tmp-converted-bert-a")
    target = out_dir / "converted-bert-a"
    log(f"note: {model_dir} is a transformers BERT checkpoint; converted exactly to bert-a in {target}")
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    model, _ = load_model(model_dir)
    staging = out_dir / ".tmp-converted-bert-a"
    outputs.remove(staging.name)
    model.save_pretrained(str(staging))
    if tokenizer_dir is None:
        load_tokenizer(model_dir, model.config, explicit=False).save_pretrained(str(staging))
    outputs.remove(target.name)
    staging.rename(target)
    return target


def _write_glue_card(
    folder: Path,
    task: Any,
    settings: GlueSettings,
    results: dict,
    source: str,
    info: Any,
    lr: float | None = None,
    seed: int | None = None,
) -> None:
    """README.md of a GLUE result folder (or of one run's saved model): scheme, recipe, data, dev scores."""
    from tupe.io.model_card import write_model_card

    if not folder.is_dir():
        return
    recipe = {
        "task": task.name,
        "pre-trained model": f"{info.path} ({info.pretrain_steps or 'unknown'} pre-training steps)",
        "learning rates": ", ".join(f"{x:g}" for x in settings.lrs) if lr is None else f"{lr:g}",
        "seeds": ", ".join(map(str, settings.seeds)) if seed is None else str(seed),
        "epochs": settings.epochs,
        "batch size": settings.batch_size,
        "max sequence length": settings.max_seq_len,
        "warm-up": f"{settings.warmup_steps} steps"
        if settings.warmup_steps is not None
        else f"{settings.warmup_ratio:g} of the steps",
        "weight decay": settings.weight_decay,
        "Adam betas": f"{settings.adam_beta1}, {settings.adam_beta2}",
        "Adam epsilon": settings.adam_epsilon,
        "dropout": settings.dropout,
        "protocol": "median over seeds per learning rate, best learning rate reported (the TUPE paper's)",
    }
    d = results["data"]
    data = (
        f"GLUE {task.name} from {source}: {d['train_examples']:,} training examples; dev: "
        + ", ".join(f"{n:,} ({k})" for k, n in d["dev_examples"].items())
        + (" (a subset: not comparable with published numbers)" if settings.max_eval_samples else "")
        + "."
    )
    metrics: dict[str, Any] = {}
    if seed is not None:
        run = next((r for r in results["runs"] if r["lr"] == lr and r["seed"] == seed), None)
        for split, ms in (run or {}).get("scores", {}).items():
            metrics.update({f"{split} {m}": v for m, v in ms.items()})
    elif results.get("best"):
        best = results["best"]
        metrics["best learning rate"] = f"{best['lr']:g} ({best['n_seeds']} seeds)"
        for split, ms in best["median"].items():
            metrics.update({f"{split} {m} (median)": v for m, v in ms.items()})
    metrics["runs finished"] = (
        f"{len(results['runs'])}{'' if results['complete'] else ' (grid not complete)'}"
    )
    write_model_card(
        folder,
        kind="text-classification",
        scheme=info.scheme,
        recipe=recipe,
        data=data,
        metrics=metrics,
        notes="" if seed is not None else "The fine-tuned models are in `runs/*/model` with `--save-models`.",
    )


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


# --------------------------------------------------------------------------------------------------------- CLI


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="pre-trained tupe checkpoint directory (save_pretrained); a transformers BERT folder is converted",
    )
    p.add_argument("--task", required=True, help=f"GLUE task: {', '.join(TASKS)}")
    p.add_argument(
        "--data-dir",
        help="GLUE root (TASK/train.tsv, TASK/dev.tsv), a task directory, the `datasets` GLUE files "
        "(TASK/train-*.parquet, validation-*.parquet, or .json/.jsonl), a `datasets` copy saved with "
        "save_to_disk, or hub[:REPO] to load nyu-mll/glue from the hub",
    )
    p.add_argument(
        "--train-file",
        help="instead of --data-dir: a train file (task's TSV layout, `datasets` GLUE .parquet, or .json/.jsonl)",
    )
    p.add_argument(
        "--dev-file",
        action="append",
        help="with --train-file: a dev file (same formats); MNLI: give it twice, matched then mismatched",
    )
    p.add_argument(
        "--out", required=True, type=V.nonempty_path, help="output directory (results.json, runs/)"
    )
    add_grid_arguments(
        p,
        lrs_help="learning rates (default: the paper's 2e-5,3e-5,4e-5,5e-5; for a model narrower than "
        f"{SMALL_MODEL_WIDTH}, {','.join(f'{x:g}' for x in SMALL_MODEL_LRS)})",
        seeds_default=PAPER_SEEDS,
        epochs_default=None,
        epochs_help=f"epochs (default: the paper's 10, or 5 for MNLI/QQP/QNLI; {SMALL_MODEL_EPOCHS:g} for a model "
        f"narrower than {SMALL_MODEL_WIDTH})",
        max_seq_len_help="max tokens per example (default min(512, model's max))",
    )
    add_run_arguments(p)  # with --report-to and the step flags (add_step_arguments)
    add_hub_arguments(
        p,
        push_help="push every run's fine-tuned model (needs --save-models and a login; the Trainer's push_to_hub)",
        id_help="Hub repository prefix for --push-to-hub; each run adds its name, e.g. "
        "me/tupe-a-rte-lr2e-05_seed1 (default prefix: the --out folder's name)",
    )
    V.annotate_ranges(p)


def settings_from_args(args: argparse.Namespace) -> GlueSettings:
    """The run settings of `tupe glue`'s options (the shared flag vocabulary, tupe/training/flags.py)."""
    return GlueSettings(task=get_task(args.task).name, **grid_settings(args))


def run(args: argparse.Namespace) -> int:
    V.check_out_folder("--out", args.out)
    for flag, value in (("--data-dir", args.data_dir), ("--train-file", args.train_file)):
        if value is not None and not str(value).startswith("hub"):
            V.check_path_kind(flag, value, "any" if flag == "--data-dir" else "file")
    for value in args.dev_file or []:
        V.check_path_kind("--dev-file", value, "file")
    if args.tokenizer is not None:
        V.check_path_kind("--tokenizer", args.tokenizer, "folder")
    for name in ("batch_size", "eval_batch_size"):
        if getattr(args, name) <= 0:
            raise TupeError(f"--{name.replace('_', '-')} must be positive")
    if args.epochs is not None and args.epochs <= 0:
        raise TupeError("--epochs must be positive")
    if not (args.dropout < 0 or 0 <= args.dropout < 1):
        raise TupeError(f"--dropout must be in [0, 1) (or -1 for the checkpoint's), got {args.dropout}")
    if args.lrs is not None and any(lr <= 0 for lr in args.lrs):
        raise TupeError(f"learning rates must be positive, got {args.lrs}")
    settings = settings_from_args(args)
    V.apply_threads(args.threads)
    quiet = args.quiet
    log = console_log(quiet)

    with stop_on_sigterm(args.out, "tupe glue"), hushed_libraries(args.progress, quiet):
        _run_cli_grid(args, settings, log)
    return 0


def _run_cli_grid(args: argparse.Namespace, settings: GlueSettings, log: Callable[[str], None]) -> None:
    run_grid(
        args.model,
        settings,
        args.out,
        data_dir=args.data_dir,
        train_file=args.train_file,
        dev_files=args.dev_file,
        scheme=args.scheme,
        tokenizer_dir=args.tokenizer,
        save_models=args.save_models,
        overwrite=args.overwrite,
        log=log,
        report_to=parse_report_to(args.report_to),
        progress=args.progress and not args.quiet,
        push_to_hub=args.push_to_hub,
        hub_model_id=args.hub_model_id,
    )


class _Stopped(KeyboardInterrupt):
    """SIGTERM turned into an interruption, so the grid stops the way Ctrl-C stops it."""


@contextlib.contextmanager
def stop_on_sigterm(out: str, command: str) -> Iterator[None]:
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
