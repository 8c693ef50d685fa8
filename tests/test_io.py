"""The shared I/O layer: one checkpoint loader for every command, and its one-line errors."""

from __future__ import annotations

import pytest
from transformers import BertConfig, BertForMaskedLM

from tupe import TupeForMaskedLM, TupeModel
from tupe.errors import TupeError
from tupe.io import load_model_and_tokenizer

from .helpers import tiny_config, train_test_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_test_tokenizer(["the cat sat on the mat"] * 20 + ["a dog ran past"] * 20, 300)


def test_loads_a_tupe_checkpoint_with_its_kernel_and_tokenizer(tmp_path, tokenizer):
    TupeForMaskedLM(
        tiny_config("tupe-a", vocab_size=len(tokenizer), attention_kernel="fold")
    ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, tok = load_model_and_tokenizer(tmp_path)
    assert isinstance(model, TupeForMaskedLM) and not model.training
    assert model.config.attention_kernel == "fold" and len(tok) == len(tokenizer)
    encoder, _ = load_model_and_tokenizer(tmp_path, TupeModel, attn_implementation="eager")
    assert isinstance(encoder, TupeModel) and encoder.resolve_attention_kernel() == "eager"


def test_converts_a_bert_checkpoint(tmp_path, tokenizer):
    bert = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    BertForMaskedLM(bert).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, _ = load_model_and_tokenizer(tmp_path)
    assert model.config.position_scheme == "bert-a"


def test_missing_tokenizer_is_one_line(tmp_path, tokenizer):
    TupeForMaskedLM(tiny_config("bert-a", vocab_size=len(tokenizer))).save_pretrained(tmp_path)
    with pytest.raises(TupeError, match="no tokenizer files .*--tokenizer DIR"):
        load_model_and_tokenizer(tmp_path)


def test_failed_writes_reported_names_the_file_and_what_was_kept(tmp_path) -> None:  # noqa: ANN001
    """The one place that turns a failed write into a one-line `WriteError`; other errors pass untouched."""
    import errno

    from tupe.io.files import WriteError, failed_writes_reported

    cleaned = []
    state = {"kept": "nothing yet"}
    with pytest.raises(WriteError) as info:
        with failed_writes_reported(
            tmp_path / "out", lambda: state["kept"], cleanup=lambda: cleaned.append(1)
        ):
            state["kept"] = "checkpoint-4 is kept"  # the message is worded after the failure
            raise OSError(
                errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "model.safetensors")
            )
    assert str(info.value) == (
        f"cannot write {tmp_path / 'out' / 'model.safetensors'}: No space left on device; checkpoint-4 is kept"
    )
    assert cleaned == [1]
    # torch and safetensors report a full disk in their own exception types: the path given is named
    with pytest.raises(WriteError, match=r"cannot write .*out: .*file write failed.*; kept"):
        with failed_writes_reported(tmp_path / "out", "kept"):
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    for err in (ValueError("not a write"), TupeError("already one line")):
        with pytest.raises(type(err)) as info:
            with failed_writes_reported(tmp_path, "kept", cleanup=lambda: cleaned.append(2)):
                raise err
        assert info.value is err
    assert cleaned == [1]


def test_atomic_write_files_is_all_or_nothing(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Issue 38: `tupe analyze` on a full disk left some figures and said "nothing was written". Several files of
    one result are written all or nothing: the third one failing leaves the previous versions and no temp file."""
    import errno
    import os

    from tupe.io import files

    (tmp_path / "b.json").write_text("old b\n")
    real_fsync, calls = os.fsync, []

    def fsync_fails_third(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync_fails_third)
    with pytest.raises(TupeError) as err:
        files.atomic_write_files(tmp_path, {"a.png": b"a", "b.json": b"new b", "c.html": b"c"})
    assert str(err.value) == (
        f"cannot write {tmp_path / 'c.html'}: No space left on device; none of its 3 files was written; the "
        "previous b.json kept as they were"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]
    assert (tmp_path / "b.json").read_text() == "old b\n"
    monkeypatch.setattr(files.os, "fsync", real_fsync)
    files.atomic_write_files(tmp_path, {"a.png": b"a", "b.json": b"new b"})
    assert (tmp_path / "a.png").read_bytes() == b"a" and (tmp_path / "b.json").read_bytes() == b"new b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.json"]
