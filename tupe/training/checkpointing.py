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

import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tupe.errors import TupeError

MANIFEST_NAME = "tupe_checkpoint.json"
MANIFEST_FORMAT = 1
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# files the Trainer writes with torch.save (zip archives since torch 1.6): a truncated one has no zip directory
_TORCH_ZIP_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt")


# ------------------------------------------------------------------------------------------------ atomic files
def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside `path` durable (no-op where directories cannot be opened, e.g. Windows)."""
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


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file and folder under `path`, so a rename that publishes it never exposes unwritten data."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)
        fsync_dir(root)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file next to `path`, fsync it, then rename: readers see old or new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------------- weights
def check_safetensors(path: str | os.PathLike) -> None:
    """Raise a one-line `TupeError` if `path` is not a complete safetensors file (truncated, corrupt, empty).

    Reads the header only: safetensors checks that the tensors it declares exactly cover the file, which catches
    truncation and most corruption of the header. Flipped bytes inside tensor data are only caught by a manifest.
    """
    from safetensors import safe_open

    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise TupeError(f"{path}: cannot read the weights file ({err.strerror or err})") from None
    if size < 8:
        raise TupeError(f"{path}: corrupt or truncated safetensors file ({size} bytes)")
    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except Exception as err:  # noqa: BLE001 - SafetensorError and OSError: the reason is what the user needs
        reason = " ".join(str(err).split())
        raise TupeError(f"{path}: corrupt or truncated safetensors file ({reason})") from None


def check_model_weights(model_dir: str | os.PathLike) -> list[Path]:
    """The safetensors weight files of a `save_pretrained` folder, each checked; a `TupeError` if none or broken.

    Pickle weights (`pytorch_model.bin`) are refused: unpickling can run code, and `tupe` always writes safetensors.
    """
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise TupeError(f"{index}: unreadable safetensors index ({err})") from None
        files = [model_dir / s for s in shards]
        for f in files:
            if not f.is_file():
                raise TupeError(f"{f}: missing weights shard listed in {index.name}")
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        if any(model_dir.glob("pytorch_model*.bin")) or any(model_dir.glob("*.pt")):
            raise TupeError(
                f"{model_dir}: only pickle weights (pytorch_model.bin), which tupe does not load because unpickling "
                "can run code; re-save the model with save_pretrained(DIR) (safetensors)"
            )
        ckpts = list_checkpoints(model_dir)
        hint = f"; a pre-training run not finished yet? use --model {ckpts[0]}" if ckpts else ""
        raise TupeError(f"{model_dir}: no model weights (model.safetensors){hint}")
    for f in files:
        check_safetensors(f)
    return files


def first_nonfinite_parameter(model: Any) -> str | None:
    """Name of the first parameter holding NaN or inf, or None; run before saving so a checkpoint is never poisoned."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not bool(torch.isfinite(p).all()):
                return name
    return None


# --------------------------------------------------------------------------------------------------- manifest
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def write_manifest(
    ckpt_dir: str | os.PathLike, step: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Record size and SHA-256 of every file of a finished checkpoint folder, as its last file (atomically)."""
    ckpt_dir = Path(ckpt_dir)
    files = {
        p.relative_to(ckpt_dir).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in _files_under(ckpt_dir)
    }
    manifest = {"format": MANIFEST_FORMAT, "step": int(step), "files": files, **(extra or {})}
    atomic_write_json(ckpt_dir / MANIFEST_NAME, manifest)
    return manifest


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
            manifest = json.loads(manifest_path.read_text())
            files = manifest["files"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
            return f"unreadable {MANIFEST_NAME} ({err})"
        for rel, meta in files.items():
            f = ckpt_dir / rel
            if not f.is_file():
                return f"{rel} is missing"
            size = f.stat().st_size
            if size != meta["bytes"]:
                return f"{rel} has {size} bytes, expected {meta['bytes']} (truncated or changed)"
            if deep and _sha256(f) != meta["sha256"]:
                return f"{rel} does not match its SHA-256 in {MANIFEST_NAME} (corrupt)"
        return None
    if not (ckpt_dir / "trainer_state.json").is_file():
        return "no trainer_state.json (incomplete)"
    try:
        json.loads((ckpt_dir / "trainer_state.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
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


def checkpoint_step(path: str | os.PathLike) -> int | None:
    m = _CHECKPOINT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` folders of `run_dir`, newest (highest N) first; staging/trash folders are never listed."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0, reverse=True)


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


def remove_tree_atomically(path: str | os.PathLike) -> None:
    """Delete a folder so that a kill half-way never leaves a partial folder under its old name.

    The folder is first renamed to a hidden `.trash-*` name (atomic), then deleted.
    """
    path = Path(path)
    if not path.exists():
        return
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.replace(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale_staging(run_dir: str | os.PathLike) -> list[str]:
    """Remove what a killed save or delete left behind (`.tmp-checkpoint-*`, `.trash-*`); returns their names."""
    run_dir = Path(run_dir)
    removed = []
    if run_dir.is_dir():
        for p in run_dir.iterdir():
            if p.name.startswith((".tmp-checkpoint-", ".trash-checkpoint-")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p.name)
    return removed


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
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TupeError(f"{path}: cannot read the checkpoint's model config ({err})") from None
    if config.get("model_type") != "tupe":
        raise TupeError(f"{path}: model_type {config.get('model_type')!r} is not a tupe checkpoint")
    for key, want in expected.items():
        if key in config and config[key] != want:
            raise TupeError(
                f"{path}: {key} {config[key]!r} does not match this run's {want!r}; the checkpoint belongs to "
                "another model (use another --out, or --overwrite to start again)"
            )


def check_weights_match_config(model_dir: str | os.PathLike) -> None:
    """Raise a one-line `TupeError` if a tupe folder's weights do not fit its config.json (shape or missing tensor).

    Why: `from_pretrained` re-initialises mismatched or missing tensors with only a log warning (GLUE loads with
    `ignore_mismatched_sizes=True` for the new head), so an edited config or weights copied from another model
    would train from random encoder weights without any error. Only the encoder (`tupe.*`) is compared: heads
    differ legitimately between masked-LM and classification checkpoints. Reads shapes from the safetensors
    headers and builds the model on the meta device: no weights are loaded.
    """
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig

    import tupe  # noqa: F401  (registers the tupe model type)
    from tupe.modeling import TupeForMaskedLM

    model_dir = Path(model_dir)
    files = check_model_weights(model_dir)
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        expected = {
            k: tuple(v.shape)
            for k, v in TupeForMaskedLM(config).state_dict().items()
            if k.startswith("tupe.")
        }
    found: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                if name not in expected:
                    continue
                found.add(name)
                got = tuple(fh.get_slice(name).get_shape())
                if got != expected[name]:
                    raise TupeError(
                        f"{f}: tensor {name} has shape {list(got)} but {model_dir / 'config.json'} implies "
                        f"{list(expected[name])}: the weights and the config belong to different models"
                    )
    missing = sorted(set(expected) - found)
    if missing:
        raise TupeError(
            f"{model_dir}: {len(missing)} encoder tensor(s) that config.json implies are not in the weights "
            f"(first: {missing[0]}): the weights and the config belong to different models"
        )
