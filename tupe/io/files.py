"""Durable files: atomic writes (old or new content, never half), fsync, hashing, one writer per folder.

Why: runs are killed and machines pre-empted; a reader (a resumed run, `tupe report`) must never see half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tupe.errors import TupeError


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _fsync(path: str | os.PathLike) -> None:
    """fsync a file or folder; a no-op where that is impossible (folders on Windows, vanished files)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside `path` durable."""
    _fsync(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file next to `path`, fsync it, rename it over `path`, fsync the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; what we publish is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def json_clean(x: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_clean(v) for v in x]
    return x


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 1, clean: bool = False) -> None:
    """`atomic_write_text` of `obj` as JSON; `clean` writes NaN/inf as null (strict JSON)."""
    if clean:
        obj = json_clean(obj)
    atomic_write_text(path, json.dumps(obj, indent=indent, allow_nan=not clean) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    return sha256_files([Path(path)])


def sha256_files(files: Iterable[str | os.PathLike]) -> str:
    """SHA-256 of the files' bytes, concatenated in the given order."""
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, command: str) -> Iterator[None]:
    """One writer per output folder (`folder/.lock`, an OS lock that dies with its process, so never stale).

    Two commands writing one folder would train the same runs and overwrite each other's files.
    """
    from filelock import FileLock, Timeout

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / ".lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise TupeError(f"{folder}: another `{command}` is writing here; wait for it") from None
    try:
        yield
    finally:
        lock.release()


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file and folder under `path`, so the rename that publishes it never exposes unwritten data."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            _fsync(os.path.join(root, name))
        _fsync(root)
