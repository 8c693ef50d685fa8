"""Validation-loss curves of pre-training runs on one figure (`tupe plot RUN_DIR... [--out PNG]`).

Reads each run's `metrics.jsonl` (written by `tupe pretrain`): records with `eval_loss` are validation points,
records with `loss` training points. The legend names each run by its positional scheme (from `tupe_run.json`)
or, failing that, by its folder name. `tupe compare` and `tupe demo` draw their figure with this module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tupe.errors import TupeError


def read_metrics(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, validation records) of a run, each sorted by step; later duplicates of a step win."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise TupeError(f"{run_dir}: no metrics.jsonl (not a `tupe pretrain` output folder?)")
    train: dict[int, dict] = {}
    valid: dict[int, dict] = {}
    text = path.read_text()
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step = int(rec["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if lineno == len(lines) and not text.endswith("\n"):  # cut by a kill: the run wrote it last
                print(f"warning: {path}:{lineno}: ignoring a cut last line", file=sys.stderr)
                continue
            raise TupeError(f"{path}:{lineno}: not a metrics record: {line[:80]!r}") from None
        if "eval_loss" in rec:
            valid[step] = rec
        elif "loss" in rec:
            train[step] = rec
    return [train[s] for s in sorted(train)], [valid[s] for s in sorted(valid)]


def run_label(run_dir: str | Path) -> str:
    """The run's scheme name (from tupe_run.json), else its folder name."""
    try:
        return json.loads((Path(run_dir) / "tupe_run.json").read_text())["scheme"]
    except (OSError, json.JSONDecodeError, KeyError):
        return Path(run_dir).name


def steps_to_reach(valid: list[dict[str, Any]], target: float) -> int | None:
    """First evaluated step whose validation loss is at or below `target` (None if never)."""
    for rec in valid:
        if rec["eval_loss"] <= target:
            return int(rec["step"])
    return None


def plot_curves(
    run_dirs: list[str | Path],
    out_png: str | Path,
    labels: list[str] | None = None,
    title: str | None = None,
    show_train: bool = False,
    baseline: float | None = None,
) -> Path:
    """Draw validation loss against step for every run on one figure and save it as a PNG.

    Runs that share a label (several seeds of one scheme) share a colour and one legend entry; `baseline` draws
    the unigram baseline as a dashed line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise TupeError("no run folder given")
    labels = labels or [run_label(d) for d in run_dirs]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = 0
    color_of: dict[str, str] = {}
    for run, label in zip(run_dirs, labels):
        train, valid = read_metrics(run)
        first = label not in color_of
        color = color_of.setdefault(label, colors[len(color_of) % len(colors)])
        several = labels.count(label) > 1
        if valid:
            ax.plot(
                [r["step"] for r in valid],
                [r["eval_loss"] for r in valid],
                marker="" if several else "o",
                markersize=3.5,
                linewidth=1.2 if several else 1.8,
                alpha=0.85 if several else 1.0,
                color=color,
                label=label if first else None,
            )
            drawn += 1
        if show_train and train:
            ax.plot(
                [r["step"] for r in train],
                [r["loss"] for r in train],
                linestyle=":",
                linewidth=1.0,
                alpha=0.7,
                color=color,
                label=f"{label} (training)" if first else None,
            )
    if drawn == 0:
        plt.close(fig)
        raise TupeError("none of the runs has a validation record yet (eval_loss in metrics.jsonl)")
    if baseline is not None:
        ax.axhline(
            baseline, color="0.4", linestyle="--", linewidth=1.0, label=f"unigram baseline ({baseline:.2f})"
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("validation masked-LM loss (nats / masked token)")
    ax.set_title(title or "Pre-training validation loss")
    ax.grid(True, alpha=0.3)
    ax.legend(title="scheme", frameon=False)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="output folders of `tupe pretrain`")
    p.add_argument("--out", default="valid_loss.png", help="PNG to write (default: valid_loss.png)")
    p.add_argument("--title", help="figure title")
    p.add_argument("--labels", help="comma-separated legend labels (default: each run's scheme)")
    p.add_argument("--train", action="store_true", help="also draw the training loss (dotted)")


def run(args: argparse.Namespace) -> int:
    labels = args.labels.split(",") if args.labels else None
    if labels and len(labels) != len(args.runs):
        raise TupeError(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    path = plot_curves(args.runs, args.out, labels=labels, title=args.title, show_train=args.train)
    print(path)
    return 0
