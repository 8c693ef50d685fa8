"""Run the `tupe` CLI with one injected fault that SIGKILLs the process at a chosen point of checkpointing.

    python fault_runner.py MODE tupe-args...

MODE is one of
    kill-mid-write:N:NAME   the N-th time the Trainer torch.saves a file called NAME, write half of it, then SIGKILL
    kill-before-publish:N   SIGKILL just before the N-th complete checkpoint is renamed into place
    kill-mid-rotate:N       the N-th time an old checkpoint is deleted (save_total_limit), delete part of it, SIGKILL

Real kills at exact points complement the random-time kills of the tests: a checkpoint write takes milliseconds
for a tiny model, so random timing alone would rarely land inside one.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import sys


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install(mode: str) -> None:
    kind, _, rest = mode.partition(":")
    count = {"n": 0}
    if kind == "kill-mid-write":
        n_str, _, name = rest.partition(":")
        target = int(n_str)
        import torch

        real_save = torch.save

        def save(obj, f, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if isinstance(f, str | os.PathLike) and os.path.basename(os.fspath(f)) == name:
                count["n"] += 1
                if count["n"] == target:
                    buf = io.BytesIO()
                    real_save(obj, buf, *args, **kwargs)
                    data = buf.getvalue()
                    with open(f, "wb") as fh:
                        fh.write(data[: len(data) // 2])
                        fh.flush()
                        os.fsync(fh.fileno())
                    _die()
            return real_save(obj, f, *args, **kwargs)

        torch.save = save
    elif kind == "kill-before-publish":
        target = int(rest)
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if ".tmp-checkpoint-" in os.fspath(src) and re.fullmatch(
                r"checkpoint-\d+", os.path.basename(dst)
            ):
                count["n"] += 1
                if count["n"] == target:
                    _die()
            return real_replace(src, dst, *args, **kwargs)

        os.replace = replace
    elif kind == "kill-mid-rotate":
        target = int(rest)
        real_rmtree = shutil.rmtree

        def rmtree(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if re.fullmatch(r"checkpoint-\d+", os.path.basename(os.fspath(path))):
                count["n"] += 1
                if count["n"] == target:
                    for victim in ("model.safetensors", "trainer_state.json"):
                        p = os.path.join(path, victim)
                        if os.path.exists(p):
                            os.unlink(p)
                    _die()
            return real_rmtree(path, *args, **kwargs)

        shutil.rmtree = rmtree
    else:
        raise SystemExit(f"unknown fault mode {mode!r}")


if __name__ == "__main__":
    install(sys.argv[1])
    from tupe.cli import main

    sys.exit(main(sys.argv[2:]))
