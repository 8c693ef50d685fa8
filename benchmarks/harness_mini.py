"""Time hf-bert, bert-a and tupe-a at the mini shape in one process, as an outside harness would.

No benchmark machinery runs before the models (`tupe bench` first measures a matmul peak on large matrices, which
changes glibc's malloc thresholds by itself). `tupe.bench.runner` only builds the models, the batch and the
training step (forward, backward, clipping, fused AdamW). Usage (docs/benchmarks.md):

    python benchmarks/harness_mini.py untuned|tuned [DROPOUT]
"""

import dataclasses
import statistics
import sys

import torch

if sys.argv[1] == "tuned":
    import tupe

    tupe.tune_cpu_allocator()
from tupe.bench import runner  # noqa: E402
from tupe.bench.flops import preset_shape  # noqa: E402

torch.set_num_threads(2)
dropout = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
shape = dataclasses.replace(preset_shape("mini"), dropout=dropout)  # 2 x 128, 4 heads, FFN 512, vocab 8192
device = torch.device("cpu")
batch = runner.make_batch(32, 128, 8192, device)
candidates = [runner.build_hf_bert(shape, 128, batch, device, torch.float32)] + [
    runner.build_tupe(s, "default", shape, 128, batch, device, torch.float32) for s in ("bert-a", "tupe-a")
]
runner.time_interleaved(candidates, device, rounds=20, warmup=3)
m = {c.scheme: statistics.median(c.times) for c in candidates}
print(
    sys.argv[1],
    " ".join(f"{k} {1000 * v:.0f} ms" for k, v in m.items()),
    f"tupe-a/hf-bert {m['tupe-a'] / m['hf-bert']:.3f} tupe-a/bert-a {m['tupe-a'] / m['bert-a']:.3f}",
)
