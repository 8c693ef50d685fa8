"""Checkpoint safety: the manifest catches what a rename alone cannot (a truncated copy, a flipped byte), the
latest-checkpoint finder skips broken folders, non-finite losses stop the run (or are skipped and counted) and
never reach a checkpoint, and nothing but safetensors/weights-only state is loaded."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from tupe.errors import TupeError
from tupe.io.checkpoints import check_model_weights
from tupe.training.checkpointing import MANIFEST_NAME, find_latest_checkpoint, verify_checkpoint

from .conftest import assert_user_error, pretrain_args, run_cli


@pytest.fixture(scope="module")
def run4(rel_corpus, rel_tokenizer, rel_cache, tmp_path_factory) -> Path:  # noqa: ANN001
    """A finished 4-step run with checkpoint-2 and checkpoint-4 (do not modify: copy it)."""
    from tupe.cli import main

    out = tmp_path_factory.mktemp("run4") / "run"
    assert main([str(a) for a in pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=4)]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def test_every_checkpoint_has_a_complete_manifest(run4: Path) -> None:
    for ckpt in (run4 / "checkpoint-2", run4 / "checkpoint-4"):
        manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
        listed = set(manifest["files"])
        on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()} - {MANIFEST_NAME}
        assert listed == on_disk and {"model.safetensors", "optimizer.pt", "rng_state.pth"} <= listed
        assert manifest["step"] == int(ckpt.name.split("-")[1])
        assert verify_checkpoint(ckpt) is None
    assert find_latest_checkpoint(run4, log=None) == run4 / "checkpoint-4"


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("truncate-optimizer", "optimizer.pt has"),  # an interrupted copy of the run folder
        (
            "flip-weights-byte",
            "model.safetensors does not match its SHA-256",
        ),  # same size, header still valid
        ("delete-rng", "rng_state.pth is missing"),
        ("manifest-cut", "unreadable tupe_checkpoint.json"),
    ],
)
def test_damaged_latest_checkpoint_is_skipped(run4: Path, tmp_path: Path, damage: str, reason: str) -> None:
    run = _copy(run4, tmp_path)
    ckpt = run / "checkpoint-4"
    if damage == "truncate-optimizer":
        os.truncate(ckpt / "optimizer.pt", 100)
    elif damage == "flip-weights-byte":
        data = bytearray((ckpt / "model.safetensors").read_bytes())
        data[-3] ^= 0x01
        (ckpt / "model.safetensors").write_bytes(bytes(data))
        check_model_weights(ckpt)  # safetensors itself cannot see it: only the manifest does
    elif damage == "delete-rng":
        (ckpt / "rng_state.pth").unlink()
    else:
        (ckpt / MANIFEST_NAME).write_text('{"format": 1, "fil')
    warnings: list[str] = []
    assert reason in (verify_checkpoint(ckpt) or "")
    assert find_latest_checkpoint(run, log=warnings.append) == run / "checkpoint-2"
    assert len(warnings) == 1 and "checkpoint-4" in warnings[0] and reason in warnings[0]


def test_checkpoint_without_manifest_is_checked_structurally(run4: Path, tmp_path: Path) -> None:
    """Folders written by the plain Trainer (no manifest): weights header, zip directories, required files."""
    run = _copy(run4, tmp_path)
    for ckpt in run.glob("checkpoint-*"):
        (ckpt / MANIFEST_NAME).unlink()
    assert verify_checkpoint(run / "checkpoint-4") is None
    os.truncate(run / "checkpoint-4" / "scheduler.pt", 20)
    assert "scheduler.pt is truncated" in verify_checkpoint(run / "checkpoint-4")
    os.truncate(run / "checkpoint-2" / "model.safetensors", 1000)
    assert "corrupt or truncated" in verify_checkpoint(run / "checkpoint-2")
    assert find_latest_checkpoint(run, log=None) is None


def test_staging_and_trash_folders_are_never_taken(run4: Path, tmp_path: Path) -> None:
    run = _copy(run4, tmp_path)
    shutil.copytree(run / "checkpoint-4", run / ".tmp-checkpoint-6" / "checkpoint-6")
    shutil.copytree(run / "checkpoint-4", run / ".trash-checkpoint-8-123")
    assert find_latest_checkpoint(run, log=None) == run / "checkpoint-4"


def test_state_files_are_weights_only_loadable(run4: Path) -> None:
    """optimizer/scheduler/RNG state: tensors, containers and numpy arrays (the RNG state; allow-listed exactly as
    the Trainer does), loadable with weights_only=True, which never runs code."""
    from transformers.trainer_pt_utils import safe_globals

    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        path = run4 / "checkpoint-4" / name
        assert zipfile.is_zipfile(path)
        with safe_globals():
            torch.load(path, weights_only=True)


@pytest.mark.slow
def test_the_trainer_loads_state_with_weights_only(
    monkeypatch,
    run4: Path,
    rel_corpus,
    rel_tokenizer,
    rel_cache,
    tmp_path: Path,
    capsys,  # noqa: ANN001
) -> None:
    """Every torch.load during a resume passes weights_only=True (transformers 5.23 does; guard against drift)."""
    calls = []
    real = torch.load

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    run = _copy(run4, tmp_path)
    shutil.rmtree(
        run / "checkpoint-4"
    )  # resume from checkpoint-2: optimizer, scheduler and RNG state are loaded
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, run, max_steps=4, resume=True)
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    assert len(calls) >= 3 and all(w is True for w in calls), calls


def _poison(monkeypatch, at: set[int]) -> None:  # noqa: ANN001
    """Make the training loss NaN on the given training forward passes (1-based)."""
    from tupe.modeling import TupeForMaskedLM

    real = TupeForMaskedLM.forward
    calls = {"n": 0}

    def forward(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = real(self, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] in at:
                out.loss = out.loss * float("nan")  # what the trainer trains on
        return out

    monkeypatch.setattr(TupeForMaskedLM, "forward", forward)


@pytest.mark.slow
def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
    monkeypatch,
    rel_corpus,
    rel_tokenizer,
    rel_cache,
    tmp_path,
    capsys,  # noqa: ANN001
) -> None:
    import signal

    _poison(monkeypatch, {5})
    out = tmp_path / "run"
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    code, _, err = run_cli(pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=8), capsys)
    # the graceful-stop handlers are put back although training failed
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    line = assert_user_error(
        code, err, "training loss is nan (not finite) at step 5", "checkpoint-4", "--skip-nonfinite"
    )
    assert "last good checkpoint" in line
    assert find_latest_checkpoint(out, log=None) == out / "checkpoint-4"
    assert not (out / "checkpoint-6").exists() and not list(out.glob(".tmp-*"))


@pytest.mark.slow
def test_skip_nonfinite_skips_and_counts_and_resumes_the_count(
    monkeypatch,
    rel_corpus,
    rel_tokenizer,
    rel_cache,
    tmp_path,
    capsys,  # noqa: ANN001
) -> None:
    _poison(monkeypatch, {3, 6})
    out = tmp_path / "run"
    args = pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=6, skip_nonfinite=True)
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    warned = [ln for ln in err.splitlines() if "batch skipped" in ln]
    assert len(warned) == 2 and "at step 3" in warned[0] and "at step 6" in warned[1]
    summary = json.loads((out / "pretrain_summary.json").read_text())
    assert summary["nonfinite_skipped"] == 2
    manifest = json.loads((out / "checkpoint-4" / MANIFEST_NAME).read_text())
    assert manifest["nonfinite_skipped"] == 1  # the count travels with the checkpoint, for --resume
    logged = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in logged if "loss" in r}
    # per-step logging: a skipped step is logged as 0 (documented), every other step as its finite loss
    assert [s for s, x in losses.items() if x == 0.0] == [3, 6]
    assert all(0 < x < 100 for s, x in losses.items() if s not in (3, 6))
    assert all(r["eval_loss"] == r["eval_loss"] for r in logged if "eval_loss" in r)
    from safetensors.torch import load_file

    assert all(torch.isfinite(t).all() for t in load_file(out / "model.safetensors").values())


def test_non_finite_weights_are_never_saved(
    monkeypatch, rel_corpus, rel_tokenizer, rel_cache, tmp_path, capsys
) -> None:  # noqa: ANN001
    """A finite loss whose update makes the weights NaN (an inf gradient) must not become a checkpoint."""
    from tupe.training import trainer as pt

    real_save = pt.PretrainTrainer._save_checkpoint

    def save(self, model, trial):  # noqa: ANN001, ANN202
        if self.state.global_step == 4:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] = float("inf")
        return real_save(self, model, trial)

    monkeypatch.setattr(pt.PretrainTrainer, "_save_checkpoint", save)
    out = tmp_path / "run"
    code, _, err = run_cli(pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=6), capsys)
    assert_user_error(code, err, "is not finite after step 4", "without saving checkpoint-4")
    assert find_latest_checkpoint(out, log=None) == out / "checkpoint-2"
    assert not (out / "checkpoint-4").exists()


def test_pickle_weights_are_refused_before_loading(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(TupeError, match="only pickle weights"):
        check_model_weights(tmp_path)


def test_checkpoints_load_without_trust_remote_code(run4: Path) -> None:
    """`import tupe` registers the model type: a run folder and its checkpoints load with the Auto classes locally,
    trust_remote_code=False."""
    from transformers import AutoModelForMaskedLM

    import tupe  # noqa: F401

    for folder in (run4, run4 / "checkpoint-2"):
        model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=False)
        assert type(model).__module__.startswith("tupe.")
