"""tupe.runtime: the malloc tuning keeps a freed 16 MiB block in the heap, and `keep_large_blocks` a 100 MiB one
(over glibc's 32 MiB cap on the mmap threshold) too, is off with TUPE_MALLOC_TUNING=0 and
is applied by the `tupe` command line. Each check runs in a fresh interpreter (the setting is process-wide)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# glibc's mallinfo2 (>= 2.33): `hblks` counts the blocks malloc got from mmap instead of the heap, `keepcost`
# the releasable top of the heap
_MALLINFO = """
import ctypes, sys
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
"""
_PROBE = (
    _MALLINFO
    + """{setup}
mapped = 0
for size in (16, 100):  # MiB: under and over glibc's 32 MiB cap on the mmap threshold
    before = libc.mallinfo2().hblks
    block = libc.malloc(size * 1024 * 1024)
    mapped += libc.mallinfo2().hblks - before
    libc.free(block)
print(tuned, mapped)
"""
)


def _run(code: str, env: dict | None = None) -> list[str]:
    """`code` (built on `_MALLINFO`) in a fresh interpreter; the words it prints."""
    if not hasattr(__import__("ctypes").CDLL("libc.so.6"), "mallinfo2"):
        pytest.skip("glibc without mallinfo2")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, env=env
    )
    return out.stdout.split()


def _probe(setup: str, env: dict | None = None) -> list[str]:
    return _run(_PROBE.format(setup=setup), env)


def test_tuned_allocator_keeps_large_blocks_in_the_heap():
    tuned, mapped = _probe(
        "import tupe.runtime as r\ntuned = r.tune_cpu_allocator() and r.cpu_allocator_tuned()"
    )
    assert tuned == "True"
    assert mapped == "1"  # 16 MiB served from the heap (freeing it returns nothing); 100 MiB still mapped
    tuned, mapped = _probe(
        "import tupe.runtime as r\nr.tune_cpu_allocator()\ntuned = r.keep_large_blocks() and r.large_blocks_kept()"
    )
    assert (tuned, mapped) == ("True", "0")  # both from the heap


def test_keep_large_blocks_needs_the_tuning():
    env = {**os.environ, "TUPE_MALLOC_TUNING": "0"}
    setup = "import tupe.runtime as r\nr.tune_cpu_allocator()\ntuned = r.keep_large_blocks()"
    assert _probe(setup, env) == ["False", "2"]


def test_untuned_allocator_maps_large_blocks_and_the_switch_turns_tuning_off():
    assert _probe("tuned = False") == [
        "False",
        "2",
    ]  # glibc's default: a fresh mmap (and page faults) per block
    env = {**os.environ, "TUPE_MALLOC_TUNING": "0"}
    assert _probe("import tupe.runtime as r\ntuned = r.tune_cpu_allocator()", env) == ["False", "2"]


def test_command_line_applies_it(tmp_path):
    setup = (
        "import tupe.cli, tupe.runtime as r\n"
        f"tupe.cli.main(['report', {str(tmp_path / 'missing')!r}])\n"  # fails after parsing: that is enough
        "tuned = r.cpu_allocator_tuned()"
    )
    tuned, mapped = _probe(setup)
    assert (tuned, mapped) == ("True", "1")  # `tupe report` keeps glibc's mmap for blocks over 32 MiB


def test_console_log_prints_each_line_unless_quiet(capsys):
    from tupe.runtime import console_log

    console_log(False)("step 1")
    console_log(True)("hidden")
    assert capsys.readouterr().out == "step 1\n"


def test_keep_large_blocks_never_trims_the_heap():
    """A step that frees more than the 1 GiB trim threshold (transformers' DeBERTa at `base`) keeps it in the heap:
    `keepcost` (the releasable top of the heap) still holds a freed 1.2 GiB block."""
    code = _MALLINFO + (
        "import tupe.runtime as r\nr.tune_cpu_allocator()\nkept = r.keep_large_blocks()\n"
        "block = libc.malloc(1200 * 1024 * 1024)\nlibc.free(block)\n"
        "print(kept, libc.mallinfo2().keepcost >= 1200 * 1024 * 1024)\n"
    )
    assert _run(code) == ["True", "True"]
