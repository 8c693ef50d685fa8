"""Fine-tune a pre-trained `tupe` checkpoint on one GLUE task with the paper's protocol (Ke et al., ICLR 2021, Sec. 4.1 and Table 2; see docs/glue.md).

Grid: learning rates {2e-5, 3e-5, 4e-5, 5e-5} x 5 seeds, batch 32, 10 epochs (5 for MNLI, QQP, QNLI), linear
warm-up over 6% of the steps then linear decay, Adam (0.9, 0.999), eps 1e-6, weight decay 0.01, clip 1.0. A
learning rate's score is the median of its seeds' dev scores, and the best learning rate is reported. This module
is the command (its flags, the task's files, the paper's defaults); the run, the grid, its resume and results.json
are the pipeline `tupe finetune` shares (tupe/finetuning/pipeline/run.py `run_finetuning`, with GLUE's task family,
tupe/finetuning/glue/family.py), on the `transformers` Trainer like pre-training.

Each finished run writes `runs/lr<LR>_seed<S>/result.json` (atomically, last) and its dev predictions; an
interrupted grid started again with the same command skips the runs that finished. `results.json` is rewritten
after every run with all scores, the median per learning rate and the best one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.finetuning.glue.encoding import load_data, subsample
from tupe.finetuning.glue.family import GlueFamily, read_predictions  # noqa: F401  (read_predictions: re-exported)
from tupe.finetuning.glue.protocol import (  # noqa: F401  (re-exported: other modules import them from here)
    PAPER_LRS,
    PAPER_SEEDS,
    SMALL_MODEL_EPOCHS,
    SMALL_MODEL_LRS,
    SMALL_MODEL_WIDTH,
    GlueSettings,
    is_small_model,
    lr_key,
    run_name,
    summarize,
)
from tupe.finetuning.glue.tasks import TASKS, get_task
from tupe.finetuning.pipeline.folder import grid_folder, stop_on_sigterm
from tupe.finetuning.pipeline.run import GridOptions, open_checkpoint, run_finetuning
from tupe.finetuning.pipeline.settings import add_grid_arguments, add_run_arguments, grid_settings
from tupe.io.outputs import OutputFolder
from tupe.io.reading import CONFIG_LIMIT, RESULTS_LIMIT, read_json, read_text
from tupe.runtime import console_log, hushed_libraries
from tupe.training.reporting import add_hub_arguments, parse_report_to


@dataclass
class GridResult:
    out_dir: Path
    results: dict[str, Any]  # results.json (`GridResults.to_json()`)


def run_grid(
    model_dir: str | Path,
    settings: GlueSettings,
    out_dir: str | Path,
    data_dir: str | None = None,
    train_file: str | None = None,
    dev_files: Sequence[str] | None = None,
    **options: Any,
) -> GridResult:
    """Fine-tune every (lr, seed) of the grid that has not finished yet in `out_dir`, then summarise.

    The data: `data_dir`, or `train_file` and `dev_files`. Other keyword arguments: those of `GridOptions` (scheme,
    tokenizer_dir, save_models, overwrite, log, report_to, progress, push_to_hub, hub_model_id).
    """
    opts = GridOptions(**{**options, "report_to": options.get("report_to") or []})
    with grid_folder(Path(out_dir), "tupe glue"):  # a refusal leaves --out as it was found
        return _glue_grid(Path(model_dir), settings, Path(out_dir), (data_dir, train_file, dev_files), opts)


def _glue_grid(
    model_dir: Path,
    settings: GlueSettings,
    out_dir: Path,
    files: tuple[str | None, str | None, Sequence[str] | None],
    opts: GridOptions,
) -> GridResult:
    """The GLUE side of the shared pipeline: the checkpoint, the paper's (or the small-model) defaults, the task's
    files and their subsets; then `run_finetuning` with GLUE's family."""
    task = get_task(settings.task)
    if opts.push_to_hub and not opts.save_models:
        raise TupeError("--push-to-hub pushes the fine-tuned models, which only --save-models keeps: add it")
    outputs = glue_outputs(out_dir)
    checkpoint = open_checkpoint(model_dir, out_dir, outputs, GlueFamily.outputs, opts)
    config = checkpoint.config
    lrs_default, epochs_default = settings.lrs is None, settings.epochs is None
    settings = settings.resolved(task, config.max_position_embeddings, config.hidden_size)
    if is_small_model(config.hidden_size) and (lrs_default or epochs_default):
        opts.log(
            f"small model (width {config.hidden_size} < {SMALL_MODEL_WIDTH}): the small-model defaults"
            + (f", learning rates {','.join(f'{x:g}' for x in settings.lrs)}" if lrs_default else "")
            + (f", {settings.epochs:g} epochs" if epochs_default else "")
            + " (the paper's 2e-5..5e-5 leave such a model at the majority class; --lrs/--epochs to change)"
        )
    if not settings.lrs or not settings.seeds:
        raise TupeError("the grid is empty: give at least one learning rate and one seed")
    data = load_data(task, *files)
    data.train = subsample(data.train, settings.max_train_samples)
    data.dev = {k: subsample(v, settings.max_eval_samples) for k, v in data.dev.items()}
    results = run_finetuning(GlueFamily(task, data, settings), settings, checkpoint, out_dir, outputs, opts)
    return GridResult(out_dir, results.to_json())


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


# --------------------------------------------------------------------------------------------------------- CLI


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
    # the values' ranges are the shared flags' types (add_grid_arguments), checked by the parser
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
