"""A grid finished before `tupe glue` and `tupe finetune` shared one pipeline (tests/data/grid_v1, written by the
code of commit 37d7939) is resumed by the same command line: every run is found (nothing is trained again), the
results.json written keeps every key the old one had, and `tupe report` reads both the old and the new files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tupe.cli import main

from ..glue.fixtures import make_checkpoint, write_task

V1 = Path(__file__).resolve().parents[1] / "data" / "grid_v1"
FINETUNE_DATA = Path(__file__).resolve().parents[1] / "data" / "finetune"
COMMON = ["--epochs", "1", "--batch-size", "16", "--lrs", "1e-4", "--seeds", "1,2", "--no-progress", "--report-to", "none"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("model") / "tiny-tupe-a")


def _old_folder(name: str, tmp_path: Path, model: Path) -> Path:
    """The old grid folder, with its runs' fingerprints naming this test's checkpoint: the recorded weights' hash
    is the only input that may differ with the torch version that builds the tiny model."""
    from tupe.io.checkpoints import inspect_checkpoint

    out = tmp_path / name
    shutil.copytree(V1 / name, out)
    sha = inspect_checkpoint(model)[0].weights_sha256
    for f in out.glob("runs/*/result.json"):
        r = json.loads(f.read_text())
        r["fingerprint"]["model_weights_sha256"] = sha
        f.write_text(json.dumps(r, indent=2))
    return out


def _key_paths(d: Any, prefix: str = "") -> set[str]:
    """Every key path of nested dicts (a list: its first element's), e.g. `best.median.dev.accuracy`."""
    if isinstance(d, list):
        return _key_paths(d[0], prefix + "[]") if d else set()
    if not isinstance(d, dict):
        return set()
    out = set()
    for k, v in d.items():
        if prefix.endswith(("model", "engine")):  # what the checkpoint and versions say: not the grid's keys
            continue
        out.add(f"{prefix}.{k}")
        out |= _key_paths(v, f"{prefix}.{k}")
    return out


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import Trainer

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(Trainer, "train", refuse)


def _check_resumed(out: Path) -> None:
    old = json.loads((V1 / out.name / "results.json").read_text())
    new = json.loads((out / "results.json").read_text())
    assert new["complete"] and len(new["runs"]) == 2
    assert [r["scores"] for r in new["runs"]] == [r["scores"] for r in old["runs"]]
    assert new["best"]["lr"] == old["best"]["lr"] and new["per_lr"].keys() == old["per_lr"].keys()
    assert _key_paths(old) - _key_paths(new) == set()  # readers of the old file find every key


def test_a_glue_grid_finished_before_one_pipeline_is_resumed(
    tiny_model, tmp_path, no_training, capsys
) -> None:
    glue = tmp_path / "glue"
    write_task(glue, "RTE")
    out = _old_folder("glue-rte", tmp_path, tiny_model)
    argv = ["glue", "--model", str(tiny_model), "--task", "RTE", "--data-dir", str(glue), "--out", str(out)]
    assert main([*argv, *COMMON]) == 0
    assert "2 runs, 2 already done" in capsys.readouterr().out
    _check_resumed(out)


def test_a_finetune_classification_grid_finished_before_one_pipeline_is_resumed(
    tiny_model, tmp_path, no_training, capsys
) -> None:
    out = _old_folder("finetune-classification", tmp_path, tiny_model)
    argv = ["finetune", "--task", "classification", "--model", str(tiny_model), "--out", str(out),
            "--train", str(FINETUNE_DATA / "sentiment_train.csv"),
            "--validation", str(FINETUNE_DATA / "sentiment_val.csv")]  # fmt: skip
    assert main([*argv, *COMMON]) == 0
    assert "2 runs, 2 already done" in capsys.readouterr().out
    _check_resumed(out)
    assert (out / "predictions.jsonl").read_text() == (V1 / out.name / "predictions.jsonl").read_text()


def test_tupe_report_reads_the_results_written_before_one_pipeline() -> None:
    from tupe.finetuning.glue.report import make_report

    md, csv_text = make_report([str(V1 / "glue-rte"), str(V1 / "finetune-classification")])
    # the table those files gave when they were written, word for word (tests/data/grid_v1/report.md)
    assert md == (V1 / "report.md").read_text() and csv_text == (V1 / "report.csv").read_text()
    assert "| TUPE-A | ? | 50.00 | 50.00 | 50.00 |" in md.splitlines()
