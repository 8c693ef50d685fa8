"""20 SIGKILLs of a tiny `tupe pretrain` (its whole process group) at random moments, start-up included, each
followed by `--resume`: the final run equals the uninterrupted one bit for bit. The lock of each killed run is
taken over by the next (the OS releases it with the process). Seeded by `TUPE_KILL_SEED` (default 0)."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from .conftest import pretrain_args, start_cli
from .test_kill_resume import TIMEOUT, _finish, _last_step, _records

SEED = int(os.environ.get("TUPE_KILL_SEED", "0"))
KILLS = int(os.environ.get("TUPE_KILLS", "20"))


@pytest.mark.slow
def test_twenty_random_sigkills_then_resume_is_bit_exact(rel_corpus, rel_tokenizer, rel_cache, tmp_path):  # noqa: ANN001
    from safetensors.torch import load_file

    from tupe.training.checkpointing import verify_checkpoint

    steps = 40
    opts = dict(max_steps=steps, save_steps=2, eval_steps=8, save_total_limit=2)
    ref = tmp_path / "ref"
    code, err = _finish(start_cli(pretrain_args(rel_corpus, rel_tokenizer, rel_cache, ref, **opts)), "ref")
    assert code == 0, err
    out = tmp_path / "run"
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, **opts)
    rng = random.Random(SEED)
    log, started = [], False
    for _ in range(KILLS):
        proc = start_cli(args + (["--resume"] if started else []), start_new_session=True)
        started = True
        before = _last_step(out)
        if rng.random() < 0.3:  # a random moment of start-up (imports, data, lock, checkpoint loading)
            time.sleep(rng.uniform(0.0, 4.0))
        else:  # a random moment shortly after a random step
            target = min(steps, before + rng.randint(1, 3))
            deadline = time.monotonic() + TIMEOUT
            while _last_step(out) < target and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.15))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=TIMEOUT)
        log.append(f"rc {proc.returncode} at step {_last_step(out)}")
        if proc.returncode == 0:
            break  # the run finished before the kill landed
    print("\n".join(log))
    code, err = _finish(start_cli(args + ["--resume"]), "final resume")
    assert code == 0, err[-3000:]
    assert _records(out) == _records(ref)
    assert [r["step"] for r in _records(out) if "loss" in r] == list(range(1, steps + 1))
    a, b = load_file(ref / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert verify_checkpoint(out / f"checkpoint-{steps}") is None
    assert not list(out.glob(".tmp-checkpoint-*"))
    assert sum(line.startswith("rc -9") for line in log) >= min(KILLS, 15), log
