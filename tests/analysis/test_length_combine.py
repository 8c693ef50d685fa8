"""scripts/results/combine_length.py: the length study's chunks as one report, paired with bert-a by seed across
chunks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers import load_script


def _script():  # noqa: ANN202 - the script as a module
    return load_script("scripts/results/combine_length.py")


def _chunk(folder: Path, seeds: list[int], schemes: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"seeds": seeds, "schemes": schemes}))


def _row(loss: list[float]) -> dict:
    return {
        "final_losses": loss,
        "plateau_exit_steps": [None, 800, 900],
        "ood:built-in": [x + 0.3 for x in loss],
        "word_order:built-in": [0.0, 0.0, 0.0],
        "tokens_per_word:built-in": [1.443] * 3,
        "L=128 (none)": [x + 0.3 for x in loss],
        "L=1024 (interpolate)": [x + 0.4 for x in loss],
        "passkey d=16 (none)": [0.1, 0.2, 0.3],
    }


def test_pairs_schemes_across_chunks_by_seed(tmp_path: Path) -> None:
    c = _script()
    _chunk(tmp_path / "length-1", [0, 1, 2], {"bert-a": _row([6.0, 6.1, 6.2])})
    other = _row([5.0, 5.2, 5.3])
    _chunk(tmp_path / "length-2", [0, 1, 2], {"rope": other})
    assert c.main([str(tmp_path)]) == 0
    md = (tmp_path / "length.md").read_text()
    # rope - bert-a by seed: -1.0, -0.9, -0.9: mean -0.933, t(2) 4.303 x 0.0577 / sqrt(3) = 0.143
    assert (
        "| rope | 5.167 ± 0.153 | 5.000, 5.200, 5.300 | -0.933 [-1.077, -0.790] * | never, 800, 900 |" in md
    )
    assert "| rope | none | 5.467 ± 0.153 |  |  |" in md
    assert "| bert-a | interpolate |  | 6.500 ± 0.100 |  |" in md
    # passkey 0.1, 0.2, 0.3: mean 0.2, half-width 4.303 x 0.1 / sqrt(3) = 0.248
    assert "| rope | none | +0.200 [-0.048, +0.448] |" in md
    assert json.loads((tmp_path / "length.json").read_text())["schemes"]["rope"] == other


def test_refuses_chunks_that_disagree(tmp_path: Path) -> None:
    c = _script()
    _chunk(tmp_path / "length-1", [0, 1, 2], {"bert-a": _row([6.0, 6.1, 6.2])})
    _chunk(tmp_path / "length-2", [0, 1], {"rope": _row([5.0, 5.2, 5.3])})
    with pytest.raises(SystemExit, match="seeds"):
        c.main([str(tmp_path)])
    (tmp_path / "length-2" / "study.json").unlink()
    _chunk(tmp_path / "length-3", [0, 1, 2], {"bert-a": _row([6.0, 6.1, 6.2])})
    with pytest.raises(SystemExit, match="bert-a is in two chunks"):
        c.main([str(tmp_path)])


def test_verdict_takes_each_schemes_best_method_at_the_longest_length(tmp_path: Path) -> None:
    c = _script()
    bert = {"L=128 (interpolate)": [6.0, 6.1, 6.2], "L=1024 (interpolate)": [6.0, 6.05, 6.1]}
    rope = {
        "L=128 (none)": [5.0, 5.1, 5.2],
        "L=1024 (none)": [7.0, 7.5, 8.0],
        "L=128 (yarn)": [5.0, 5.1, 5.2],
        "L=1024 (yarn)": [5.1, 5.2, 5.4],
        "passkey d=16 (yarn)": [0.1, 0.2, 0.3],
        "passkey d=64 (yarn)": [0.2, 0.2, 0.3],
        "passkey d=64 (none)": [0.5, 0.6, 0.7],  # not the verdict's method: not counted
    }
    _chunk(tmp_path / "length-1", [0, 1, 2], {"bert-a": bert})
    _chunk(tmp_path / "length-2", [0, 1, 2], {"rope": rope})
    runs = [  # `tupe evaluate --lengths`: per length, per tokenizer group, the unigram of the evaluated blocks
        {"length": n, "tokenizer_groups": [{"unigram": {"loss": {"value": u}}}]}
        for n, u in ((128, 6.6), (1024, 6.58))
    ]
    (tmp_path / "length-1" / "lengths-none.json").write_text(json.dumps({"runs": runs}))
    assert c.main([str(tmp_path)]) == 0
    md = (tmp_path / "length.md").read_text()
    verdict = md.split("## Verdict per scheme at 1,024 tokens")[1]
    # bert-a: 1024 - 128 by seed 0.0, -0.05, -0.1: mean -0.05, t(2) 4.303 x 0.05 / sqrt(3) = 0.124
    assert (
        "| bert-a | interpolate | 6.100 ± 0.100 | 6.050 ± 0.050 | -0.050 [-0.174, +0.074] |  | none |"
        in verdict
    )
    # rope with yarn (5.233 at 1,024 beats none's 7.5): change 0.1, 0.1, 0.2 -> +0.133 [-0.010, +0.277];
    # minus bert-a -0.9, -0.85, -0.7 -> -0.817 [-1.075, -0.558]; passkey d=64: 0.233 [0.090, 0.377] > 0, d=16 not
    assert (
        "| rope | yarn | 5.100 ± 0.100 | 5.233 ± 0.153 | +0.133 [-0.010, +0.277] | -0.817 [-1.075, -0.558] * "
        "| 64: +0.233 [+0.090, +0.377] |" in verdict
    )
    assert "from 6.600 to 6.580 (-0.020" in verdict
    assert "| unigram of the evaluated blocks | | 6.600 | 6.580 | |" in md
    assert (tmp_path / "length.png").stat().st_size > 0
