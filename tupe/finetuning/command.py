"""Fine-tune a pre-trained checkpoint on your own files: named entities (CoNLL), extractive question answering
(SQuAD), multiple choice (SWAG) or sentence classification, over a learning-rate x seed grid (docs/finetuning.md).

The grid, its resume and its Trainer runs are the machinery `tupe glue` uses (tupe/training/finetuning.py); a task
family (ner.py, qa.py, choice.py, classification.py) brings its reader, encoding, head and metric. Everything the
files or flags get wrong is refused in one line before anything is written. `OUT/results.json` holds the best
learning rate's mean over seeds of every metric (x 100) at the top level, each seed's below, and every run;
`OUT/predictions.jsonl` the validation predictions of the best run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.finetuning.arguments import FinetuneSettings, add_arguments, settings_from  # noqa: F401 (cli)
from tupe.finetuning.family import Family

RESULTS_FORMAT = 1


def family_for(settings: FinetuneSettings) -> Family:
    from tupe.finetuning.choice import ChoiceFamily
    from tupe.finetuning.classification import ClassificationFamily
    from tupe.finetuning.ner import NerFamily
    from tupe.finetuning.qa import QaFamily

    table = {f.name: f for f in (NerFamily, QaFamily, ChoiceFamily, ClassificationFamily)}
    return table[settings.task](settings)


def _subset(examples: list[Any], n: int | None) -> list[Any]:
    """A fixed random subset (seed 0, the same for every run), kept in file order."""
    if n is None or n >= len(examples):
        return examples
    import numpy as np

    rows = sorted(np.random.default_rng(0).choice(len(examples), size=n, replace=False).tolist())
    return [examples[i] for i in rows]


def summarize(family: Family, runs: list[dict], lrs: list[float], seeds: list[int]) -> dict[str, Any]:
    """Per learning rate the mean (and standard deviation) over its seeds of every metric; the best learning
    rate by the mean main metric, its means at the top level and its seeds' scores."""
    per_lr: dict[str, Any] = {}
    for lr in lrs:
        mine = sorted((r for r in runs if r["lr"] == lr), key=lambda r: r["seed"])
        if not mine:
            continue
        names = list(mine[0]["scores"])
        per_lr[f"{lr:g}"] = {
            "lr": lr,
            "seeds": [r["seed"] for r in mine],
            "n_seeds": len(mine),
            "complete": all(any(r["seed"] == s for r in mine) for s in seeds),
            "mean": {m: statistics.fmean(r["scores"][m] for r in mine) for m in names},
            "std": {
                m: statistics.stdev(r["scores"][m] for r in mine) if len(mine) > 1 else None for m in names
            },
            "per_seed": {str(r["seed"]): r["scores"] for r in mine},
        }
    if not per_lr:
        return {"per_lr": per_lr, "best": None}
    best = max(per_lr.values(), key=lambda v: v["mean"][family.main_metric])
    return {  # the family's metrics first, then any others its scores have (SQuAD v2.0's HasAns_*, NoAns_*)
        **{m: best["mean"][m] for m in family.metrics},
        **best["mean"],
        "best": {k: best[k] for k in ("lr", "n_seeds", "seeds", "mean", "std")},
        "per_seed": best["per_seed"],
        "per_lr": per_lr,
    }


def run(args: argparse.Namespace) -> int:
    V.check_out_folder("--out", args.out)
    for flag, value in (("--train", args.train), ("--validation", args.validation)):
        V.check_path_kind(flag, value, "any")
    if args.tokenizer is not None:
        V.check_path_kind("--tokenizer", args.tokenizer, "folder")
    settings = settings_from(args)
    V.apply_threads(args.threads)
    quiet = args.quiet
    from tupe.glue.finetune import stop_on_sigterm
    from tupe.runtime import console_log, hushed_libraries
    from tupe.training.reporting import parse_report_to

    log = console_log(quiet)

    with stop_on_sigterm(args.out, "tupe finetune"), hushed_libraries(args.progress, quiet):
        finetune(
            args.model,
            settings,
            args.train,
            args.validation,
            args.out,
            scheme=args.scheme,
            tokenizer_dir=args.tokenizer,
            save_models=args.save_models,
            overwrite=args.overwrite,
            progress=args.progress and not quiet,
            log=log,
            report_to=parse_report_to(args.report_to),
        )
    return 0


def finetune(
    model_dir: str | Path,
    settings: FinetuneSettings,
    train_path: str | Path,
    dev_path: str | Path,
    out_dir: str | Path,
    scheme: str | None = None,
    tokenizer_dir: str | None = None,
    save_models: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    report_to: list[str] | None = None,
) -> dict[str, Any]:
    """Read, check and encode everything (refusing bad input before anything is written), then run the grid in
    `out_dir` under its lock. Returns the results."""
    from tupe.io.checkpoints import read_config

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    train_path, dev_path = Path(train_path), Path(dev_path)
    raw = read_config(model_dir)
    settings = settings.resolved(int(raw.get("max_position_embeddings", 512)), raw.get("hidden_size"))
    family = family_for(settings)
    train = _subset(_read(family, train_path, "--train"), settings.max_train_samples)
    dev = _subset(_read(family, dev_path, "--validation"), settings.max_eval_samples)
    family.check(train, dev, train_path, dev_path)

    from tupe.glue.finetune import converted_if_bert
    from tupe.io.files import folder_lock
    from tupe.io.outputs import OutputFolder

    created = not out_dir.exists()
    try:
        with folder_lock(out_dir, "tupe finetune"):
            try:
                # what the command writes at the top of --out; anything there that it did not write stops it here
                outputs = OutputFolder(out_dir, "tupe finetune")
                outputs.claim(
                    "results.json",
                    "predictions.jsonl",
                    "runs",
                    *(["tensorboard"] if "tensorboard" in (report_to or []) else []),
                )
                model_dir = converted_if_bert(model_dir, out_dir, tokenizer_dir, log, outputs)
                return _run(
                    model_dir,
                    family,
                    settings,
                    train,
                    dev,
                    (train_path, dev_path),
                    out_dir,
                    scheme,
                    tokenizer_dir,
                    save_models,
                    overwrite,
                    progress,
                    log,
                    outputs,
                    report_to or [],
                )
            except TupeError:
                _forget_new_folder(out_dir, created)
                raise
    except TupeError:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            import contextlib

            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise


def _read(family: Family, path: Path, flag: str) -> list[Any]:
    """The examples of the file `flag` names; an error reading it names the flag before the file, line or value."""
    try:
        return family.read(path)
    except TupeError as err:
        raise TupeError(f"{flag} {err}") from None


def _forget_new_folder(out_dir: Path, created: bool) -> None:
    """A refusal found only once the model and tokenizer are loaded (a SQuAD question too long for its window)
    leaves nothing behind either: a folder this command created, with no finished run, is emptied (under the
    lock, whose own files go when it is released) and then removed."""
    import shutil

    from tupe.io.files import LOCK_INFO_NAME, LOCK_NAME

    if not created or any(out_dir.glob("runs/*/result.json")):
        return
    for entry in out_dir.iterdir():
        if entry.name in (LOCK_NAME, LOCK_INFO_NAME):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _run(
    model_dir: Path,
    family: Family,
    settings: FinetuneSettings,
    train: list[Any],
    dev: list[Any],
    paths: tuple[Path, Path],
    out_dir: Path,
    scheme: str | None,
    tokenizer_dir: str | None,
    save_models: bool,
    overwrite: bool,
    progress: bool,
    log: Callable[[str], None],
    outputs: Any,
    report_to: list[str],
) -> dict[str, Any]:
    from tupe.io.checkpoints import inspect_checkpoint, load_tokenizer
    from tupe.io.files import atomic_write_json, atomic_write_text
    from tupe.runtime import tupe_version
    from tupe.training.finetuning import plan_grid, run_grid, run_name

    info, config = inspect_checkpoint(model_dir, scheme)
    tokenizer = load_tokenizer(tokenizer_dir or model_dir, config, explicit=tokenizer_dir is not None)
    train_ds = family.encode_train(tokenizer, train)
    eval_ds, aux = family.encode_eval(tokenizer, dev)
    grid = plan_grid(
        out_dir,
        settings,
        len(train_ds),
        info.weights_sha256,
        family.fingerprint(train, dev),
        overwrite,
        outputs,
    )
    log(
        f"{family.name}: {len(train)} train / {len(dev)} validation examples ({len(train_ds)} / {len(eval_ds)} "
        f"model inputs) from {paths[0]}, {paths[1]}; model {model_dir} (scheme {info.scheme})"
    )
    log(grid.describe(settings, len(train_ds)))
    baseline = family.baseline(train, dev)

    def run_one(lr: float, seed: int, run_dir: Path, callbacks: list[Any]) -> dict:
        from tupe.training.finetuning import (
            finish_run,
            load_head,
            loss_curve,
            make_trainer,
            training_arguments,
        )

        model = load_head(
            family.model_class(), str(model_dir), seed, settings.dropout, **family.model_kwargs()
        )
        for key, value in family.config_extras().items():
            setattr(model.config, key, value)
        args = training_arguments(
            settings,
            lr,
            seed,
            run_dir / "trainer",
            len(train_ds),
            report_to,
            early_stopping=settings.early_stopping,
        )
        trainer = make_trainer(
            model,
            args,
            train_ds,
            family.collator(tokenizer),
            tokenizer,
            callbacks,
            eval_ds=eval_ds,
            early_stopping=settings.early_stopping,
            logging_dir=out_dir / "tensorboard" / run_name(lr, seed) if "tensorboard" in report_to else None,
            stopped_message=lambda: (
                f"run lr={lr:g} seed={seed} stopped; the finished runs (their result.json) are kept: free space "
                "and rerun the same command"
            ),
        )
        t0 = time.time()
        out = trainer.train()
        train_seconds = time.time() - t0
        scores, rows = family.score(trainer.predict(eval_ds), aux, dev)
        atomic_write_text(run_dir / "predictions.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        used = finish_run(trainer, run_dir, save_models, f"run lr={lr:g} seed={seed} is redone next time")
        if save_models:
            _write_card(
                run_dir / "model", family, settings, info, paths, lr, seed, scores, len(train), len(dev)
            )
        return {
            "lr": lr,
            "seed": seed,
            "scores": scores,
            "main": scores[family.main_metric],
            "train_loss": float(out.training_loss),
            "loss_curve": loss_curve(trainer),
            "steps": int(trainer.state.global_step),
            "epochs_trained": float(trainer.state.epoch or 0.0),
            "trainer": used,
            "train_seconds": round(train_seconds, 2),
            "seconds": round(time.time() - t0, 2),
        }

    state: dict[str, Any] = {}

    def on_update(runs: list[dict]) -> None:
        summary = summarize(family, runs, settings.lrs, settings.seeds)
        best_run = None
        if summary["best"] is not None:
            mine = [r for r in runs if r["lr"] == summary["best"]["lr"]]
            best_run = max(mine, key=lambda r: r["main"])
        results = {
            "format": RESULTS_FORMAT,
            "command": "finetune",
            "task": family.name,
            "metrics": list(family.metrics),
            "main_metric": family.main_metric,
            "scale": 100,
            "columns": [[col, metric] for col, metric in family.report_columns],
            **summary,
            "best_run": None if best_run is None else run_name(best_run["lr"], best_run["seed"]),
            "baseline": baseline,
            "label_names": family.label_names(),
            "model": asdict(info),
            "scheme": info.scheme,
            "pretrain_steps": info.pretrain_steps,
            "data": {
                "train": str(paths[0]),
                "validation": str(paths[1]),
                "train_examples": len(train),
                "validation_examples": len(dev),
                "train_features": len(train_ds),
                "validation_features": len(eval_ds),
                **family.describe_data(train, dev),
                "sha256": grid.fingerprint["data_sha256"],
            },
            "settings": asdict(settings),
            "protocol": "mean over seeds per learning rate; best learning rate by the mean main metric; scores on "
            "the validation file after the last epoch"
            + (" (the best epoch by validation loss: early stopping)" if settings.early_stopping else ""),
            "engine": {"trainer": "transformers.Trainer", "tupe": tupe_version()},
            "complete": all(g in {(r["lr"], r["seed"]) for r in runs} for g in grid.runs),
            "runs": sorted(
                ({k: v for k, v in r.items() if k not in ("fingerprint", "loss_curve")} for r in runs),
                key=lambda r: (r["lr"], r["seed"]),
            ),
        }
        if best_run is not None:
            src = out_dir / "runs" / run_name(best_run["lr"], best_run["seed"]) / "predictions.jsonl"
            atomic_write_text(out_dir / "predictions.jsonl", src.read_text(encoding="utf-8"))
        atomic_write_json(out_dir / "results.json", results, indent=2, clean=True)
        state["results"] = results

    def describe(r: dict) -> str:
        return ", ".join(f"{m}={r['scores'][m]:.2f}" for m in family.metrics)

    run_grid(grid, run_one, on_update, f"{family.name} grid", progress, log, describe)
    results = state["results"]
    if results["best"] is not None:
        b = results["best"]
        log(
            f"best lr {b['lr']:g}: mean {family.main_metric} {b['mean'][family.main_metric]:.2f} over "
            f"{b['n_seeds']} seeds -> {out_dir / 'results.json'}"
        )
    return results


# a task family -> the pipeline tag of its fine-tuned models (their model card's kind)
CARD_KINDS = {
    "ner": "token-classification",
    "qa": "question-answering",
    "multiple-choice": "multiple-choice",
    "classification": "text-classification",
}


def _write_card(
    folder: Path,
    family: Family,
    settings: FinetuneSettings,
    info: Any,
    paths: tuple[Path, Path],
    lr: float,
    seed: int,
    scores: dict[str, float],
    n_train: int,
    n_dev: int,
) -> None:
    """README.md of one run's saved model: scheme, recipe, data, validation scores, how to load it (for NER with
    the pipeline aggregation strategy that matches its training labels)."""
    from tupe.io.model_card import write_model_card

    recipe = {
        "task": family.name,
        "pre-trained model": f"{info.path} ({info.pretrain_steps or 'unknown'} pre-training steps)",
        "learning rate": f"{lr:g}",
        "seed": seed,
        "epochs": settings.epochs if settings.max_steps is None else None,
        "max steps": settings.max_steps,
        "batch size": settings.batch_size,
        "gradient accumulation": settings.grad_accum if settings.grad_accum > 1 else None,
        "max sequence length": settings.max_seq_len,
        "dropout": settings.dropout,
        "labels": "every sub-token (--label-all-tokens)"
        if settings.label_all_tokens
        else ("a word's first sub-token" if family.name == "ner" else None),
    }
    extras = family.config_extras()
    write_model_card(
        folder,
        kind=CARD_KINDS.get(family.name, "text-classification"),
        scheme=info.scheme,
        recipe=recipe,
        data=f"Training file {paths[0]} ({n_train:,} examples); validation file {paths[1]} ({n_dev:,}).",
        metrics={f"validation {m}": v for m, v in scores.items()},
        aggregation_strategy=extras.get("aggregation_strategy", "first"),
        notes=(
            f"The labels were trained on {recipe['labels']}: read words with the pipeline's "
            f'`aggregation_strategy="{extras["aggregation_strategy"]}"` (also in config.json).'
            if "aggregation_strategy" in extras
            else ""
        ),
    )
