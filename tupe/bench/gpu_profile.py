"""The GPU suite's `profile` stage in its own process (`python -m tupe.bench.gpu_suite --profile-child`): one base
training step of each model under PyTorch's profiler."""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .gpu_environment import write_json

PROFILED = (
    "bert-a",
    "tupe-a",
    "alibi",
)  # bert-a with SDPA flash, then these with their default kernels, + hf-bert


def _device_time_us(event) -> float:  # noqa: ANN001 - a profiler FunctionEventAvg
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def _builders(shape: Any, seq_len: int, batch: Any, device: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(label, build) of each profiled model: bert-a with SDPA flash, the others of PROFILED with their default
    kernels, transformers' BERT."""
    import torch

    from .runner import build_flash_baseline, build_hf_bert, build_tupe

    builders = [
        (
            "bert-a [sdpa-flash]",
            lambda: build_flash_baseline(shape, seq_len, batch, device, torch.float32, torch.bfloat16),
        )
    ]
    for scheme in PROFILED[1:]:
        builders.append(
            (
                f"{scheme} [default]",
                lambda s=scheme: build_tupe(
                    s, "default", shape, seq_len, batch, device, torch.float32, torch.bfloat16
                ),
            )
        )
    builders.append(("hf-bert", lambda: build_hf_bert(shape, seq_len, batch, device, torch.float32)))
    return builders


def _profiled_step(cand: Any, device: Any, steps: int, warmup: int, activities: list) -> dict:
    """One model's figures: `warmup` steps (and any compilation) outside the profile, then `steps` under it."""
    import torch
    from torch.autograd import DeviceType

    from .flops import synchronize
    from .profiling import quiet_profile

    for _ in range(warmup):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            cand.step()
    synchronize(device)
    with quiet_profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                cand.step()
        synchronize(device)
        wall = (time.perf_counter() - t0) / steps
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    busy = sum(_device_time_us(e) for e in kernels) / 1e6 / steps
    return dict(
        wall_ms=1e3 * wall,
        gpu_busy_ms=1e3 * busy if kernels else None,
        gpu_idle_share=(1 - busy / wall) if kernels else None,
        kernel_launches_per_step=sum(e.count for e in kernels) / steps if kernels else None,
        top_kernels=[
            {
                "name": e.key[:90],
                "ms_per_step": _device_time_us(e) / 1e3 / steps,
                "calls": e.count // steps,
            }
            for e in sorted(kernels, key=_device_time_us, reverse=True)[:8]
        ],
        top_cpu_ops=[
            {"name": e.key[:90], "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps}
            for e in sorted(
                (e for e in events if e.device_type == DeviceType.CPU),
                key=lambda e: e.self_cpu_time_total,
                reverse=True,
            )[:8]
        ],
    )


def _print_row(label: str, row: dict) -> None:
    busy = row.get("gpu_busy_ms")
    print(
        f"profile: {label:24s} "
        + (
            row.get("error")
            or f"wall {row['wall_ms']:.1f} ms/step"
            + (
                f", GPU busy {busy:.1f} ms ({100 * (1 - row['gpu_idle_share']):.0f}%), "
                f"{row['kernel_launches_per_step']:.0f} kernels/step"
                if busy is not None
                else ""
            )
        ),
        flush=True,
    )


def profile_child(args: argparse.Namespace) -> int:
    """`profile`, in its own process: one base training step of each model under PyTorch's profiler (CPU + CUDA
    activities): wall time per step, the GPU's busy time (sum of kernel times) and so its idle share, the top
    kernels and the top CPU-side operators. A step whose GPU is mostly idle is launch-bound, not compute-bound."""
    import torch
    from torch.profiler import ProfilerActivity

    from .flops import Shape, preset_shape
    from .runner import make_batch

    device = torch.device(args.device)
    out = Path(args.out)
    if args.smoke:
        shape, seq_len, batch_size, steps = Shape(64, 2, 1, 256, 1000, 0.1), 32, 2, 1
    else:
        shape, seq_len, batch_size, steps = preset_shape("base"), 512, 16, 3
    batch = make_batch(batch_size, seq_len, shape.vocab_size, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    result: dict = {
        "shape": shape.__dict__,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "steps": steps,
        "rows": [],
    }

    for label, build in _builders(shape, seq_len, batch, device):
        row: dict = {"label": label}
        try:
            cand = build()
            row["kernel"] = cand.kernel
            row.update(_profiled_step(cand, device, steps, 1 if args.smoke else 3, activities))
            del cand
        except Exception as e:  # noqa: BLE001 - recorded; the next model runs
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        write_json(out / "profile.json", result)
        _print_row(label, row)
    return 0
