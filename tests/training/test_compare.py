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
    captured = capsys.readouterr()
    printed = captured.out
    assert "| bert-a | 1 |" in printed and "| tupe-a | 1 |" in printed and "valid_loss.png" in printed
    assert "Unigram baseline" in printed
    # one seed: a paired bootstrap interval on the shared validation blocks, and a warning that they are few
    paired = json.loads((out / "compare_summary.json").read_text())["paired"]
    d = paired["tupe-a - bert-a"]
    assert d["low"] <= d["value"] <= d["high"]
    assert d["value"] == pytest.approx(paired["tupe-a"]["value"] - paired["bert-a"]["value"])
    n, tokens = paired["validation"]["blocks"], paired["validation"]["masked_tokens"]
    assert 0 < n < 100 and tokens > 0
    assert f"95% bootstrap CI over the {n:,} shared validation blocks ({tokens:,} masked tokens" in printed
    assert f"tupe-a - bert-a  {d['value']:+8.3f}   [{d['low']:+.3f}, {d['high']:+.3f}]  paired" in printed
    warning = captured.err.strip().splitlines()[-1]
    assert warning.startswith(
        f"warning: small validation set ({n:,} validation blocks, {tokens:,} masked tokens)"
    )
    assert "under 100 blocks the intervals are unreliable" in warning and "--valid-every" in warning
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
    stats = summary["stats"]["schemes"]
    assert stats["bert-a"]["steps_to_reach_reference"] == [4] and stats["bert-a"]["diff_vs_reference"] == [
        0.0
    ]
    final = {s: read_metrics(out / s)[1][-1]["eval_loss"] for s in ("bert-a", "tupe-a")}
    assert stats["tupe-a"]["diff_vs_reference"] == pytest.approx([final["tupe-a"] - final["bert-a"]])
    assert "| step | bert-a | tupe-a |" in (out / "valid_loss.md").read_text()
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
    code = main(["demo", "--out", str(out), "--corpus", str(tiny_corpus), "--max-steps", "4",
                 "--cache-dir", str(tmp_path / "cache"), "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "unigram baseline" in printed and "demo finished" in printed
    assert "tupe-a - bert-a" in printed and "paired" in printed
    # 4 steps: still above the unigram baseline, and the verdict says so from the numbers
    assert "bert-a had not yet learned even the token frequencies after 4 steps" in printed
    assert "held-out validation blocks of the training corpus" in printed
    # by default both models are judged on the shipped out-of-domain book too, paired
    assert (
        "On built-in evaluation text (Great Astronomers" in printed and "paired on the same blocks" in printed
    )
    assert json.loads((out / "eval_text.json").read_text())["eval_text"] == ["built-in"]
    assert (out / "valid_loss.png").exists()
    run = json.loads((out / "tupe-a" / "tupe_run.json").read_text())
    assert run["model"]["hidden_size"] == 128 and run["optim"]["warmup_steps"] == 100
    # the paired recomputation agrees with each run's own final evaluation
    from tupe.analysis.curves import read_metrics
    from tupe.comparison.paired import paired_comparison

    paired = paired_comparison({s: out / s for s in ("bert-a", "tupe-a")}, reference="bert-a", resamples=50)
    for s in ("bert-a", "tupe-a"):
        assert paired[s]["value"] == pytest.approx(read_metrics(out / s)[1][-1]["eval_loss"], rel=1e-5)
    assert paired["tupe-a - bert-a"]["value"] == pytest.approx(
        paired["tupe-a"]["value"] - paired["bert-a"]["value"]
    )


@pytest.mark.slow
def test_compare_several_seeds_in_parallel(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path, tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    out = tmp_path / "seeds"
    args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir) + ["--max-steps", "4"]
    cmd = ["compare", "--schemes", "bert-a,tupe-a", "--seeds", "0,1", "--parallel", "2", "--out", str(out)]
    assert main([*cmd, *args]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "| bert-a | 2 |" in printed and "| tupe-a | 2 |" in printed
    assert "minus bert-a (mean [95% CI])" in printed  # the Student-t interval over seeds
    summary = json.loads((out / "compare_summary.json").read_text())
    lo, hi = summary["stats"]["schemes"]["tupe-a"]["diff_ci95"]
    assert lo <= summary["stats"]["schemes"]["tupe-a"]["diff_mean"] <= hi
    assert "paired" not in summary and summary["warning"] in captured.err
    assert "under 100 blocks the intervals are unreliable" in summary["warning"]
    assert summary["seeds"] == [0, 1]
    for scheme in ("bert-a", "tupe-a"):
        finals = [read_metrics(out / scheme / f"seed-{k}")[1][-1]["eval_loss"] for k in (0, 1)]
        assert summary["stats"]["schemes"][scheme]["final_losses"] == pytest.approx(finals)
        for k in (0, 1):
            run = json.loads((out / scheme / f"seed-{k}" / "tupe_run.json").read_text())
            assert run["optim"]["seed"] == k and (out / "logs" / f"{scheme}-seed-{k}.log").exists()
    # different seeds, different runs; same seed, same initial data order across schemes
    assert (
        summary["stats"]["schemes"]["bert-a"]["final_losses"][0]
        != summary["stats"]["schemes"]["bert-a"]["final_losses"][1]
    )
    rows = list(csv.reader((out / "valid_loss.csv").open()))
    assert rows[0] == ["step", "bert-a/seed-0", "bert-a/seed-1", "tupe-a/seed-0", "tupe-a/seed-1"]
    assert (out / "valid_loss.png").read_bytes()[:4] == b"\x89PNG"
    # a rerun with --resume trains nothing
    mtime = (out / "tupe-a" / "seed-1" / "model.safetensors").stat().st_mtime_ns
    assert main([*cmd, "--resume", *args]) == 0
    assert (out / "tupe-a" / "seed-1" / "model.safetensors").stat().st_mtime_ns == mtime


def test_parse_seeds() -> None:
    from tupe.comparison.compare import parse_seeds
    from tupe.errors import TupeError

    assert parse_seeds("0,1,2") == [0, 1, 2] and parse_seeds("3-5") == [3, 4, 5] and parse_seeds("7") == [7]
    for bad in ("a", "1,1", ""):
        with pytest.raises(TupeError, match="--seeds"):
            parse_seeds(bad)
    # seeds numpy and torch cannot take are refused while parsing, naming the option; a huge range is not expanded
    with pytest.raises(TupeError, match=r"--seeds: each seed must be from 0 to 4294967295, got 4294967296"):
        parse_seeds("1,4294967296")
    with pytest.raises(TupeError, match=r"--seeds: more than 1,000 seeds in '0-100000000000'"):
        parse_seeds("0-100000000000")
    assert parse_seeds("0-999") == list(range(1000))


def test_validation_warning_wording() -> None:
    from tupe.comparison.paired import MIN_VALID_BLOCKS, validation_warning

    assert MIN_VALID_BLOCKS == 100
    clear = {
        "b - a": {"value": -0.2, "low": -0.3, "high": -0.1},
        "b": {"value": 5.0, "low": 4.9, "high": 5.1},
    }
    assert validation_warning(425, 8000, clear) is None
    assert validation_warning(99) == (
        "warning: small validation set (99 validation blocks): under 100 blocks the intervals are unreliable; "
        "use more text or a lower --valid-every (1 block in N is held out)"
    )
    unclear = {"b - a": {"value": 0.01, "low": -0.02, "high": 0.04}}
    line = validation_warning(425, 8000, unclear)
    assert line == (
        "warning: small validation set (425 validation blocks, 8,000 masked tokens): too few to resolve "
        "b - a = +0.010 [95% CI -0.020, +0.040]; use more text or a lower --valid-every (1 block in N is held out)"
    )


def test_a_second_compare_on_one_out_is_refused_at_once(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path, tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    from tests.helpers import hold_lock

    out = tmp_path / "cmp"
    holder = hold_lock("folder_lock", out, "tupe compare", ["compare", "--out", out])
    try:
        args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir) + ["--max-steps", "2"]
        assert main(["compare", "--schemes", "bert-a,tupe-a", "--out", str(out), *args]) == 2
        err = capsys.readouterr().err
        assert f"{out}: another `tupe compare` is writing here (pid {holder.pid} " in err
        assert {p.name for p in out.iterdir()} == {".lock", ".lock.info"}  # no run started
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_sigterm_to_a_parallel_compare_stops_and_checkpoints_its_runs(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """A SIGTERM reaches only the parent (a scheduler, `kill PID`): it must pass it on so that every run
    checkpoints and stops, not leave the runs going on as orphans."""
    import signal
    import subprocess
    import sys
    import time

    from tests.reliability.conftest import subprocess_env

    out = tmp_path / "cmp"
    args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir) + [
        "--max-steps",
        "100000",
        "--threads",
        "1",
    ]
    cmd = ["compare", "--schemes", "bert-a,tupe-a", "--parallel", "2", "--out", str(out), *args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tupe", *cmd],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all(
            list((out / s).glob("checkpoint-*")) for s in ("bert-a", "tupe-a")
        ):
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "tupe compare: stopped by SIGTERM" in err and "--resume" in err
    for scheme in ("bert-a", "tupe-a"):
        log = (out / "logs" / f"{scheme}.log").read_text()
        assert "stopped by SIGTERM after step" in log, log[-2000:]
