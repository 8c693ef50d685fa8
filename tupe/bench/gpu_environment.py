"""What the GPU suite records about the machine before any stage (`environment`: GPU, driver, CUDA, torch and
library versions, the commit), the data-sheet peak its MFU figures divide by (`dense_bf16_peak`), the baseline
scheme of its ratios (`bert_scheme`) and how its stages write their JSON (`write_json`)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, FLOP/s; the MFU denominator
DENSE_BF16_PEAKS = (
    ("H200", 989.4e12, "H200 SXM data sheet: 1,979 TFLOP/s bf16 with sparsity, 989 dense"),
    ("H100 NVL", 835.5e12, "H100 NVL data sheet: 1,671 with sparsity"),
    ("H100 PCIe", 756.5e12, "H100 PCIe data sheet: 1,513 with sparsity"),
    ("H100", 989.4e12, "H100 SXM data sheet: 1,979 TFLOP/s bf16 with sparsity, 989 dense"),
    ("A100", 312e12, "A100 data sheet: 312 TFLOP/s bf16 dense"),
)

# the schemes of `long`, in the order they are measured (the budget may end the list): those whose kernel builds
# no n x n tensor first (bert-a: SDPA flash; tupe-a: the folded term; rope: flash), then deberta (its (b, h, n, n)
# terms: where memory runs out), then the flex schemes (compiled anew for every length: the slowest to measure)
LONG_ORDER = ("bert-a", "tupe-a", "rope", "deberta", "alibi", "t5", "tupe-r", "bert-r", "bert-a-d")
LONG_LENGTHS = (1024, 2048, 4096, 8192)


def dense_bf16_peak(gpu_name: str | None) -> tuple[float | None, str]:
    """(FLOP/s, source) of the named GPU's dense bf16 peak, or (None, why) for a device not in the table."""
    for key, peak, source in DENSE_BF16_PEAKS:
        if gpu_name and key in gpu_name:
            return peak, source
    return None, f"no data-sheet peak known for {gpu_name!r}: MFU is given against the measured matmul peak"


def _run_quiet(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str) -> dict:
    """GPU, driver, CUDA, torch and library versions, the commit; printed before any stage runs."""
    import importlib.metadata as md

    import torch

    env: dict = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": device,
    }
    for package in ("transformers", "tokenizers", "accelerate", "safetensors", "triton", "numpy"):
        try:
            env[package] = md.version(package)
        except md.PackageNotFoundError:
            env[package] = None
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        props = torch.cuda.get_device_properties(0)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_multiprocessors"] = props.multi_processor_count
        env["cudnn"] = torch.backends.cudnn.version()
        env["nvidia_smi"] = _run_quiet(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                "--format=csv,noheader",
            ]
        )
    peak, source = dense_bf16_peak(env.get("gpu"))
    env["dense_bf16_peak_flops"], env["dense_bf16_peak_source"] = peak, source
    env["commit"] = _run_quiet(["git", "describe", "--always", "--dirty"])  # -dirty: uncommitted changes ran
    return env


def write_json(path: Path, value: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    tmp.replace(path)


def bert_scheme() -> str | None:
    """The scheme transformers' BERT implements (bert-a): the baseline of the ratios, asked of the schemes."""
    from tupe.modeling.positional import comparator_scheme
    from tupe.training.model import HF_BERT

    return comparator_scheme(HF_BERT)
