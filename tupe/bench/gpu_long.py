"""The GPU suite's `long` stage in its own process (`python -m tupe.bench.gpu_suite --long-child`): batch 1 at
long sequences, one model at a time, until it runs out of memory."""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Any

from .gpu_environment import bert_scheme, write_json

# the schemes of `long`, in the order they are measured (the budget may end the list): those whose kernel builds
# no n x n tensor first (bert-a: SDPA flash; tupe-a: the folded term; rope: flash), then deberta (its (b, h, n, n)
# terms: where memory runs out), then the flex schemes (compiled anew for every length: the slowest to measure)
LONG_ORDER = ("bert-a", "tupe-a", "rope", "deberta", "alibi", "t5", "tupe-r", "bert-r", "bert-a-d")
LONG_LENGTHS = (1024, 2048, 4096, 8192)


def _plan(args: argparse.Namespace) -> tuple[tuple[int, ...], int, Any, list[str]]:
    """(lengths, timed rounds, shape, schemes in order) of the stage: tiny ones with --smoke."""
    from tupe.modeling import POSITION_SCHEMES

    from .flops import Shape, preset_shape

    if args.smoke:
        lengths, rounds = (64, 128), 1
        shape = Shape(64, 2, 1, 256, 1000, 0.0)
    else:
        lengths, rounds = LONG_LENGTHS, 3
        shape = Shape(**{**preset_shape("base").__dict__, "dropout": 0.0})  # no dropout: flex may run
    order = [s for s in LONG_ORDER if s in POSITION_SCHEMES] + [
        s for s in POSITION_SCHEMES if s not in LONG_ORDER
    ]
    if args.long_schemes:
        order = [s.strip() for s in args.long_schemes.split(",") if s.strip()]
    return lengths, rounds, shape, order


def _timed_steps(cand: Any, device: Any, n: int, rounds: int, row: dict) -> None:
    """One untimed first step (with any compilation) and `rounds` timed ones of `cand`, into `row`."""
    import torch

    from .runner import state_bytes

    state = state_bytes(cand)
    times = []
    for i in range(1 + rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            cand.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i == 0:
            row["first_step_s"] = time.perf_counter() - t0  # includes any compilation
        else:
            times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        row["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        row["step_peak_above_state_bytes"] = int(torch.cuda.max_memory_allocated() - before)
    row["state_bytes"] = state
    row["step_s"] = statistics.median(times)
    row["tokens_per_s"] = n / row["step_s"]
    row["model_tflops_per_step"] = cand.flops / 1e12


def _print_row(scheme: str, n: int, row: dict) -> None:
    mem = row.get("peak_bytes")
    print(
        f"long: {scheme:15s} n={n:5d} kernel={row.get('kernel', '-'):6s} "
        + (
            f"step {row['step_s'] * 1e3:8.1f} ms  peak {mem / 2**30:6.2f} GiB"
            if "step_s" in row and mem is not None
            else (f"step {row['step_s'] * 1e3:8.1f} ms" if "step_s" in row else row.get("error", ""))
        ),
        flush=True,
    )


def long_child(args: argparse.Namespace) -> int:
    """`long`, in its own process: one model at a time, its rows written after each measurement."""
    import torch

    from .runner import build_flash_baseline, build_tupe, make_batch

    device = torch.device(args.device)
    out = Path(args.out)
    lengths, rounds, shape, order = _plan(args)
    result: dict = {"shape": shape.__dict__, "lengths": list(lengths), "autocast": "bfloat16", "rows": []}
    baseline = bert_scheme()
    for scheme in order:
        for n in lengths:
            row: dict = {"scheme": scheme, "seq_len": n}
            cand = None
            try:
                batch = make_batch(1, n, shape.vocab_size, device)
                if scheme == baseline:  # bert-a: its SDPA-flash build is the one to beat
                    cand = build_flash_baseline(shape, n, batch, device, torch.float32, torch.bfloat16)
                else:
                    cand = build_tupe(
                        scheme, "default", shape, n, batch, device, torch.float32, torch.bfloat16
                    )
                row["kernel"] = cand.kernel
                _timed_steps(cand, device, n, rounds, row)
            except torch.OutOfMemoryError as e:
                row["error"] = "out of memory"
                row["detail"] = str(e).splitlines()[0][:300]
            except Exception as e:  # noqa: BLE001 - recorded, and the next scheme runs
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            del cand
            gc.collect()  # the model and optimizer of this row are gone before the next row's peak is read
            if device.type == "cuda":
                torch.cuda.empty_cache()
            result["rows"].append(row)
            write_json(out / "long.json", result)
            _print_row(scheme, n, row)
            if "error" in row:
                break  # longer sequences of this scheme would fail the same way
    return 0
