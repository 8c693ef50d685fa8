"""Validation-loss curves of pre-training runs on one figure (`tupe plot RUN_DIR|COMPARE_DIR... [--out PNG]`).

Reads each run's `metrics.jsonl` (written by `tupe pretrain`): records with `eval_loss` are validation points,
records with `loss` training points. A `tupe compare` folder stands for all its runs (`DIR/<scheme>/` or, with
several seeds, `DIR/<scheme>/seed-<k>/`), seeds of a scheme in one colour and one legend entry. The legend names
each run by its positional scheme (from `tupe_run.json`) or, failing that, by its folder name, with the folder
added where two runs from different places would otherwise share a name; it sits outside the axes so it never
hides a curve. `tupe compare` and `tupe demo` draw their figure with this module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.io.reading import read_json


def read_metrics(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, validation records) of a run, each sorted by step; later duplicates of a step win."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise TupeError(f"{run_dir}: no metrics.jsonl (not a `tupe pretrain` output folder?)")
    train: dict[int, dict] = {}
    valid: dict[int, dict] = {}
    from tupe.io.reading import iter_lines

    lines = list(iter_lines(path, "metrics log"))  # a FIFO, a device or a huge line: one line naming the file
    ends_with_newline = _ends_with_newline(path)
    for lineno, raw in lines:
        if not raw.strip():
            continue
        line = raw.decode("utf-8", errors="replace")
        try:
            rec = json.loads(raw)
            step = int(rec["step"])
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError):
            if lineno == len(lines) and not ends_with_newline:  # cut by a kill: the run wrote it last
                print(f"warning: {path}:{lineno}: ignoring a cut last line", file=sys.stderr)
                continue
            raise TupeError(f"{path}:{lineno}: not a metrics record: {line[:80]!r}") from None
        if step < 0:
            raise TupeError(f"{path}:{lineno}: step {step} is negative: not a metrics record of tupe's")
        for key in ("eval_loss", "loss"):
            if key in rec and (isinstance(rec[key], bool) or not isinstance(rec[key], int | float | None)):
                raise TupeError(f"{path}:{lineno}: {key} {str(rec[key])[:40]!r} is not a number")
        if "eval_loss" in rec:
            valid[step] = rec
        elif "loss" in rec:
            train[step] = rec
    return [train[s] for s in sorted(train)], [valid[s] for s in sorted(valid)]


def _ends_with_newline(path: Path) -> bool:
    from tupe.io.reading import open_regular

    with open_regular(path, "metrics log") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return True
        fh.seek(size - 1)
        return fh.read(1) == b"\n"


def run_label(run_dir: str | Path) -> str:
    """The run's scheme name (from tupe_run.json), else its folder name."""
    try:
        return str(read_json(Path(run_dir) / "tupe_run.json", "run record")["scheme"])
    except (TupeError, KeyError):
        return Path(run_dir).name


def _seed_key(path: Path) -> tuple[int, str]:
    tail = path.name.rpartition("-")[2]
    return (int(tail), path.name) if tail.isdigit() else (1 << 62, path.name)


def find_runs(path: str | Path) -> list[tuple[Path, str]]:
    """(run folder, legend group) of every run that `path` stands for: a `tupe pretrain` folder is one run; a
    `tupe compare` folder is all its runs, `DIR/<scheme>/` or `DIR/<scheme>/seed-<k>/`, in the comparison's
    scheme order (reference first) with seeds in numeric order, grouped by scheme."""
    path = Path(path)
    if os.path.lexists(path / "metrics.jsonl"):
        from tupe.io.reading import check_regular

        check_regular(path / "metrics.jsonl", "metrics log")  # a FIFO or a device: refused by name
        return [(path, run_label(path))]
    if not path.is_dir():
        raise TupeError(
            f"{path}: no such folder (expected a `tupe pretrain` or `tupe compare` output folder)"
        )
    order: list[str] = []
    try:
        order = [str(x) for x in read_json(path / "compare_summary.json", "comparison summary")["schemes"]]
    except (TupeError, KeyError, TypeError):
        pass
    children = sorted(
        (c for c in path.iterdir() if c.is_dir() and not c.name.startswith(".")),
        key=lambda c: (order.index(c.name) if c.name in order else len(order), c.name),
    )
    runs: list[tuple[Path, str]] = []
    for child in children:
        if (child / "metrics.jsonl").is_file():
            runs.append((child, run_label(child)))
            continue
        seeds = sorted((g for g in child.glob("seed-*") if (g / "metrics.jsonl").is_file()), key=_seed_key)
        runs.extend((g, run_label(g)) for g in seeds)
    if not runs:
        raise TupeError(
            f"{path}: no metrics.jsonl (not a `tupe pretrain` output folder?), and no run folders in it "
            "(not a `tupe compare` output folder either)"
        )
    return runs


def legend_labels(sources: list[str | Path], groups: list[list[tuple[Path, str]]]) -> list[str]:
    """One label per run, from `find_runs` of each source (a command-line argument): runs of one source (the
    seeds of a comparison) keep their shared name; a name that two sources would share gets the source's path
    (relative to what the sources have in common) in brackets, so two distinct experiments never merge into one
    legend entry or print the same text: `bert-a [cmp-1]`, `bert-a [cmp-2]`."""
    resolved = [Path(src).resolve() for src in sources]
    common = Path(os.path.commonpath(resolved)) if len(resolved) > 1 else None
    names = [
        str(r.relative_to(common)) if common is not None and r != common else r.name or str(r)
        for r in resolved
    ]
    shared: dict[str, set[int]] = {}
    for i, runs in enumerate(groups):
        for _, label in runs:
            shared.setdefault(label, set()).add(i)
    return [
        f"{label} [{names[i]}]" if len(shared[label]) > 1 else label
        for i, runs in enumerate(groups)
        for _, label in runs
    ]


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
    fig, ax = plt.subplots(figsize=(8.5, 4.8), dpi=130)
    drawn, trained = _draw_runs(
        ax, run_dirs, labels, show_train, plt.rcParams["axes.prop_cycle"].by_key()["color"]
    )
    if drawn == 0:
        plt.close(fig)
        raise TupeError("none of the runs has a validation record yet (eval_loss in metrics.jsonl)")
    if baseline is not None:
        ax.axhline(
            baseline, color="0.4", linestyle="--", linewidth=1.0, label=f"unigram baseline ({baseline:.2f})"
        )
    if trained:  # one entry for every dotted line: the colour already names the run
        ax.plot([], [], linestyle=":", color="0.3", label="training loss (dotted, same colour)")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation masked-LM loss (nats / masked token)")
    ax.set_title(title or "Pre-training validation loss")
    ax.grid(True, alpha=0.3)
    # beside the axes, not on them: with many runs an inside legend covers the curves it names
    ax.legend(title="scheme", frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    import io

    from tupe.io.files import atomic_write_bytes

    out_png = Path(out_png)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(out_png, buf.getvalue())  # never half a figure; a full disk is one line naming it
    return out_png


def _draw_runs(
    ax: Any, run_dirs: list[str | Path], labels: list[str], show_train: bool, colors: list[str]
) -> tuple[int, bool]:
    """Each run's validation curve (and, with `show_train`, its training loss dotted) on `ax`, runs of one label
    in one colour with one legend entry; returns (validation curves drawn, whether a training curve was)."""
    styles = ["-", "--", "-.", (0, (1, 1))]  # beyond the colour cycle, the line style tells groups apart
    drawn = 0
    trained = False
    color_of: dict[str, tuple[str, Any]] = {}
    for run, label in zip(run_dirs, labels):
        train, valid = read_metrics(run)
        first = label not in color_of
        k = len(color_of)
        color, style = color_of.setdefault(
            label, (colors[k % len(colors)], styles[(k // len(colors)) % len(styles)])
        )
        same = [Path(d) for d, lab in zip(run_dirs, labels) if lab == label]
        several = len(same) > 1
        kind = "seeds" if all(d.name.startswith("seed-") for d in same) else "runs"
        entry = f"{label} ({len(same)} {kind})" if several else label
        if valid:
            ax.plot(
                [r["step"] for r in valid],
                [r["eval_loss"] for r in valid],
                marker="" if several else "o",
                markersize=3.5,
                linewidth=1.2 if several else 1.8,
                alpha=0.85 if several else 1.0,
                color=color,
                linestyle=style,
                label=entry if first else None,
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
            )
            trained = True
    return drawn, trained


def compare_baseline(path: str | Path) -> float | None:
    """The unigram baseline a `tupe compare` folder recorded (compare_summary.json), else None."""
    try:
        value = read_json(Path(path) / "compare_summary.json", "comparison summary")["stats"]["unigram_loss"]
    except (TupeError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="output folders of `tupe pretrain`, or of `tupe compare` (all its runs, seeds included)",
    )
    p.add_argument(
        "--out",
        default="valid_loss.png",
        metavar="PNG",
        type=V.nonempty_path,
        help="PNG to write (default: valid_loss.png)",
    )
    p.add_argument("--title", help="figure title")
    p.add_argument(
        "--labels",
        help="comma-separated legend entries, one per scheme group in legend order (default: each run's "
        "scheme, with its folder added where two folders share one)",
    )
    p.add_argument("--train", action="store_true", help="also draw the training loss (dotted)")


def run(args: argparse.Namespace) -> int:
    from tupe.io.outputs import claim_file

    V.check_out_file("--out", args.out)
    groups = [find_runs(src) for src in args.runs]
    run_dirs = [d for runs in groups for d, _ in runs]
    labels = legend_labels(args.runs, groups)
    if args.labels:
        names = [x.strip() for x in args.labels.split(",")]
        entries = list(dict.fromkeys(labels))
        if len(names) != len(entries):
            raise TupeError(
                f"--labels has {len(names)} names for {len(entries)} legend entries ({', '.join(entries)})"
            )
        rename = dict(zip(entries, names))
        labels = [rename[lab] for lab in labels]
    # the unigram baseline only when every source is a comparison that measured the same one (the same data)
    baselines = {compare_baseline(src) for src in args.runs}
    claim_file(args.out, "tupe plot", "--out")  # a figure of the user's is never replaced
    path = plot_curves(
        run_dirs,
        args.out,
        labels=labels,
        title=args.title,
        show_train=args.train,
        baseline=baselines.pop() if len(baselines) == 1 else None,
    )
    print(f"{path} ({len(run_dirs)} runs)")
    return 0
