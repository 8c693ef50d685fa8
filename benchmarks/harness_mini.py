"""Time hf-bert, bert-a and tupe-a at the mini shape in one process, as an outside harness would.

No benchmark machinery runs before the models (`tupe bench` first measures a matmul peak on large matrices, which
changes glibc's malloc thresholds by itself). `tupe.bench.runner` only builds the models, the batch and the
training step (forward, backward, clipping, fused AdamW). Usage (docs/benchmarks.md):

    python benchmarks/harness_mini.py untuned|tuned [DROPOUT]
"""

import dataclasses
import statistics

import torch

from tupe.scripts import ScriptParser, parse_or_exit
from tupe.validators import float_range

parser = ScriptParser(prog="harness_mini.py", description=__doc__.splitlines()[0])
parser.add_argument("allocator", choices=("untuned", "tuned"))
parser.add_argument(
    "dropout", nargs="?", type=float_range(0.0, 1.0, lo_open=False, hi_open=True), default=0.0
)
args = parse_or_exit(parser)

if args.allocator == "tuned":
    import tupe

    tupe.tune_cpu_allocator()
from tupe.bench import runner  # noqa: E402
from tupe.bench.flops import preset_shape  # noqa: E402

torch.set_num_threads(2)
dropout = args.dropout
shape = dataclasses.replace(preset_shape("mini"), dropout=dropout)  # 2 x 128, 4 heads, FFN 512, vocab 8192
device = torch.device("cpu")
batch = runner.make_batch(32, 128, 8192, device)
candidates = [runner.build_hf_bert(shape, 128, batch, device, torch.float32)] + [
    runner.build_tupe(s, "default", shape, 128, batch, device, torch.float32) for s in ("bert-a", "tupe-a")
]
runner.time_interleaved(candidates, device, rounds=20, warmup=3)
m = {c.scheme: statistics.median(c.times) for c in candidates}
print(
    args.allocator,
    " ".join(f"{k} {1000 * v:.0f} ms" for k, v in m.items()),
    f"tupe-a/hf-bert {m['tupe-a'] / m['hf-bert']:.3f} tupe-a/bert-a {m['tupe-a'] / m['bert-a']:.3f}",
)
