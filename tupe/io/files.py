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
from collections.abc import Callable, Iterable, Iterator
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
    """Write `text` (UTF-8) to a temporary file next to `path`, fsync it, rename it over `path`, fsync the folder."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """`atomic_write_text` for bytes (figures): a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{path.name}.tupe-", suffix=".tmp", dir=path.parent
        )  # outputs.TEMP_OF
    except OSError as err:
        raise write_error(path, err, "nothing was written") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; what we publish is an ordinary file
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        kept = "its previous content is kept" if path.exists() else "nothing was written"
        raise write_error(path, err, kept) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_files(folder: str | os.PathLike, files: dict[str, bytes]) -> None:
    """Write several files of one result all or nothing: each to its temporary file beside it (fsynced) first, and
    only when every one is complete are they renamed into place (a rename needs no space). A failure (a full
    disk) removes the temporary files and leaves every earlier version as it was: one `WriteError` naming the file
    that failed and saying so."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[str, Path]] = []
    try:
        for name, data in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.tupe-", suffix=".tmp", dir=folder)  # outputs.TEMP_OF
            staged.append((name, Path(tmp)))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o666 & ~_UMASK)
    except BaseException as err:
        for _, tmp in staged:
            tmp.unlink(missing_ok=True)
        if not isinstance(err, OSError):
            raise
        name = staged[-1][0] if staged else next(iter(files), "")
        existed = [n for n in files if (folder / n).exists()]
        kept = f"none of its {len(files)} files was written" + (
            f"; the previous {', '.join(existed)} kept as they were" if existed else ""
        )
        raise write_error(folder / name, err, kept) from None
    for name, tmp in staged:
        os.replace(tmp, folder / name)
    fsync_dir(folder)


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


LOCK_NAME = ".lock"
LOCK_INFO_NAME = ".lock.info"  # who holds the lock: pid, host, command, start time (JSON)


def _lock_holder(info_path: Path) -> tuple[str, str | None]:
    """(description of the lock's holder, its `tupe COMMAND` if known), read without blocking (a FIFO or a huge
    file in its place is 'holder unknown')."""
    from tupe.io.reading import read_json

    try:
        info = read_json(info_path, "lock holder record", 64 * 1024)
        command = info.get("tool") if isinstance(info.get("tool"), str) else None
        return f"pid {info['pid']} on {info['host']}, started {info['started']}: {info['command']}", command
    except (TupeError, KeyError, TypeError):
        return "holder unknown", None


@contextlib.contextmanager
def _held(lock_path: Path, info_path: Path, command: str, refusal: str) -> Iterator[None]:
    """Hold the OS (flock) lock `lock_path` and describe the holder in `info_path`, or refuse at once with
    `refusal` followed by the holder's description."""
    import socket
    import sys
    import time

    from filelock import FileLock, Timeout

    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder, holder_command = _lock_holder(info_path)
        if holder_command is not None:  # name the command that holds it, not the one refused
            refusal = refusal.replace(f"`{command}`", f"`{holder_command}`")
        raise TupeError(f"{refusal} ({holder}); wait for it or stop it") from None
    except OSError as err:  # the lock file cannot be made (permissions, disk full)
        raise write_error(lock_path, err, "nothing was written") from None
    try:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(["tupe", *sys.argv[1:]]) if sys.argv[1:] else command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "tool": command,
        }
        try:
            atomic_write_text(info_path, json.dumps(info) + "\n")
        except OSError:
            pass  # the lock itself holds; only the description of its holder is missing
        yield
    finally:
        # A finished command leaves no lock files: removed while the lock is still held, so a command waiting on
        # the old file finds it unlinked once it gets it and starts again on a new one (filelock checks that)
        for path in (info_path, lock_path):
            with contextlib.suppress(OSError):
                path.unlink()
        lock.release()


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, command: str) -> Iterator[None]:
    """One writer per output folder: `folder/.lock` is an OS (flock) lock that the kernel releases when its process
    dies, so a lock left by a killed run is never stale, it is simply taken over; `folder/.lock.info` names the
    holder (pid, host, command line), so a second writer is refused at once with one line naming the first.

    Two commands writing one folder would train the same runs and overwrite each other's files.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise TupeError(f"{folder} is a file, not a folder") from None
    refusal = f"{folder}: another `{command}` is writing here"
    with _held(folder / LOCK_NAME, folder / LOCK_INFO_NAME, command, refusal):
        yield


def file_lock_names(path: str | os.PathLike) -> tuple[Path, Path]:
    """The lock and holder-info files of a single output file: hidden `.NAME.lock` and `.NAME.lock.info` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock"), path.with_name(f".{path.name}.lock.info")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, command: str) -> Iterator[None]:
    """One writer per output file (`tupe evaluate --json`), as `folder_lock` is per folder: locking the file's
    folder instead would refuse two evaluations writing different files of one results folder."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise TupeError(f"{path}: {path.parent} is a file, not a folder") from None
    lock_path, info_path = file_lock_names(path)
    with _held(lock_path, info_path, command, f"{path}: another `{command}` is writing it"):
        yield


class WriteError(TupeError, OSError):
    """A write that failed (disk full, permissions, I/O error), as one line naming the path and what was kept; an
    `OSError` too, so code that handles failed writes still does."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "write failed"


_WRITE_FAILURE_MARKERS = (
    "no space left",
    "file write failed",
    "storagefull",
    "ioerror",
    "disk quota",
    "file too large",
    # torch.save's C++ zip writer on a full disk: "[enforce fail at inline_container.cc:672] . unexpected pos
    # 9472 vs 9364", "basic_ios::clear: iostream error"
    "inline_container",
    "iostream error",
    "unexpected pos",
)
_REASONS = ("No space left on device", "File too large", "Disk quota exceeded", "Input/output error")


def is_write_failure(err: BaseException) -> bool:
    """An `OSError`, or the way torch.save (RuntimeError from its C++ writer) and safetensors (SafetensorError)
    report a failed write (disk full, file too large, I/O error)."""
    if isinstance(err, OSError):
        return True
    text = str(err).lower()
    return any(m in text for m in _WRITE_FAILURE_MARKERS)


def _free_bytes(path: str | os.PathLike) -> int | None:
    p = Path(path)
    for candidate in (p, *p.parents):
        if candidate.exists():
            try:
                st = os.statvfs(candidate)
            except OSError:
                return None
            return st.f_bavail * st.f_frsize
    return None


def _reason(err: BaseException, path: str | os.PathLike) -> str:
    """The failure in words: the OS's own (`strerror`), a known phrase inside a library's message, or, for the
    C++ writers' cryptic messages, 'No space left on device' when the file system is indeed (nearly) full."""
    strerror = getattr(err, "strerror", None)
    if strerror:
        return strerror
    text = " ".join(str(err).split())
    for phrase in _REASONS:
        if phrase.lower() in text.lower():
            return phrase
    free = _free_bytes(path)
    if free is not None and free < (4 << 20):
        return f"No space left on device ({free} bytes free)"
    return text[:200]


def write_error(
    path: str | os.PathLike, err: BaseException, kept: str = "the previous version is kept"
) -> WriteError:
    """A one-line error for a failed write (disk full, permissions): the path, the reason and what was kept."""
    if isinstance(err, WriteError):
        return err
    return WriteError(f"cannot write {path}: {_reason(err, path)}; {kept}")


def _failed_path(err: BaseException, path: str | os.PathLike) -> str | os.PathLike:
    """The file the failure names, if it is one of the output's (under `path`'s folder): a copy's error can name
    its *source* (tupe's own modeling_tupe.py, copied into a checkpoint), which is not what failed to be written."""
    root = Path(path).absolute().parent
    for name in (getattr(err, "filename2", None), getattr(err, "filename", None)):
        if name and Path(os.fsdecode(name)).absolute().is_relative_to(root):
            return _published(Path(os.fsdecode(name)).absolute(), root)
    return path


def _published(file: Path, root: Path) -> Path:
    """A file of a staging folder (`ROOT/.tmp-NAME/NAME/...`, written there and renamed into place) by the name it
    is published under (`ROOT/NAME/...`), the one the user knows; other files unchanged."""
    parts = file.relative_to(root).parts
    if len(parts) >= 2 and parts[0] == f".tmp-{parts[1]}":
        return root.joinpath(*parts[1:])
    return file


@contextlib.contextmanager
def failed_writes_reported(
    path: str | os.PathLike,
    kept: str | Callable[[], str],
    cleanup: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Turn a failed write inside the block (`is_write_failure`; `TupeError`s pass unchanged) into one
    `WriteError` naming the file (the exception's own `filename` where it is an output file, else `path`) and what
    was kept (`kept` may be a function, for a message that depends on the state after the failure). `cleanup`
    (removing partial files) runs first; other exceptions pass through untouched."""
    try:
        yield
    except Exception as err:
        if isinstance(err, TupeError) or not is_write_failure(err):
            raise
        if cleanup is not None:
            cleanup()
        where = _failed_path(err, path)
        raise write_error(where, err, kept() if callable(kept) else kept) from None


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file and folder under `path`, so the rename that publishes it never exposes unwritten data."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            _fsync(os.path.join(root, name))
        _fsync(root)
