"""The scripts of benchmarks/ and scripts/results/ that take positional arguments (issue 49's sweep): a bad argument
is one line `SCRIPT: error: ...` naming it, exit code 2, before any model is built or file written; `--help` works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "argv", "needle"),
    [
        ("checkpointing_memory.py", ["bogus", "1", "8", "on"], "invalid choice: 'bogus'"),
        ("checkpointing_memory.py", ["bert-a", "0", "8", "on"], "argument batch"),
        ("checkpointing_memory.py", ["bert-a", "1", "8", "maybe"], "argument checkpointing"),
        ("checkpointing_memory.py", ["bert-a"], "the following arguments are required"),
        ("harness_mini.py", ["fast"], "argument allocator"),
        ("harness_mini.py", ["tuned", "1.5"], "argument dropout"),
        ("mmap_max_ab.py", ["bert-a,bogus"], "unknown scheme 'bogus'"),
        ("mmap_max_ab.py", ["bert-a", "0"], "argument pairs"),
        ("mmap_max_micro.py", ["extra"], "unrecognized arguments: extra"),
        ("mmap_max_rss.py", [], "the following arguments are required: mode"),
        ("deberta_rows_ab.py", ["0"], "argument rounds"),
        ("hf_deberta_trim_ab.py", ["sometimes"], "argument mode"),
        ("step_time_commits.py", ["NOWHERE", "."], "NOWHERE is not a checkout of tupe"),
        ("step_time_commits.py", [".", ".", "--schemes", "bert-a,bogus"], "unknown scheme 'bogus'"),
        ("step_time_commits.py", [".", ".", "--rounds", "2"], "argument --rounds"),
        ("../scripts/results/collect.py", ["NOWHERE"], "RUN_DIR NOWHERE is not a folder"),
        ("../scripts/results/collect.py", [".", "bogus"], "unknown scheme 'bogus'"),
        ("../scripts/results/paired_valid.py", ["NOWHERE", "c", "d", "bert-a"], "is not a folder"),
        ("../scripts/results/paired_valid.py", [".", "c", "d", "bogus"], "unknown scheme 'bogus'"),
        ("../scripts/results/position_table.py", [], "the following arguments are required: RUN_DIR"),
        ("../scripts/results/position_table.py", ["NOWHERE"], "RUN_DIR NOWHERE is not a folder"),
        ("../scripts/results/combine_length.py", ["."], "holds no length-*/study.json"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(script, argv, needle):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = done.stderr.strip()
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, err)
    assert err.startswith(f"{Path(script).name}: error: ") and needle in err and len(err.splitlines()) == 1, (
        err
    )


@pytest.mark.slow
def test_help_describes_the_script():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checkpointing_memory.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "Peak memory of one training step" in done.stdout
