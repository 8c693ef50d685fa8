"""The run folder of `tupe pretrain`: what it holds, whether a new run may use it, and cleaning up on resume.

`tupe_run.json` records the run's identity (scheme, model, data, optimiser); a folder holding another run is
refused unless --overwrite, one holding this run unless --resume or --overwrite, and a folder that is not a tupe
run is never wiped.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tupe.errors import TupeError
from tupe.io.files import atomic_write_text

RUN_FILE = "tupe_run.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "pretrain_summary.json"
RUN_FORMAT = 1
# files a tupe run writes at the top of its folder (anything else makes --overwrite refuse to wipe the folder)
_RUN_ARTIFACTS_PREFIXES = (
    "checkpoint-",
    ".tmp-checkpoint-",
    "tensorboard",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer",
    "special_tokens_map.json",
    "training_args.bin",
    "modeling_tupe.py",
    "configuration_tupe.py",
    "positional.py",
    "kernels.py",
    "conversion.py",
    METRICS_FILE,
    SUMMARY_FILE,
    RUN_FILE,
)


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
    "conversion.py",
    ".tmp-final",
    ".lock",
    ".lock.info",
    METRICS_FILE,
    SUMMARY_FILE,
    RUN_FILE,
}
# checkpoints, their staging folders, and atomic_write_text's temporary files (".NAME.XXXX.tmp")
_RUN_ARTIFACT_PATTERN = re.compile(r"^(\.tmp-)?checkpoint-\d+(-old)?$|^\.[^/]+\.tmp$")
LOCK_FILES = (".lock", ".lock.info")


def is_run_artifact(name: str) -> bool:
    """Whether `name` (an entry at the top of a run folder) is one `tupe pretrain` writes; only those are ever
    deleted by --overwrite (a user's notes, `tupe analyze` or `tupe glue` outputs kept in the folder are not)."""
    return name in _RUN_ARTIFACT_NAMES or bool(_RUN_ARTIFACT_PATTERN.match(name))


def _identity_diff(old: dict, new: dict) -> list[str]:
    diffs = []
    for section in ("scheme", "model", "data", "optim"):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    diffs.append(f"{section}.{k}: {a.get(k)!r} -> {b.get(k)!r}")
        elif a != b:
            diffs.append(f"{section}: {a!r} -> {b!r}")
    return diffs


def check_out_dir(out: Path, identity: dict, resume: bool, overwrite: bool) -> str:
    """Decide what to do with `out`: 'fresh', 'resume' or 'wipe'. Raises a `TupeError` when it must refuse.

    A folder that holds another run is refused unless --overwrite; one that holds this run is refused unless
    --resume or --overwrite; a non-empty folder that is not a tupe run is never wiped.
    """
    if out.exists() and not out.is_dir():
        raise TupeError(f"--out {out} is a file, not a folder")
    entries = [p for p in out.iterdir() if p.name not in LOCK_FILES] if out.exists() else []
    if not entries:
        return "fresh"
    run_file = out / RUN_FILE
    if not run_file.exists():
        foreign = [p.name for p in entries if not is_run_artifact(p.name)]
        if foreign:
            raise TupeError(
                f"--out {out} is not empty and is not a tupe run folder (it holds {foreign[0]!r}); choose a new --out"
            )
        return "wipe" if overwrite else _refuse(out, "holds files of an unfinished run (no tupe_run.json)")
    try:
        old = json.loads(run_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TupeError(f"{run_file}: unreadable ({err}); use --overwrite to start again") from None
    diffs = _identity_diff(old, identity)
    if overwrite:
        return "wipe"
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise TupeError(f"--out {out} holds a different run ({shown}); use another --out or pass --overwrite")
    if resume:
        return "resume"
    return _refuse(out, "already holds this run")


def _refuse(out: Path, why: str) -> str:
    raise TupeError(f"--out {out} {why}; pass --resume to continue it or --overwrite to start again")


def _wipe(out: Path) -> list[str]:
    """--overwrite: delete what `tupe pretrain` wrote in `out` (never its lock), keep everything else; returns the
    names kept (foreign files: a user's notes, `tupe analyze` / `tupe glue` outputs)."""
    kept = []
    for p in sorted(out.iterdir()):
        if p.name in LOCK_FILES:
            continue
        if not is_run_artifact(p.name):
            kept.append(p.name + ("/" if p.is_dir() else ""))
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return kept


def _truncate_metrics(path: Path, last_step: int) -> None:
    """On resume, drop records the interrupted run wrote after the checkpoint we continue from."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut by the kill
    atomic_write_text(path, "".join(line + "\n" for line in keep))
