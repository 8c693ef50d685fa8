"""benchmarks/glue_padding_free.py (issue 36's padded vs padding-free GLUE step benchmark) runs, resumes and
measures the padding share as padded batches hold it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers import load_script


def _script():  # noqa: ANN202
    return load_script("benchmarks/glue_padding_free.py")


def test_the_padding_share_is_the_pad_tokens_of_padded_batches() -> None:
    import torch
    from transformers import DataCollatorWithPadding

    from ..glue.fixtures import make_tokenizer

    tok = make_tokenizer()
    texts = ["the film was good .", "a", "the cat seems grim and the dog looked happy .", "warm day", "b c"]
    enc = [tok(t) for t in texts]
    batches = [[0, 2], [1, 3, 4]]
    pad = DataCollatorWithPadding(tok)
    padded = [pad([dict(enc[i]) for i in b]) for b in batches]
    pads = sum(int((p["attention_mask"] == 0).sum()) for p in padded)
    total = sum(p["input_ids"].numel() for p in padded)
    lengths = [len(e["input_ids"]) for e in enc]
    assert _script().padding_share(lengths, batches) == pads / total
    assert torch.equal(padded[0]["attention_mask"].sum(1), torch.tensor([lengths[0], lengths[2]]))


def test_glue_padding_free_benchmark_runs_and_resumes(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from ..glue.fixtures import write_task

    write_task(tmp_path / "glue", "CoLA")
    write_task(tmp_path / "glue", "SST-2")
    out = tmp_path / "out.json"
    argv = ["--data-dir", str(tmp_path / "glue"), "--tasks", "CoLA,SST-2", "--steps", "1", "--warmup", "0",
            "--batch-size", "8", "--json", str(out)]  # fmt: skip
    result = _script().main(argv)
    assert json.loads(out.read_text()) == result
    cola = result["CoLA/mini/tupe-a/batch8"]
    assert 0 < cola["padding_share"] < 1 and cola["examples"] == 48
    assert (
        set(cola["examples_per_s"]) == {"padded", "padding-free"} and cola["ratio_padding_free_to_padded"] > 0
    )
    assert cola["batch_tokens_timed"]["padding-free"] < cola["batch_tokens_timed"]["padded"]
    assert "(target 1.5x)" in capsys.readouterr().out
    assert _script().main(argv) == result  # both tasks there: skipped
    assert capsys.readouterr().err.count("skipped") == 2


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--steps", "0"], "argument --steps: must be an integer >= 1, got 0"),
        (["--batch-size", "0"], "argument --batch-size"),
        (["--device", "cuda"], "--device cuda: no CUDA device is available"),
        (["--json", "FOLDER"], "is a folder, expected a file"),
        (["--json", "/proc/nope.json"], "--json /proc/nope.json: cannot write there"),
        (["--json", "MINE"], "holds something other than this script's results"),
        (["--json", "BROKEN"], "not valid JSON"),
        (["--tasks", "SST-9"], "unknown GLUE task 'SST-9'"),
        (["--data-dir", "NOPE"], "--data-dir"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(tmp_path: Path, capsys, argv, needle) -> None:  # noqa: ANN001
    """Issue 49, item 15: --steps 0, --batch-size 0, --device cuda on a CPU, a folder or /proc as --json ended
    in tracebacks."""
    import torch

    from tupe.scripts import run_script

    from ..glue.fixtures import write_task

    if torch.cuda.is_available() and "cuda" in argv:
        pytest.skip("CUDA is available here")
    write_task(tmp_path / "glue", "SST-2")
    mine, broken = tmp_path / "mine.json", tmp_path / "broken.json"
    mine.write_text('{"my": "results"}\n')
    broken.write_text('{"SST-2/mini": {"task": ')
    names = {"FOLDER": tmp_path, "MINE": mine, "BROKEN": broken, "NOPE": tmp_path / "nope"}
    argv = ["--data-dir", str(tmp_path / "glue"), "--tasks", "SST-2", *(str(names.get(a, a)) for a in argv)]
    assert run_script(_script().main, argv, prog="glue_padding_free.py") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glue_padding_free.py: error:") and "\n" not in err and needle in err, err
    assert mine.read_text() == '{"my": "results"}\n'
