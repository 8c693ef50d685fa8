"""transformers' DeBERTa at the `base` shape with the heap trimmed above 1 GiB ("trim") or never ("notrim").

One process per mode: `tupe.tune_cpu_allocator()`, blocks over 32 MiB from the heap (`M_MMAP_MAX` 0), and for
"notrim" `tupe.keep_large_blocks()` (which also sets `M_TRIM_THRESHOLD` to -1, as `tupe bench` now does). Builds
the bench's hf-deberta and tupe deberta candidates (batch 1 x 512, one thread), runs 2 hf-deberta steps, then
3 rounds of one deberta step and one hf-deberta step, printing each step's wall and CPU time and minor page
faults. Usage, from the repository root (docs/benchmarks.md):

    python benchmarks/hf_deberta_trim_ab.py trim; python benchmarks/hf_deberta_trim_ab.py notrim
"""

import ctypes
import resource
import time

import torch

import tupe
from tupe.bench.flops import preset_shape
from tupe.bench.runner import build_hf_deberta, build_tupe, make_batch
from tupe.scripts import ScriptParser, parse_or_exit  # noqa: E402

parser = ScriptParser(prog="hf_deberta_trim_ab.py", description=__doc__.splitlines()[0])
parser.add_argument("mode", choices=("trim", "notrim"))
args = parse_or_exit(parser)
tupe.tune_cpu_allocator()
if args.mode == "notrim":
    tupe.keep_large_blocks()
else:
    ctypes.CDLL("libc.so.6").mallopt(-4, 0)  # M_MMAP_MAX 0 only: the heap is still trimmed above 1 GiB
torch.set_num_threads(1)
shape, seq, cpu = preset_shape("base"), 512, torch.device("cpu")
batch = make_batch(1, seq, shape.vocab_size, cpu)
hf = build_hf_deberta(shape, seq, batch, cpu, torch.float32)
ours = build_tupe("deberta", "auto", shape, seq, batch, cpu, torch.float32)


def step(candidate) -> str:  # noqa: ANN001
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0, c0 = time.perf_counter(), time.process_time()
    candidate.step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return f"{candidate.label} {time.perf_counter() - t0:.2f} s (cpu {time.process_time() - c0:.2f}) faults {faults}"


for _ in range(2):
    print(args.mode, "alone", step(hf), flush=True)
for _ in range(3):
    print(args.mode, "alternating", step(ours), "|", step(hf), flush=True)
