"""Resident memory with glibc's mmap on ("before") or off ("after", `tupe.keep_large_blocks()`) when block
sizes vary: a `base`-shape tupe-a (untrained) evaluates inputs of 512, 1024, 2048, 4096, 1024, 4096, 512 tokens
without gradients, two threads; RSS and peak RSS (MiB) after each. Usage (docs/benchmarks.md):

    python benchmarks/mmap_max_rss.py before; python benchmarks/mmap_max_rss.py after
"""

import resource

import torch

import tupe
from tupe.bench.flops import preset_shape
from tupe.bench.runner import tupe_config
from tupe.modeling import TupeForMaskedLM
from tupe.scripts import ScriptParser, parse_or_exit  # noqa: E402

parser = ScriptParser(prog="mmap_max_rss.py", description=__doc__.splitlines()[0])
parser.add_argument("mode", choices=("before", "after"))
args = parse_or_exit(parser)
tupe.tune_cpu_allocator()
if args.mode == "after":
    tupe.keep_large_blocks()  # glibc's mmap off for blocks over 32 MiB too
torch.set_num_threads(2)
shape = preset_shape("base")
cfg = tupe_config("tupe-a", "auto", shape, 4096)
m = TupeForMaskedLM(cfg).eval()


def rss():
    return int([line for line in open("/proc/self/status") if line.startswith("VmRSS")][0].split()[1]) // 1024


with torch.no_grad():
    for n in (512, 1024, 2048, 4096, 1024, 4096, 512):
        m(input_ids=torch.randint(5, 1000, (1, n)))
        print(
            args.mode,
            n,
            "rss",
            rss(),
            "peak",
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            flush=True,
        )
