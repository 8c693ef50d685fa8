"""glibc's mmap for blocks over 32 MiB on or off, at the `base` shape: fresh processes, alternating.

`tupe.tune_cpu_allocator` sets the mmap threshold (32 MiB, glibc's cap) and the trim threshold, so blocks over
32 MiB (the 32,768 x 768 gradients of the word embeddings, 100 MB) are still mapped afresh each step;
`tupe.keep_large_blocks` (which `tupe pretrain` and `tupe bench` call) also sets `M_MMAP_MAX` to 0. Each run
here is a fresh interpreter that applies the tuning, and for "after" `keep_large_blocks`, trains `SCHEME` for
2 + STEPS steps (batch 1 x 512, one thread) and prints the median step's wall and CPU time, the minor page
faults per step and the peak RSS. Usage, from the repository root (docs/benchmarks.md):

    python benchmarks/mmap_max_ab.py [SCHEMES] [PAIRS] [STEPS]     # defaults: bert-a,deberta 2 4
"""

import json
import statistics
import subprocess
import sys

CHILD = """
import json, resource, statistics, sys, time
import torch, tupe
from tupe.bench.flops import preset_shape
from tupe.bench.runner import build_tupe, make_batch
tupe.tune_cpu_allocator()
if sys.argv[1] == "after":
    tupe.keep_large_blocks()  # glibc's mmap off for blocks over 32 MiB too
torch.set_num_threads(1)
shape, cpu = preset_shape("base"), torch.device("cpu")
batch = make_batch(1, 512, shape.vocab_size, cpu)
c = build_tupe(sys.argv[2], "auto", shape, 512, batch, cpu, torch.float32)
c.step(); c.step()
wall, cpu_s, faults = [], [], []
for _ in range(int(sys.argv[3])):
    f0, t0, p0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter(), time.process_time()
    c.step()
    wall.append(time.perf_counter() - t0); cpu_s.append(time.process_time() - p0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps(dict(wall=statistics.median(wall), cpu=statistics.median(cpu_s), faults=statistics.median(faults),
                      peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""

from tupe.modeling import POSITION_SCHEMES  # noqa: E402
from tupe.scripts import ScriptParser, parse_or_exit  # noqa: E402
from tupe.validators import int_range, name_list  # noqa: E402

parser = ScriptParser(prog="mmap_max_ab.py", description=__doc__.splitlines()[0])
parser.add_argument(
    "schemes",
    nargs="?",
    type=lambda text: name_list(text, POSITION_SCHEMES, "SCHEMES", "scheme"),
    default=["bert-a", "deberta"],
)
parser.add_argument("pairs", nargs="?", type=int_range(1, 1000), default=2)
parser.add_argument("steps", nargs="?", type=int_range(1, 10000), default=4)
args = parse_or_exit(parser)
schemes, pairs, steps = args.schemes, args.pairs, str(args.steps)
results: dict = {}
for pair in range(pairs):
    for scheme in schemes:
        for mode in ("before", "after") if pair % 2 == 0 else ("after", "before"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode, scheme, steps], capture_output=True, text=True, check=True
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results.setdefault((scheme, mode), []).append(row)
            print(scheme, mode, row, flush=True)
for scheme in schemes:
    b, a = results[(scheme, "before")], results[(scheme, "after")]
    med = {k: [statistics.median(r[k] for r in rows) for rows in (b, a)] for k in b[0]}
    print(
        f"{scheme}: wall {med['wall'][0]:.3f} -> {med['wall'][1]:.3f} s ({med['wall'][1] / med['wall'][0]:.3f}), "
        f"cpu {med['cpu'][0]:.3f} -> {med['cpu'][1]:.3f} s ({med['cpu'][1] / med['cpu'][0]:.3f}), "
        f"faults/step {med['faults'][0]:.0f} -> {med['faults'][1]:.0f}, "
        f"peak RSS {med['peak_rss_mib'][0]:.0f} -> {med['peak_rss_mib'][1]:.0f} MiB"
    )
