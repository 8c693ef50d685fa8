"""Which `kernel_options` let the compiled flex_attention run tupe's biased attention (forward + backward) on this
GPU, and how fast: each candidate in its own process (a failed compile leaves nothing behind), base shape
(12 heads of 64), bf16 q/k/v, the (h, n, n) float32 term with a gradient, as `tupe.modeling.kernels` calls it.

    python benchmarks/gpu/flex_probe.py OUT.json [--seq-len 512] [--batch 16] [--timeout 60]

The last line printed is the JSON of the fastest candidate that worked ({} if PyTorch's own choice did), for
`export TUPE_FLEX_KERNEL_OPTIONS=...`; nothing is printed there if none worked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CANDIDATES = (
    {"BLOCK_M": 64, "BLOCK_N": 64},
    {"BLOCK_M": 128, "BLOCK_N": 64},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2},
    {},  # PyTorch's own choice (failed to compile on an H200 with torch 2.11)
)
# (tupe's default on sm90 is the first: tupe.modeling.kernels.SM90_HALF_FLEX_OPTIONS; the probe sets each explicitly)


def child(options: dict, seq_len: int, batch: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tupe
    import torch

    from tupe.modeling.kernels import flex_bias_attention

    os.environ["TUPE_FLEX_KERNEL_OPTIONS"] = json.dumps(options)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (
        torch.randn(batch, 12, seq_len, 64, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
        for _ in range(3)
    )
    bias = torch.randn(12, seq_len, seq_len, device=dev, generator=g).requires_grad_()
    t0 = time.perf_counter()
    flex_bias_attention(q, k, v, bias, None, 0.125).sum().backward()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        flex_bias_attention(q, k, v, bias, None, 0.125).sum().backward()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    print(json.dumps({"compile_s": compile_s, "fwd_bwd_ms": 1e3 * times[len(times) // 2]}))


def main(argv: list[str] | None = None) -> int:
    """The probe; a bad flag, or no CUDA GPU, is one line and exit code 2 before any candidate (on a CPU it used to
    exit 0 having tested nothing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tupe
    from tupe.errors import TupeError
    from tupe.scripts import ScriptParser, claim_output_file
    from tupe.validators import float_range, int_range

    parser = ScriptParser(prog="flex_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the JSON file of the candidates' results")
    parser.add_argument("--seq-len", type=int_range(2, 1 << 20), default=512)
    parser.add_argument("--batch", type=int_range(1), default=16)
    parser.add_argument(
        "--timeout", type=float_range(0, lo_open=True), default=60, help="seconds per candidate"
    )
    parser.add_argument(
        "--max-ok", type=int_range(1), default=2, help="stop after this many candidates worked"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child), args.seq_len, args.batch)
        return 0
    import torch

    if not torch.cuda.is_available():
        raise TupeError("no CUDA GPU here: the probe compiles flex_attention's GPU kernels; run it on a GPU")
    claim_output_file("OUT", args.out, "flex_probe.py")
    rows = []
    for options in CANDIDATES:
        cmd = [sys.executable, __file__, args.out, "--child", json.dumps(options)]
        cmd += ["--seq-len", str(args.seq_len), "--batch", str(args.batch)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                row = {"options": options, **json.loads(lines[-1])}
            else:
                err = [ln for ln in done.stderr.splitlines() if "Error" in ln]
                row = {"options": options, "error": (err[-1] if err else done.stderr[-300:])[:400]}
        except subprocess.TimeoutExpired:
            row = {"options": options, "error": f"no result in {args.timeout:.0f} s"}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        with open(args.out, "w") as f:
            json.dump({"seq_len": args.seq_len, "batch": args.batch, "rows": rows}, f, indent=2)
        if sum("fwd_bwd_ms" in r for r in rows) >= args.max_ok:
            break
    ok = [r for r in rows if "fwd_bwd_ms" in r]
    if ok:
        print(json.dumps(min(ok, key=lambda r: r["fwd_bwd_ms"])["options"]))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tupe.scripts import run_script

    sys.exit(run_script(main, prog="flex_probe.py"))
