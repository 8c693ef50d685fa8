"""Collect the mini-scale reproduction (docs/RESULTS.md) from its run folder into docs/results/.

Usage: python scripts/results/collect.py RUN_DIR   (RUN_DIR holds compare/, glue/, and the analysis text)

Copies the small outputs (loss curves, tables, summaries), re-runs `tupe analyze --no-json-maps` on every
pre-trained model (small JSON), and writes glue_seeds.md: every seed's dev score, mean +/- sample std and the
median the paper's protocol uses, and a cross-model figure of the first-layer term shares.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from pathlib import Path

SCHEMES = [
    s
    for s in ["bert-a", "bert-r", "tupe-a", "tupe-r", "tupe-a-tie-cls"]
    if len(sys.argv) < 3 or s in sys.argv[2:]
]
TASKS = [("CoLA", "mcc"), ("SST-2", "accuracy"), ("MRPC", "accuracy")]
HERE = Path(__file__).resolve().parents[2] / "docs" / "results"  # where the collected outputs go
ANALYSIS_TEXT = (
    os.environ.get("GUTENBERG_DIR", "gutenberg") + "/203-0.txt"
)  # the analysis text of RESULTS Part B


def copy_compare(run: Path) -> None:
    for name in ("valid_loss.png", "valid_loss.md", "valid_loss.csv", "compare_summary.json"):
        if (run / "compare" / name).exists():
            shutil.copy(run / "compare" / name, HERE / name)
    summaries = {}
    for s in SCHEMES:
        f = run / "compare" / s / "pretrain_summary.json"
        if f.exists():
            d = json.loads(f.read_text())
            summaries[s] = {
                k: d.get(k)
                for k in (
                    "steps",
                    "final_eval_loss",
                    "train_loss",
                    "wall_seconds",
                    "num_parameters",
                    "train_blocks",
                    "valid_blocks",
                    "corpus",
                )
            }
    (HERE / "pretrain_summaries.json").write_text(json.dumps(summaries, indent=1))


def analyze_all(run: Path) -> dict:
    from tupe.analysis.analyze import analyze

    out = {}
    for s in SCHEMES:
        model = run / "compare" / s
        if not (model / "model.safetensors").exists():
            continue
        res = analyze(
            model,
            HERE / "analysis" / s,
            text=ANALYSIS_TEXT,
            max_length=128,
            num_blocks=64,
            title=s,
            json_maps=False,
        )
        (
            HERE / "analysis" / s / "analysis.html"
        ).unlink()  # large (inlined images); regenerate with tupe analyze
        out[s] = res
    return out


def term_share_figure(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    terms = ["word_word", "word_pos", "pos_word", "pos_pos"]
    labels = ["word→word", "word→position", "position→word", "position→position"]
    models = [s for s in SCHEMES if s in results and "decomposition" in results[s]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), constrained_layout=True)
    width = 0.8 / len(models)
    for k, s in enumerate(models):
        st = results[s]["decomposition"]["stats"]
        for ax, key in zip(axes, ("row_std_per_head", "row_std_per_example")):
            ax.bar([i + k * width for i in range(4)], [st[t][key] for t in terms], width, label=s)
    for ax, title in zip(axes, ("averaged over 64 text blocks (per head)", "on single inputs (per head)")):
        ax.set_xticks([i + width * (len(models) - 1) / 2 for i in range(4)], labels)
        ax.set_ylabel("row std of the term (logits)")
        ax.set_title(f"First-layer logit terms: variation across key positions,\n{title}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.savefig(HERE / "term_row_std.png", dpi=110)
    plt.close(fig)


def glue_table(run: Path) -> str:
    lines = [
        "| model | " + " | ".join(f"{t} ({m}) seeds" for t, m in TASKS) + " |",
        "|---|" + "---|" * len(TASKS),
    ]
    summary = {}
    for s in SCHEMES:
        cells = []
        for task, metric in TASKS:
            f = run / "glue" / s / task / "results.json"
            if not f.exists():
                cells.append("not run")
                continue
            d = json.loads(f.read_text())
            vals = [r["scores"]["dev"][metric] * 100 for r in d["runs"]]
            if not vals:
                cells.append("no finished run")
                continue
            mean = statistics.mean(vals)
            sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
            med = statistics.median(vals)
            summary.setdefault(s, {})[task] = {
                "seeds": vals,
                "mean": mean,
                "sd": sd,
                "median": med,
                "lr": d["runs"][0]["lr"],
            }
            cells.append(
                f"{mean:.1f} ± {sd:.1f} (median {med:.1f}; " + ", ".join(f"{v:.1f}" for v in vals) + ")"
            )
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    (HERE / "glue_seeds.json").write_text(json.dumps(summary, indent=1))
    table = "\n".join(lines) + "\n"
    (HERE / "glue_seeds.md").write_text(table)
    return table


def main(run: Path) -> None:
    HERE.mkdir(exist_ok=True)
    copy_compare(run)
    results = analyze_all(run)
    if results:
        term_share_figure(results)
    if (run / "glue" / "report.md").exists():
        shutil.copy(run / "glue" / "report.md", HERE / "glue_report.md")
    print(glue_table(run))


def _command(argv: list[str] | None) -> None:
    from tupe.errors import TupeError
    from tupe.scripts import ScriptParser

    p = ScriptParser(prog="collect.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="holds compare/, glue/ and the analysis text"
    )
    p.add_argument("schemes", nargs="*", metavar="SCHEME", help="only these schemes (default: all five)")
    args = p.parse_args(argv)
    if not args.run_dir.is_dir():
        raise TupeError(f"RUN_DIR {args.run_dir} is not a folder")
    if unknown := sorted(set(args.schemes) - {"bert-a", "bert-r", "tupe-a", "tupe-r", "tupe-a-tie-cls"}):
        raise TupeError(f"unknown scheme {unknown[0]!r}; choose from: {', '.join(SCHEMES)}")
    main(args.run_dir)


if __name__ == "__main__":
    from tupe.scripts import run_script

    raise SystemExit(run_script(_command))
