"""argparse `type=` validators: every numeric flag is checked when it is parsed, with its allowed range in the
error message and in `--help` (`annotate_ranges` appends it), and path flags are checked for their kind before
any work starts (`check_out_folder`, `check_out_file`, `check_path_kind`).

A value out of range is `tupe CMD: error: argument --grad-accum: must be an integer >= 1, got 0`.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tupe.errors import TupeError


def _typed(fn: Callable[[str], object], text: str) -> Callable[[str], object]:
    fn.range_text = text  # type: ignore[attr-defined]
    fn.__name__ = text  # argparse names the type in some messages
    return fn


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An integer in [lo, hi] (either end open when None)."""
    text = (
        f"an integer from {lo} to {hi}"
        if lo is not None and hi is not None
        else f"an integer >= {lo}"
        if lo is not None
        else f"an integer <= {hi}"
        if hi is not None
        else "an integer"
    )

    def parse(s: str) -> int:
        try:
            v = int(str(s).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {text}, got {s!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {text}, got {v}")
        return v

    return _typed(parse, text)  # type: ignore[return-value]


def float_range(
    lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False
) -> Callable[[str], float]:
    """A finite number in the interval (open or closed ends); NaN and infinities are always refused."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    text = "a finite number" + (" " + " and ".join(parts) if parts else "")

    def parse(s: str) -> float:
        try:
            v = float(str(s).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {text}, got {s!r}") from None
        bad = not math.isfinite(v)
        if lo is not None:
            bad |= v <= lo if lo_open else v < lo
        if hi is not None:
            bad |= v >= hi if hi_open else v > hi
        if bad:
            raise argparse.ArgumentTypeError(f"must be {text}, got {s}")
        return v

    return _typed(parse, text)  # type: ignore[return-value]


# upper bounds where a value multiplies memory or time: beyond them a run cannot work on any machine, and numbers
# that large end in an allocation abort or an overflow deep inside a library instead of one line
MAX_STEPS = 2**31 - 1
MAX_VOCAB = 1 << 22
MAX_WIDTH = 1 << 16
MAX_LAYERS = 1024
MAX_LENGTH = 1 << 20
MAX_THREADS = 1024

positive_int = int_range(1)
nonneg_int = int_range(0)
seed_int = int_range(0, 2**32 - 1)  # numpy's and torch's seeding accept no more
positive_float = float_range(0, lo_open=True)
nonneg_float = float_range(0)
open_prob = float_range(0, 1, lo_open=True, hi_open=True)  # strictly between 0 and 1
unit_interval = float_range(0, 1, hi_open=True)  # 0 <= x < 1 (dropout, Adam betas)


def name_list(text: str, valid: Sequence[str], flag: str, what: str) -> list[str]:
    """A comma-separated list of names from `valid` (`--schemes bert-a,tupe-a`), at least one, none twice; a
    `TupeError` naming `flag` and the choices otherwise. The one parser of such lists (`what`: "scheme")."""
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    if not items:
        raise TupeError(f"{flag} needs at least one {what}")
    for item in items:
        if item not in valid:
            raise TupeError(f"unknown {what} {item!r} in {flag}; choose from: {', '.join(valid)}")
    if len(set(items)) != len(items):
        raise TupeError(f"{flag} lists a {what} twice: {text}")
    return items


def _comma_list(one: Callable[[str], Any], text: str, wording: str) -> Callable[[str], list]:
    """Comma-separated values, each read by `one`, at least one; else one error naming `text`."""

    def parse(s: str) -> list:
        items = [x for x in str(s).split(",") if x.strip()]
        try:
            if items:
                return [one(x) for x in items]
        except argparse.ArgumentTypeError:
            pass
        raise argparse.ArgumentTypeError(f"{wording} {text}, got {s!r}")

    return _typed(parse, text)  # type: ignore[return-value]


def int_list(lo: int = 1) -> Callable[[str], list[int]]:
    """Comma-separated integers, each >= lo."""
    return _comma_list(int_range(lo), f"comma-separated integers >= {lo}", "must be")


def seed_list(s: str) -> list[int]:
    """Comma-separated seeds, each a `seed_int`: refused while parsing, before any model loads."""
    return _seed_list(s)


_seed_list = _comma_list(seed_int, f"comma-separated seeds, each from 0 to {2**32 - 1}", "must be")
seed_list.range_text = _seed_list.range_text  # type: ignore[attr-defined]


def float_list(lo: float = 0.0, lo_open: bool = True) -> Callable[[str], list[float]]:
    """Comma-separated finite numbers, each > lo (or >= lo)."""
    text = f"comma-separated numbers (each finite, {'>' if lo_open else '>='} {lo:g})"
    return _comma_list(float_range(lo, lo_open=lo_open), text, "expected")


def nonempty_path(s: str) -> str:
    """A path that is not empty (`--out ""` would silently mean the current folder)."""
    if not str(s).strip():
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    if "\x00" in str(s):
        raise argparse.ArgumentTypeError(f"must be a path, got {s!r} (NUL byte)")
    return str(s)


nonempty_path.range_text = None  # type: ignore[attr-defined]


def add_threads_progress(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, what: str = "progress bars"
) -> None:
    """`--threads N` (validated, dest `threads`) and `--no-progress` (dest `progress`), worded alike in every
    command that computes; `apply_threads` applies the first."""
    p.add_argument(
        "--threads",
        type=int_range(1, MAX_THREADS),
        metavar="N",
        help="CPU threads for torch (default: torch's choice, all cores; 1 is faster on a busy machine)",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help=f"no {what}")


def apply_threads(threads: int | None) -> None:
    """torch.set_num_threads for `--threads` (nothing when it was not given)."""
    if threads is not None:
        import torch

        torch.set_num_threads(int(threads))


def annotate_ranges(parser: argparse.ArgumentParser) -> None:
    """Append each validated flag's allowed range to its `--help` text."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public accessor
        text = getattr(action.type, "range_text", None)
        if text and action.help is not argparse.SUPPRESS and "[" + text + "]" not in (action.help or ""):
            action.help = f"{action.help} [{text}]" if action.help else f"[{text}]"


def check_out_folder(flag: str, path: str | os.PathLike, must_exist: bool = False) -> Path:
    """`path` may be created as an output folder: not a file (or a link to one), not inside a file; with
    `must_exist`, it must exist (`--resume` on a misspelled folder must not start a fresh run)."""
    p = Path(path).expanduser()
    if not str(path).strip():
        raise TupeError(f"{flag} is empty; give a folder")
    if p.is_symlink() and not p.exists():
        raise TupeError(f"{flag} {p} is a broken symbolic link")
    if p.exists() and not p.is_dir():
        raise TupeError(f"{flag} {p} is a file, not a folder")
    if must_exist and not p.exists():
        raise TupeError(f"{flag} {p} does not exist (misspelled?); drop --resume to start a new run there")
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise TupeError(f"{flag} {p}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK) and not p.exists():
                raise TupeError(f"{flag} {p}: cannot create it, {parent} is not writable")
            break
    return p


def check_out_file(flag: str, path: str | os.PathLike) -> Path:
    """`path` may be written as an output file: not a folder or a device, and its folder can be made."""
    p = Path(path).expanduser()
    if not str(path).strip():
        raise TupeError(f"{flag} is empty; give a file")
    if p.is_dir():
        raise TupeError(f"{flag} {p} is a folder, expected a file")
    if p.exists() and not p.is_file():
        raise TupeError(f"{flag} {p} is not a regular file (a FIFO or device?)")
    for parent in p.absolute().parents:  # the nearest existing folder must be a writable folder
        if parent.exists():
            if not parent.is_dir():
                raise TupeError(f"{flag} {p}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK) or not _can_create_in(parent):
                raise TupeError(f"{flag} {p}: cannot write there, {parent} is not writable")
            break
    return p


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder`: `os.access` says yes to root everywhere, also in /proc and /sys,
    where nothing can be made. Probed with an unnamed temporary file (nothing is left, nothing is visible)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_path_kind(flag: str, path: str | os.PathLike, kind: str) -> Path:
    """An input path that must exist and be a `file`, a `folder`, or `any` of them."""
    p = Path(path).expanduser()
    if not str(path).strip():
        raise TupeError(f"{flag} is empty; give a path")
    if not p.exists():
        raise TupeError(f"{flag} {p}: no such {'file or folder' if kind == 'any' else kind}")
    if kind == "file" and not p.is_file():
        raise TupeError(
            f"{flag} {p} is {'a folder' if p.is_dir() else 'not a regular file'}, expected a file"
        )
    if kind == "folder" and not p.is_dir():
        raise TupeError(f"{flag} {p} is a file, expected a folder")
    if kind == "any" and not (p.is_file() or p.is_dir()):
        raise TupeError(f"{flag} {p} is not a regular file or folder (a FIFO or device?)")
    return p


def model_bytes(vocab: int, hidden: int, layers: int, intermediate: int) -> int:
    """Bytes to train an encoder of this shape in float32: weights, gradients and Adam's two moments (16 bytes a
    parameter); activations not counted."""
    params = vocab * hidden + layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    return 16 * params


def activation_bytes(
    batch: int,
    length: int,
    hidden: int,
    layers: int,
    heads: int,
    intermediate: int,
    vocab: int,
    training: bool,
) -> int:
    """Bytes of float32 activations of one forward pass over `batch` sequences of `length` tokens. Training keeps
    every layer's for the backward pass: per token and layer about 16 hidden-size vectors (queries, keys, values,
    context, outputs, norms, dropout masks), 2 intermediate-size ones (the feed-forward's input and output of its
    activation) and 3 attention rows per head (scores, probabilities, dropout mask), then 3 vocabulary-size rows
    (logits, softmax, gradient). Inference holds one layer at a time and the logits. Plus the (heads, length,
    length) position term a content-free scheme builds once per pass. Measured on CPU (tupe-a, 2 x 32 model,
    blocks of 32): 10.5 KB a token, estimated 10.3 KB."""
    per_layer = 16 * hidden + 2 * intermediate + 3 * heads * length
    per_token = (layers * per_layer if training else per_layer // 2 + per_layer % 2) + (
        3 if training else 1
    ) * vocab
    return 4 * batch * length * per_token + 4 * 2 * heads * length * length


def physical_memory() -> int | None:
    """The memory this process may use: the machine's physical memory, or less where a control group
    (`memory.max`, cgroup v1 `memory.limit_in_bytes`) or an address-space limit (`ulimit -v`) caps it."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as fh:
                value = fh.read(64).strip()
        except (OSError, UnicodeDecodeError):
            continue
        if value.isdigit() and 0 < int(value) < total:
            total = int(value)
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY and 0 < soft < total:
            total = soft
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        pass
    return total


def resident_bytes() -> int:
    """This process's resident memory now (Python, torch, what it has loaded), 0 where it cannot be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read(256).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):  # pragma: no cover - not Linux
        return 0


def check_memory(what: str, nbytes: int) -> None:
    """Refuse, before any allocation, settings that need more memory than the machine has beside what this process
    already holds (one line naming them): they would otherwise end in the kernel's OOM killer or an allocation
    abort (`tupe evaluate --lengths 19000`: an estimate of 9.45 GiB passed a 9.54 GiB limit, and the process's
    own gigabyte made the allocation fail)."""
    total = physical_memory()
    baseline = resident_bytes()
    if total is not None and nbytes + baseline > total:
        beside = f" leaves beside this process's {baseline / 2**30:,.1f} GiB" if baseline else ""
        raise TupeError(
            f"{what} needs about {nbytes / 2**30:,.1f} GiB of memory, more than this machine's "
            f"{total / 2**30:,.1f} GiB{beside}: choose smaller values"
        )


def parse_device(text: str):  # noqa: ANN201 - torch.device, imported lazily
    """`--device`: a torch device that exists here ('cpu', 'cuda', 'cuda:1', 'mps'), else one line naming it."""
    import torch

    try:
        device = torch.device(str(text))
    except (RuntimeError, ValueError, TypeError):
        raise TupeError(f"--device {text!r} is not a device (expected cpu, cuda, cuda:N or mps)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TupeError(f"--device {text}: no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise TupeError(f"--device {text}: there are only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type not in ("cpu", "mps"):
        raise TupeError(f"--device {text!r}: tupe runs on cpu, cuda or mps")
    return device
