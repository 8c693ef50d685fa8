"""The cost of glibc mapping fresh pages for a 100 MB block, in isolation (docs/benchmarks.md).

Fresh interpreters with `tupe.tune_cpu_allocator()` applied, and for "after" `tupe.keep_large_blocks()`
(glibc's `M_MMAP_MAX` at 0); each times, on one thread, a zero-filled 32,768 x 768 float32 tensor (the word
embeddings' gradient at the `base` shape, which the embedding's backward allocates every step) and the
(32,768 x 75) @ (75 x 768) product that gives the tied decoder's gradient. Usage: python benchmarks/mmap_max_micro.py
"""

import subprocess
import sys

CHILD = """
import resource, statistics, sys, time
import torch, tupe
tupe.tune_cpu_allocator()
if sys.argv[1] == "after":
    tupe.keep_large_blocks()  # glibc's mmap off for blocks over 32 MiB too
torch.set_num_threads(1)
x, y = torch.rand(32768, 75), torch.rand(75, 768)
for name, f in (("zeros(32768, 768)", lambda: torch.zeros(32768, 768)), ("mm -> 32768 x 768", lambda: x @ y)):
    f()
    times, faults = [], []
    for _ in range(9):
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(f"{sys.argv[1]:6s} {name:18s} {statistics.median(times) * 1e3:6.1f} ms  {statistics.median(faults):6.0f} faults")
"""

from tupe.scripts import ScriptParser, parse_or_exit  # noqa: E402

parse_or_exit(ScriptParser(prog="mmap_max_micro.py", description=__doc__.splitlines()[0]))  # no arguments
for mode in ("before", "after", "before", "after"):
    print(
        subprocess.run(
            [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
        ).stdout,
        end="",
    )
