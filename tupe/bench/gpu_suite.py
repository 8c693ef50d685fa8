"""The GPU benchmark suite: one command that spends a lent GPU's minutes measuring, not preparing.

    benchmarks/gpu/run.sh --out DIR [--budget 540]        # = python -m tupe.bench.gpu_suite --out DIR ...
    python -m tupe.bench.gpu_suite --out DIR --device cpu --smoke    # the CPU dry run the tests make

Stages, in the order `--stages` gives them, each with its own share of the budget (the shares of the stages asked
for, scaled to `--budget`; time a stage leaves unused goes to the next ones; a stage with too little time left is
skipped with a note). By default:

1. `cuda-tests`: `pytest tests/cuda` (correctness first: a speed figure of a wrong kernel is worthless);
2. `steps`: `tupe bench` at the `base` shape, bf16 autocast, 128 x 64 and 512 x 16: every scheme with its
   default kernel, `bert-a` with SDPA held to its flash backend (`--flash-baseline`), transformers' BERT (SDPA)
   and DeBERTa-v2; tokens/s, MFU against the GPU's dense bf16 peak, peak memory, ratios to `bert-a [sdpa-flash]`;
   a batch that does not fit is halved until it does (the table says which batch ran);
3. `profile`: one base/512 step of bert-a (flash), tupe-a, alibi and transformers' BERT under PyTorch's profiler:
   wall time against the GPU's busy time (its idle share: launch-bound or compute-bound), kernels per step, the top
   kernels;
4. `long`: batch 1 at 1,024 to 8,192 tokens (base shape, bf16, no dropout so that `flex` may run): step time and
   peak memory of every scheme with its default kernel, one model at a time, until it runs out of memory;
5. `end-to-end`: `tupe pretrain --preset base --precision bf16` on the built-in corpus for a few hundred steps with
   evaluation and checkpoints inside the timed loop: tokens/s including data loading.

and, asked for by name (`--stages packing-speed,studies`; tupe/bench/gpu_studies.py), what the open issues still
need from a GPU:

6. `packing-speed`: issue 36's documents-vs-stream pre-training step and padding-free-vs-padded `tupe glue` step at
   base/512 in bf16 (`benchmarks/packing_step.py`, `benchmarks/glue_padding_free.py`);
7. `studies`: the packing study of issue 36 and the length study of issue 37, jobs in priority order, each
   resumable (`--studies`, `--studies-work`).

`--archive PATH` packs `--out` into one gzipped tar (in parts of 15 MiB where larger) after every stage and every
step of `studies`: what the device returns is at most 8 files, so point it into the device's return folder.

Every stage is a child process with a time limit (interrupted, then killed, at its end), writes its JSON under
`--out` as it goes, and `summary.md` / `summary.json` are rewritten after every stage: a run cut off by the
device's limit leaves every finished stage's results. The GPU, driver and library versions are printed first
(`environment.json`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tupe.errors import TupeError
from tupe.scripts import ScriptParser, claim_scratch_folder, reset_scratch_folder, run_script
from tupe.validators import check_out_file, float_range, int_range

from .children import child_env, end_on_sigterm, python_command, run_logged
from .gpu_studies import packing_speed_lines, stage_packing_speed, stage_studies, studies_lines, write_archive

DEFAULT_STAGES = ("cuda-tests", "steps", "profile", "long", "end-to-end")
STAGES = (*DEFAULT_STAGES, "packing-speed", "studies")
# seconds of the default 540 s budget (the shares of the stages asked for are scaled to --budget): on an H200
# (2026-11-27) tests/cuda without fp16 took 56 s, each `tupe bench` of `steps` about 60 s, end-to-end 66 s, a flex
# scheme's lengths in `long` ~25 s of compiling; `studies` takes whatever the others leave
SHARES = {"cuda-tests": 100, "steps": 150, "profile": 60, "long": 140, "end-to-end": 90, "packing-speed": 90,
          "studies": 400}  # fmt: skip
MIN_STAGE_S = 25  # a stage with less time than this left is skipped
WORK_MARKER = ".tupe-gpu-suite-work"  # written into the --work the suite makes: only such a folder is emptied
OUT_MARKER = ".tupe-gpu-suite"  # written into --out: a rerun may write over the suite's own results there

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


# ---- environment -----------------------------------------------------------------------------------------------


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


# ---- running a stage -------------------------------------------------------------------------------------------


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    tmp.replace(path)


# ---- stage 1: tests/cuda ---------------------------------------------------------------------------------------


def stage_cuda_tests(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    tests = Path("tests/cuda")
    if not tests.is_dir():
        return {"skipped": "tests/cuda not found: run the suite from the repository root"}
    junit = out / "cuda_tests.xml"
    cmd = [
        *python_command(),
        "-m",
        "pytest",
        str(tests),
        "-v",
        "-p",
        "no:cacheprovider",
        "-ra",
        "--maxfail=10",
    ]
    cmd += ["--durations=10", f"--junitxml={junit}"]
    env = child_env()
    if args.smoke:  # the CPU dry run: the same file on the CPU, its two cheapest tests
        env["TUPE_TEST_DEVICE"] = args.device
        cmd += ["-k", "refused or masked_lm_loss"]
    elif args.cuda_tests_k:
        cmd += ["-k", args.cuda_tests_k]
    run = run_logged(cmd, out / "cuda_tests.log", timeout, env)
    result: dict = {
        "command": " ".join(cmd),
        **run,
        "selection": cmd[cmd.index("-k") + 1] if "-k" in cmd else None,
    }
    result.update(_junit_counts(junit))
    return result


def _junit_counts(path: Path) -> dict:
    if not path.exists():
        return {"counts": None}
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["time_s"] = sum(float(s.get("time", 0)) for s in suites)
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for s in suites
        for case in s.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {"counts": counts, "failed": failed}


def _bert_scheme() -> str | None:
    """The scheme transformers' BERT implements (bert-a): the baseline of the ratios, asked of the schemes."""
    from tupe.modeling.positional import comparator_scheme
    from tupe.training.model import HF_BERT

    return comparator_scheme(HF_BERT)


# ---- stage 2: training steps at base ---------------------------------------------------------------------------


def stage_steps(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    from tupe.modeling import POSITION_SCHEMES

    deadline = time.monotonic() + timeout
    shapes = [(32, 2)] if args.smoke else [(128, 64), (512, 16)]
    result: dict = {"shapes": []}
    for seq_len, batch in shapes:
        while True:
            path = out / f"steps_{seq_len}x{batch}.json"
            cmd = [*python_command(), "-m", "tupe", "bench", "--preset", "base", "--seq-len", str(seq_len)]
            cmd += ["--batch-size", str(batch), "--schemes", ",".join(POSITION_SCHEMES), "--attention-kernel"]
            cmd += ["default", "--flash-baseline", "--autocast", "bfloat16", "--device", args.device]
            cmd += ["--json", str(path), "--no-progress"]
            if args.smoke:
                cmd += ["--shape", "2x64", "--rounds", "1", "--warmup", "0", "--peak-flops", "1e11"]
            else:
                cmd += ["--rounds", "10", "--warmup", "3"]
            left = deadline - time.monotonic()
            if left < MIN_STAGE_S / 2:
                result["shapes"].append({"seq_len": seq_len, "skipped": "out of time"})
                break
            run = run_logged(cmd, out / "steps.log", left, child_env())
            entry = {"seq_len": seq_len, "batch_size": batch, "json": path.name, **run}
            if run["returncode"] == 0 and path.exists():
                entry["bench"] = json.loads(path.read_text())
                result["shapes"].append(entry)
                break
            tail = (out / "steps.log").read_text(errors="replace")[-4000:].lower()
            if "out of memory" in tail and batch > 1 and not run["timed_out"]:
                batch //= 2  # the largest batch that fits: halve and try again
                continue
            result["shapes"].append(entry)
            break
        _write_json(out / "steps.json", result)
    return result


# ---- stage 3: where a step's time goes ----------------------------------------------------------------------

PROFILED = (
    "bert-a",
    "tupe-a",
    "alibi",
)  # bert-a with SDPA flash, then these with their default kernels, + hf-bert


def _run_child(args: argparse.Namespace, out: Path, timeout: float, stage: str, extra: list[str]) -> dict:
    """A stage that runs in its own `--STAGE-child` process: its run record merged with the JSON it wrote (rows
    written one by one, so a child cut off by its time share still leaves what it measured)."""
    cmd = [
        *python_command(),
        "-m",
        "tupe.bench.gpu_suite",
        f"--{stage}-child",
        "--out",
        str(out),
        "--device",
        args.device,
    ]
    cmd += ["--smoke"] if args.smoke else []
    run = run_logged([*cmd, *extra], out / f"{stage}.log", timeout, child_env())
    path = out / f"{stage}.json"
    return {**run, **(json.loads(path.read_text()) if path.exists() else {"rows": []})}


def stage_profile(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    return _run_child(args, out, timeout, "profile", [])


def _device_time_us(event) -> float:  # noqa: ANN001 - a profiler FunctionEventAvg
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def profile_child(args: argparse.Namespace) -> int:
    """`profile`, in its own process: one base training step of each model under PyTorch's profiler (CPU + CUDA
    activities): wall time per step, the GPU's busy time (sum of kernel times) and so its idle share, the top
    kernels and the top CPU-side operators. A step whose GPU is mostly idle is launch-bound, not compute-bound."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    from .flops import Shape, preset_shape, synchronize
    from .profiling import quiet_profile
    from .runner import build_flash_baseline, build_hf_bert, build_tupe, make_batch

    device = torch.device(args.device)
    out = Path(args.out)
    if args.smoke:
        shape, seq_len, batch_size, steps = Shape(64, 2, 1, 256, 1000, 0.1), 32, 2, 1
    else:
        shape, seq_len, batch_size, steps = preset_shape("base"), 512, 16, 3
    batch = make_batch(batch_size, seq_len, shape.vocab_size, device)
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
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    result: dict = {
        "shape": shape.__dict__,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "steps": steps,
        "rows": [],
    }

    for label, build in builders:
        row: dict = {"label": label}
        try:
            cand = build()
            row["kernel"] = cand.kernel
            for _ in range(1 if args.smoke else 3):  # warm-up (and any compilation) outside the profile
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
            row.update(
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
            del cand
        except Exception as e:  # noqa: BLE001 - recorded; the next model runs
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        _write_json(out / "profile.json", result)
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
    return 0


def profile_table(profile: dict) -> list[str]:
    rows = profile.get("rows", [])
    if not rows:
        return ["(no rows)"]
    lines = [
        f"One step at base, {profile.get('batch_size')} x {profile.get('seq_len')}, bf16 autocast, under PyTorch's "
        f"profiler (mean of {profile.get('steps')}):",
        "",
        "| model | kernel | wall ms | GPU busy ms | GPU busy share | kernels per step | top kernels (ms per step) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | - | {r['error'][:60]} | | | | |")
            continue
        busy = r.get("gpu_busy_ms")
        top = "; ".join(f"{k['name'][:40]} {k['ms_per_step']:.2f}" for k in r.get("top_kernels", [])[:3])
        lines.append(
            f"| {r['label']} | {r.get('kernel', '-')} | {r['wall_ms']:.1f} | {_fmt(busy, '.1f')} | "
            f"{_fmt(100 * (1 - r['gpu_idle_share']) if busy is not None else None, '.0f')}% | "
            f"{_fmt(r.get('kernel_launches_per_step'), '.0f')} | {top or '-'} |"
        )
    return lines


# ---- stage 4: long sequences, batch 1 --------------------------------------------------------------------------


def stage_long(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    return _run_child(
        args, out, timeout, "long", ["--long-schemes", args.long_schemes] if args.long_schemes else []
    )


def long_child(args: argparse.Namespace) -> int:
    """`long`, in its own process: one model at a time, its rows written after each measurement."""
    import torch

    from tupe.modeling import POSITION_SCHEMES

    from .flops import Shape, preset_shape
    from .runner import build_flash_baseline, build_tupe, make_batch, state_bytes

    device = torch.device(args.device)
    out = Path(args.out)
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
    result: dict = {"shape": shape.__dict__, "lengths": list(lengths), "autocast": "bfloat16", "rows": []}
    baseline = _bert_scheme()
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
            _write_json(out / "long.json", result)
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
            if "error" in row:
                break  # longer sequences of this scheme would fail the same way
    return 0


# ---- stage 5: tupe pretrain end to end -------------------------------------------------------------------------


def stage_end_to_end(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    from .endtoend import summarize_run

    deadline = time.monotonic() + timeout
    # scratch (the model, checkpoints, the cache: GBs at base) outside --out, which holds results only
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tupe-gpu-e2e-"))
    reset_scratch_folder(work, WORK_MARKER)  # main() refused a --work of the user's before any stage
    env = child_env()
    env["TUPE_CACHE"] = str(work / "cache")
    if args.smoke:
        corpus = work / "corpus.txt"
        import gzip

        from tupe.data.corpus import DEFAULT_CORPUS_DIR

        with gzip.open(sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))[0], "rt", encoding="utf-8") as f:
            text = f.read(200_000)
        corpus.write_text(text)
        common = ["--preset", "mini", "--corpus", str(corpus), "--vocab-size", "300", "--max-seq-len", "32"]
        common += [
            "--num-layers",
            "1",
            "--hidden-size",
            "32",
            "--num-heads",
            "2",
            "--intermediate-size",
            "64",
        ]
        common += ["--batch-size", "4", "--eval-steps", "3", "--save-steps", "4", "--precision", "fp32"]
        steps = 6
    else:
        common = ["--preset", "base", "--precision", "bf16", "--eval-steps", "100", "--save-steps", "150"]
        common += ["--logging-steps", "50"]
        steps = args.e2e_steps
    common += ["--scheme", "tupe-a", "--no-progress"]
    prep = run_logged(
        [*python_command(), "-m", "tupe", "pretrain", "--out", str(work / "prep"), "--prepare-only", *common],
        out / "end_to_end.log",
        deadline - time.monotonic(),
        env,
    )
    result: dict = {"prepare": prep, "steps": steps}
    if prep["returncode"] != 0:
        result["error"] = "preparing the data failed (see end_to_end.log)"
        return result
    stamps = work / "stamps.json"
    pre = ["--out", str(work / "run"), "--max-steps", str(steps + 1), *common]
    cmd = [*python_command(), "-m", "tupe.bench.endtoend", str(stamps), *pre]
    t_launch = time.time()
    run = run_logged(cmd, out / "end_to_end.log", deadline - time.monotonic(), env)
    result.update(run=run, command="tupe pretrain " + " ".join(pre))
    starts = json.loads(stamps.read_text())["step_starts"] if stamps.exists() else []
    if run["returncode"] != 0 or len(starts) < 2:
        result["error"] = f"tupe pretrain ended with {run['returncode']} after {len(starts)} steps"
        if len(starts) < 2:
            return result
    done = min(steps, len(starts) - 1)
    from tupe.training.presets import get_preset

    values = get_preset("mini" if args.smoke else "base")
    seq = 32 if args.smoke else int(values["max_length"])
    batch = 4 if args.smoke else int(values["batch_size"])
    summary = summarize_run(
        {"launch": t_launch, "step_starts": starts, "wall_s": run["wall_s"], "peak_rss_bytes": None},
        done,
        seq * batch,
    )
    result["figures"] = summary
    metrics = work / "run" / "metrics.jsonl"
    if metrics.exists():
        result["metrics_tail"] = metrics.read_text().splitlines()[-3:]
    return result


# ---- the summary ---------------------------------------------------------------------------------------------


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def steps_table(bench: dict, peak: float | None) -> tuple[list[str], dict]:
    """Markdown rows of one `tupe bench` JSON, and the ratios the targets read."""
    rows = bench.get("steps", [])
    flash = next((r for r in rows if r["backend"] == "sdpa-flash"), None)
    hf = next((r for r in rows if r["scheme"] == "hf-bert"), None)
    measured = bench.get("matmul_peak_flops")
    lines = [
        "| model | kernel | step ms | tokens/s | x bert-a [sdpa-flash] | MFU (data sheet) | MFU (measured matmul) "
        "| peak memory GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios: dict = {}
    for r in rows:
        rel = r["tokens_per_s"] / flash["tokens_per_s"] if flash else None
        ratios[r["label"]] = rel
        flops_s = r["model_tflops_per_step"] * 1e12 / r["step_s_median"]
        lines.append(
            f"| {r['label']} | {r['kernel']} | {r['step_s_median'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | "
            f"{_fmt(rel)} | {_fmt(flops_s / peak * 100 if peak else None, '.1f')}% | "
            f"{_fmt(flops_s / measured * 100 if measured else None, '.1f')}% | "
            f"{_fmt(r['peak_memory_bytes'] / 2**30 if r.get('peak_memory_bytes') else None, '.2f')} |"
        )
    extra = {"flash": flash, "hf": hf}
    return lines, {"ratios": ratios, **extra}


def targets(bench: dict, peak: float | None) -> list[str]:
    """The issue's targets, read off the base/512 run: met or not, with the figure."""
    _, info = steps_table(bench, peak)
    flash, hf, ratios = info["flash"], info["hf"], info["ratios"]
    rows = bench.get("steps", [])
    out = []
    if flash:
        schemes = {
            r["label"]: ratios[r["label"]] for r in rows if r["scheme"] not in ("hf-bert", "hf-deberta")
        }
        schemes.pop(flash["label"], None)
        worst = min(schemes.items(), key=lambda kv: kv[1]) if schemes else None
        if worst:
            missed = [f"{k} {v:.3f}" for k, v in schemes.items() if v < 0.85]
            out.append(
                f"- every scheme >= 0.85 x bert-a [sdpa-flash]: **{'met' if not missed else 'not met'}** "
                f"(lowest {worst[0]} {worst[1]:.3f}"
                + (f"; below: {', '.join(missed)}" if missed else "")
                + ")"
            )
        tupe_a = next((v for k, v in schemes.items() if k.startswith("tupe-a [")), None)
        if tupe_a is not None:
            out.append(
                f"- tupe-a >= 0.95 x bert-a [sdpa-flash]: **{'met' if tupe_a >= 0.95 else 'not met'}** "
                f"({tupe_a:.3f})"
            )
    baseline = _bert_scheme()
    bert = next((r for r in rows if r["scheme"] == baseline and r["backend"] != "sdpa-flash"), None)
    if bert and hf:
        rel = bert["tokens_per_s"] / hf["tokens_per_s"]
        out.append(
            f"- bert-a [default] >= 1.0 x hf-bert (SDPA): **{'met' if rel >= 1.0 else 'not met'}** "
            f"({rel:.3f}; bert-a [sdpa-flash] {flash['tokens_per_s'] / hf['tokens_per_s']:.3f})"
            if flash
            else f"- bert-a >= 1.0 x hf-bert: {rel:.3f}"
        )
    for r in (flash, bert):
        if r and peak:
            mfu = r["model_tflops_per_step"] * 1e12 / r["step_s_median"] / peak
            out.append(
                f"- MFU of {r['label']} >= 40% of the dense bf16 peak: **{'met' if mfu >= 0.4 else 'not met'}** "
                f"({100 * mfu:.1f}%)"
            )
    return out


def long_table(long: dict) -> list[str]:
    rows = [r for r in long.get("rows", [])]
    if not rows:
        return ["(no rows)"]
    lengths = sorted({r["seq_len"] for r in rows})
    by: dict = {}
    for r in rows:
        by.setdefault(r["scheme"], {})[r["seq_len"]] = r
    head = (
        "| scheme | kernel | "
        + " | ".join(f"{n} ms / GiB" for n in lengths)
        + " | memory growth per doubling |"
    )
    lines = [head, "| --- | --- | " + " | ".join("---:" for _ in lengths) + " | --- |"]
    for scheme, cells in by.items():
        kernel = next((c.get("kernel") for c in cells.values() if c.get("kernel")), "-")
        parts = []
        for n in lengths:
            c = cells.get(n)
            if c is None:
                parts.append("not run")
            elif "error" in c:
                parts.append(c["error"][:40])
            elif c.get("peak_bytes") is not None:
                parts.append(f"{c['step_s'] * 1e3:.0f} / {c['peak_bytes'] / 2**30:.2f}")
            else:
                parts.append(f"{c['step_s'] * 1e3:.1f} / -")
        growth = [
            cells[b]["step_peak_above_state_bytes"] / cells[a]["step_peak_above_state_bytes"]
            for a, b in zip(lengths, lengths[1:])
            if a in cells
            and b in cells
            and cells[a].get("step_peak_above_state_bytes")
            and cells[b].get("step_peak_above_state_bytes")
        ]
        g = ", ".join(f"{x:.2f}" for x in growth) if growth else "-"
        lines.append(f"| {scheme} | {kernel} | " + " | ".join(parts) + f" | {g} |")
    lines.append("")
    lines.append(
        "Growth: the step's memory above parameters + optimizer state, at 2n over n (2.0 = linear, 4.0 = "
        "quadratic)."
    )
    return lines


def write_summary(out: Path, env: dict, stages: dict) -> None:
    peak = env.get("dense_bf16_peak_flops")
    md = ["# GPU benchmark suite", ""]
    md.append(
        f"Device: {env.get('gpu') or env.get('device')} ({env.get('nvidia_smi') or '-'}); torch "
        f"{env.get('torch')} (CUDA {env.get('torch_cuda')}), triton {env.get('triton')}, transformers "
        f"{env.get('transformers')}, Python {env.get('python')}; commit {env.get('commit')}; started "
        f"{env.get('started_utc')}."
    )
    md.append(
        f"MFU denominator: {_fmt(peak / 1e12 if peak else None, '.1f')} TFLOP/s dense bf16 "
        f"({env.get('dense_bf16_peak_source')})."
    )
    md.append("")
    for name in [s for s in STAGES if s in stages or s in DEFAULT_STAGES]:
        st = stages.get(name)
        md.append(f"## {name}")
        md.append("")
        if st is None:
            md.append("not run")
        elif "skipped" in st:
            md.append(f"skipped: {st['skipped']}")
        elif name == "cuda-tests":
            c = st.get("counts")
            md.append(
                f"`{st.get('command')}`: "
                + (
                    f"**{c['passed']} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped** "
                    f"in {c['time_s']:.0f} s"
                    if c
                    else f"no report (exit {st.get('returncode')})"
                )
                + (" (cut off by its time share)" if st.get("timed_out") else "")
            )
            for f in st.get("failed", [])[:20]:
                md.append(f"- failed: {f}")
        elif name == "steps":
            for sh in st.get("shapes", []):
                if "bench" not in sh:
                    md.append(
                        f"- {sh.get('seq_len')}: {sh.get('skipped') or 'failed (exit ' + str(sh.get('returncode')) + ')'}"
                    )
                    continue
                b = sh["bench"]
                md.append(
                    f"### base, {b['batch_size']} x {b['seq_len']}, bf16 autocast, median of the interleaved "
                    f"rounds (matmul peak measured {b['matmul_peak_flops'] / 1e12:.1f} TFLOP/s)"
                )
                md.append("")
                lines, _ = steps_table(b, peak)
                md += lines
                md.append("")
                if b["seq_len"] >= 512 or len(st["shapes"]) == 1:
                    md.append("Targets (base/512):")
                    md += targets(b, peak)
                    md.append("")
        elif name == "profile":
            md += profile_table(st)
        elif name == "long":
            md += long_table(st)
        elif "error" in st:
            md.append(f"error: {st['error']}")
        elif name == "packing-speed":
            md += packing_speed_lines(st)
        elif name == "studies":
            md += studies_lines(st, out)
        elif name == "end-to-end":
            fig = st.get("figures")
            if fig:
                md.append(
                    f"`{st.get('command')}`: **{fig['tokens_per_s']:,.0f} tokens/s** over {fig['timed_steps']} "
                    f"steps including evaluation and checkpoints (steady {fig['steady_tokens_per_s']:,.0f}); "
                    f"first step {fig['time_to_first_step_s']:.1f} s after launch."
                )
            if st.get("error"):
                md.append(f"error: {st['error']}")
        md.append("")
    (out / "summary.md").write_text("\n".join(md))
    _write_json(out / "summary.json", {"environment": env, "stages": stages})


# ---- the command -----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ScriptParser(
        prog="benchmarks/gpu/run.sh",
        description="The GPU benchmark suite (docs/benchmarks.md, 'GPU'): cuda tests, training steps at base, "
        "long sequences, tupe pretrain end to end (and, when named, issue 36's packing timings and the open issues' "
        "studies), inside a time budget; results under --out as they come.",
    )
    parser.add_argument("--out", required=True, help="results folder (created; JSON, logs, summary.md)")
    parser.add_argument(
        "--budget",
        type=float_range(0, lo_open=True),
        default=540.0,
        help="seconds for all stages (default 540)",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cuda (default) or cpu (with --smoke: the dry run)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes: checks the script, measures nothing"
    )
    parser.add_argument(
        "--stages",
        default=",".join(DEFAULT_STAGES),
        help=f"comma-separated, of {', '.join(STAGES)} (default: %(default)s)",
    )
    parser.add_argument(
        "--archive",
        default=None,
        help="also pack --out into this .tar.gz (parts PATH.partNN of 15 MiB where larger) after every stage",
    )
    parser.add_argument(
        "--studies",
        default=None,
        help="studies: the jobs to run, in this order (default: all, packing,length-1,...; gpu_studies.py)",
    )
    parser.add_argument(
        "--studies-work",
        default="/tmp/tupe-gpu-studies",
        help="studies and packing-speed: the study folders, kept between calls to resume (default %(default)s)",
    )
    parser.add_argument(
        "--studies-parallel",
        type=int_range(1, 1024),
        default=36,
        help="studies: runs trained at once (default 36)",
    )
    parser.add_argument(
        "--glue-data",
        default=None,
        help="GLUE root with SST-2/ (and CoLA/): SST-2 of the packing study, packing-speed's glue step",
    )
    parser.add_argument(
        "--ood-text",
        action="append",
        default=None,
        help="studies: another out-of-domain text of the length jobs (repeatable; one missing is noted, skipped)",
    )
    parser.add_argument(
        "--cuda-tests-k",
        default="not fp16",
        help="pytest -k of the cuda-tests stage (default %(default)r: fp16 saves a third of the compiles; '' = all)",
    )
    parser.add_argument(
        "--e2e-steps", type=int_range(1), default=300, help="timed steps of end-to-end (default 300)"
    )
    parser.add_argument(
        "--work",
        default=None,
        help="scratch folder of end-to-end, emptied first: new, empty, or one the suite made (default: a new "
        "temporary folder)",
    )
    parser.add_argument(
        "--long-schemes",
        default=None,
        help="comma-separated schemes of the long stage (default: all, in LONG_ORDER)",
    )
    parser.add_argument("--long-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        parser.error(f"--stages: unknown {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    _refuse_repeats(parser, "--stages", stages)
    args.stages = stages
    from .gpu_studies import job_names

    names = job_names()
    args.studies = [j.strip() for j in (args.studies or ",".join(names)).split(",") if j.strip()]
    unknown = [j for j in args.studies if j not in names]
    if unknown:
        parser.error(f"--studies: unknown {', '.join(unknown)}; choose from {', '.join(names)}")
    _refuse_repeats(parser, "--studies", args.studies)
    if args.device == "cpu" and not args.smoke and not (args.long_child or args.profile_child):
        parser.error("--device cpu runs the base shapes for hours; add --smoke for the CPU dry run")
    return args


def _refuse_repeats(parser: argparse.ArgumentParser, flag: str, names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        parser.error(f"{flag}: {', '.join(repeated)} given more than once")


def check_paths(args: argparse.Namespace) -> None:
    """--out, --work and --archive, before any stage: nothing of the user's is written over or emptied."""
    out = claim_results_folder(args.out)
    if args.work:
        work = claim_scratch_folder("--work", args.work, WORK_MARKER)
        if work.resolve() == out.resolve() or out.resolve() in work.resolve().parents:
            raise TupeError(
                f"--work {work} is inside --out {out}, which holds results only; give another folder"
            )
    if args.archive:
        check_out_file("--archive", args.archive)


def claim_results_folder(path: str) -> Path:
    """--out: new, empty, or the results of an earlier run of the suite (its marker, or its summary.json), whose
    files the suite writes again; a folder of other files is refused before any stage."""
    from tupe.validators import check_out_folder

    out = check_out_folder("--out", path)
    if out.is_dir() and not (out / OUT_MARKER).is_file() and not (out / "summary.json").is_file():
        entries = sorted(e.name for e in out.iterdir())
        if entries:
            raise TupeError(
                f"--out {out} is not empty and holds no results of the suite (it holds {entries[0]!r}); "
                "give a new or empty folder"
            )
    return out


RUNNERS = {
    "cuda-tests": stage_cuda_tests,
    "steps": stage_steps,
    "profile": stage_profile,
    "long": stage_long,
    "end-to-end": stage_end_to_end,
    "packing-speed": stage_packing_speed,
    "studies": stage_studies,
}


def main(argv: list[str] | None = None) -> int:
    """The suite; a bad flag or path is one line `run.sh: error: ...` and exit code 2 before any stage."""
    return run_script(_main, argv, prog="gpu_suite")


def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.long_child or args.profile_child:  # the suite's own children, in the --out it checked
        out.mkdir(parents=True, exist_ok=True)
        return long_child(args) if args.long_child else profile_child(args)
    check_paths(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise TupeError(
                "--device cuda but torch.cuda.is_available() is False (use --device cpu --smoke for the dry run)"
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).touch()
    t_start = time.monotonic()
    end_on_sigterm()
    env = environment(args.device)
    print("environment:", json.dumps(env, indent=1), flush=True)
    _write_json(out / "environment.json", env)
    stages: dict = {}

    def checkpoint() -> None:
        write_summary(out, env, stages)
        if args.archive:
            files = write_archive(out, Path(args.archive))
            print(
                f"archive: {', '.join(f'{f} ({f.stat().st_size / 2**20:.1f} MiB)' for f in files)}",
                flush=True,
            )

    def progress(name: str, partial: dict) -> None:  # a stage's results so far (studies: after every step)
        stages[name] = partial
        checkpoint()

    total = sum(SHARES[s] for s in args.stages)
    shares = {s: SHARES[s] * args.budget / total for s in args.stages}
    for i, name in enumerate(args.stages):
        left = args.budget - (time.monotonic() - t_start)
        later = sum(shares[s] for s in args.stages[i + 1 :])
        timeout = min(left, max(shares[name], left - later))
        if timeout < MIN_STAGE_S and not args.smoke:
            stages[name] = {"skipped": f"{left:.0f} s of the budget left"}
            print(f"== {name}: skipped ({left:.0f} s left)", flush=True)
        else:
            print(f"== {name}: up to {timeout:.0f} s ({left:.0f} s of the budget left)", flush=True)
            t0 = time.monotonic()
            args.progress_hook = lambda partial, name=name: progress(name, partial)
            try:
                stages[name] = RUNNERS[name](args, out, timeout)
            except Exception as e:  # noqa: BLE001 - the next stage still runs; the summary says what failed
                stages[name] = {"error": f"{type(e).__name__}: {e}"}
            stages[name]["stage_wall_s"] = time.monotonic() - t0
            print(f"== {name}: done in {stages[name]['stage_wall_s']:.0f} s", flush=True)
        checkpoint()
    print((out / "summary.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
