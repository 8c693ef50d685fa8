"""The run folder of `tupe pretrain`: what it holds, whether a new run may use it, and cleaning up on resume.

`tupe_run.json` records the run's identity (scheme, model, data, optimiser); a folder holding another run is
refused unless --overwrite, one holding this run unless --resume or --overwrite, and a folder that is not a tupe
run is never wiped.

`tupe_files.json` records every name tupe wrote at the top of the folder, each added *before* it is written, so a
kill never leaves an unrecorded file of tupe's; --overwrite removes exactly those and keeps anything else (a
user's notes, `tupe analyze` or `tupe glue` outputs), naming what it kept. Folders written before the record
existed fall back to tupe's known output names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tupe.errors import TupeError
from tupe.io.files import atomic_write_text
from tupe.io.outputs import TEMP_OF, read_record, update_record
from tupe.io.reading import iter_lines, read_json
from tupe.training.optimizers import DEFAULT_OPTIMIZER

RUN_FILE = "tupe_run.json"
WRITTEN_FILE = "tupe_files.json"  # the names tupe wrote at the top of the run folder
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "pretrain_summary.json"
RUN_FORMAT = 1
LOCK_FILES = (".lock", ".lock.info")

# Known names: only for folders without a record (written by an older tupe), and to adopt such a folder's files
# into the record the first time a newer tupe writes there.
_RUN_ARTIFACT_NAMES = {
    "tensorboard",
    "config.json",
    "README.md",  # the model card
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "training_args.bin",
    "modeling_tupe.py",
    "configuration_tupe.py",
    "positional.py",
    "kernels.py",
    "attention_interface.py",  # the kernels under transformers' AttentionInterface, imported by modeling_tupe.py
    "kernel_registry.py",  # kernels.py split by job (issue 48): the registry, the context, documents, ops
    "context.py",
    "documents.py",
    "ops.py",
    "conversion.py",
    "token_classification.py",  # the token-classification pipeline a model folder carries (issue 49)
    "word_spans.py",
    "rope_scaling.py",  # RoPE scaling (rope_parameters), imported by positional.py (issue 49)
    ".tmp-final",
    METRICS_FILE,
    SUMMARY_FILE,
    RUN_FILE,
}
_CHECKPOINT_NAME = re.compile(r"^(\.tmp-)?checkpoint-\d+(-old)?$")  # checkpoints and their staging folders
# checkpoints, their staging folders, and atomic_write_text's temporary files (".NAME.tupe-XXXXXXXX.tmp")
_RUN_ARTIFACT_PATTERN = re.compile(_CHECKPOINT_NAME.pattern + "|" + TEMP_OF.pattern)
PRETRAIN = "tupe pretrain"  # the owner of this module's names in the shared record (tupe/io/outputs.py)


def is_run_artifact(name: str) -> bool:
    """Whether `name` (an entry at the top of a run folder) is one of the names `tupe pretrain` writes: the rule
    for folders without a `tupe_files.json` record (written by an older tupe)."""
    return name in _RUN_ARTIFACT_NAMES or bool(_RUN_ARTIFACT_PATTERN.match(name))


def read_written(out: Path) -> set[str] | None:
    """The names `tupe pretrain` recorded in `out/tupe_files.json` (other commands' names are not its own); None
    without a readable record (an older tupe's folder)."""
    record = read_record(out)
    if record is None:
        return None
    return {n for n, owner in record.items() if owner == PRETRAIN}


def record_written(out: Path, *names: str) -> None:
    """Add `names` (entries at the top of `out`) to the record, before they are written: a kill between the two
    leaves a recorded name that does not exist (harmless), never a file of tupe's that --overwrite would keep.

    The first record made in a folder of an older tupe adopts the entries its known-names rule claims."""
    recorded = read_written(out)
    if recorded is None:
        recorded = {p.name for p in out.iterdir() if is_run_artifact(p.name)} if out.is_dir() else set()
    if set(names) <= recorded and (out / WRITTEN_FILE).is_file():
        return
    update_record(out, add=dict.fromkeys(recorded | set(names), PRETRAIN))


def _write_record(out: Path, names: set[str]) -> None:
    """Make pretrain's part of the record exactly `names`, keeping the other commands' entries."""
    record = read_record(out) or {}
    mine = {n for n, owner in record.items() if owner == PRETRAIN}
    update_record(out, add=dict.fromkeys(names, PRETRAIN), drop=mine - set(names))


def is_owned(name: str, recorded: set[str] | None) -> bool:
    """Whether the entry `name` at the top of a run folder is tupe's: recorded (or the temporary file of a
    recorded name), or, without a record, one of tupe's known names."""
    if recorded is None:
        return is_run_artifact(name)
    if name in recorded:
        return True
    m = TEMP_OF.match(name)
    return m is not None and (m["name"] in recorded or m["name"] == WRITTEN_FILE)


# Identity values recorded only when they are not the default (runs made before the option keep their identity):
# a record without one reads as the default
_IDENTITY_DEFAULTS = {("data", "packing"): "stream"}
_IDENTITY_FLAGS = {("data", "packing"): "--packing"}  # named as the user gives them


def _identity_diff(old: dict, new: dict) -> list[str]:
    diffs = []
    for section in ("scheme", "model", "data", "optim", "init_from"):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                default = _IDENTITY_DEFAULTS.get((section, k))
                if a.get(k, default) != b.get(k, default):
                    name = _IDENTITY_FLAGS.get((section, k), f"{section}.{k}")
                    diffs.append(f"{name}: {a.get(k, default)!r} -> {b.get(k, default)!r}")
        elif a != b:
            diffs.append(f"{section}: {a!r} -> {b!r}")
    return diffs


# The optimiser settings that make a run what it is (a change is another run: --resume refuses it)
_OPTIM_KEYS = (
    "batch_size",
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
)


def run_identity(run: Any, model: dict[str, Any], corpus: str, tokenizer: str) -> dict[str, Any]:
    """What `tupe_run.json` records and `check_out_dir` compares (`run`: the `ResolvedConfig`, of whose parts the
    data and the optimisation are read; `model`: the model's config values; `corpus`, `tokenizer`: their
    fingerprints). The same record as before the configuration had parts: earlier run folders resume."""
    data, optim = run.data, run.optim
    identity: dict[str, Any] = {
        "format": RUN_FORMAT,
        "scheme": run.model.scheme,
        "model": model,
        "data": {
            "corpus": corpus,
            "tokenizer": tokenizer,
            "max_length": int(data.max_length),
            "valid_every": int(data.valid_every),
            "mlm_probability": float(data.mlm_probability),
        },
        "optim": {k: getattr(optim, k) for k in _OPTIM_KEYS}
        | {"seed": optim.seed, "grad_accum": optim.grad_accum},
    }
    # recorded only when set, so runs made before these options existed keep their identity
    if data.packing != "stream":
        identity["data"]["packing"] = data.packing
    if optim.lr_scheduler != "linear":
        identity["optim"]["lr_scheduler"] = optim.lr_scheduler
    if optim.optimizer != DEFAULT_OPTIMIZER:
        identity["optim"]["optimizer"] = optim.optimizer
    if optim.positional_lr_scale != 1.0:
        identity["optim"]["positional_lr_scale"] = optim.positional_lr_scale
    if optim.positional_weight_decay is not None:
        identity["optim"]["positional_weight_decay"] = optim.positional_weight_decay
    return identity


def prepare_run_folder(
    out: Path, action: str, record: dict[str, Any], log: Callable[[str], None], warn: Callable[[str], None]
) -> None:
    """Make `out` ready for the run `check_out_dir` allowed (`action`), on the main process: --overwrite removes
    what tupe wrote (naming what it kept), a save cut by a kill is dropped, and `tupe_run.json` (`record`) is
    written."""
    if action == "wipe":
        kept = _wipe(out)
        log(f"--overwrite: removed the previous run's files from {out}")
        if kept:
            warn(f"--overwrite: kept {len(kept)} file(s) tupe did not write in {out}: {', '.join(kept[:5])}")
    out.mkdir(parents=True, exist_ok=True)
    record_written(out, RUN_FILE, METRICS_FILE)  # before writing them: see the module docstring
    for stale in out.glob(".tmp-checkpoint-*"):  # a save cut by a kill
        shutil.rmtree(stale, ignore_errors=True)
    atomic_write_text(out / RUN_FILE, json.dumps(record, indent=1))


def check_out_dir(out: Path, identity: dict, resume: bool, overwrite: bool) -> str:
    """Decide what to do with `out`: 'fresh', 'resume' or 'wipe'. Raises a `TupeError` when it must refuse.

    A folder that holds another run is refused unless --overwrite; one that holds this run is refused unless
    --resume or --overwrite; a non-empty folder that is not a tupe run is never wiped.
    """
    if out.exists() and not out.is_dir():
        raise TupeError(f"--out {out} is a file, not a folder")
    entries = [p for p in out.iterdir() if p.name not in (*LOCK_FILES, WRITTEN_FILE)] if out.exists() else []
    if not entries:
        return "fresh"
    run_file = out / RUN_FILE
    recorded = read_written(out)
    _refuse_clobbering(out, recorded, entries)
    if not run_file.exists():
        foreign = [p.name for p in entries if not is_owned(p.name, recorded)]
        if recorded is not None and not [p for p in entries if is_owned(p.name, recorded)]:
            return "fresh"  # only files tupe did not write, left by an earlier --overwrite: they are kept
        if foreign and recorded is None:
            raise TupeError(
                f"--out {out} is not empty and is not a tupe run folder (it holds {foreign[0]!r}); choose a new --out"
            )
        if overwrite:
            return "wipe"
        if resume:
            raise TupeError(
                f"--out {out} holds files of a run that never wrote tupe_run.json, so --resume has nothing to "
                "continue; pass --overwrite instead of --resume to start again"
            )
        return _refuse(out, "holds files of an unfinished run (no tupe_run.json)")
    try:
        old = read_json(run_file, "run record", expect=dict)
    except TupeError as err:
        raise TupeError(f"{err}; use --overwrite to start again") from None
    diffs = _identity_diff(old, identity)
    if overwrite:
        return "wipe"
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise TupeError(f"--out {out} holds a different run ({shown}); use another --out or pass --overwrite")
    if resume:
        return "resume"
    return _refuse(out, "already holds this run")


def _refuse_clobbering(out: Path, recorded: set[str] | None, entries: list[Path]) -> None:
    """A file tupe did not write but would write over (a user's README.md where the model card goes) stops the run
    before any work, not hours later when the card or final model is saved."""
    clash = [
        p.name
        for p in entries
        if not is_owned(p.name, recorded)
        and (p.name in _RUN_ARTIFACT_NAMES or _CHECKPOINT_NAME.match(p.name))
    ]
    if clash:
        raise TupeError(
            f"--out {out} holds {clash[0]!r}, which tupe did not write there but would overwrite; move it away"
        )


def _refuse(out: Path, why: str) -> str:
    raise TupeError(f"--out {out} {why}; pass --resume to continue it or --overwrite to start again")


def _wipe(out: Path) -> list[str]:
    """--overwrite: delete what tupe wrote in `out` (from its record, else by tupe's known names; never the lock),
    keep everything else; returns the names kept (foreign files: a user's notes, `tupe analyze` / `tupe glue`
    outputs). The record is emptied last, so an --overwrite killed half-way is finished by the next one."""
    recorded = read_written(out)
    kept = []
    for p in sorted(out.iterdir()):
        if p.name in LOCK_FILES or p.name == WRITTEN_FILE:
            continue
        if not is_owned(p.name, recorded):
            kept.append(p.name + ("/" if p.is_dir() else ""))
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    _write_record(out, set())
    return kept


def truncate_metrics(path: Path, last_step: int) -> None:
    """On resume, drop records the interrupted run wrote after the checkpoint we continue from."""
    if not os.path.lexists(path):
        return
    keep = []
    for _, raw in iter_lines(path, "metrics log"):  # a FIFO or /dev/zero is refused, a huge line too
        try:
            if json.loads(raw)["step"] <= last_step:
                keep.append(raw.decode("utf-8"))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            continue  # a line cut by the kill
    atomic_write_text(path, "".join(line + "\n" for line in keep))
