"""deberta before and after its layers project each relative row once, interleaved in one process.

Before (the code up to 51483fc): every layer projected one relative vector per offset, 2n - 1 rows (1,023 at
n = 512). Now: one per row of the table that the input reads (511 at n = 512 with 256 log buckets), gathered per
offset after the projection. "before" is rebuilt here by giving one model the old `DisentangledPositions.forward`
(same weights, same batch, the old projection exactly); both train at the `base` shape, batch 1 x 512, one thread.
Usage, from the repository root (docs/benchmarks.md):

    python benchmarks/deberta_rows_ab.py [ROUNDS]
"""

import statistics
import types

import torch

import tupe
from tupe.bench.flops import preset_shape
from tupe.bench.runner import build_tupe, make_batch, time_interleaved

tupe.tune_cpu_allocator()  # as the `tupe` command runs
torch.set_num_threads(1)
from tupe.scripts import ScriptParser, parse_or_exit  # noqa: E402
from tupe.validators import int_range  # noqa: E402

parser = ScriptParser(prog="deberta_rows_ab.py", description=__doc__.splitlines()[0])
parser.add_argument("rounds", nargs="?", type=int_range(1, 1000), default=4)
rounds = parse_or_exit(parser).rounds
shape, seq, cpu = preset_shape("base"), 512, torch.device("cpu")
batch = make_batch(1, seq, shape.vocab_size, cpu)
before = build_tupe("deberta", "auto", shape, seq, batch, cpu, torch.float32)
after = build_tupe("deberta", "auto", shape, seq, batch, cpu, torch.float32)
before.label, after.label = "before: one row per offset", "after: each row read once"


def per_offset(self, n):
    """The old forward: LN(P) of each offset's row, 2n - 1 vectors, no index."""
    offsets = torch.arange(n - 1, -n, -1, device=self.rel_embeddings.weight.device)
    return self.LayerNorm(self.rel_embeddings(self.rows(offsets))), None


relative = before.model.tupe.positional.relative
relative.forward = types.MethodType(per_offset, relative)
rows = [c.model.tupe.positional.relative(seq)[0].shape[0] for c in (before, after)]
print(f"relative rows each layer projects: before {rows[0]}, after {rows[1]}")
time_interleaved([before, after], cpu, rounds, 1)
for c in (before, after):
    print(
        f"{c.label:28s} wall {statistics.median(c.times):7.3f} s  cpu {statistics.median(c.cpu_times):7.3f} s"
        f"  (cpu per round {[round(t, 2) for t in c.cpu_times]})"
    )
wall = statistics.median(after.times) / statistics.median(before.times)
cpu_ratio = statistics.median(after.cpu_times) / statistics.median(before.cpu_times)
print(f"after / before: wall {wall:.3f}, cpu {cpu_ratio:.3f}")
