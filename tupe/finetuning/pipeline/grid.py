"""The learning-rate x seed grid in its folder: each finished run is `runs/lr<LR>_seed<S>/result.json`, written
atomically and last with the fingerprint of everything that determines its score, so the same command started
again skips the runs that finished (`plan_grid`, `finished_runs`) and refuses a folder made with other settings;
`train_grid` runs the rest under one progress bar."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tupe.errors import TupeError
from tupe.finetuning.pipeline.trainer import progress_callback
from tupe.io.files import atomic_write_json

if TYPE_CHECKING:
    from tupe.finetuning.pipeline.settings import GridSettings
    from tupe.io.outputs import OutputFolder


def run_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}_seed{seed}"


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
