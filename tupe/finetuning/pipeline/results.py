"""What a grid's runs come to: the summary over seeds (`summarize_grid`: mean or median, as the family's protocol
asks), one finished run's record (`RunResult`, runs/<run>/result.json) and the grid's (`GridResults`,
results.json, read by `tupe report`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tupe.errors import TupeError


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
