"""Collect `tupe glue` results into a table shaped like the paper's Table 1 (Markdown and CSV).

One row per fine-tuned checkpoint (named by its position scheme and pre-training steps), the paper's columns
(MNLI-m/mm, QNLI, QQP, SST, CoLA, MRPC, RTE, STS) with each task's best-learning-rate median x 100, and the
average over the columns every row has; a majority-class row, and per model and task whether every seed of the
best learning rate beats it. `--paper` adds the paper's BERT-Base rows (Ke et al., ICLR 2021, Table 1), averaged
over the same columns so the numbers compare.
"""

from __future__ import annotations

import argparse
import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.finetuning.pipeline.results import GridResults


def task_columns() -> list[tuple[str, str, str, str]]:
    """(column, task, dev split, metric) of every task in the table (`GlueTask.report_columns`), in table order:
    the paper's Table 1 order for GLUE, then any task added to the table."""
    from tupe.finetuning.glue.tasks import TASKS

    return [(col, t.name, split, metric) for t in TASKS.values() for col, split, metric in t.report_columns]


PAPER_COLUMNS = ["MNLI-m", "MNLI-mm", "QNLI", "QQP", "SST", "CoLA", "MRPC", "RTE", "STS"]  # Table 1

# The paper's Table 1 (BERT-Base, GLUE dev), Ke et al., ICLR 2021, Table 1: (name, scheme, steps, the 9 numbers).
PAPER_ROWS: list[tuple[str, str, int, list[float]]] = [
    ("BERT-A", "bert-a", 1_000_000, [84.93, 84.91, 91.34, 91.04, 92.88, 55.19, 88.29, 68.61, 89.43]),
    ("BERT-R", "bert-r", 1_000_000, [85.81, 85.84, 92.16, 91.12, 92.90, 55.43, 89.26, 71.46, 88.94]),
    ("TUPE-A", "tupe-a", 1_000_000, [86.05, 85.99, 91.92, 91.16, 93.19, 63.09, 88.37, 71.61, 88.88]),
    ("TUPE-R", "tupe-r", 1_000_000, [86.21, 86.19, 92.17, 91.30, 93.26, 63.56, 89.89, 73.56, 89.23]),
    ("TUPE-A mid", "tupe-a", 300_000, [84.76, 84.83, 90.96, 91.00, 92.25, 62.13, 87.10, 68.79, 88.16]),
    ("TUPE-R mid", "tupe-r", 300_000, [84.86, 85.21, 91.23, 91.14, 92.41, 62.47, 87.29, 69.85, 88.63]),
    (
        "TUPE-A tie-cls",
        "tupe-a-tie-cls",
        1_000_000,
        [85.91, 85.73, 91.90, 91.05, 93.17, 59.46, 88.53, 69.54, 88.97],
    ),
    ("BERT-A^d", "bert-a-d", 1_000_000, [85.26, 85.28, 91.56, 91.02, 92.70, 59.73, 88.46, 71.31, 87.47]),
]


def scheme_display_name(scheme: str) -> str:
    """The paper's name of a scheme (its report's `display_name`), or the name itself for one this package lacks."""
    from tupe.modeling.positional import SCHEMES

    return SCHEMES[scheme].report.display_name if scheme in SCHEMES else scheme


def format_steps(steps: int | None) -> str:
    if steps is None:
        return "?"
    if steps >= 1_000_000:
        return f"{steps / 1_000_000:g}M"
    if steps >= 1000:
        return f"{steps / 1000:g}k"
    return str(steps)


@dataclass
class Row:
    name: str
    scheme: str
    steps: int | None
    source: str  # "ours" or "paper"
    model_path: str = ""
    cells: dict[str, float] = field(default_factory=dict)  # column -> score x 100
    incomplete: set[str] = field(default_factory=set)  # columns whose grid is not finished
    details: dict[str, str] = field(default_factory=dict)  # task -> "best lr 2e-05, 5 seeds, f1 90.1"
    off_protocol: set[str] = field(default_factory=set)  # tasks run with settings other than the paper's
    # column -> the best learning rate's per-seed main scores x 100 (None: undefined)
    seed_scores: dict[str, list[float | None]] = field(default_factory=dict)


def protocol_differences(data: dict[str, Any]) -> list[str]:
    """How a results.json's settings differ from the paper's fine-tuning protocol (Ke et al., ICLR 2021, Sec. 4.1 and Table 2; see docs/glue.md)."""
    from tupe.finetuning.glue.protocol import PAPER_LRS
    from tupe.finetuning.glue.tasks import get_task

    s = data.get("settings") or {}
    if not s:
        return []
    task = get_task(data["task"])
    out = []
    if s.get("epochs") is not None and float(s["epochs"]) != task.epochs:
        out.append(f"{s['epochs']:g} epochs (paper {task.epochs})")
    lrs = sorted(float(x) for x in s.get("lrs", PAPER_LRS))
    if lrs != sorted(PAPER_LRS):
        out.append(f"lr {','.join(f'{x:g}' for x in lrs)} (paper 2e-5,3e-5,4e-5,5e-5)")
    n_seeds = len(s.get("seeds", [1, 2, 3, 4, 5]))
    if n_seeds != 5:
        out.append(f"{n_seeds} seeds (paper 5)")
    paper = {
        "batch_size": 32,
        "warmup_ratio": 0.06,
        "weight_decay": 0.01,
        "adam_epsilon": 1e-6,
        "dropout": 0.1,
    }
    if s.get("warmup_steps") is not None:  # --warmup-steps in place of the ratio
        paper.pop("warmup_ratio")
        out.append(f"warm-up {s['warmup_steps']} steps (paper 6% of the steps)")
    for key, value in paper.items():
        if key in s and s[key] != value:
            out.append(f"{key} {s[key]} (paper {value})")
    if s.get("max_seq_len") not in (None, 512):
        limit = (data.get("model", {}).get("config") or {}).get("max_position_embeddings")
        why = ", the model's limit" if limit == s["max_seq_len"] else ""
        out.append(f"max length {s['max_seq_len']}{why} (paper 512)")
    if s.get("max_train_samples"):
        out.append(
            f"train subset of {data.get('data', {}).get('train_examples', s['max_train_samples'])} examples"
        )
    if s.get("max_eval_samples"):
        out.append("dev subset")
    return out


def find_results(paths: list[str]) -> list[Path]:
    """Every results.json named, in a named folder, or anywhere below a named folder."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif (p / "results.json").is_file():
            found.append(p / "results.json")
        elif p.is_dir():
            found.extend(sorted(p.rglob("results.json")))
        else:
            raise TupeError(f"{p}: no such file or directory")
    if not found:
        raise TupeError(f"no results.json under {', '.join(paths)} (run `tupe glue` first)")
    return list(dict.fromkeys(found))


def _load(path: Path) -> GridResults:
    """The results record of a results.json written by `tupe glue` or `tupe finetune` (any version)."""
    from tupe.io.reading import RESULTS_LIMIT, read_json

    data = read_json(path, "GLUE results", RESULTS_LIMIT)  # a FIFO, /dev/zero or a list: one line naming it
    return GridResults.from_json(data, path)


def build_rows(paths: list[Path]) -> list[Row]:
    """One row per checkpoint (same weights), one cell per task column."""
    rows: dict[str, Row] = {}
    seen: dict[tuple[str, str], Path] = {}
    for path in paths:
        try:
            _add_row(path, rows, seen)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as err:
            # a hand-edited or foreign results.json: one line naming it, not a traceback
            raise TupeError(
                f"{path}: not a `tupe glue` results.json of the expected shape ({type(err).__name__}: {err})"
            ) from None
    out = list(rows.values())
    # Disambiguate rows that would print the same name.
    names: dict[tuple[str, str], int] = {}
    for r in out:
        names[(r.name, format_steps(r.steps))] = names.get((r.name, format_steps(r.steps)), 0) + 1
    for r in out:
        if names[(r.name, format_steps(r.steps))] > 1:
            r.name = f"{r.name} ({Path(r.model_path).name})"
    return out


_MAJORITY: dict[str, float] = {}
_EXTRA_COLUMNS: list[str] = []  # columns of `tupe finetune` results, named in their results.json


def _add_finetune(row: Row, data: GridResults) -> None:
    """A `tupe finetune` results.json: its columns (`columns`: [column, metric]) hold the best learning rate's
    mean over seeds, already x 100; the trivial baseline it records (all-O for NER, the most frequent training
    label for classification and multiple choice) goes to the baseline row."""
    best = data.best
    for col, metric in data.columns or []:
        if col not in _EXTRA_COLUMNS:
            _EXTRA_COLUMNS.append(col)
        for scores in (data.baseline or {}).values():
            if metric in scores:
                _MAJORITY[col] = float(scores[metric])
        if best is None or metric not in best["mean"]:
            continue
        row.cells[col] = float(best["mean"][metric])
        if not data.complete:
            row.incomplete.add(col)
        if metric == data.main_metric:
            row.seed_scores[col] = [float(s[metric]) for s in (data.per_seed or {}).values()]
    if best is not None:
        # one seed has no spread: "n/a", not a standard deviation of 0.00 that reads as a measured one
        one = int(best.get("n_seeds", 0)) < 2

        def spread(m: str) -> str:
            sd = best.get("std", {}).get(m)
            return "sd n/a" if one or sd is None else f"± {sd:.2f}"

        shown = ", ".join(f"{m} {best['mean'][m]:.2f} {spread(m)}" for m in data.metrics)
        seeds = "1 seed" if one else f"mean ± sd of {best['n_seeds']} seeds"
        row.details[data.task] = (
            f"best lr {best['lr']:g}, {seeds}: {shown} "
            f"({data.data.get('validation', '')})" + ("" if data.complete else " (grid not finished)")
        )


def _add_row(path: Path, rows: dict[str, Row], seen: dict[tuple[str, str], Path]) -> None:
    """Add one results.json to the rows (its model's row, its task's cells)."""
    data = _load(path)
    model = data.model
    key = model.get("weights_sha256") or model["path"]
    if (key, data.task) in seen:
        raise TupeError(
            f"{path}: a second {data.task} result for {model['path']} (first: {seen[(key, data.task)]}); "
            "name one of them"
        )
    seen[(key, data.task)] = path
    row = rows.get(key)
    if row is None:
        name = scheme_display_name(data.scheme)
        row = rows[key] = Row(name, data.scheme, data.pretrain_steps, "ours", model["path"])
    if data.command == "finetune":
        _add_finetune(row, data)
        return
    _add_majority(data)
    best = data.best
    if best is None:
        return
    subset = any(data.settings.get(k) for k in ("max_train_samples", "max_eval_samples"))
    best_lr = next((e for e in data.per_lr.values() if e.get("lr") == best["lr"]), None)
    for col, task, split, metric in task_columns():
        if task == data.task:
            value = best["median"].get(split, {}).get(metric)
            if value is not None:
                row.cells[col] = 100.0 * value
                if not data.complete:
                    row.incomplete.add(col)
                if subset:  # an MNLI subset is not MNLI-m: the cell says so
                    row.incomplete.add(col + "#subset")
            main = (split, metric) == (data.main_split, data.main_metric)
            if main and best_lr and best_lr.get("main_scores"):
                row.seed_scores[col] = [None if v is None else 100.0 * v for v in best_lr["main_scores"]]
    others = [
        f"{split.replace('dev_', '')} {m} {100 * v:.2f}" if len(best["median"]) > 1 else f"{m} {100 * v:.2f}"
        for split, ms in best["median"].items()
        for m, v in ms.items()
        if v is not None
    ]
    diffs = protocol_differences(data.to_json())
    if diffs:
        row.off_protocol.add(data.task)
    row.details[data.task] = (
        f"best lr {best['lr']:g}, median of {best['n_seeds']} seeds: {', '.join(others)}"
        + ("" if data.complete else " (grid not finished)")
        + (f"; differs from the paper's protocol: {'; '.join(diffs)}" if diffs else "")
    )


def majority_score(majority: dict[str, float | None], split: str, metric: str) -> float | None:
    """What always predicting the most frequent dev label of `split` scores on `metric`, x 100 (`majority`: a
    results file's `dev_majority_accuracy`): its accuracy, MCC 0 (CoLA); None otherwise (STS-B, F1)."""
    acc = majority.get(split)
    if metric == "accuracy" and acc is not None:
        return 100.0 * acc
    if metric == "mcc" and split in majority:
        return 0.0
    return None


def _add_majority(data: GridResults) -> None:
    """The majority-class baseline of a task's dev split(s) (`majority_score`)."""
    majority = data.data.get("dev_majority_accuracy") or {}
    for col, task, split, metric in task_columns():
        score = majority_score(majority, split, metric) if task == data.task else None
        if score is not None:
            _MAJORITY[col] = score


def majority_row() -> Row | None:
    if not _MAJORITY:
        return None
    return Row("majority class", "-", None, "baseline", "", dict(_MAJORITY))


def paper_rows() -> list[Row]:
    return [
        Row(name, scheme, steps, "paper", "", dict(zip(PAPER_COLUMNS, values)))
        for name, scheme, steps, values in PAPER_ROWS
    ]


def table_columns(rows: list[Row]) -> list[str]:
    present = {c for r in rows if r.source == "ours" for c in r.cells}
    return [c for c in [*(c for c, *_ in task_columns()), *_EXTRA_COLUMNS] if c in present]


def average_columns(rows: list[Row], columns: list[str]) -> list[str]:
    """The columns every row has (WNLI left out, as in the paper): the only ones averaged, so every Avg is over
    the same tasks."""
    scored = [r for r in rows if r.source != "baseline"] or rows
    glue = {c for c, *_ in task_columns()}
    return [c for c in columns if c != "WNLI" and c in glue and all(c in r.cells for r in scored)]


def average(row: Row, columns: list[str]) -> tuple[float | None, bool]:
    """Mean over `columns` (those every row has); the flag says whether the row lacks some of them."""
    values = [row.cells[c] for c in columns if c in row.cells]
    if not values or len(values) < len(columns):
        return None, True
    return sum(values) / len(values), False


def _markdown_columns(columns: list[str]) -> list[str]:
    """The Markdown table's task columns: MNLI-m and -mm share one column like the paper's."""
    md_cols: list[str] = []
    for c in columns:
        if c in ("MNLI-m", "MNLI-mm") and {"MNLI-m", "MNLI-mm"} <= set(columns):
            if "MNLI-m/mm" not in md_cols:
                md_cols.append("MNLI-m/mm")
        else:
            md_cols.append(c)  # MNLI-m alone when only the matched dev set was scored
    return md_cols


def _cell(row: Row, c: str) -> str:
    """One Markdown cell: the score with its marks (an unfinished grid, a subset), or "-"."""
    if c == "MNLI-m/mm":
        return "/".join(_cell(row, x) for x in ("MNLI-m", "MNLI-mm"))
    if c not in row.cells:
        return "-"
    marks = ("†" if c in row.incomplete else "") + ("‡" if c + "#subset" in row.incomplete else "")
    return f"{row.cells[c]:.2f}" + marks


def _markdown_table(rows: list[Row], md_cols: list[str], avg_cols: list[str]) -> list[str]:
    header = ["model", "steps", *md_cols, "Avg"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        avg, missing = average(r, avg_cols)
        avg_s = "-" if avg is None else f"{avg:.2f}"
        name = r.name + (" (paper)" if r.source == "paper" else "")
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    "-" if r.source == "baseline" else format_steps(r.steps),
                    *(_cell(r, c) for c in md_cols),
                    avg_s,
                ]
            )
            + " |"
        )
    return lines


def _notes(rows: list[Row], columns: list[str], avg_cols: list[str]) -> list[str]:
    """The lines under the table: what the cells are, how Avg is taken, and each mark the table uses."""
    extra = [c for c in columns if c in _EXTRA_COLUMNS]
    glue = len(extra) < len(columns)
    notes = [
        "",
        *(
            [
                "GLUE dev; each cell is the median over seeds at the best learning rate, x 100: Matthews correlation "
                "(CoLA), Pearson (STS), accuracy (the rest)."
            ]
            if glue
            else []
        ),
        (
            f"Avg is the mean over the columns every row has: {', '.join(avg_cols)} (MNLI-m and -mm count "
            "separately, as in the paper; WNLI is never averaged)."
            if avg_cols
            else "Avg: no column is shared by every row, so no row is averaged."
        ),
    ]
    if extra:
        notes.append(
            f"{', '.join(extra)}: `tupe finetune` on the validation file named below, the mean over seeds at the "
            "best learning rate (x 100); their baseline is all-O (NER F1, 0 by definition) or the most frequent "
            "training label (accuracy)."
        )
    if glue and any(r.source == "baseline" for r in rows):
        notes.append(
            "majority class: always predicting the most frequent dev label (accuracy; MCC 0 for CoLA; none for "
            "STS-B, a regression)."
        )
    if any(any(k.endswith("#subset") for k in r.incomplete) for r in rows):
        notes.append(
            "‡ trained or scored on a subset of the task (--max-train-samples / --max-eval-samples): not the full "
            "dev set, not comparable with the paper."
        )
    if any(r.source == "paper" for r in rows):
        notes.append(
            "Paper rows: Ke et al. (ICLR 2021), Table 1, BERT-Base; their Avg recomputed over these columns."
        )
    if any(not k.endswith("#subset") for r in rows for k in r.incomplete):
        notes.append("† the lr x seed grid of this cell is not finished.")
    if any(r.off_protocol for r in rows):
        notes.append("Some cells come from settings other than the paper's protocol: see the list below.")
    return notes


def _csv_table(rows: list[Row], columns: list[str], avg_cols: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "scheme", "steps", *columns, "Avg", "source", "model_path"])
    for r in rows:
        avg, _ = average(r, avg_cols)
        w.writerow(
            [
                r.name,
                r.scheme,
                "" if r.steps is None else r.steps,
                *("" if c not in r.cells else f"{r.cells[c]:.4f}" for c in columns),
                "" if avg is None else f"{avg:.4f}",
                r.source,
                r.model_path,
            ]
        )
    return buf.getvalue()


def render(rows: list[Row]) -> tuple[str, str]:
    """(Markdown, CSV) for the rows; MNLI-m and -mm share one Markdown column like the paper."""
    columns = table_columns(rows)
    avg_cols = average_columns(rows, columns)
    lines = _markdown_table(rows, _markdown_columns(columns), avg_cols)
    notes = _notes(rows, columns, avg_cols)
    details = []
    for r in rows:
        for task, text in r.details.items():
            details.append(f"- {r.name} {format_steps(r.steps)}, {task}: {text}")
    baseline = next((r for r in rows if r.source == "baseline"), None)
    versus = majority_verdicts(rows, baseline) if baseline is not None else []
    if versus:
        versus = ["", "Against the majority class (every seed of the best learning rate):", *versus]
    md = "\n".join(lines + notes + ([""] + details if details else []) + versus) + "\n"
    return md, _csv_table(rows, columns, avg_cols)


def majority_verdicts(rows: list[Row], baseline: Row) -> list[str]:
    """Whether each model beats the majority class beyond the seed spread: a median above it can be one lucky
    seed, so the lowest seed decides (an undefined score, a constant prediction, counts as no better)."""
    out = []
    for r in rows:
        for col, scores in r.seed_scores.items():
            if col not in baseline.cells or not scores:
                continue
            base = baseline.cells[col]
            known = [v for v in scores if v is not None]
            low = min(known) if len(known) == len(scores) else None
            high = max(known) if known else None
            spread = ", ".join("undefined" if v is None else f"{v:.2f}" for v in scores)
            if low is not None and low > base:
                how = f"beats it on every seed (lowest {low:.2f})"
            elif high is not None and high > base:
                how = "not beyond the seed spread (some seeds at or below it)"
            else:
                how = "no seed above it"
            out.append(f"- {r.name} {format_steps(r.steps)}, {col}: {how}; seeds {spread} vs {base:.2f}")
    return out


def make_report(paths: list[str], include_paper: bool = False) -> tuple[str, str]:
    _MAJORITY.clear()
    _EXTRA_COLUMNS.clear()
    rows = build_rows(find_results(paths))
    baseline = majority_row()
    if baseline is not None:
        rows = rows + [baseline]
    if include_paper:
        rows = rows + paper_rows()
    return render(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="`tupe glue --out` folders (searched recursively)"
    )
    p.add_argument(
        "--out", type=V.nonempty_path, help="write the Markdown table here and the CSV next to it (.csv)"
    )
    p.add_argument("--paper", action="store_true", help="add the paper's BERT-Base rows for comparison")


def run(args: argparse.Namespace) -> int:
    from tupe.io.files import atomic_write_text
    from tupe.io.outputs import check_file, claim_file

    if args.out:
        out = Path(args.out)
        md_path = out.with_suffix(".md") if out.suffix.lower() == ".csv" else out
        csv_path = out.with_suffix(".csv")
        for path in (md_path, csv_path):  # before any work; a user's file beside --out is never replaced
            V.check_out_file("--out", path)
            check_file(path, "tupe report", "--out")
    md, csv_text = make_report(args.run_dirs, include_paper=args.paper)
    print(md, end="")
    if args.out:
        claim_file(md_path, "tupe report", "--out")
        claim_file(csv_path, "tupe report", "--out")
        atomic_write_text(md_path, md)
        atomic_write_text(csv_path, csv_text)
        print(f"wrote {md_path} and {csv_path}")
    return 0
