"""Run folders are owned and locked; disk-full and I/O errors are one line naming the path and what was kept."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import assert_user_error, pretrain_args, run_cli, subprocess_env


def _enospc(*a: object, **k: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.slow
def test_overwrite_removes_only_what_tupe_wrote(
    rel_corpus, rel_tokenizer, rel_cache, tmp_path, capsys
) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=2)
    assert run_cli(args, capsys)[0] == 0
    (out / "NOTES.md").write_text("my notes\n")
    (out / "analysis").mkdir()
    (out / "analysis" / "fig.png").write_bytes(b"png")
    (out / "glue-sst2").mkdir()
    (out / "glue-sst2" / "results.json").write_text("{}")
    code, _, err = run_cli([*args, "--overwrite"], capsys)
    assert code == 0, err
    assert "kept 3 file(s) tupe did not write" in err and "NOTES.md" in err
    assert (out / "NOTES.md").read_text() == "my notes\n"
    assert (out / "analysis" / "fig.png").read_bytes() == b"png"
    assert (out / "glue-sst2" / "results.json").read_text() == "{}"
    assert (out / "model.safetensors").is_file()
    # the record names every entry tupe wrote, and nothing else
    recorded = set(json.loads((out / "tupe_files.json").read_text())["files"])
    on_disk = {p.name for p in out.iterdir()} - {".lock", ".lock.info", "tupe_files.json"}
    assert on_disk - recorded == {"NOTES.md", "analysis", "glue-sst2"}
    assert {"tupe_run.json", "metrics.jsonl", "README.md", "model.safetensors", "checkpoint-2"} <= recorded

    # a folder from before the record (none): the known-names rule, foreign files still kept
    (out / "tupe_files.json").unlink()
    code, _, err = run_cli([*args, "--overwrite"], capsys)
    assert code == 0 and "kept 3 file(s) tupe did not write" in err, err
    assert (out / "NOTES.md").read_text() == "my notes\n" and (out / "tupe_files.json").is_file()


def test_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(
    rel_corpus,
    rel_tokenizer,
    rel_cache,
    tmp_path,
    capsys,  # noqa: ANN001
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    code = (
        "import sys,time; from tupe.io.files import folder_lock\n"
        "with folder_lock(sys.argv[1], 'tupe pretrain'):\n print('locked', flush=True); time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=2)
        code_, _, err = run_cli(args, capsys)
        assert_user_error(code_, err, "another `tupe pretrain` is writing here", f"pid {proc.pid}")
        assert list(out.iterdir()) and not (out / "tupe_run.json").exists()  # refused before any work
        proc.send_signal(signal.SIGKILL)  # the holder dies: its lock is stale and must be taken over
        proc.wait()
        code_, _, err = run_cli(args, capsys)
        assert code_ == 0, err
    finally:
        proc.kill()


def test_glue_refuses_a_second_writer(tmp_path) -> None:  # noqa: ANN001
    from tupe.errors import TupeError
    from tupe.finetuning.glue.finetune import run_grid
    from tupe.io.files import folder_lock

    with folder_lock(tmp_path / "g", "tupe glue"):
        with pytest.raises(TupeError, match="another `tupe glue` is writing here"):
            run_grid(tmp_path / "model", None, tmp_path / "g")  # type: ignore[arg-type]


@pytest.mark.slow
def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(
    rel_corpus,
    rel_tokenizer,
    rel_cache,
    tmp_path,
    capsys,
    monkeypatch,  # noqa: ANN001
) -> None:
    from transformers import Trainer

    from tupe.training.checkpointing import find_latest_checkpoint, verify_checkpoint

    out = tmp_path / "run"
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=4, save_steps=2, eval_steps=4)
    calls = {"n": 0}
    original = Trainer._save_optimizer_and_scheduler

    def second_save_fails(self, output_dir):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 2:
            _enospc()
        return original(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", second_save_fails)
    code, _, err = run_cli(args, capsys)
    line = assert_user_error(
        code, err, "No space left on device", "checkpoint-4 was not saved", "checkpoint-2"
    )
    assert str(out) in line
    latest = find_latest_checkpoint(out, log=None)
    assert latest is not None and latest.name == "checkpoint-2" and verify_checkpoint(latest) is None
    assert not list(out.glob(".tmp-checkpoint-*"))
    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", original)
    code, _, err = run_cli([*args, "--resume"], capsys)  # space freed: the run continues
    assert code == 0, err


@pytest.mark.slow
def test_disk_full_while_saving_the_final_model(
    rel_corpus, rel_tokenizer, rel_cache, tmp_path, capsys, monkeypatch
) -> None:  # noqa: ANN001
    from transformers import Trainer

    out = tmp_path / "run"
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=2, save_steps=2, eval_steps=2)
    original = Trainer.save_model

    def fails(self, output_dir=None, _internal_call=False):  # noqa: ANN001, ANN202
        if str(output_dir).endswith(".tmp-final"):
            _enospc()
        return original(self, output_dir, _internal_call)

    monkeypatch.setattr(Trainer, "save_model", fails)
    code, _, err = run_cli(args, capsys)
    assert_user_error(code, err, "No space left on device", "final model was not saved", "checkpoints")
    assert (out / "checkpoint-2").is_dir() and not (out / ".tmp-final").exists()
    monkeypatch.setattr(Trainer, "save_model", original)
    code, _, err = run_cli([*args, "--resume"], capsys)
    assert code == 0, err
    assert (out / "model.safetensors").is_file()


def test_disk_full_while_writing_tensorboard_names_the_folder_and_what_was_kept(
    rel_corpus, rel_tokenizer, rel_cache, tmp_path, capsys, monkeypatch
) -> None:  # noqa: ANN001
    from torch.utils.tensorboard import SummaryWriter

    out = tmp_path / "run"
    args = pretrain_args(
        rel_corpus,
        rel_tokenizer,
        rel_cache,
        out,
        max_steps=4,
        save_steps=2,
        eval_steps=4,
        report_to="tensorboard",
    )
    original = SummaryWriter.add_scalar

    def full_from_step_3(self, tag, value, global_step=None, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if global_step is not None and global_step >= 3:
            _enospc()
        return original(self, tag, value, global_step, *a, **k)

    monkeypatch.setattr(SummaryWriter, "add_scalar", full_from_step_3)
    code, _, err = run_cli(args, capsys)
    line = assert_user_error(
        code,
        err,
        f"cannot write {out / 'tensorboard'}: No space left on device",
        "TensorBoard logging failed",
    )
    assert (
        f"the latest checkpoint {out / 'checkpoint-2'} and metrics.jsonl are kept" in line
        and "--resume" in line
    )
    assert (out / "checkpoint-2").is_dir() and (out / "metrics.jsonl").is_file()
    monkeypatch.setattr(SummaryWriter, "add_scalar", original)
    code, _, err = run_cli([*args, "--resume"], capsys)  # space freed: the run continues
    assert code == 0, err


def test_atomic_write_on_a_full_disk_keeps_the_old_content(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    import tupe.io.files as files
    from tupe.errors import TupeError

    path = tmp_path / "results.json"
    files.atomic_write_text(path, "old\n")
    monkeypatch.setattr(files.os, "fsync", _enospc)
    with pytest.raises(
        TupeError, match=r"cannot write .*results.json: No space left on device; its previous"
    ):
        files.atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_disk_full_while_caching_names_the_cache(
    rel_corpus, rel_tokenizer, tmp_path, capsys, monkeypatch
) -> None:  # noqa: ANN001
    import tupe.data.packing as packing

    def encode_fails(corpus, tokenizer, path, **kw):  # noqa: ANN001, ANN003, ANN202
        Path(path).write_bytes(b"partial")
        _enospc()

    monkeypatch.setattr(packing, "encode_to_stream", encode_fails)
    args = pretrain_args(rel_corpus, rel_tokenizer, tmp_path / "cache", tmp_path / "run", max_steps=2)
    code, _, err = run_cli([*args, "--prepare-only"], capsys)
    assert_user_error(code, err, "No space left on device", "data cache entry", str(tmp_path / "cache"))
    assert not [p for p in (tmp_path / "cache" / "packed").iterdir()]  # no partial entry left


def test_cr_only_glue_tsv_is_read_as_rows(tmp_path) -> None:  # noqa: ANN001
    from tupe.finetuning.glue.tasks import get_task, read_tsv

    rows = ["sentence\tlabel"] + [f"word number {i}\t{i % 2}" for i in range(50)]
    path = tmp_path / "train.tsv"
    path.write_bytes(("\r".join(rows) + "\r").encode())
    split = read_tsv(get_task("SST-2"), path)
    assert len(split) == 50


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_overwrite_follows_the_record_of_what_tupe_wrote(tmp_path) -> None:  # noqa: ANN001
    from tupe.training.run_folder import _wipe, read_written, record_written

    out = tmp_path / "run"
    out.mkdir()
    record_written(out, "tupe_run.json", "metrics.jsonl", "checkpoint-2", "my-own-output.bin")
    for name in ("tupe_run.json", "metrics.jsonl", "my-own-output.bin", ".metrics.jsonl.tupe-a1b2c3d4.tmp"):
        (out / name).write_text("tupe\n")
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "model.safetensors").write_text("w")
    (out / ".lock").write_text("")
    # not recorded, even under names tupe uses elsewhere: kept
    for name in ("NOTES.md", "config.json", ".notes.swp"):
        (out / name).write_text("mine\n")
    (out / "checkpoint-9").mkdir()
    kept = _wipe(out)
    assert sorted(kept) == [".notes.swp", "NOTES.md", "checkpoint-9/", "config.json"]
    assert _names(out) == {
        ".lock",
        ".notes.swp",
        "NOTES.md",
        "checkpoint-9",
        "config.json",
        "tupe_files.json",
    }
    assert read_written(out) == set()  # emptied last: the next run records its own files


def test_a_folder_without_record_falls_back_to_known_names_and_is_adopted(tmp_path) -> None:  # noqa: ANN001
    from tupe.training.run_folder import _wipe, read_written, record_written

    out = tmp_path / "old-run"
    out.mkdir()
    for name in ("tupe_run.json", "config.json", "model.safetensors", "NOTES.md"):
        (out / name).write_text("x")
    (out / "checkpoint-4").mkdir()
    assert sorted(_wipe(out)) == ["NOTES.md"] and _names(out) == {"NOTES.md", "tupe_files.json"}

    for name in ("tupe_run.json", "config.json"):
        (out / name).write_text("x")
    (out / "tupe_files.json").unlink()
    record_written(out, "metrics.jsonl")  # a newer tupe resuming an older run adopts what the old rule claims
    assert read_written(out) == {"tupe_run.json", "config.json", "metrics.jsonl"}


def test_a_file_tupe_did_not_write_but_would_overwrite_stops_the_run_first(tmp_path) -> None:  # noqa: ANN001
    from tupe.errors import TupeError
    from tupe.training.run_folder import check_out_dir, record_written

    out = tmp_path / "run"
    out.mkdir()
    record_written(out, "tupe_run.json")
    (out / "tupe_run.json").write_text("{}")
    (out / "README.md").write_text("my own readme\n")  # where the model card will go
    with pytest.raises(
        TupeError, match=r"holds 'README.md', which tupe did not write there but would overwrite"
    ):
        check_out_dir(out, {}, resume=True, overwrite=False)
    with pytest.raises(TupeError, match="README.md"):
        check_out_dir(out, {}, resume=False, overwrite=True)
    (out / "README.md").rename(out / "NOTES.md")
    assert check_out_dir(out, {}, resume=True, overwrite=False) == "resume"


def test_a_folder_left_with_only_foreign_files_by_overwrite_starts_fresh(tmp_path) -> None:  # noqa: ANN001
    from tupe.training.run_folder import _wipe, check_out_dir, record_written

    out = tmp_path / "run"
    out.mkdir()
    record_written(out, "tupe_run.json")
    (out / "tupe_run.json").write_text("{}")
    (out / "NOTES.md").write_text("mine")
    _wipe(out)  # then killed before the new run wrote anything
    assert check_out_dir(out, {}, resume=False, overwrite=False) == "fresh"
    (out / "tupe_files.json").unlink()  # without a record the same folder is a foreign one
    from tupe.errors import TupeError

    with pytest.raises(TupeError, match="is not a tupe run folder"):
        check_out_dir(out, {}, resume=False, overwrite=True)


def test_every_file_a_saved_model_writes_is_a_known_name(tmp_path) -> None:  # noqa: ANN001
    """The known names (folders without a record) cover the model folder's remote-code copies of tupe's modules."""
    from tupe import TupeForMaskedLM
    from tupe.training.run_folder import is_run_artifact

    from ..helpers import tiny_config

    TupeForMaskedLM(tiny_config("tupe-a")).save_pretrained(tmp_path)
    assert "kernel_registry.py" in _names(tmp_path)
    assert sorted(name for name in _names(tmp_path) if not is_run_artifact(name)) == []
