"""benchmarks/packing_step.py (issue 36's documents-vs-stream step benchmark) runs and reports what it says."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from ..helpers import load_script


def test_packing_step_benchmark_runs_at_a_tiny_shape(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = load_script("benchmarks/packing_step.py")
    rng = random.Random(0)
    words = "the a man woman dog cat saw met found left near by house river town".split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 20))) + "." for _ in range(600)]
    (tmp_path / "docs.txt").write_text("\n\n".join(docs) + "\n")
    result = script.main(
        ["--corpus", str(tmp_path / "docs.txt"), "--cache-dir", str(tmp_path / "cache"), "--rounds", "2",
         "--warmup", "0", "--batch-size", "4", "--max-seq-len", "32", "--vocab-size", "300", "--hidden-size", "32",
         "--valid-every", "20", "--json", str(tmp_path / "out.json")]
    )  # fmt: skip
    assert json.loads((tmp_path / "out.json").read_text()) == result
    assert set(result["median_step_s"]) == {"stream", "documents"} and result["rounds"] == 2
    assert result["ratio_documents_to_stream"] > 0 and 0 < result["packing_efficiency"] <= 1
    assert 0 <= result["documents_padding_share"] < 1
    assert isinstance(result["position_ids_honoured"], bool)
    assert "x target)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--scheme", "hf-bert"],
            "hf-bert",
        ),  # issue 49, item 14: was a ratio and "position_ids_honoured": true
        (["--scheme", "tupe-x"], "unknown scheme 'tupe-x'"),
        (["--rounds", "0"], "argument --rounds: must be an integer >= 1, got 0"),
        (["--batch-size", "0"], "argument --batch-size"),
        (["--device", "cuda"], "--device cuda: no CUDA device is available"),
        (["--json", "FOLDER"], "is a folder, expected a file"),
        (["--json", "/proc/nope.json"], "--json /proc/nope.json: cannot write there"),
        (["--json", "MINE"], "exists and tupe did not write it"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(tmp_path: Path, capsys, argv, needle) -> None:  # noqa: ANN001
    if torch.cuda.is_available() and "cuda" in argv:
        pytest.skip("CUDA is available here")
    from tupe.scripts import run_script

    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "results"}\n')
    argv = [{"FOLDER": str(tmp_path), "MINE": str(mine)}.get(a, a) for a in argv]
    script = load_script("benchmarks/packing_step.py")
    argv += ["--cache-dir", str(tmp_path / "cache")]
    assert run_script(script.main, argv, prog="packing_step.py") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("packing_step.py: error:") and "\n" not in err and needle in err, err
    assert not (tmp_path / "cache").exists() and mine.read_text() == '{"my": "results"}\n'
