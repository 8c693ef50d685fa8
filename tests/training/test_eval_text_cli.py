"""`tupe compare --eval-text`: every finished run evaluated on another text at the end, paired against the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.conftest import tiny_cli_args
from tupe.cli import main


@pytest.mark.slow
def test_compare_eval_text(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path, tmp_path: Path, capsys
):
    other = tmp_path / "other.txt"
    other.write_text("The orbit of the planet was computed by Kepler from the observations of Tycho.\n" * 60)
    out = tmp_path / "cmp"
    args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir) + ["--max-steps", "2"]
    rc = main(["compare", "--schemes", "bert-a,tupe-a", "--out", str(out), *args, "--eval-text", str(other)])
    printed = capsys.readouterr().out
    assert rc == 0
    result = json.loads((out / "eval_text.json").read_text())
    # the record's paths are relative to its own folder (no machine paths in a record)
    assert result["eval_text"] == [str(other)] and result["text"]["files"] == ["../other.txt"]
    assert [m["name"] for m in result["models"]] == ["bert-a", "tupe-a"]
    assert [m["path"] for m in result["models"]] == ["bert-a", "tupe-a"]
    assert "bert-a - tupe-a" in printed and "paired on the same blocks and masks" in printed


def test_a_wrong_eval_text_stops_compare_and_demo_before_any_training(tmp_path: Path, capsys):
    missing = tmp_path / "nope.txt"
    for cmd in (["compare", "--schemes", "bert-a,tupe-a"], ["demo"]):
        out = tmp_path / cmd[0]
        assert main([*cmd, "--out", str(out), "--eval-text", str(missing), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert "--eval-text: " in err and str(missing) in err and len(err.splitlines()) == 1, err
        assert not out.exists()


@pytest.mark.parametrize(
    "name, data, needle",
    [
        ("text.zip", b"PK\x03\x04" + bytes(range(256)) * 4, "is a zip archive, not text"),
        ("one.txt", b"x", "2 bytes of text (with line ends), fewer than the 127 tokens"),
    ],
    ids=["zip", "one-character"],
)
def test_eval_text_that_cannot_be_evaluated_stops_before_any_training(
    tmp_path: Path, capsys, name: str, data: bytes, needle: str
):
    """Issue 38: a zip or a one-character --eval-text trained every scheme, then failed naming --text."""
    bad = tmp_path / name
    bad.write_bytes(data)
    for cmd in (["compare", "--schemes", "bert-a,tupe-a"], ["demo"]):
        out = tmp_path / cmd[0]
        assert main([*cmd, "--out", str(out), "--eval-text", str(bad), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"tupe {cmd[0]}: error: --eval-text: ") and len(err.splitlines()) == 1, err
        assert needle in err and str(bad) in err, err
        assert not out.exists()
