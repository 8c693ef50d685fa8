"""Pre-train several positional schemes on identical data and seeds, then compare their validation loss.

`tupe compare --schemes bert-a,tupe-a --out DIR [pretrain options]` trains `DIR/<scheme>/` one after the other
(same tokenizer, same cached blocks, same masks, same data order and initial seed), then writes:

- `DIR/valid_loss.png`: validation-loss curves (tupe.analysis.curves);
- `DIR/valid_loss.md` and `DIR/valid_loss.csv`: validation loss of every scheme at every evaluation;
- for each scheme, the first evaluated step at which it reaches the *first* scheme's final validation loss and
  that step as a fraction of the first scheme's steps (the paper's "TUPE needs 30% of the steps" claim, Fig. 5a),
  in the Markdown table and in `DIR/compare_summary.json`.

With `--resume`, finished schemes are kept and an interrupted one continues from its latest checkpoint.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import time
from pathlib import Path
from typing import Any

from tupe.errors import TupeError
from tupe.training.arguments import add_compare_arguments as add_arguments  # noqa: F401 (torch-free parser)
from tupe.training.checkpointing import atomic_write_text
from tupe.training.pretrain import (
    SUMMARY_FILE,
    PretrainConfig,
    config_from_args,
    pretrain,
)


def parse_schemes(text: str) -> list[str]:
    from tupe.modeling import POSITION_SCHEMES

    schemes = [s.strip() for s in text.split(",") if s.strip()]
    if len(schemes) < 1:
        raise TupeError("--schemes needs at least one scheme")
    for s in schemes:
        if s not in POSITION_SCHEMES:
            raise TupeError(f"unknown scheme {s!r} in --schemes; choose from: {', '.join(POSITION_SCHEMES)}")
    if len(set(schemes)) != len(schemes):
        raise TupeError(f"--schemes lists a scheme twice: {text}")
    return schemes


def _finished(run_dir: Path, max_steps: int) -> bool:
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text())["steps"] >= max_steps
    except (OSError, json.JSONDecodeError, KeyError):
        return False


def summarize(out: Path, schemes: list[str]) -> dict[str, Any]:
    """Write the plot, the Markdown/CSV tables and compare_summary.json for finished runs in `out`."""
    from tupe.analysis.curves import plot_curves, read_metrics, steps_to_reach

    runs = {s: read_metrics(out / s)[1] for s in schemes}
    steps = sorted({r["step"] for v in runs.values() for r in v})
    by_step = {s: {r["step"]: r["eval_loss"] for r in v} for s, v in runs.items()}
    base = schemes[0]
    if not runs[base]:
        raise TupeError(f"{out / base}: no validation record")
    base_final = runs[base][-1]["eval_loss"]
    base_steps = runs[base][-1]["step"]
    reach = {}
    for s in schemes:
        step = steps_to_reach(runs[s], base_final)
        reach[s] = {
            "final_step": runs[s][-1]["step"] if runs[s] else None,
            "final_eval_loss": runs[s][-1]["eval_loss"] if runs[s] else None,
            "steps_to_reach_first_final": step,
            "fraction_of_first_steps": round(step / base_steps, 3) if step is not None else None,
        }

    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    w.writerow(["step", *schemes])
    for st in steps:
        w.writerow([st, *[f"{by_step[s][st]:.4f}" if st in by_step[s] else "" for s in schemes]])
    atomic_write_text(out / "valid_loss.csv", fh.getvalue())

    lines = ["| step | " + " | ".join(schemes) + " |", "|---:|" + "---:|" * len(schemes)]
    for st in steps:
        vals = [by_step[s].get(st) for s in schemes]
        best = min(v for v in vals if v is not None)
        cells = [
            "" if v is None else (f"**{v:.4f}**" if v == best and len(schemes) > 1 else f"{v:.4f}")
            for v in vals
        ]
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Steps each scheme needs to reach {base}'s final validation loss ({base_final:.4f} at step {base_steps}):",
        "",
        "| scheme | final valid loss | steps to reach | fraction of steps |",
        "|---|---:|---:|---:|",
    ]
    for s in schemes:
        r = reach[s]
        step = r["steps_to_reach_first_final"]
        frac = r["fraction_of_first_steps"]
        lines.append(
            f"| {s} | {r['final_eval_loss']:.4f} | {step if step is not None else 'not reached'} | "
            f"{f'{frac:.0%}' if frac is not None else '-'} |"
        )
    table = "\n".join(lines) + "\n"
    atomic_write_text(out / "valid_loss.md", table)
    png = plot_curves([out / s for s in schemes], out / "valid_loss.png", labels=schemes)
    summary = {"schemes": schemes, "baseline": base, "reach": reach, "plot": str(png), "table": table}
    atomic_write_text(out / "compare_summary.json", json.dumps(summary, indent=1))
    return summary


def compare(base: PretrainConfig, schemes: list[str], log=print) -> dict[str, Any]:  # noqa: ANN001
    """Pre-train every scheme with `base`'s settings into `base.out/<scheme>` and summarise."""
    out = Path(base.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    max_steps = int(base.resolved()["max_steps"])
    timings = {}
    for i, scheme in enumerate(schemes, 1):
        run_dir = out / scheme
        if base.resume and _finished(run_dir, max_steps):
            log(f"[{i}/{len(schemes)}] {scheme}: already finished in {run_dir}, reusing it")
            continue
        log(f"[{i}/{len(schemes)}] pre-training {scheme} -> {run_dir}")
        t0 = time.perf_counter()
        cfg = PretrainConfig(**{**base.__dict__, "out": str(run_dir), "scheme": scheme})
        pretrain(cfg)
        timings[scheme] = round(time.perf_counter() - t0, 1)
    summary = summarize(out, schemes)
    summary["seconds_per_scheme"] = timings
    return summary


def run(args: argparse.Namespace) -> int:
    schemes = parse_schemes(args.schemes)
    summary = compare(config_from_args(args, scheme=schemes[0]), schemes)
    print()
    print(summary["table"])
    print(f"plot: {summary['plot']}")
    return 0
