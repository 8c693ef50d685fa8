"""Result records kept in the repository: small in the tree, whole through one loader, free of machine paths.

Why: a study's per-block losses (every evaluated block of every run, at every length and distance) and the paired
differences of every pair of runs are what intervals are computed from, but as JSON text they made `docs/results`
50 MB. In the tree each such file keeps everything a report reads; the bulky keys (`BULKY`: `per_block`,
`differences`) are stripped, and a manifest beside the files (`MANIFEST`, `stripped.json`) names, per file, the
commit and path of the whole original in git history with its SHA-256. History is never rewritten, so
`load_result` gives every reader the file as it was written, the stripped keys put back and checked against the
checksum; `export_arrays` writes the per-block numbers of a folder as one columnar `.npz` (exact float64/int64)
with a manifest of every array (file, key path, dtype, shape, sha256), outside the tree, for whoever wants them.

Paths: a record written by a command names files relative to the folder it is written to (`recorded_path`,
`recorded_command`), so a committed record carries no absolute path of the machine that ran it;
`anonymise_paths` rewrites those already written (`/work/runs/X` -> `runs/X`, a checkout's own files relative to
the repository, anything else under /work, /root, /home or /tmp -> a placeholder).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tupe.errors import TupeError

MANIFEST = "stripped.json"
BULKY = ("per_block", "differences")

# An absolute path on a machine that ran something: /work/..., /root/..., /home/USER/..., /tmp/... followed by a
# name (not "/tmp/" alone, not "~/...", not a relative path).
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|home|tmp)/[\w.-]")

_ANONYMISE = [
    # a checkout of this repository (main, a worktree): its own files, relative to the repository root
    (
        re.compile(
            r"(?<![\w.~/-])/work/(?:main|wt[\w.-]*(?:/[\w.-]+)?|repo)/(?=(?:tupe|tests|docs|benchmarks|scripts)/)"
        ),
        "",
    ),
    (re.compile(r"(?<![\w.~/-])/work/runs/"), "runs/"),
    (re.compile(r"(?<![\w.~/-])/work/shared/data/"), "DATA/"),
    (re.compile(r"(?<![\w.~/-])/work/main(?=[/\s\"',]|$)"), "."),
    (re.compile(r"(?<![\w.~/-])/work/"), "WORK/"),
    (re.compile(r"(?<![\w.~/-])/root/"), "~/"),
    (re.compile(r"(?<![\w.~/-])/home/[\w.-]+/"), "~/"),
    (re.compile(r"(?<![\w.~/-])/tmp/pytest-of-[\w.-]+/pytest-\d+/"), "TMP/"),
    (re.compile(r"(?<![\w.~/-])/tmp/(?=[\w.-])"), "TMP/"),
]


def anonymise_paths(text: str) -> str:
    """`text` with every absolute machine path (MACHINE_PATH) made relative or given a placeholder."""
    for pattern, replacement in _ANONYMISE:
        text = pattern.sub(replacement, text)
    return text


def recorded_path(path: str | os.PathLike, base: str | os.PathLike) -> str:
    """How a record written in folder `base` names `path`: relative to `base` (`..` where it is outside)."""
    return Path(os.path.relpath(Path(path).absolute(), Path(base).absolute())).as_posix()


def recorded_command(argv: Sequence[str], base: str | os.PathLike) -> str:
    """A command line for a record written in folder `base`: the program by its name (`tupe`, or the script's
    path inside the package), every absolute path argument (or `--opt=/abs`) relative to `base`."""
    if not argv:
        return ""
    program = Path(argv[0])
    parts = program.parts
    shown = program.name
    if "tupe" in parts and program.name != "__main__.py":  # a module of the package run as a script
        shown = "/".join(parts[len(parts) - 1 - parts[::-1].index("tupe") :])
    elif program.name == "__main__.py" or program.name == "tupe":
        shown = "tupe"
    out = [shown]
    for arg in argv[1:]:
        key, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if value.startswith("/"):
            value = recorded_path(value, base)
        out.append(f"{key}{eq}{value}")
    return " ".join(out)


PATH_KEYS = frozenset({"path", "files", "data_cache", "plot", "folder", "source", "text", "command"})


def relative_paths(data: Any, base: str | os.PathLike, key: str = "") -> Any:  # noqa: ANN401 - any JSON value
    """A record about to be written in folder `base` with the absolute paths under `PATH_KEYS` relative to `base`
    (a command line word by word, its program by name: `recorded_command`). Names (a model given by its path is
    named by it) stay as given: they label rows."""
    if isinstance(data, dict):
        return {k: relative_paths(v, base, k) for k, v in data.items()}
    if isinstance(data, list):
        return [relative_paths(v, base, key) for v in data]
    if not isinstance(data, str) or "/" not in data or key not in PATH_KEYS:
        return data
    if key == "command":
        return recorded_command(data.split(" "), base)
    if data.startswith("/") and not any(c.isspace() for c in data):
        return recorded_path(data, base)
    return data


# --- stripped records -------------------------------------------------------------------------------------------


def strip_result(data: Any, keys: Sequence[str] = BULKY) -> Any:  # noqa: ANN401 - any JSON value
    """`data` without `keys` at any depth."""
    if isinstance(data, dict):
        return {k: strip_result(v, keys) for k, v in data.items() if k not in keys}
    if isinstance(data, list):
        return [strip_result(v, keys) for v in data]
    return data


def restore(current: Any, original: Any, keys: Sequence[str]) -> Any:  # noqa: ANN401
    """`current` (a stripped record) with `keys` put back from `original`, wherever the original has them."""
    if isinstance(current, dict) and isinstance(original, dict):
        out = {}
        for k, v in original.items():
            if k in keys:
                out[k] = v
            elif k in current:
                out[k] = restore(current[k], v, keys)
        for k, v in current.items():  # keys the stripped file has and the original lacks (none today)
            out.setdefault(k, v)
        return out
    if isinstance(current, list) and isinstance(original, list) and len(current) == len(original):
        return [restore(c, o, keys) for c, o in zip(current, original, strict=True)]
    return current


def _manifest_for(path: Path) -> tuple[Path, dict[str, Any]] | None:
    for folder in path.parents:
        manifest = folder / MANIFEST
        if manifest.is_file():
            return folder, json.loads(manifest.read_text())
        if (folder / ".git").exists():
            return None
    return None


def _original_bytes(folder: Path, entry: dict[str, Any], commit: str, shown: str) -> bytes:
    try:
        data = subprocess.run(
            ["git", "-C", str(folder), "show", f"{commit}:{entry['original']}"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise TupeError(
            f"{shown}: its stripped keys are in git history ({entry['original']} at commit {commit[:12]}), which "
            "this copy cannot read (a source archive or a shallow clone: `git fetch --unshallow`)"
        ) from err
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise TupeError(f"{shown}: the original at {commit[:12]} has SHA-256 {digest}, not {entry['sha256']}")
    return data


def load_result(path: str | os.PathLike, whole: bool = True) -> Any:  # noqa: ANN401 - the JSON record
    """A result record as written: the file, and where a manifest (`stripped.json` in its folder or above) lists
    it and `whole` is true, its stripped keys put back from the original in git history (checksum verified)."""
    path = Path(path)
    data = json.loads(path.read_text())
    found = _manifest_for(path.absolute()) if whole else None
    if found is None:
        return data
    folder, manifest = found
    entry = manifest["files"].get(path.absolute().relative_to(folder).as_posix())
    if entry is None:
        return data
    original = json.loads(_original_bytes(folder, entry, manifest["commit"], str(path)))
    return restore(data, original, manifest["keys"])


def stripped_files(folder: str | os.PathLike) -> list[str]:
    """The files a folder's manifest lists, relative to the folder."""
    return sorted(json.loads((Path(folder) / MANIFEST).read_text())["files"])


def _arrays(data: Any, at: str = "") -> Iterator[tuple[str, list[Any]]]:  # noqa: ANN401
    """Every list of numbers under `data` with its key path (`models/3/per_block/nll`)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _arrays(v, f"{at}/{k}" if at else k)
    elif isinstance(data, list):
        if data and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data):
            yield at, data
        else:
            for i, v in enumerate(data):
                yield from _arrays(v, f"{at}/{i}")


def export_arrays(
    folder: str | os.PathLike, out: str | os.PathLike, keys: Sequence[str] = ("per_block",)
) -> Path:
    """The per-block numbers of every file a folder's manifest lists, as one `per_block.npz` in `out` (float64 or
    int64: exactly the JSON's numbers) and `per_block.json`: per array its file, key path, dtype, shape and sha256."""
    import numpy as np

    folder, out = Path(folder), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {}
    entries = []
    for rel in stripped_files(folder):
        whole = load_result(folder / rel)
        for key in keys:
            for at, values in _arrays(_only(whole, key)):
                dtype = np.int64 if all(isinstance(v, int) for v in values) else np.float64
                a = np.asarray(values, dtype=dtype)
                name = f"a{len(arrays)}"
                arrays[name] = a
                digest = hashlib.sha256(a.tobytes()).hexdigest()
                entries.append({"array": name, "file": rel, "key": at, "dtype": a.dtype.name, "shape": list(a.shape),
                                "sha256": digest})  # fmt: skip
    np.savez_compressed(out / "per_block.npz", **arrays)
    manifest = {"source": folder.as_posix(), "arrays": entries}
    (out / "per_block.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out / "per_block.npz"


def _only(data: Any, key: str) -> Any:  # noqa: ANN401
    """`data` reduced to the subtrees under `key` (their paths kept)."""
    if isinstance(data, dict):
        kept = {k: (v if k == key else _only(v, key)) for k, v in data.items()}
        return {k: v for k, v in kept.items() if v not in (None, {}, [])}
    if isinstance(data, list):
        kept = [_only(v, key) for v in data]
        return kept if any(v not in (None, {}, []) for v in kept) else None
    return None


def strip_folder(
    folder: str | os.PathLike, commit: str, files: Sequence[str], keys: Sequence[str] = BULKY
) -> None:
    """Strip `keys` from `files` (relative to `folder`) as they are at `commit`, and write the manifest that
    `load_result` restores them from (`python scripts/results/stored.py strip`)."""
    folder = Path(folder)
    root = Path(subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"], capture_output=True,
                               check=True, text=True).stdout.strip())  # fmt: skip
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    if manifest and manifest["commit"] != commit:
        raise TupeError(f"{manifest_path}: already names commit {manifest['commit'][:12]}")
    manifest = {
        "about": "per file: the keys stripped from it and the whole original in git history; "
        "tupe.io.results.load_result puts them back",
        "commit": commit,
        "keys": list(keys),
        "files": manifest.get("files", {}),
    }
    for rel in files:
        original = (folder / rel).absolute().relative_to(root.absolute()).as_posix()
        data = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{original}"], capture_output=True,
                              check=True).stdout  # fmt: skip
        record = json.loads(data)
        (folder / rel).write_text(json.dumps(strip_result(record, keys), indent=1, ensure_ascii=False) + "\n")
        manifest["files"][rel] = {
            "original": original,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
    manifest["files"] = dict(sorted(manifest["files"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
