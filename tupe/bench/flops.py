"""Model FLOPs of one training step, and the device's measured matrix-multiply peak.

Model FLOPs count the matrix multiplications the model's equations need (as in MFU, Chowdhery et al. 2022):
projections, attention scores and values, the positional term (once per forward for TUPE), the MLM head on the
rows it actually predicts; backward = 2 x forward. Work an implementation adds (the folded path's wider heads) is
not counted, so a faster backend scores higher only by running faster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used: `tupe bench --help` imports this module for `Shape`
    import torch

HF_DEBERTA = (
    "hf-deberta"  # transformers' DebertaV2ForMaskedLM (DeBERTa-v3's choices): the deberta scheme's count
)


@dataclass(frozen=True)
class Shape:
    """Encoder shape of a benchmark (BERT-Base by default)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    vocab_size: int = 32768
    dropout: float = 0.1


def preset_shape(name: str, layers: int | None = None) -> Shape:
    """The model shape and vocabulary of a preset of tupe.training.presets."""
    from tupe.training.presets import get_preset

    preset = get_preset(name)
    return Shape(
        hidden_size=preset["hidden_size"],
        num_hidden_layers=layers or preset["num_hidden_layers"],
        num_attention_heads=preset["num_attention_heads"],
        intermediate_size=preset["intermediate_size"],
        vocab_size=preset["vocab_size"],
        dropout=preset.get("dropout", 0.1),
    )


def forward_flops(shape: Shape, scheme: str, batch: int, seq_len: int, predicted_rows: int) -> float:
    """Matmul FLOPs of one forward pass (multiply-add = 2 FLOPs).

    `predicted_rows`: rows the MLM head runs on (masked tokens with sparse prediction, batch x seq_len without).
    `scheme` is a TUPE position scheme or a transformers comparator, counted as the scheme it implements (the
    scheme's report's `transformers_comparator`; "hf-bert": BERT-A with a dense head, "hf-deberta": DeBERTa).
    """
    from tupe.modeling.positional import comparator_scheme, scheme_class
    from tupe.training.model import HF_BERT

    h, f, v, layers = shape.hidden_size, shape.intermediate_size, shape.vocab_size, shape.num_hidden_layers
    tokens = batch * seq_len
    per_layer = 2 * tokens * h * (3 * h) + 2 * tokens * h * h + 2 * 2 * tokens * h * f
    per_layer += 2 * 2 * batch * seq_len * seq_len * h  # q k^T and probs v, all heads
    total = layers * per_layer
    cls = scheme_class(comparator_scheme(scheme) or scheme)
    if scheme != HF_BERT:
        total += cls.report.forward_flops(
            h, seq_len, shape.num_attention_heads
        )  # positional side, once per forward
    total += layers * cls.report.layer_flops(h, seq_len, batch)  # positional terms inside every layer
    total += 2 * predicted_rows * h * h + 2 * predicted_rows * h * v  # MLM head: dense + tied decoder
    return float(total)


def train_step_flops(shape: Shape, scheme: str, batch: int, seq_len: int, predicted_rows: int) -> float:
    """Forward + backward (2 x forward) model FLOPs of one optimizer step."""
    return 3.0 * forward_flops(shape, scheme, batch, seq_len, predicted_rows)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on the CPU."""
    import torch  # not at the top: `tupe bench --help` imports this module

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(
    device: torch.device,
    dtype: torch.dtype,
    sizes: tuple[int, ...] = (1024, 2048, 3072),
    repeats: int = 5,
    clock: str = "wall",
) -> tuple[float, dict[int, float]]:
    """Best FLOP/s of square `a @ b` over a few sizes (median of `repeats` timings each), in `dtype`.

    Returns (peak, {size: FLOP/s}). On a shared CPU the wall-clock figure moves with the load: measure it in the
    same run as the steps it divides. `clock="cpu"` divides by the process's CPU time instead (per busy
    core-second; with one thread, what the core does when it runs), the denominator of the CPU-time MFU.
    """
    import torch

    timer = time.perf_counter if clock == "wall" else time.process_time
    by_size = {}
    for n in sizes:
        if device.type == "cuda":
            n *= 4  # GPUs need larger products to approach their peak
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(2):
            a @ b
        synchronize(device)
        times = []
        for _ in range(repeats):
            t0 = timer()
            a @ b
            synchronize(device)
            times.append(timer() - t0)
        times.sort()
        by_size[n] = 2 * n**3 / times[len(times) // 2]
    return max(by_size.values()), by_size
