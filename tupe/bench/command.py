"""Time one training step of each positional scheme and attention backend against transformers' BERT.

For every scheme x backend, and always for `hf-bert` (transformers' BertForMaskedLM, SDPA attention, same shape,
vocabulary and dropout), one optimizer step (forward, backward, gradient clipping, fused AdamW) is timed over
interleaved rounds. Reported: median step time and spread, tokens/s, peak memory, model-FLOPs utilisation
against the same device's matrix-multiply peak measured in the same run, and every step time as a ratio.
`--attention-only` times the attention core of the encoder instead (see tupe/bench/attention.py).

Shapes: `--preset mini` (or base, paper) sets the model shape, the vocabulary and, for mini, the preset's batch
(32 x 128); `--shape mini,4x256` times several shapes one after another in the same run (LxH: L layers of width
H, H/64 heads, FFN 4H, the preset's vocabulary). `--breakdown` splits a step's time into embeddings and
positional term, attention, feed-forward, LM head and loss, optimizer (tupe/bench/breakdown.py).
`--end-to-end` times `tupe pretrain` itself on the built-in corpus and compares it with the bare step
(tupe/bench/endtoend.py).

This module imports no torch at the top: `tupe bench --help` must start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tupe import validators as V
from tupe.errors import TupeError

from .flops import HF_DEBERTA, Shape, preset_shape

if TYPE_CHECKING:
    import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--schemes",
        default="bert-a,tupe-a,tupe-r",
        help="comma-separated position schemes (default: %(default)s)",
    )
    parser.add_argument(
        "--attention-kernel",
        "--backends",
        dest="backends",
        default="eager,sdpa,default",
        metavar="KERNELS",
        help="comma-separated attention kernels, each timed for every scheme: auto or a name of the model's kernel "
        "registry (tupe.modeling.ATTENTION_KERNELS, docs/model.md; an unknown name is refused with the list), or "
        "the aliases default (= auto) and sdpa-fold (= fold); a kernel that cannot run a scheme is refused, not replaced "
        "(default: %(default)s). --backends is the old name",
    )
    parser.add_argument(
        "--preset",
        default="base",
        help="model shape and vocabulary from tupe.training.presets (default: base); mini also sets "
        "the batch to the preset's 32 x 128",
    )
    parser.add_argument(
        "--shape",
        default=None,
        help="comma-separated shapes timed one after another in this run: preset names or LxH "
        "(L layers, width H, H/64 heads, FFN 4H), e.g. mini,4x256 (default: the preset's)",
    )
    parser.add_argument(
        "--seq-len",
        type=V.int_range(2, V.MAX_LENGTH),
        default=None,
        help="default: the preset's block length (128 mini, 512 base)",
    )
    parser.add_argument(
        "--batch-size", type=V.positive_int, default=None, help="default: 32 for mini (the preset's), else 1"
    )
    parser.add_argument(
        "--layers", type=V.positive_int, default=None, help="override the preset's number of layers"
    )
    parser.add_argument(
        "--rounds",
        type=V.positive_int,
        default=5,
        help="timed rounds (one step of every model each; default 5)",
    )
    parser.add_argument("--warmup", type=V.nonneg_int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--device", default="auto", help="cpu, cuda (default: cuda when available)")
    parser.add_argument(
        "--autocast",
        choices=["none", "bfloat16", "float16"],
        default="none",
        help="mixed precision for every model (default: none, float32)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory step")
    parser.add_argument("--no-hf-bert", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-hf-deberta",
        action="store_true",
        help="with deberta among --schemes, leave out hf-deberta (transformers' DebertaV2ForMaskedLM with the "
        "same choices, timed by default as deberta's comparator)",
    )
    parser.add_argument(
        "--flash-baseline",
        action="store_true",
        help="also time bert-a with SDPA held to its flash backend (label `bert-a [sdpa-flash]`; refused, not "
        "replaced, where flash cannot run the step) and give every step time as a ratio to it",
    )
    parser.add_argument(
        "--peak-flops",
        type=V.positive_float,
        default=None,
        help="matrix-multiply peak (FLOP/s) for MFU, instead of measuring it (for repeatable runs and tests)",
    )
    parser.add_argument(
        "--attention-only", action="store_true", help="time the attention core (forward + backward) only"
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also profile each model's step: time in embeddings + positional term, attention, feed-forward, "
        "LM head + loss, optimizer",
    )
    parser.add_argument(
        "--breakdown-steps", type=V.positive_int, default=3, help="profiled steps (default 3)"
    )
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="also time `tupe pretrain` (the --preset, built-in corpus, its evaluation/logging intervals) and "
        "report its tokens/s against the bare step's",
    )
    parser.add_argument(
        "--e2e-schemes", default="tupe-a", help="schemes run end to end (default: %(default)s)"
    )
    parser.add_argument(
        "--e2e-steps",
        type=V.positive_int,
        default=100,
        help="timed steps of the end-to-end run (default 100)",
    )
    parser.add_argument(
        "--e2e-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the end-to-end `tupe pretrain` (repeatable), e.g. --e2e-arg=--batch-size=4",
    )
    parser.add_argument(
        "--json",
        type=V.nonempty_path,
        default=None,
        metavar="PATH",
        help="write all results to this JSON file (atomically)",
    )
    V.add_threads_progress(parser, "per-round progress lines")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no log lines on stderr (progress, matmul peaks); the tables only",
    )
    V.annotate_ranges(parser)


def parse_shapes(text: str | None, preset: str, layers: int | None = None) -> list[tuple[str, Shape]]:
    """`--shape`: preset names or LxH specs (H/64 heads, at least 1; FFN 4H; the preset's vocabulary/dropout)."""
    base = preset_shape(preset, layers)
    if not text:
        return [(preset, base)]
    shapes = []
    for spec in (s.strip() for s in text.split(",")):
        if not spec:
            continue
        if "x" in spec:
            try:
                n_layers, width = (int(v) for v in spec.split("x"))
            except ValueError:
                raise TupeError(f"--shape {spec!r}: expected LxH, e.g. 4x256, or a preset name") from None
            if not (1 <= n_layers <= V.MAX_LAYERS and 1 <= width <= V.MAX_WIDTH):
                raise TupeError(
                    f"--shape {spec!r}: layers must be from 1 to {V.MAX_LAYERS} and width from 1 to {V.MAX_WIDTH}"
                )
            heads = max(1, width // 64)
            if width % heads:
                raise TupeError(f"--shape {spec!r}: width {width} is not a multiple of {heads} heads")
            shapes.append(
                (
                    spec,
                    Shape(width, n_layers, heads, 4 * width, base.vocab_size, base.dropout),
                )
            )
        else:
            shapes.append((spec, preset_shape(spec, layers)))
    if not shapes:
        raise TupeError("--shape is empty")
    return shapes


def default_batch(preset: str, seq_len: int | None, batch_size: int | None) -> tuple[int, int]:
    """(seq_len, batch_size): the preset's block length; the preset's batch for mini, 1 for the larger ones."""
    from tupe.training.presets import get_preset

    values = get_preset(preset)
    seq = seq_len or int(values["max_length"])
    batch = batch_size or (int(values["batch_size"]) if preset == "mini" else 1)
    return seq, batch


def machine_description(device: torch.device) -> dict:
    import torch

    from tupe.runtime import cpu_allocator_tuned, large_blocks_kept

    info = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "malloc_tuned": cpu_allocator_tuned(),  # tupe.runtime: the `tupe` command keeps freed blocks for reuse
        "malloc_large_blocks_kept": large_blocks_kept(),  # and, for the timed loops, blocks over 32 MiB too
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        except OSError:  # pragma: no cover
            pass
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:  # pragma: no cover
        pass
    return info


def _fmt_bytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def ratios(rows: list[dict], key: str = "step_s_median") -> dict[str, float]:
    """Step-time ratios the targets are stated in (medians of the same run)."""
    from tupe.training.model import HF_BERT

    by = {(r["scheme"], r["backend"]): r[key] for r in rows if r.get(key)}
    out = {}
    from .runner import FLASH_BASELINE

    flash = next((t for (s, b), t in by.items() if b == FLASH_BASELINE), None)
    if flash:
        for (scheme, backend), t in by.items():
            if backend != FLASH_BASELINE:
                out[f"{scheme} [{backend}] / bert-a [{FLASH_BASELINE}]"] = t / flash
    hf = by.get((HF_BERT, "sdpa"))
    hf_deberta = by.get((HF_DEBERTA, "eager"))
    from tupe.modeling.positional import comparator_scheme, scheme_class

    baseline = comparator_scheme(HF_BERT)  # the scheme transformers' BERT implements (bert-a)

    for (scheme, backend), t in by.items():
        if backend == FLASH_BASELINE:
            continue
        if scheme in (HF_BERT, HF_DEBERTA):
            if scheme == HF_DEBERTA and hf:
                out["hf-deberta / hf-bert"] = t / hf
            continue
        if hf:
            out[f"{scheme} [{backend}] / hf-bert"] = t / hf
        if (
            hf_deberta and scheme_class(scheme).report.transformers_comparator == HF_DEBERTA
        ):  # transformers' own one
            out[f"{scheme} [{backend}] / hf-deberta"] = t / hf_deberta
        bert = by.get((baseline, backend))
        if bert and scheme != baseline:
            out[f"{scheme} / {baseline} [{backend}]"] = t / bert
    return out


def _print_steps(result: dict, rows: list[dict], shape: Shape, args: argparse.Namespace, peak: float) -> None:
    from tupe.runtime import cpu_allocator_tuned, large_blocks_kept
    from tupe.training.model import HF_BERT

    print(
        f"training step, batch {args.batch_size} x {args.seq_len}, {shape.num_hidden_layers} x "
        f"{shape.hidden_size} ({shape.num_attention_heads} heads, FFN {shape.intermediate_size}), vocab "
        f"{shape.vocab_size}, {args.autocast if args.autocast != 'none' else 'float32'}, "
        f"median of {args.rounds} interleaved rounds; matmul peak {peak / 1e9:.1f} GFLOP/s; malloc tuning "
        f"{'on' if cpu_allocator_tuned() else 'off'}{', large blocks kept' if large_blocks_kept() else ''}"
    )
    print(
        f"{'model':26s} {'kernel':7s} {'step s':>8s} {'q1-q3':>13s} {'tok/s':>8s} {'MFU':>6s} "
        f"{'memory':>10s} {'/hf-bert':>8s} {'MFU(cpu)':>8s}"
    )
    hf = next((r["step_s_median"] for r in rows if r["scheme"] == HF_BERT), None)
    for r in rows:
        rel = "-" if not hf else f"{r['step_s_median'] / hf:.3f}"
        mfu_cpu = "-" if r["mfu_cpu_time"] is None else f"{100 * r['mfu_cpu_time']:.1f}%"
        print(
            f"{r['label']:26s} {r['kernel']:7s} {r['step_s_median']:8.3f} "
            f"{r['step_s_q1']:6.2f}-{r['step_s_q3']:<6.2f} {r['tokens_per_s']:8.1f} "
            f"{100 * r['mfu']:5.1f}% {_fmt_bytes(r['peak_memory_bytes']):>10s} {rel:>8s} {mfu_cpu:>8s}"
        )
    print(f"ratios of median step times: {'wall':>8s} {'cpu':>8s}")
    for k, v in result["ratios"].items():
        cpu = result["ratios_cpu_time"].get(k)
        print(f"  {k:40s} {v:8.3f} {'-' if cpu is None else f'{cpu:8.3f}':>8s}")


def _print_breakdown(rows: list[dict]) -> None:
    from .breakdown import CATEGORIES

    print("where a step's time goes (ms per step, PyTorch profiler; % of the profiled total):")
    print(f"{'model':26s} " + " ".join(f"{c[:13]:>13s}" for c in CATEGORIES) + f" {'total':>8s} {'wall':>8s}")
    for r in rows:
        cells = " ".join(f"{r['ms_per_step'][c]:7.1f} {100 * r['fraction'][c]:4.0f}%" for c in CATEGORIES)
        print(f"{r['label']:26s} {cells} {r['profiled_total_ms']:8.1f} {r['profiled_wall_ms']:8.1f}")


def _time_shape(name: str, shape: Shape, args: argparse.Namespace, schemes, backends, device, log) -> dict:
    import torch

    from .flops import matmul_peak
    from .runner import (
        build_hf_bert,
        build_hf_deberta,
        build_tupe,
        make_batch,
        measure_peak_memory,
        time_interleaved,
    )

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    autocast = None if args.autocast == "none" else dtypes[args.autocast]
    batch = make_batch(args.batch_size, args.seq_len, shape.vocab_size, device)
    cands = []
    if not args.no_hf_bert:
        cands.append(build_hf_bert(shape, args.seq_len, batch, device, torch.float32))
    from tupe.modeling.positional import scheme_class

    wants_deberta = any(scheme_class(s).report.transformers_comparator == HF_DEBERTA for s in schemes)
    if wants_deberta and not getattr(args, "no_hf_deberta", False):
        cands.append(build_hf_deberta(shape, args.seq_len, batch, device, torch.float32))
    if getattr(args, "flash_baseline", False):
        from .runner import build_flash_baseline

        cands.append(build_flash_baseline(shape, args.seq_len, batch, device, torch.float32, autocast))
    for s in schemes:
        for b in backends:
            cands.append(build_tupe(s, b, shape, args.seq_len, batch, device, torch.float32, autocast))
    peak_dtype = autocast or torch.float32
    fixed = args.peak_flops
    peak_before, by_size = (fixed, {}) if fixed else matmul_peak(device, peak_dtype)
    log(f"matmul peak before: {peak_before / 1e9:.1f} GFLOP/s {by_size}")
    load_before = _loadavg()
    step_log = log if args.progress else None  # --no-progress: no line per round
    time_interleaved(cands, device, args.rounds, args.warmup, autocast, step_log)
    load_after = _loadavg()
    peak_after, by_size_after = (fixed, {}) if fixed else matmul_peak(device, peak_dtype)
    log(f"matmul peak after: {peak_after / 1e9:.1f} GFLOP/s")
    peak = max(peak_before, peak_after)
    peak_cpu = None
    if device.type == "cpu":
        peak_cpu = fixed or max(matmul_peak(device, peak_dtype, clock="cpu")[0] for _ in range(2))
        log(f"matmul peak per CPU-second: {peak_cpu / 1e9:.1f} GFLOP/s")
    if not args.no_memory:
        for cand in cands:
            measure_peak_memory(cand, device, autocast)
    tokens = args.batch_size * args.seq_len
    rows = [c.summary(tokens, peak, peak_cpu) for c in cands]
    group: dict = {
        "name": name,
        "shape": shape.__dict__,
        "loadavg_timed_rounds": [load_before, load_after],
        "matmul_peak_flops": peak,
        "matmul_peak_flops_per_cpu_second": peak_cpu,
        "matmul_peak_by_size": {"before": by_size, "after": by_size_after},
        "steps": rows,
        "ratios": ratios(rows),
        "ratios_cpu_time": ratios(rows, "cpu_s_median"),
    }
    _print_steps(group, rows, shape, args, peak)
    if args.breakdown:
        if autocast is not None or device.type != "cpu":
            raise TupeError("--breakdown: CPU float32 only (it sums the profiler's CPU operator times)")
        from .breakdown import breakdown

        group["breakdown"] = [breakdown(c, steps=args.breakdown_steps) for c in cands]
        _print_breakdown(group["breakdown"])
    group["_candidates"] = cands
    return group


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def run(args: argparse.Namespace) -> int:
    import torch

    from tupe.modeling import POSITION_SCHEMES
    from tupe.modeling.kernel_registry import ATTENTION_KERNELS, KERNEL_ALIASES

    from .runner import backend_kernel

    if args.json:  # checked before the minutes of timing, not after
        args.json = V.check_out_file("--json", args.json)
        from tupe.io.outputs import check_file

        check_file(args.json, "tupe bench", "--json")  # a file tupe did not write is never replaced
    V.apply_threads(args.threads)
    from tupe.runtime import keep_large_blocks

    keep_large_blocks()  # every model's step repeats its sizes (a no-op unless the allocator is tuned)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = V.parse_device(args.device)
    schemes = V.name_list(args.schemes, POSITION_SCHEMES, "--schemes", "scheme")
    kernels = (*ATTENTION_KERNELS, *KERNEL_ALIASES)
    backends = V.name_list(args.backends, kernels, "--attention-kernel", "attention kernel")
    for s in schemes:  # a kernel that cannot run a scheme: refused now, with the reason, before any timing
        for b in backends:
            backend_kernel(b, s)
    args.seq_len, args.batch_size = default_batch(args.preset, args.seq_len, args.batch_size)
    if args.seq_len < 2 or args.batch_size < 1 or args.rounds < 1:
        raise TupeError("--seq-len must be >= 2, --batch-size and --rounds >= 1")
    shapes = parse_shapes(args.shape, args.preset, args.layers)
    for (
        spec,
        sh,
    ) in shapes:  # weights, gradients, Adam state and one layer's attention scores must fit in memory
        V.check_memory(
            f"--shape {spec} with --seq-len {args.seq_len} and --batch-size {args.batch_size}",
            V.model_bytes(sh.vocab_size, sh.hidden_size, sh.num_hidden_layers, sh.intermediate_size)
            + 3 * 4 * args.batch_size * sh.num_attention_heads * args.seq_len**2,
        )
    shape = shapes[0][1]
    log = (lambda m: None) if args.quiet else (lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    result: dict = {
        "argv": sys.argv,
        "machine": machine_description(device),
        "shape": shape.__dict__,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "autocast": args.autocast,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    if args.attention_only:
        from .attention import build_attention_candidate, time_attention

        cands = [
            build_attention_candidate(s, b, shape, args.batch_size, args.seq_len, device)
            for s in schemes
            for b in backends
        ]
        rows = time_attention(cands, device, args.rounds, args.warmup, log if args.progress else None)
        result["attention"] = rows
        print(
            f"attention core, {shape.num_hidden_layers} layers, batch {args.batch_size} x {args.seq_len}, "
            f"forward + backward, median of {args.rounds}:"
        )
        print(
            f"{'model':28s} {'kernel':7s} {'ms':>9s} {'min':>9s} {'max':>9s} {'vs eager':>9s} "
            f"{'cpu ms':>9s} {'vs eager':>9s}"
        )
        for r in rows:
            vs = "-" if r["vs_eager"] is None else f"{r['vs_eager']:.3f}"
            cvs = "-" if r["cpu_vs_eager"] is None else f"{r['cpu_vs_eager']:.3f}"
            print(
                f"{r['label']:28s} {r['kernel']:7s} {r['ms_median']:9.1f} {r['ms_min']:9.1f} "
                f"{r['ms_max']:9.1f} {vs:>9s} {r['cpu_ms_median']:9.1f} {cvs:>9s}"
            )
    else:
        groups = []
        for name, shp in shapes:
            groups.append(_time_shape(name, shp, args, schemes, backends, device, log))
            print()
        first = groups[0]
        # the first shape's figures at the top level too (the layout of single-shape runs)
        for key in ("matmul_peak_flops", "matmul_peak_flops_per_cpu_second", "matmul_peak_by_size"):
            result[key] = first[key]
        result["steps"], result["ratios"], result["ratios_cpu_time"] = (
            first["steps"],
            first["ratios"],
            first["ratios_cpu_time"],
        )
        if args.end_to_end:
            from .endtoend import compare_end_to_end

            e2e_schemes = V.name_list(args.e2e_schemes, POSITION_SCHEMES, "--e2e-schemes", "scheme")
            result["end_to_end"] = compare_end_to_end(
                groups, args, e2e_schemes, threads=torch.get_num_threads(), log=log
            )
        for g in groups:
            g.pop("_candidates", None)
        result["shapes"] = groups
    result["machine"]["loadavg_end"] = _loadavg()
    result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.json:
        from tupe.io.files import atomic_write_text
        from tupe.io.outputs import claim_file

        claim_file(args.json, "tupe bench", "--json")

        atomic_write_text(args.json, json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0
