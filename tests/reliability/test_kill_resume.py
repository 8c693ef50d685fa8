"""Real SIGKILLs of real `tupe` subprocesses, at random moments and at exact points of checkpointing, then
`--resume`: the loss trajectory and the final weights must equal those of an uninterrupted run, bit for bit.

Kill points are drawn from a seeded generator (`TUPE_KILL_SEED`, default 0) so a failure can be replayed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from tupe.training.checkpointing import find_latest_checkpoint, list_checkpoints, verify_checkpoint

from .conftest import pretrain_args, start_cli

SEED = int(os.environ.get("TUPE_KILL_SEED", "0"))
TIMEOUT = 300  # seconds for one subprocess (a shared 2-core machine can be slow)


def _records(out: Path) -> list[dict]:
    """metrics.jsonl as comparable records (step, loss/lr/grad_norm or eval_loss); timing fields dropped."""
    keep = ("step", "loss", "lr", "grad_norm", "eval_loss")
    path = out / "metrics.jsonl"
    return [{k: r[k] for k in keep if k in r} for r in map(json.loads, path.read_text().splitlines())]


def _last_step(out: Path) -> int:
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    step = 0
    for line in path.read_text().splitlines():
        try:
            step = max(step, int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            pass  # a line cut by a kill
    return step


def _finish(proc, what: str) -> tuple[int, str]:  # noqa: ANN001
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except Exception:
        proc.kill()
        raise
    return proc.returncode, err


def _kill_at_random(proc, out: Path, rng: random.Random, window: tuple[int, int]) -> tuple[str, int]:  # noqa: ANN001
    """SIGKILL `proc` a random moment after it logged a random step of `window`; returns (what, step seen)."""
    target = rng.randint(*window)
    deadline = time.monotonic() + TIMEOUT
    while _last_step(out) < target and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.2))
    if proc.poll() is not None:
        proc.communicate()
        return f"finished by itself (rc {proc.returncode})", _last_step(out)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)
    return "killed", _last_step(out)


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_is_bit_exact(rel_corpus, rel_tokenizer, rel_cache, tmp_path):  # noqa: ANN001
    from safetensors.torch import load_file

    steps = 36
    opts = dict(max_steps=steps, save_steps=3, eval_steps=6, save_total_limit=2)
    ref = tmp_path / "ref"
    code, err = _finish(
        start_cli(pretrain_args(rel_corpus, rel_tokenizer, rel_cache, ref, **opts)), "reference"
    )
    assert code == 0, err

    out = tmp_path / "run"
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, **opts)
    rng = random.Random(SEED)
    # a fault injected in the subprocess, or a window of steps for a kill from outside at a random moment; the
    # windows leave room for the faults, which need a checkpoint still to write after the resume before them
    plan: list[str | tuple[int, int]] = [
        "kill-mid-write:2:optimizer.pt",  # inside the write of the 2nd checkpoint (step 6)
        (8, 12),
        "kill-before-publish:1",  # checkpoint complete in its staging folder, not yet renamed
        (17, 22),
        "kill-mid-rotate:1",  # while deleting an old checkpoint (save_total_limit=2)
        (26, 31),
        (33, 36),  # late: often during the final evaluation or model save
    ]
    log = []
    for i, entry in enumerate(plan):
        fault = entry if isinstance(entry, str) else None
        proc = start_cli(args + (["--resume"] if i else []), fault=fault)
        if fault is None:
            what, step = _kill_at_random(proc, out, rng, entry)  # type: ignore[arg-type]
        else:
            code, err = _finish(proc, fault)
            assert code == -signal.SIGKILL, (fault, code, err[-2000:])
            what, step = f"killed by {fault}", _last_step(out)
        latest = find_latest_checkpoint(out, log=None)
        log.append(f"{what} at step {step}; latest complete checkpoint: {latest.name if latest else None}")
        # whatever was cut, the newest complete checkpoint verifies and no partial one carries a final name
        # unless it fails verification (the half-deleted checkpoint of kill-mid-rotate)
        if fault == "kill-mid-write:2:optimizer.pt":
            assert (out / ".tmp-checkpoint-6").is_dir() and not (out / "checkpoint-6").exists()
            assert latest is not None and latest.name == "checkpoint-3"
        if fault == "kill-before-publish:1":
            staged = [p for p in out.glob(".tmp-checkpoint-*/checkpoint-*")]
            assert staged and verify_checkpoint(staged[0]) is None  # complete, yet never taken: not renamed
            assert latest is not None and latest.name != staged[0].name
        if fault == "kill-mid-rotate:1":
            broken = [p for p in list_checkpoints(out) if verify_checkpoint(p) is not None]
            assert broken and all(b != latest for b in broken)
            assert latest is not None and latest == list_checkpoints(out)[0]
    print("\n".join(log))  # shown with -s / on failure: where each kill landed
    kills = sum(entry.startswith("killed") for entry in log)
    assert kills >= 6, log  # the 3 faults always kill; at most one random kill may come after the run ended

    code, err = _finish(start_cli(args + ["--resume"]), "final resume")
    assert code == 0, err[-3000:]
    assert _records(out) == _records(ref)  # every step's loss, lr, grad norm and every validation loss
    steps_logged = [r["step"] for r in _records(out) if "loss" in r]
    assert steps_logged == list(range(1, steps + 1))  # nothing lost, nothing counted twice
    a, b = load_file(ref / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert verify_checkpoint(out / f"checkpoint-{steps}") is None
    assert not list(out.glob(".tmp-checkpoint-*")) and not list(out.glob(".trash-*"))


@pytest.mark.slow
def test_killed_glue_grid_resumes_without_redoing_finished_runs(tmp_path):  # noqa: ANN001
    from tests.glue.fixtures import make_checkpoint, write_task

    model = make_checkpoint(tmp_path / "model")
    data = tmp_path / "glue"
    write_task(data, "SST-2", n_train=64, n_dev=16)
    grid = ["--lrs", "1e-4,2e-4", "--seeds", "1,2", "--epochs", "1", "--batch-size", "16"]

    def args(out: Path) -> list[str]:
        return ["glue", "--model", model, "--task", "SST-2", "--data-dir", data, "--out", out, *grid]

    ref = tmp_path / "ref"
    code, err = _finish(start_cli(args(ref)), "reference grid")
    assert code == 0, err[-3000:]

    out = tmp_path / "run"
    proc = start_cli(args(out))
    deadline = time.monotonic() + TIMEOUT
    while (
        len(list(out.glob("runs/*/result.json"))) < 2 and proc.poll() is None and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    time.sleep(random.Random(SEED).uniform(0.0, 0.5))
    assert proc.poll() is None, "the grid finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)
    finished = {p.parent.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("runs/*/result.json")}
    assert 2 <= len(finished) < 4

    proc = start_cli(args(out))
    stdout, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    assert f"{len(finished)} already done" in stdout
    for name, (content, mtime) in finished.items():  # finished runs were not redone
        p = out / "runs" / name / "result.json"
        assert p.read_bytes() == content and p.stat().st_mtime_ns == mtime
    a = json.loads((ref / "results.json").read_text())
    b = json.loads((out / "results.json").read_text())
    assert b["complete"] and [r["scores"] for r in b["runs"]] == [r["scores"] for r in a["runs"]]
    assert [r["train_loss"] for r in b["runs"]] == [r["train_loss"] for r in a["runs"]]
    shutil.rmtree(tmp_path / "model")


@pytest.mark.slow
def test_sigterm_checkpoints_at_the_next_step_then_resume_is_bit_exact(
    rel_corpus, rel_tokenizer, rel_cache, tmp_path
):  # noqa: ANN001
    """Pre-emption: SIGTERM (what schedulers send before SIGKILL) costs no recomputation. With no periodic
    checkpoint due, the run finishes its step, checkpoints it, exits 143 with a one-line hint, and resumes exactly."""
    from safetensors.torch import load_file

    opts = dict(max_steps=12, save_steps=1000, eval_steps=4)
    ref = tmp_path / "ref"
    code, err = _finish(
        start_cli(pretrain_args(rel_corpus, rel_tokenizer, rel_cache, ref, **opts)), "reference"
    )
    assert code == 0, err

    out = tmp_path / "run"
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, **opts)
    proc = start_cli(args)
    deadline = time.monotonic() + TIMEOUT
    while _last_step(out) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc, "SIGTERM")
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err
    stopped = _last_step(out)
    assert 5 <= stopped < 12
    line = [ln for ln in err.splitlines() if "stopped by SIGTERM" in ln]
    assert len(line) == 1 and f"after step {stopped}" in line[0] and "--resume" in line[0]
    latest = find_latest_checkpoint(out, log=None)
    assert latest is not None and latest.name == f"checkpoint-{stopped}"  # nothing computed was lost

    code, err = _finish(start_cli(args + ["--resume"]), "resume")
    assert code == 0, err[-3000:]
    assert _records(out) == _records(ref)
    a, b = load_file(ref / "model.safetensors"), load_file(out / "model.safetensors")
    assert all((a[k] == b[k]).all() for k in a)
