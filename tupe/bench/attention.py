"""`tupe bench --attention-only`: the attention core of a whole encoder, forward + backward, per backend.

What is timed is exactly what the backends differ in: the content-free term computed once (`TupeModel.
_attention_inputs`) and `TupeSelfAttention.attend` of every layer on given projected queries, keys and values,
then the backward pass into them and into the positional parameters. The QKV / output projections, identical in
every backend, are left out (they would dilute the ratios); the full-step benchmark has them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .flops import Shape
from .runner import tupe_config


@dataclass
class AttentionCandidate:
    label: str
    scheme: str
    backend: str
    kernel: str
    run: Callable[[], None]
    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)


def build_attention_candidate(
    scheme: str, backend: str, shape: Shape, batch_size: int, seq_len: int, device: torch.device
) -> AttentionCandidate:
    from tupe.modeling import TupeModel, resolve_attention_kernel

    config = tupe_config(
        scheme, backend, shape, seq_len, vocab_size=8, intermediate_size=8
    )  # no embeddings used
    torch.manual_seed(0)
    model = TupeModel(config).to(device).train()
    h, d = config.num_attention_heads, config.head_dim
    g = torch.Generator(device="cpu").manual_seed(1)
    # (b, n, 3, h, d) leaves viewed as (b, h, n, d), the layout the fused QKV projection produces
    leaves = [
        torch.randn(batch_size, seq_len, 3, h, d, generator=g).to(device).requires_grad_()
        for _ in range(config.num_hidden_layers)
    ]
    grads = [
        torch.randn(batch_size, seq_len, h, d, generator=g).to(device) for _ in leaves
    ]  # (b, n, h, d) outputs
    resolved = resolve_attention_kernel(model, device, torch.float32, training=True, grad=True)

    def run() -> None:
        inputs = model._attention_inputs(seq_len, None, torch.float32)
        outs = []
        for layer, leaf in zip(model.layers, leaves):
            q, k, v = leaf.permute(2, 0, 3, 1, 4)
            outs.append(layer.attention.attend(q, k, v, inputs)[0])
        torch.autograd.backward(outs, grads)
        for t in leaves:
            t.grad = None
        model.zero_grad(set_to_none=True)

    return AttentionCandidate(f"{scheme} [{backend}]", scheme, backend, resolved, run)


def time_attention(
    candidates: list[AttentionCandidate],
    device: torch.device,
    rounds: int,
    warmup: int,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    order = list(range(len(candidates)))
    for r in range(warmup + rounds):
        for i in order:
            cand = candidates[i]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
            cand.run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
            if r >= warmup:
                cand.times.append(elapsed)
                cand.cpu_times.append(time.process_time() - c0)
            if progress is not None:
                progress(f"{'warm-up' if r < warmup else 'round'} {cand.label} {elapsed * 1e3:.1f} ms")
        order = order[1:] + order[:1]
    rows = []
    for cand in candidates:
        times = sorted(cand.times)
        rows.append(
            {
                "label": cand.label,
                "scheme": cand.scheme,
                "backend": cand.backend,
                "kernel": cand.kernel,
                "ms_median": statistics.median(times) * 1e3,
                "ms_min": times[0] * 1e3,
                "ms_max": times[-1] * 1e3,
                "cpu_ms_median": statistics.median(cand.cpu_times) * 1e3,
            }
        )
    eager = {r["scheme"]: r for r in rows if r["backend"] == "eager"}
    for r in rows:
        ref = eager.get(r["scheme"])
        r["vs_eager"] = r["ms_median"] / ref["ms_median"] if ref else None
        r["cpu_vs_eager"] = r["cpu_ms_median"] / ref["cpu_ms_median"] if ref else None
    return rows
