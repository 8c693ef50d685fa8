"""Every bad input of `bad_inputs.CASES`, through the real CLI (`tupe.cli.main`): exit code 2, exactly one
`tupe COMMAND: error: ...` line naming the file/line/value, and no traceback. Plus the `--debug` escape hatch and
the inputs that are accepted with a warning when the user asks for it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .bad_inputs import API_CASES, CASES, ApiCase, Case, Ctx
from .conftest import assert_user_error, run_cli


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, ctx: Ctx, capsys) -> None:  # noqa: ANN001
    try:
        argv = case.make(ctx)
        code, _, err = run_cli(argv, capsys)
    finally:
        for fn in ctx.cleanup:
            fn()
    assert_user_error(code, err, *case.needles)


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_bad_python_input(case: ApiCase, ctx: Ctx) -> None:
    with pytest.raises(case.error) as info:
        case.call(ctx)
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in case.needles), message


def test_every_case_is_a_row_of_the_docs_table() -> None:
    """docs/reliability.md lists every case (regenerate its rows with `python -m tests.reliability.bad_inputs`)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text(encoding="utf-8")
    missing = [c.id for c in CASES if f"test_bad_input[{c.id}]" not in doc]
    missing += [c.id for c in API_CASES if f"test_bad_python_input[{c.id}]" not in doc]
    assert missing == []


def test_debug_flag_shows_the_traceback(ctx: Ctx) -> None:
    from tupe.cli import main
    from tupe.errors import TupeError

    argv = [str(a) for a in ctx.pretrain(corpus=ctx.tmp / "nope.txt")]
    with pytest.raises(TupeError, match="corpus path not found"):
        main([argv[0], "--debug", *argv[1:]])


def test_shared_artefacts_were_not_modified(finished_run: Path, glue_assets) -> None:  # noqa: ANN001
    """The cases copy what they break; the shared run and model must still be whole."""
    from tupe.io.checkpoints import check_model_weights
    from tupe.training.checkpointing import verify_checkpoint

    model, data = glue_assets
    check_model_weights(model)
    assert (data / "SST-2" / "train.tsv").read_text().startswith("sentence\tlabel")
    assert all(verify_checkpoint(p) is None for p in finished_run.glob("checkpoint-*"))


@pytest.mark.slow
def test_skip_bad_text_trains_with_one_warning_per_file(ctx: Ctx, capsys) -> None:  # noqa: ANN001
    corpus = Path(shutil.copytree(ctx.corpus, ctx.tmp / "corpus"))
    (corpus / "latin.txt").write_bytes("ok line\ncaf\xe9 au lait\nmore\n".encode("latin-1"))
    (corpus / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    code, _, err = run_cli(ctx.pretrain(corpus=corpus, skip_bad_text=True), capsys)
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: corpus file")]
    assert len(warnings) == 2, err  # one per bad file although the corpus is read twice (BPE and packing)
    assert any(
        "latin.txt: skipped 1 line(s) that are not UTF-8 (first at byte offset 11)" in w for w in warnings
    )
    assert any("image.png: a PNG image, not text; file skipped" in w for w in warnings)


def test_resume_skips_a_corrupt_latest_checkpoint_with_a_warning(ctx: Ctx, capsys) -> None:  # noqa: ANN001
    """A checkpoint damaged after it was written (a flipped byte: same size, valid header) is caught by its
    manifest's SHA-256; --resume names it and continues from the previous one."""
    run = Path(shutil.copytree(ctx.finished_run, ctx.tmp / "run"))
    (run / "model.safetensors").unlink()
    weights = run / "checkpoint-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    code, _, err = run_cli(ctx.pretrain(out=run, resume=True), capsys)
    assert code == 0, err
    assert "skipping" in err and "checkpoint-4: model.safetensors does not match its SHA-256" in err
    assert (run / "model.safetensors").is_file()


def test_sequence_longer_than_the_model_allows_python_api() -> None:
    import torch

    from tupe import TupeConfig, TupeForMaskedLM

    for scheme in ("bert-a", "tupe-a", "tupe-r", "rope"):
        cfg = TupeConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=8, position_scheme=scheme,
        )  # fmt: skip
        with pytest.raises(ValueError, match="input length 9 exceeds max_position_embeddings 8"):
            TupeForMaskedLM(cfg)(torch.randint(5, 64, (1, 9)))


def test_a_failing_library_thread_is_one_warning_line_not_glued_to_the_error(monkeypatch, capfd) -> None:  # noqa: ANN001
    """A library's background thread that raises while a command fails: Python would write "Exception in thread"
    and a traceback in pieces, which could land inside the command's error line. The CLI reports it as one warning
    line of its own, and the error stays one whole line."""
    import importlib
    import threading

    from tupe.cli import COMMANDS, main
    from tupe.errors import TupeError

    module = importlib.import_module(COMMANDS["report"][0])

    def run(args: object) -> int:
        worker = threading.Thread(target=lambda: 1 / 0, name="Thread-prefetch")
        worker.start()
        worker.join()
        raise TupeError("results.json: the error the user must see")

    monkeypatch.setattr(module, "run", run)
    hook = threading.excepthook
    assert main(["report", "somewhere"]) == 2
    assert threading.excepthook is hook  # restored after the command
    err = capfd.readouterr().err
    assert err.splitlines() == [
        "tupe report: warning: a background thread (Thread-prefetch) failed: division by zero",
        "tupe report: error: results.json: the error the user must see",
    ]


def test_a_rust_panic_is_one_error_line(monkeypatch, capfd) -> None:  # noqa: ANN001
    """A panic inside the tokenizers library (pyo3's PanicException, a BaseException that no `except Exception`
    catches) on a pattern the static check cannot see: one error line, no Python traceback, no Rust stack."""
    import importlib

    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    from tupe.cli import COMMANDS, main

    tok = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(
        Regex("(a|aa)+$"), "isolated"
    )  # no nested repetition, still a panic
    module = importlib.import_module(COMMANDS["report"][0])
    monkeypatch.setattr(module, "run", lambda args: tok.encode("a" * 50_000 + "b"))
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    assert main(["report", "somewhere"]) == 2
    err = capfd.readouterr().err
    errors = [ln for ln in err.splitlines() if ": error: " in ln]
    assert errors == [
        "tupe report: error: the tokenizers library failed on this input (a panic in its Rust code: Onig: Regex "
        "search error: retry-limit-in-match over); check the tokenizer's tokenizer.json"
    ], err
    assert "Traceback" not in err and "stack backtrace" not in err, err


def test_report_to_an_integration_not_installed_is_one_line_before_any_work(
    ctx: Ctx, capsys, monkeypatch
) -> None:  # noqa: ANN001
    """Issue 49, item 15: `--report-to wandb` without wandb was a 25-line traceback from inside the Trainer, after
    the data and the model were loaded, and `tupe pretrain` had already written tupe_run.json (the corrected
    rerun was then refused as "already holds this run"). Now one line, before any file is made."""
    from transformers.integrations import integration_utils

    from .bad_inputs import _finetune, _write

    monkeypatch.setattr(
        integration_utils, "is_wandb_available", lambda: False
    )  # whether installed here or not
    train = _write(
        ctx.tmp / "cls.jsonl", '{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n'
    )
    for argv, out in (
        (ctx.pretrain(report_to="wandb"), ctx.tmp / "out"),
        (ctx.glue("--report-to", "wandb"), ctx.tmp / "g"),
        ([*_finetune(ctx, "classification", train), "--report-to", "wandb"], ctx.tmp / "ft"),
    ):
        code, _, err = run_cli(argv, capsys)
        assert_user_error(code, err, "--report-to wandb: wandb is not installed (pip install wandb)")
        assert not out.exists(), (
            argv
        )  # no run folder, no tupe_run.json: the rerun without the flag starts clean
