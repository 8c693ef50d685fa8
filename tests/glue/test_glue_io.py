"""The pieces that make an interrupted grid safe to resume: atomic writes and one writer per output folder."""

import json
import os

import pytest

from tupe.errors import TupeError
from tupe.io.files import atomic_write_json, folder_lock


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "result.json"
    atomic_write_json(target, {"a": float("nan"), "b": [1.5]}, clean=True)
    assert json.loads(target.read_text()) == {"a": None, "b": [1.5]}  # NaN is not JSON: null

    def boom(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": None, "b": [1.5]}  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temp file left behind


def test_one_grid_per_output_folder(tmp_path):
    with folder_lock(tmp_path, "tupe glue"):
        with pytest.raises(TupeError, match=r"another `tupe glue` is writing here"):
            with folder_lock(tmp_path, "tupe glue"):
                pass
    (tmp_path / ".lock").write_text("999999999")  # a lock file left by a killed process is not a lock
    with folder_lock(tmp_path, "tupe glue"):
        pass
