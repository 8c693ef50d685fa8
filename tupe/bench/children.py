"""Child processes of the GPU suite (benchmarks/gpu/run.sh): each with a time limit, its output printed and logged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def run_logged(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> dict:
    """Run `cmd`, its output both printed and appended to `log`; at `timeout` it is interrupted (SIGINT: pytest
    prints its summary, a bench child writes what it has) and killed 20 s later; if this process is interrupted
    while waiting, the child's process group is killed first. Returns exit code and times."""
    t0 = time.monotonic()
    with open(log, "a") as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                sink.write(line)
                sink.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        except BaseException:  # the suite itself interrupted or ended (SIGTERM: end_on_sigterm): no orphans
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        reader.join(timeout=5)
    return {
        "cmd": cmd,
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "wall_s": time.monotonic() - t0,
    }


def python_command() -> list[str]:
    """This interpreter, for a child process."""
    return [sys.executable]


def child_env() -> dict:
    """The environment of a child: unbuffered output, the Hub offline (the device reaches nothing), and this
    suite's own `tupe` first on the path (a benchmark script imports it from a checkout that is not installed, or
    where another copy is)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "true")
    return env


def end_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so that a child being waited for is killed before this process ends (a child
    runs in its own session and would outlive it: on the device, training on into the next call's folders)."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
