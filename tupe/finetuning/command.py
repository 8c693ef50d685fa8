"""Fine-tune a pre-trained checkpoint on your own files: named entities (CoNLL), extractive question answering
(SQuAD), multiple choice (SWAG) or sentence classification, over a learning-rate x seed grid (docs/finetuning.md).

This module is the command: its flags, reading and checking the files (everything the files or flags get wrong is
refused in one line before anything is written), the folder and its lock. The runs, the grid, its resume and
results.json are the pipeline `tupe glue` shares (tupe/finetuning/pipeline/run.py `run_finetuning`), with a task
family (ner.py, qa.py, choice.py, classification.py) bringing its reader, encoding, head and metric.
`OUT/results.json` holds the best learning rate's mean over seeds of every metric (x 100) at the top level, each
seed's below, and every run; `OUT/predictions.jsonl` the validation predictions of the best run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.finetuning.arguments import FinetuneSettings, add_arguments, settings_from  # noqa: F401 (cli)
from tupe.finetuning.family import Family


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


def run(args: argparse.Namespace) -> int:
    V.check_out_folder("--out", args.out)
    for flag, value in (("--train", args.train), ("--validation", args.validation)):
        V.check_path_kind(flag, value, "any")
    if args.tokenizer is not None:
        V.check_path_kind("--tokenizer", args.tokenizer, "folder")
    settings = settings_from(args)
    V.apply_threads(args.threads)
    quiet = args.quiet
    from tupe.finetuning.pipeline.folder import stop_on_sigterm
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
    family.use(train, dev, (train_path, dev_path))

    from tupe.finetuning.pipeline.folder import grid_folder
    from tupe.finetuning.pipeline.run import GridOptions, open_checkpoint, run_finetuning
    from tupe.io.outputs import OutputFolder

    options = GridOptions(
        scheme=scheme,
        tokenizer_dir=tokenizer_dir,
        save_models=save_models,
        overwrite=overwrite,
        progress=progress,
        log=log,
        report_to=report_to or [],
    )
    with grid_folder(out_dir, "tupe finetune"):  # a refusal leaves --out as it was found
        outputs = OutputFolder(out_dir, "tupe finetune")
        checkpoint = open_checkpoint(model_dir, out_dir, outputs, family.outputs, options)
        return run_finetuning(family, settings, checkpoint, out_dir, outputs, options).to_json()


def _read(family: Family, path: Path, flag: str) -> list[Any]:
    """The examples of the file `flag` names; an error reading it names the flag before the file, line or value."""
    try:
        return family.read(path)
    except TupeError as err:
        raise TupeError(f"{flag} {err}") from None
