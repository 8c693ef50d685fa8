"""The `mini` training step of every scheme under two checkouts of tupe, timed in one interleaved run.

Each checkout runs in its own worker process (`PYTHONPATH` set to that checkout), which builds one model per
scheme with its own code and nothing of `tupe.bench`: `TupeConfig` at the `mini` shape (2 x 128, 4 heads, FFN 512,
vocabulary 8,192, no dropout, the kernel the config chooses by default), AdamW (torch's, lr 1e-4) and a batch of
32 x 128 packed tokens, 15% masked. The parent asks the workers for one training step at a time (forward,
backward, clipping at 1.0, optimizer step), rotating the order of the (checkout, scheme) pairs every round, so a
change in the machine's load falls on every pair alike. Only one worker computes at any moment. Each worker's
first round is warm-up and is not timed. Reported: the median step time per pair, the ratio of each scheme to the
same checkout's bert-a, and the ratio of the candidate to the baseline per scheme, with the spread of the rounds.

    python benchmarks/step_time_commits.py BASELINE_CHECKOUT CANDIDATE_CHECKOUT [--rounds 15] [--threads 2]
        [--schemes bert-a,tupe-a,...] [--out FILE.json]

The machine must be quiet (nothing else running): this measures speed, so it is a benchmark, never a test.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tupe.errors import TupeError
from tupe.modeling.positional import SCHEMES
from tupe.scripts import ScriptParser, claim_output_file, run_script
from tupe.validators import int_range, name_list

WORKER = r"""
import json, sys, time
import torch
from tupe.modeling import TupeConfig, TupeForMaskedLM

threads, schemes = int(sys.argv[1]), sys.argv[2].split(",")
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
ids = torch.randint(5, 8192, (32, 128), generator=g)
ids[:, 0] = 1
masked = torch.rand(32, 128, generator=g) < 0.15
masked[:, 0] = False
labels = torch.where(masked, ids, torch.full_like(ids, -100))
ids = torch.where(masked, torch.full_like(ids, 3), ids)
batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
models = {}
for s in schemes:
    torch.manual_seed(0)
    config = TupeConfig(
        vocab_size=8192, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
        max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        position_scheme=s, sparse_prediction=True,
    )
    model = TupeForMaskedLM(config).train()
    models[s] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
for line in sys.stdin:
    model, opt = models[line.strip()]
    t0 = time.perf_counter()
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(json.dumps({"seconds": time.perf_counter() - t0, "loss": float(loss.detach())}), flush=True)
"""


def git_commit(checkout: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--", "tupe"], capture_output=True
    )
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def start_worker(checkout: Path, threads: int, schemes: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS=str(threads))
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(threads), ",".join(schemes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
    )
    ready = json.loads(proc.stdout.readline())
    if not ready.get("ready"):
        sys.exit(f"error: the worker of {checkout} did not start")
    return proc


def ask(proc: subprocess.Popen, scheme: str) -> float:
    proc.stdin.write(scheme + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())["seconds"]


def main(argv: list[str] | None = None) -> int:
    p = ScriptParser(prog="step_time_commits.py", description=__doc__.splitlines()[0])
    p.add_argument("baseline", type=Path, help="checkout of the baseline commit")
    p.add_argument("candidate", type=Path, help="checkout of the candidate commit")
    p.add_argument(
        "--rounds", type=int_range(3), default=15, help="timed rounds (default 15; one more untimed first)"
    )
    p.add_argument("--threads", type=int_range(1), default=2, help="torch threads of each worker (default 2)")
    p.add_argument(
        "--schemes", default=",".join(SCHEMES), help="comma-separated schemes (default: every registered one)"
    )
    p.add_argument("--out", help="write the medians and every round's times to this JSON file")
    args = p.parse_args(argv)
    for c in (args.baseline, args.candidate):
        if not (c / "tupe" / "__init__.py").is_file():
            raise TupeError(f"{c} is not a checkout of tupe (no tupe/__init__.py)")
    schemes = name_list(args.schemes, sorted(SCHEMES), "--schemes", "scheme")
    out = claim_output_file("--out", args.out, "step_time_commits.py") if args.out else None
    names = {"baseline": args.baseline, "candidate": args.candidate}
    workers = {k: start_worker(v.resolve(), args.threads, schemes) for k, v in names.items()}
    pairs = [(k, s) for s in schemes for k in names]
    times: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    start = time.time()
    for r in range(args.rounds + 1):
        order = pairs[r % len(pairs) :] + pairs[: r % len(pairs)]
        for k, s in order:
            t = ask(workers[k], s)
            if r > 0:
                times[(k, s)].append(t)
        print(f"round {r}/{args.rounds} done ({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
    for w in workers.values():
        w.stdin.close()
        w.wait()
    med = {pair: statistics.median(v) for pair, v in times.items()}
    print(
        f"{'scheme':<16}{'baseline ms':>12}{'candidate ms':>13}{'cand/base':>10}{'base/bert-a':>12}{'cand/bert-a':>12}"
    )
    rows = []
    for s in schemes:
        b, c = med[("baseline", s)], med[("candidate", s)]
        rb = b / med[("baseline", "bert-a")] if "bert-a" in schemes else float("nan")
        rc = c / med[("candidate", "bert-a")] if "bert-a" in schemes else float("nan")
        # per-round ratio spread: the candidate's k-th round over the baseline's k-th round
        ratios = [x / y for x, y in zip(times[("candidate", s)], times[("baseline", s)])]
        q = statistics.quantiles(ratios, n=4)
        rows.append(
            dict(
                scheme=s,
                baseline_ms=1000 * b,
                candidate_ms=1000 * c,
                ratio=c / b,
                ratio_q1=q[0],
                ratio_q3=q[2],
                baseline_vs_bert_a=rb,
                candidate_vs_bert_a=rc,
            )
        )
        print(
            f"{s:<16}{1000 * b:>12.1f}{1000 * c:>13.1f}{c / b:>10.3f}{rb:>12.3f}{rc:>12.3f}   "
            f"per-round ratio quartiles [{q[0]:.3f}, {q[2]:.3f}]"
        )
    if out:
        record = dict(
            command="python benchmarks/step_time_commits.py BASELINE CANDIDATE "
            + f"--rounds {args.rounds} --threads {args.threads} --schemes {args.schemes}",
            baseline=git_commit(args.baseline),
            candidate=git_commit(args.candidate),
            machine=dict(processor=platform.processor() or platform.machine(), cpus=os.cpu_count()),
            rows=rows,
            rounds={f"{k}/{s}": [round(t, 5) for t in v] for (k, s), v in times.items()},
        )
        out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(run_script(main))
