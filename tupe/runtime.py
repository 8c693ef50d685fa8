"""Process-wide settings every command shares: the CPU allocator tuning that makes small-shape training faster
(the `tupe` command applies it), the libraries' progress bars and verbosity (`hushed_libraries`), the commands'
own progress lines (`console_log`) and the version.

glibc's malloc hands every large block (a step's logits, attention scores, activations) back to the kernel
when it is freed and maps fresh zeroed pages for the next step: at the `mini` shape that was about a million
page faults per 30 steps and a quarter of the step time (docs/benchmarks.md). `tune_cpu_allocator` keeps
blocks of up to 32 MiB (glibc's maximum for the mmap threshold) in the heap and stops trimming the heap's top
below 1 GiB, so freed memory is reused by the next step; the peak resident memory is unchanged, what changes is
that freed memory stays with the process instead of going back to the system between steps.

Blocks over 32 MiB are still mapped afresh. Where the sizes repeat every step (pre-training's packed blocks,
`tupe bench`), `keep_large_blocks` also turns glibc's mmap off, so that the 100 MB gradients of the
32,768 x 768 word embeddings at the `base` shape stop costing about 49,000 page faults per step, and stops
trimming the heap at all (a step that frees more than 1 GiB, as transformers' DeBERTa's does at `base`, had it
mapped back every round of `tupe bench`: about 300,000 page faults per step). It is not part of
`tune_cpu_allocator`: with sizes that vary (evaluation at several lengths) large blocks kept in the heap raised
the peak RSS by 5-65% (docs/benchmarks.md).

It is a process-wide switch, so importing `tupe` does not flip it: the `tupe` command line does, and library
users may call it themselves. `TUPE_MALLOC_TUNING=0` in the environment turns it off everywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable, Iterator

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
MMAP_THRESHOLD = 32 * 1024 * 1024  # the largest value glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1024 * 1024 * 1024

_tuned: bool | None = None  # None: not tried yet
_large_kept = False
_mallopt: Callable[[int, int], int] | None = None


def tune_cpu_allocator() -> bool:
    """Make glibc's malloc keep freed blocks for reuse (see the module docstring); True if it is in effect.

    Idempotent. Does nothing (False) off Linux/glibc (e.g. musl, macOS, Windows) or when the environment sets
    `TUPE_MALLOC_TUNING=0`.
    """
    global _tuned, _mallopt
    if _tuned is not None:
        return _tuned
    _tuned = False
    if os.environ.get("TUPE_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname; find_library would run ldconfig in a subprocess
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError on a libc that is not glibc
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; setting the mmap threshold also turns off glibc's dynamic adjustment of both
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    _mallopt = mallopt if _tuned else None  # for keep_large_blocks
    return _tuned


def keep_large_blocks() -> bool:
    """Where `tune_cpu_allocator` is in effect, turn glibc's mmap off for blocks over 32 MiB too (they come from
    the heap, and glibc maps memory only when the heap cannot grow) and stop trimming the heap; True if it is in
    effect.

    For loops whose block sizes repeat every step (pre-training, `tupe bench`), called when the loop starts;
    see the module docstring for why it is not part of `tune_cpu_allocator`. Idempotent; process-wide.
    """
    global _large_kept
    if not _large_kept and _mallopt is not None:  # set by tune_cpu_allocator only when it took effect
        # and never trim the heap's top (-1, mallopt(3)): a model whose step frees more than the 1 GiB above
        # (transformers' DeBERTa at the base shape: about 300,000 page faults per step in tupe bench) can map it back
        # every step
        _large_kept = _mallopt(_M_MMAP_MAX, 0) == 1 and _mallopt(_M_TRIM_THRESHOLD, -1) == 1
    return _large_kept


def large_blocks_kept() -> bool:
    """Whether `keep_large_blocks` is in effect in this process (recorded by `tupe bench`)."""
    return _large_kept


def cpu_allocator_tuned() -> bool:
    """Whether `tune_cpu_allocator` is in effect in this process (recorded by `tupe bench`)."""
    return bool(_tuned)


def tupe_version() -> str:
    """The installed distribution's version (package metadata); `tupe.__version__`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tupe")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that was never installed
        return "0+unknown"


@contextlib.contextmanager
def hushed_libraries(progress: bool = True, quiet: bool = False) -> Iterator[None]:
    """`--no-progress` / `--quiet` for the libraries too, while the command runs: no "Writing model shards" /
    "Loading weights" / `datasets` bars without progress; only errors from `transformers` and `datasets` with
    --quiet. The previous settings come back afterwards. Without `datasets` installed (a GPU image may lack it;
    pre-training the built-in corpus never imports it), only `transformers` is hushed."""
    import transformers

    try:
        import datasets
    except ImportError:
        datasets = None

    hf = transformers.utils.logging
    saved = (hf.get_verbosity(), hf.is_progress_bar_enabled())
    saved_ds = (datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()) if datasets else None
    if not progress or quiet:
        hf.disable_progress_bar()
        if datasets:
            datasets.disable_progress_bars()
    if quiet:
        hf.set_verbosity_error()
        if datasets:
            datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        hf.set_verbosity(saved[0])
        if saved[1]:
            hf.enable_progress_bar()
        if datasets and saved_ds:
            datasets.logging.set_verbosity(saved_ds[0])
            if saved_ds[1]:
                datasets.enable_progress_bars()


def console_log(quiet: bool) -> Callable[[str], None]:
    """A command's progress-line printer: each line flushed at once (a log piped to a file keeps up), none with
    --quiet."""

    def log(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    return log
