"""The PyTorch profiler without the lines its tracing library (kineto) prints on starting and stopping.

Kineto writes `USDT:... profiler_start` / `profiler_stop` (and, at lower log levels, `STAGE:` lines) straight to
file descriptor 2 from C++, whatever Python's logging says, and no setting turns the USDT lines off
(`KINETO_LOG_LEVEL` silences the others only). So while the profiler starts and while it stops, fd 2 is sent to a
temporary file; afterwards every line of it is written back except those two kinds, so a real warning or error
printed in that window still reaches the terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

# kineto's informational lines: "USDT:2026-11-23 14:23:00 24660:24660 SyncActivityProfilerHandler.cpp:52] ..."
_KINETO_NOISE = re.compile(rb"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+:\d+\] ")


@contextlib.contextmanager
def kineto_lines_dropped() -> Iterator[None]:
    """Run the block with fd 2 captured; then write back what it printed, less kineto's USDT/STAGE lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(keepends=True) if not _KINETO_NOISE.match(line)]
            if kept:
                os.write(2, b"".join(kept))


@contextlib.contextmanager
def quiet_profile(**kwargs: Any) -> Iterator[Any]:  # noqa: ANN401 - torch.profiler.profile
    """`torch.profiler.profile(**kwargs)` as a context manager, without kineto's start/stop lines. Only the
    start and the stop are captured: what the profiled code prints goes straight to the terminal."""
    from torch.profiler import profile

    prof = profile(**kwargs)
    with kineto_lines_dropped():
        prof.__enter__()
    try:
        yield prof
    finally:
        with kineto_lines_dropped():
            prof.__exit__(None, None, None)
