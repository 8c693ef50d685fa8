"""Safe checkpoints: atomic writes, a manifest that proves a checkpoint is complete, and safe loading checks.

Why: pre-training runs for days on machines that get pre-empted, and run folders get copied between machines
(an interrupted `cp`/`rsync` leaves a folder with the right name and half its bytes). So:

- every file we publish is written under a temporary name, fsynced, then renamed (`atomic_write_text`);
- a checkpoint folder is built in a hidden staging folder and renamed to `checkpoint-N` when complete (see
  `PretrainTrainer._save_checkpoint`); its last file is `tupe_checkpoint.json`, a manifest of every file's size and
  SHA-256, so a folder that was complete once but lost bytes since (truncated copy, disk fault) is detected too;
- `find_latest_checkpoint` returns the newest checkpoint that verifies, skipping (and naming) broken ones,
  instead of `transformers`' `get_last_checkpoint`, which takes the highest `checkpoint-N` name on trust;
- model weights are loaded from safetensors only, checked first (`check_model_weights`), so a truncated or
  corrupt file is one clear error naming the file rather than a deserialisation traceback. Optimizer, scheduler
  and RNG state are `torch.save` files that the `transformers` Trainer loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tupe.errors import TupeError, one_line
from tupe.io.checkpoints import MODEL_SHAPE_KEYS, check_model_weights, list_checkpoints
from tupe.io.files import atomic_write_json, sha256_file
from tupe.io.reading import CONFIG_LIMIT, RESULTS_LIMIT, read_json

MANIFEST_NAME = "tupe_checkpoint.json"
MANIFEST_FORMAT = 1
# files the Trainer writes with torch.save (zip archives since torch 1.6): a truncated one has no zip directory
_TORCH_ZIP_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt")


# ---------------------------------------------------------------------------------------------------- weights
def first_nonfinite_parameter(model: Any) -> str | None:
    """Name of the first parameter holding NaN or inf, or None; run before saving so a checkpoint is never poisoned."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not bool(torch.isfinite(p).all()):
                return name
    return None


# --------------------------------------------------------------------------------------------------- manifest
def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def write_manifest(
    ckpt_dir: str | os.PathLike, step: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Record size and SHA-256 of every file of a finished checkpoint folder, as its last file (atomically)."""
    ckpt_dir = Path(ckpt_dir)
    files = {
        p.relative_to(ckpt_dir).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in _files_under(ckpt_dir)
    }
    manifest = {"format": MANIFEST_FORMAT, "step": int(step), "files": files, **(extra or {})}
    atomic_write_json(ckpt_dir / MANIFEST_NAME, manifest)
    return manifest


_REQUIRED_IN_MANIFEST = ("model.safetensors", "trainer_state.json")


def manifest_problem(manifest: object) -> str | None:
    """None if `manifest` has the schema `write_manifest` writes, else what is wrong (one short phrase): a
    manifest is trusted only if it lists the checkpoint's essential files, each with a size and a SHA-256."""
    if not isinstance(manifest, dict):
        return f"expected a JSON object, got {type(manifest).__name__}"
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"format {manifest.get('format')!r}, expected {MANIFEST_FORMAT}"
    step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"'step' must be a non-negative integer, got {step!r}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return f"'files' must be an object of file -> size and SHA-256, got {type(files).__name__}"
    for name in _REQUIRED_IN_MANIFEST:
        if name not in files:
            return f"'files' does not list {name}"
    for rel, meta in files.items():
        if not isinstance(rel, str) or rel.startswith(("/", "\\")) or ".." in Path(rel).parts:
            return f"file name {rel!r} is not inside the checkpoint"
        if not isinstance(meta, dict):
            return f"entry {rel!r} must be an object with 'bytes' and 'sha256'"
        size, digest = meta.get("bytes"), meta.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"entry {rel!r}: 'bytes' must be a non-negative integer, got {size!r}"
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest)
        ):
            return f"entry {rel!r}: 'sha256' must be 64 hex digits"
    skipped = manifest.get("nonfinite_skipped", 0)
    if not isinstance(skipped, int) or isinstance(skipped, bool) or skipped < 0:
        return f"'nonfinite_skipped' must be a non-negative integer, got {skipped!r}"
    return None


def verify_checkpoint(ckpt_dir: str | os.PathLike, deep: bool = True) -> str | None:
    """None if `ckpt_dir` is a complete, intact checkpoint; else the reason it is not (one short phrase).

    With a manifest: every listed file must exist with its size (and, if `deep`, its SHA-256). Without one (a
    checkpoint written by the plain Trainer): the Trainer's files must be there, the weights must be a complete
    safetensors file and every torch.save file a complete zip archive.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return "not a folder"
    manifest_path = ckpt_dir / MANIFEST_NAME
    if manifest_path.is_file():
        try:
            manifest = read_json(manifest_path, "checkpoint manifest", expect=None)
        except TupeError as err:
            return f"unreadable {MANIFEST_NAME} ({one_line(err)})"
        problem = manifest_problem(manifest)
        if problem is not None:
            return f"invalid {MANIFEST_NAME} ({problem})"
        for rel, meta in manifest["files"].items():
            f = ckpt_dir / rel
            if not f.is_file():
                return f"{rel} is missing"
            size = f.stat().st_size
            if size != meta["bytes"]:
                return f"{rel} has {size} bytes, expected {meta['bytes']} (truncated or changed)"
            if deep and sha256_file(f) != meta["sha256"]:
                return f"{rel} does not match its SHA-256 in {MANIFEST_NAME} (corrupt)"
        return None
    if not (ckpt_dir / "trainer_state.json").is_file():
        return "no trainer_state.json (incomplete)"
    try:
        read_json(ckpt_dir / "trainer_state.json", "trainer state", RESULTS_LIMIT, expect=None)
    except TupeError as err:
        return f"trainer_state.json is unreadable ({err})"
    try:
        check_model_weights(ckpt_dir)
    except TupeError as err:
        return str(err).replace(str(ckpt_dir) + os.sep, "")
    for name in _TORCH_ZIP_FILES:
        f = ckpt_dir / name
        if f.exists() and not zipfile.is_zipfile(f):
            return f"{name} is truncated or corrupt"
    for name in ("optimizer.pt", "scheduler.pt"):
        if not (ckpt_dir / name).is_file():
            return f"{name} is missing (incomplete)"
    return None


def find_latest_checkpoint(
    run_dir: str | os.PathLike, log: Callable[[str], None] | None = print, deep: bool = True
) -> Path | None:
    """The newest checkpoint of `run_dir` that verifies (see `verify_checkpoint`), or None.

    Broken ones are skipped with a warning naming the folder and the reason; nothing is deleted here.
    """
    for ckpt in list_checkpoints(run_dir):
        reason = verify_checkpoint(ckpt, deep=deep)
        if reason is None:
            return ckpt
        if log is not None:
            log(f"warning: skipping {ckpt}: {reason}")
    return None


@dataclass(frozen=True)
class ResumePoint:
    """Where a run continues: the checkpoint (None: step 0) and the non-finite batches skipped before it."""

    path: Path | None = None
    nonfinite_skipped: int = 0

    @property
    def step(self) -> int:
        return int(self.path.name.rsplit("-", 1)[1]) if self.path is not None else 0


# the model config values a checkpoint must share with the run that resumes from it
_RESUME_MUST_MATCH = ("model_type", *MODEL_SHAPE_KEYS)


def select_resume_checkpoint(
    out: Path, model: dict[str, Any], log: Callable[[str], None], warn: Callable[[str], None]
) -> ResumePoint:
    """--resume: the newest checkpoint of `out` that verifies (manifest sizes and SHA-256, not just the highest
    checkpoint-N name) and describes the model this run builds (`model`: its config values)."""
    latest = find_latest_checkpoint(out, log=warn)
    if latest is None and list_checkpoints(out):
        raise TupeError(
            f"--resume: no complete checkpoint in {out} (every checkpoint-N failed verification, see the "
            "warnings); use --overwrite to start again"
        )
    if latest is None:
        log(f"--resume: no checkpoint in {out} yet; starting from step 0")
        return ResumePoint()
    check_checkpoint_config(latest, {k: model[k] for k in _RESUME_MUST_MATCH if k in model})
    skipped = 0
    if (latest / MANIFEST_NAME).is_file():
        skipped = int(read_json(latest / MANIFEST_NAME, "checkpoint manifest").get("nonfinite_skipped", 0))
    log(f"--resume: continuing from {latest}")
    return ResumePoint(latest, skipped)


# ------------------------------------------------------------------------------------------------ pre-emption
class StopOnSignal(TrainerCallback):
    """On SIGTERM or SIGINT (pre-emption, Ctrl-C), finish the current step, save a checkpoint and stop training.

    Why: schedulers send SIGTERM some seconds before SIGKILL; without this, everything since the last periodic
    checkpoint would be recomputed. A second signal stops at once (the default behaviour). Under torchrun every
    process learns of the signal at the same step (the flag is all-reduced), so all stop together. After
    `trainer.train()` returns, `received` holds the signal number (None if training ran to its end).
    """

    def __init__(self, signals: tuple[int, ...] | None = None) -> None:
        import signal

        self.signals = signals if signals is not None else (signal.SIGTERM, signal.SIGINT)
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        import signal
        import sys

        if self.received is not None:  # second signal: stop now, as without this callback
            signal.signal(signum, signal.SIG_DFL)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        print(
            f"received {signal.Signals(signum).name}: stopping after this step with a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        import torch

        flag = 1.0 if self.received is not None else 0.0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            t = torch.tensor(
                [flag], device=args.device if torch.distributed.get_backend() == "nccl" else "cpu"
            )
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            flag = float(t.item())
            if flag and self.received is None:
                import signal

                self.received = signal.SIGTERM  # another process got it
        if flag:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.restore()

    def restore(self) -> None:
        """Put the previous handlers back (idempotent; call it in a `finally`, since a failed training run never
        reaches on_train_end and would leave Ctrl-C captured in a notebook or a test session)."""
        import signal

        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()


def check_checkpoint_config(ckpt_dir: str | os.PathLike, expected: dict[str, Any]) -> None:
    """Raise a one-line `TupeError` unless `ckpt_dir/config.json` describes the model this run builds.

    Why: the Trainer loads checkpoint weights with `strict=False`, so a checkpoint of another scheme or size copied
    into a run folder would load partially, with only a log warning.
    """
    path = Path(ckpt_dir) / "config.json"
    config = read_json(path, "checkpoint's model config", CONFIG_LIMIT, expect=dict)
    expected = dict(expected)
    model_type = expected.pop("model_type", "tupe")
    # saved off for users (`PretrainTrainer._save`), on while training
    expected.pop("sparse_prediction", None)
    if config.get("model_type") != model_type:
        raise TupeError(f"{path}: model_type {config.get('model_type')!r} is not a {model_type} checkpoint")
    for key, want in expected.items():
        if key in config and config[key] != want:
            raise TupeError(
                f"{path}: {key} {config[key]!r} does not match this run's {want!r}; the checkpoint belongs to "
                "another model (use another --out, or --overwrite to start again)"
            )
