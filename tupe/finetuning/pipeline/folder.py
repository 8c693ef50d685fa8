"""The grid's folder as a command holds it: under its lock, left as found by a refusal before any run finished
(`grid_folder`), and SIGTERM or Ctrl-C turned into a line saying what was kept (`stop_on_sigterm`)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from tupe.errors import TupeError


@contextlib.contextmanager
def grid_folder(out_dir: Path, command: str) -> Iterator[None]:
    """`out_dir` under `command`'s lock (`folder_lock`). A refusal (`TupeError`) raised before any run of the grid
    has finished leaves the folder as the command found it: what it made there this time (the new top-level
    entries it owns, such as a half-made `.tmp-converted-bert-a`, its names added to `tupe_files.json`, that record
    itself if it made it) is removed, nothing else is touched, and a folder it created is removed once empty."""
    from tupe.io.files import folder_lock

    existed = out_dir.exists()
    try:
        with folder_lock(out_dir, command):
            before = {p.name for p in out_dir.iterdir()}
            try:
                yield
            except TupeError:
                if not any(out_dir.glob("runs/*/result.json")):
                    _forget_what_was_made(out_dir, command, before)
                raise
    except TupeError:
        if not existed:
            with contextlib.suppress(OSError):
                out_dir.rmdir()  # only if empty: the lock's own files go with the lock
        raise


def _forget_what_was_made(out_dir: Path, command: str, before: set[str]) -> None:
    """Remove the top-level entries of `out_dir` that `command` made since `before` (the names there then) and
    its new names in the folder's record of tupe's files (the record too, if it was not there before)."""
    from tupe.io.outputs import RECORD_NAME, OutputFolder, read_record, update_record

    outputs = OutputFolder(out_dir, command)
    for entry in sorted(out_dir.iterdir()):
        if entry.name not in before and outputs.owns(entry.name):
            outputs.remove(entry.name)
    if RECORD_NAME not in before:
        (out_dir / RECORD_NAME).unlink(missing_ok=True)
        return
    gone = [n for n, who in (read_record(out_dir) or {}).items() if who == command]
    gone = [n for n in gone if n not in before and not os.path.lexists(out_dir / n)]
    if gone:
        update_record(out_dir, drop=gone)


class _Stopped(KeyboardInterrupt):
    """SIGTERM turned into an interruption, so the grid stops the way Ctrl-C stops it."""


@contextlib.contextmanager
def stop_on_sigterm(out: str | Path, command: str) -> Iterator[None]:
    """SIGTERM (a scheduler's pre-emption) and Ctrl-C: say what was kept and how to continue, then exit 143 / 130."""
    import signal
    import threading

    def on_term(signum, frame):  # noqa: ANN001, ARG001
        raise _Stopped()

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        yield
    except KeyboardInterrupt as err:
        what = "SIGTERM" if isinstance(err, _Stopped) else "Ctrl-C"
        print(
            f"{command}: stopped by {what}; the finished runs are kept in {Path(out) / 'runs'} (results.json "
            "lists them) and the run in progress is discarded: run the same command again to continue",
            file=sys.stderr,
            flush=True,
        )
        if isinstance(err, _Stopped):
            raise SystemExit(143) from None
        raise  # the command line says "interrupted" and exits 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
