"""The one fine-tuning pipeline (tupe/finetuning/pipeline/): its summary over seeds against independent
computations, its results record against the files written before it, and both commands on its one run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from tupe.errors import TupeError
from tupe.finetuning.pipeline.results import GridResults, summarize_grid

V1 = Path(__file__).resolve().parents[1] / "data" / "grid_v1"


def _runs(scores_by_lr: dict[float, list[float | None]], nested: bool) -> list[dict]:
    out = []
    for lr, values in scores_by_lr.items():
        for seed, v in enumerate(values, 1):
            scores = {"acc": v, "f1": None if v is None else v / 2}
            out.append({"lr": lr, "seed": seed, "scores": {"dev": scores} if nested else scores})
    return out


def test_the_median_summary_is_numpy_s_median_with_undefined_scores_lowest() -> None:
    grid = {2e-5: [0.7, 0.9, 0.71, 0.72, 0.1], 3e-5: [0.8, None, 0.69, 0.7, 0.95]}
    out = summarize_grid(
        _runs(grid, True), [2e-5, 3e-5], [1, 2, 3, 4, 5], "median", lambda s: s["dev"]["acc"]
    )
    for lr, values in grid.items():
        entry = out["per_lr"][f"{lr:g}"]
        oracle = float(np.median([-np.inf if v is None else v for v in values]))
        assert entry["main_median"] == pytest.approx(oracle)
        assert entry["median"]["dev"]["acc"] == pytest.approx(oracle)
        assert entry["main_scores"] == values and entry["complete"] and "std" not in entry
    assert out["best"]["lr"] == 2e-5  # 3e-5 has the best single run, 2e-5 the best median
    assert set(out["best"]) == {"lr", "n_seeds", "seeds", "main_median", "median"}


def test_the_mean_summary_is_statistics_mean_and_sample_stdev() -> None:
    grid = {1e-4: [60.0, 70.0, 71.0], 3e-4: [90.0, 10.0]}
    out = summarize_grid(_runs(grid, False), [1e-4, 3e-4], [1, 2, 3], "mean", lambda s: s["acc"])
    for lr, values in grid.items():
        entry = out["per_lr"][f"{lr:g}"]
        assert entry["mean"]["acc"] == pytest.approx(statistics.fmean(values))
        assert entry["std"]["f1"] == pytest.approx(statistics.stdev([v / 2 for v in values]))
        assert entry["per_seed"]["1"] == {"acc": values[0], "f1": values[0] / 2}
    assert not out["per_lr"]["0.0003"]["complete"]  # seed 3 missing
    assert out["best"]["lr"] == 1e-4 and out["best"]["std"]["acc"] == pytest.approx(
        statistics.stdev(grid[1e-4])
    )
    one = summarize_grid(_runs({1e-4: [50.0]}, False), [1e-4], [1], "mean", lambda s: s["acc"])
    assert one["best"]["std"] == {"acc": None, "f1": None}  # one seed has no spread
    with pytest.raises(TupeError, match="unknown aggregate 'mode'"):
        summarize_grid([], [1e-4], [1], "mode", lambda s: s["acc"])


@pytest.mark.parametrize(("name", "aggregate"), [("glue-rte", "median"), ("finetune-classification", "mean")])
def test_the_record_reads_and_writes_the_files_written_before_it(name: str, aggregate: str) -> None:
    old = json.loads((V1 / name / "results.json").read_text())
    record = GridResults.from_json(old, name)
    assert record.aggregate == aggregate  # not in the old files: told by the command that wrote them
    assert record.to_json() == {**old, "aggregate": aggregate}  # every key kept, one added


def test_a_record_without_what_every_results_file_has_is_refused_by_name() -> None:
    with pytest.raises(TupeError, match=r"x.json: missing 'best'; not a `tupe glue` or `tupe finetune`"):
        GridResults.from_json({"task": "RTE", "model": {}, "scheme": "tupe-a"}, "x.json")


@pytest.mark.slow
def test_glue_and_finetune_classification_share_one_run(tmp_path, monkeypatch) -> None:
    """Both commands reach the same `train_run` with their family: GLUE's median, tupe finetune's mean."""
    import tupe.finetuning.pipeline.run as ft
    from tupe.cli import main

    from ..glue.fixtures import make_checkpoint, write_task

    model = make_checkpoint(tmp_path / "model")
    write_task(tmp_path / "glue", "RTE")
    seen = []

    def first_run(job, lr, seed, run_dir, callbacks):  # noqa: ANN001, ANN202 - record, do not train
        seen.append((type(job.family).__name__, job.family.aggregate, lr, seed, job.train.num_rows))
        raise SystemExit(0)

    monkeypatch.setattr(ft, "train_run", first_run)
    common = ["--lrs", "1e-4", "--seeds", "3", "--no-progress", "--quiet", "--report-to", "none"]
    with pytest.raises(SystemExit):
        main(["glue", "--model", str(model), "--task", "RTE", "--data-dir", str(tmp_path / "glue"),
              "--out", str(tmp_path / "g"), *common])  # fmt: skip
    data = Path(__file__).resolve().parents[1] / "data" / "finetune"
    with pytest.raises(SystemExit):
        main(["finetune", "--task", "classification", "--model", str(model), "--out", str(tmp_path / "f"),
              "--train", str(data / "sentiment_train.csv"), "--validation", str(data / "sentiment_val.csv"),
              *common])  # fmt: skip
    assert seen == [("GlueFamily", "median", 1e-4, 3, 48), ("ClassificationFamily", "mean", 1e-4, 3, 40)]
