"""`tupe compare`, `tupe plot` and `tupe demo` on tiny runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.training.conftest import tiny_cli_args
from tupe.analysis.curves import read_metrics, steps_to_reach
from tupe.cli import main


def test_steps_to_reach() -> None:
    valid = [{"step": 10, "eval_loss": 5.0}, {"step": 20, "eval_loss": 4.0}, {"step": 30, "eval_loss": 3.5}]
    assert steps_to_reach(valid, 4.0) == 20
    assert steps_to_reach(valid, 4.5) == 20
    assert steps_to_reach(valid, 3.0) is None


@pytest.mark.slow
def test_compare_writes_plot_tables_and_fractions(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path, tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    out = tmp_path / "cmp"
    args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir) + ["--max-steps", "4"]
    assert main(["compare", "--schemes", "bert-a,tupe-a", "--out", str(out), *args]) == 0
    printed = capsys.readouterr().out
    assert "| step | bert-a | tupe-a |" in printed and "valid_loss.png" in printed
    for name in ("valid_loss.png", "valid_loss.md", "valid_loss.csv", "compare_summary.json"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.reader((out / "valid_loss.csv").open()))
    assert rows[0] == ["step", "bert-a", "tupe-a"] and [r[0] for r in rows[1:]] == ["2", "4"]
    for scheme in ("bert-a", "tupe-a"):
        valid = read_metrics(out / scheme)[1]
        assert [f"{r['eval_loss']:.4f}" for r in valid] == [
            r[1 + ("bert-a", "tupe-a").index(scheme)] for r in rows[1:]
        ]
    summary = json.loads((out / "compare_summary.json").read_text())
    assert summary["reach"]["bert-a"]["fraction_of_first_steps"] == 1.0
    # identical data for both schemes: same data cache, same tokenizer files
    a = json.loads((out / "bert-a" / "pretrain_summary.json").read_text())
    b = json.loads((out / "tupe-a" / "pretrain_summary.json").read_text())
    assert a["data_cache"] == b["data_cache"]
    assert (out / "bert-a" / "tokenizer.json").read_bytes() == (
        out / "tupe-a" / "tokenizer.json"
    ).read_bytes()
    # --resume keeps finished schemes (no retraining) and rebuilds the summary
    mtime = (out / "bert-a" / "model.safetensors").stat().st_mtime_ns
    assert main(["compare", "--schemes", "bert-a,tupe-a", "--out", str(out), "--resume", *args]) == 0
    assert (out / "bert-a" / "model.safetensors").stat().st_mtime_ns == mtime
    # tupe plot: several runs, one figure
    png = tmp_path / "fig" / "curves.png"
    assert main(["plot", str(out / "bert-a"), str(out / "tupe-a"), "--out", str(png), "--train"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(tmp_path), "--out", str(png)]) == 2  # not a run folder: one-line error


@pytest.mark.slow
def test_demo_runs_end_to_end_on_a_small_corpus(tiny_corpus: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--corpus", str(tiny_corpus), "--max-steps", "2",
                 "--cache-dir", str(tmp_path / "cache"), "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "| step | bert-a | tupe-a |" in printed and "demo finished" in printed
    assert (out / "valid_loss.png").exists()
    assert json.loads((out / "tupe-a" / "tupe_run.json").read_text())["model"]["hidden_size"] == 128
