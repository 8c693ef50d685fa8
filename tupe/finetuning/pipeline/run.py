"""The one fine-tuning pipeline of `tupe glue` and `tupe finetune`, joined: `run_finetuning` encodes a task
family's data, plans the grid in its folder (the runs finished there are kept), runs what is left and rewrites
results.json after every run; `train_run` is one (lr, seed) run, a fresh task head on the pre-trained checkpoint
trained by the `transformers` Trainer with the batches of `data_collator`; `open_checkpoint` claims the folder and
reads the checkpoint (a `transformers` BERT converted to bert-a first)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tupe.errors import TupeError
from tupe.finetuning.pipeline.batches import data_collator, padding_free_refusal
from tupe.finetuning.pipeline.family import TaskFamily
from tupe.finetuning.pipeline.grid import Grid, hub_run_id, plan_grid, run_name, train_grid
from tupe.finetuning.pipeline.results import GridResults, RunResult, summarize_grid
from tupe.finetuning.pipeline.settings import GridSettings
from tupe.finetuning.pipeline.trainer import (
    check_finite_start,
    eval_logs,
    finetune_training_arguments,
    finish_run,
    load_head,
    loss_curve,
    make_trainer,
)
from tupe.io.files import atomic_write_json

if TYPE_CHECKING:
    from tupe.io.outputs import OutputFolder


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
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        log(f"note: {model_dir} is a transformers BERT checkpoint; using its bert-a conversion in {target}")
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
    # said once it is done: a folder refused while converting gets its error only
    log(f"note: {model_dir} is a transformers BERT checkpoint; converted exactly to bert-a in {target}")
    return target
