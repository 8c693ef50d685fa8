"""The paper's claims judged on a study folder, each paired by seed (RESULTS Part G; issue 47 item 3).

    python -m tupe.comparison.claims runs/paper6k [--glue-tasks CoLA,MRPC,SST-2,MNLI] [--steps 1000,2000,4000,6000]

Reads what `python -m tupe.comparison.study` left in the folder, finished or not: the pre-training curves
(`runs/<scheme>/seed-<k>/metrics.jsonl`), the GLUE grids (`glue/<task>-<scheme>-seed-<k>/results.json`) and the
summary of the evaluation stages (`study.json`), and writes `claims.md` and `claims.json` beside them:

1. **Fig. 5a, "TUPE's validation loss is below the baselines' at every step"**: for each pair (tupe-a, tupe-r
   against bert-a, bert-r) and seed, whether the TUPE run is below at every evaluation both runs have, the
   share of evaluations where it is, and the step from which it stays below; the paired difference at chosen
   steps and at the end, mean over seeds with its 95% Student-t interval; the same for TUPE-R against TUPE-A and
   BERT-R against BERT-A, the paper's other orderings.
2. **"TUPE reaches the baselines' result in about 30% of the steps"** (pre-training loss): per seed the first
   evaluation at or below the baseline's final loss of the same seed, as a share of the baseline's steps.
3. **Table 1, GLUE dev**: per task each scheme's score per pre-training seed (the paper's protocol: the best
   learning rate's median over the fine-tuning seeds, x 100), and each of the paper's orderings as a difference
   paired by pre-training seed with its t interval, beside the paper's own difference.
   Also Table 1's "TUPE at 30% of the steps" rows, from grids of a TUPE run's checkpoint fine-tuned as
   `glue/<task>-<scheme>-mid-seed-<k>`, each pair's average over the tasks both schemes have, and each grid's
   protocol (learning rates, fine-tuning seeds, epochs, the training examples, the files where the grid was given
   `--train-file`/`--dev-file`, as MNLI's training sample is, the checkpoint's step).
4. The evaluation stages' readings (loss on each text, word-order delta, each length, passkey token use and
   copying at each distance): each scheme's own mean over seeds with its t interval, and minus the reference,
   paired by seed.

A difference is judged against the paper's sign: **holds** (same sign, interval excludes 0), **direction** (same
sign, interval holds 0), **not found** (opposite sign, interval holds 0), **reversed** (opposite sign, interval
excludes 0), **one seed** (no interval). With 3 seeds the t interval uses t = 4.30 (2 degrees of freedom): only a
difference large against its spread across seeds excludes 0. The unigram baseline (for "left the plateau") is the
one `tupe compare` recorded (`runs/compare_summary.json`), else that of the reference's first finished run
(`tupe.analysis.baseline.study_unigram`), or `--unigram`. `claims.json` holds every run's validation curve and is
enough to write `claims.md` again (`render`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tupe.analysis.curves import steps_to_reach
from tupe.analysis.seeds import PLATEAU_MARGIN, mean_std, plateau_exit_step, t_interval
from tupe.errors import TupeError

# The paper's pairs for Fig. 5a: each TUPE variant against each baseline.
LOSS_PAIRS = (("tupe-a", "bert-a"), ("tupe-r", "bert-a"), ("tupe-a", "bert-r"), ("tupe-r", "bert-r"))
# The paper's other orderings in pre-training (Fig. 5a's curves, Table 1's rows): relative below absolute.
ORDER_PAIRS = (("tupe-r", "tupe-a"), ("bert-r", "bert-a"))
# The paper's comparisons in Table 1: the untied model against its tied baseline, relative against absolute, and
# the best against the worst (Table 1's rows are ordered TUPE-R, TUPE-A, BERT-R, BERT-A on the average).
GLUE_PAIRS = (
    ("tupe-a", "bert-a"),
    ("tupe-r", "bert-r"),
    ("tupe-r", "tupe-a"),
    ("bert-r", "bert-a"),
    ("tupe-a", "bert-r"),
    ("tupe-r", "bert-a"),
    # "TUPE at 30% of the steps matches the baselines at 100%" (Table 1's "mid" rows: 300k of 1M steps)
    ("tupe-a-mid", "bert-a"),
    ("tupe-r-mid", "bert-r"),
)
# GLUE grids of a TUPE run's checkpoint at 30% of its steps sit beside the finished runs' as
# `glue/<task>-<scheme>-mid-seed-<k>/` (`tupe glue --model RUN/checkpoint-STEP`; RESULTS G says which step).
MID = "-mid"
# Ke, He, Liu (ICLR 2021), Table 1: GLUE dev of the BERT-Base-size models pre-trained 1M steps (CoLA: Matthews
# correlation x 100; the others accuracy x 100; "-mid": TUPE after 300k steps). Only the tasks this project ships
# or reads data for.
PAPER_GLUE: dict[str, dict[str, float]] = {
    "CoLA": {
        "bert-a": 55.19,
        "bert-r": 55.43,
        "tupe-a": 63.09,
        "tupe-r": 63.56,
        "tupe-a-mid": 62.13,
        "tupe-r-mid": 62.47,
    },
    "SST-2": {
        "bert-a": 92.88,
        "bert-r": 92.90,
        "tupe-a": 93.19,
        "tupe-r": 93.26,
        "tupe-a-mid": 92.25,
        "tupe-r-mid": 92.41,
    },
    "MRPC": {
        "bert-a": 88.29,
        "bert-r": 89.26,
        "tupe-a": 88.37,
        "tupe-r": 89.89,
        "tupe-a-mid": 87.1,
        "tupe-r-mid": 87.29,
    },
    "MNLI": {
        "bert-a": 84.93,
        "bert-r": 85.81,
        "tupe-a": 86.05,
        "tupe-r": 86.21,
        "tupe-a-mid": 84.76,
        "tupe-r-mid": 84.86,
    },
}
AVERAGE = "average"  # the tasks' mean per pre-training seed, over the tasks every scheme of a pair has
GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "MNLI")
DEFAULT_STEPS = (500, 1000, 2000, 3000, 4000, 5000, 6000)


def verdict(paper: float, diffs: Sequence[float]) -> str:
    """How paired differences read against the paper's difference `paper` (its sign is the claim)."""
    if not diffs:
        return "no data"
    lo, hi = t_interval(list(diffs))
    mean = sum(diffs) / len(diffs)
    same = (mean > 0) == (paper > 0) and mean != 0
    if lo is None or hi is None:
        return "one seed"
    excludes = lo > 0 or hi < 0
    if same:
        return "holds" if excludes else "direction"
    return "reversed" if excludes else "not found"


def paired(diffs: Sequence[float]) -> dict[str, Any]:
    """Mean, sample std and 95% t interval of paired differences, and how many are below 0."""
    mean, std = mean_std(list(diffs))
    lo, hi = t_interval(list(diffs))
    return {
        "diffs": list(diffs),
        "mean": mean,
        "std": std,
        "ci95": [lo, hi],
        "below_zero": sum(d < 0 for d in diffs),
    }


# ----------------------------------------------------------------------------------------------- reading


def read_curves(
    study: Path, schemes: Sequence[str], seeds: Sequence[int]
) -> dict[tuple[str, int], dict[str, Any]]:
    """Every run of the study that has validation records: {"valid": records sorted by step, "finished": whether
    the run wrote its pretrain_summary.json}; runs not started are left out."""
    from tupe.analysis.curves import read_metrics
    from tupe.training.run_folder import SUMMARY_FILE

    curves = {}
    for s in schemes:
        for k in seeds:
            run = study / "runs" / s / f"seed-{k}"
            if (run / "metrics.jsonl").exists():
                valid = read_metrics(run)[1]
                if valid:
                    curves[(s, k)] = {"valid": valid, "finished": (run / SUMMARY_FILE).is_file()}
    return curves


def read_glue(
    study: Path, schemes: Sequence[str], seeds: Sequence[int], tasks: Sequence[str]
) -> dict[str, Any]:
    """{task: {"metric": name, "scores": {scheme: {seed: score x 100}}, "grids": {protocol: [runs]}}} of the
    complete GLUE grids of the study (a TUPE scheme's 30%-of-steps checkpoint as `<scheme>-mid`, where its grids
    exist; `study.complete_grid`: a results.json that is not one is an error naming it)."""
    from tupe.comparison.study import complete_grid

    out: dict[str, Any] = {}
    names = [*schemes, *(s + MID for s in schemes if s.startswith("tupe"))]
    for task in tasks:
        scores: dict[str, dict[int, float]] = {}
        grids: dict[str, list[str]] = {}  # each protocol and the runs fine-tuned with it
        metric = None
        for s in names:
            for k in seeds:
                result = complete_grid(study / "glue" / f"{task}-{s}-seed-{k}" / "results.json")
                if result is None:
                    continue
                metric = result.get("main_metric")
                scores.setdefault(s, {})[k] = 100 * float(result["best"]["main_median"])
                grids.setdefault(_grid_text(result), []).append(f"{s}/seed-{k}")
        if scores:
            out[task] = {"metric": metric, "scores": scores, "grids": grids}
    return out


def _grid_text(result: dict[str, Any]) -> str:
    """A grid's protocol in one line: its learning rates, fine-tuning seeds, epochs and training examples, and the
    checkpoint's pre-training steps (what differs between two grids of one task shows there)."""
    settings = result.get("settings") or {}
    lrs = ", ".join(f"{lr:g}" for lr in settings.get("lrs") or [])
    seeds = ", ".join(map(str, settings.get("seeds") or []))
    samples = settings.get("max_train_samples")
    epochs = settings.get("epochs")
    epochs = f"{epochs:g}" if isinstance(epochs, int | float) else "?"
    text = f"learning rates {lrs or '?'}; fine-tuning seeds {seeds or '?'}; {epochs} epochs"
    data = result.get("data") or {}
    source, examples = str(data.get("source") or ""), data.get("train_examples")
    count = "" if examples is None else f" ({examples:,} examples)"
    if samples is not None:
        text += f"; {samples:,} training examples"
    elif " + " in source:  # --train-file + --dev-file: the files, by name (e.g. MNLI's training sample)
        text += "; all of the files " + " + ".join(Path(part).name for part in source.split(" + ")) + count
    else:
        text += "; whole training set" + count
    steps = result.get("pretrain_steps")
    return text + ("" if steps is None else f"; checkpoint at step {steps:,}")


# ------------------------------------------------------------------------------------------------ judging


def loss_pair(
    a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], steps: Sequence[int]
) -> dict[str, Any]:
    """Runs of `a` (a TUPE variant) against the runs of `b` (a baseline) of the same seeds (`read_curves`'s
    entries): Fig. 5a over the evaluations both have; the final difference and the steps to reach the baseline's
    final loss only for seeds whose two runs have finished."""
    per_seed: dict[str, Any] = {}
    for k in sorted(set(a) & set(b)):
        la = {r["step"]: r["eval_loss"] for r in a[k]["valid"]}
        lb = {r["step"]: r["eval_loss"] for r in b[k]["valid"]}
        common = sorted(set(la) & set(lb))
        if not common:
            continue
        below = [la[st] < lb[st] for st in common]
        done = a[k]["finished"] and b[k]["finished"]
        reach = steps_to_reach(a[k]["valid"], lb[max(lb)]) if done else None
        per_seed[str(k)] = {
            "finished": done,
            "steps_compared": len(common),
            "last_step": common[-1],
            "below_at_every_step": all(below),
            "share_below": sum(below) / len(below),
            "below_from_step": next((common[i] for i in range(len(common)) if all(below[i:])), None),
            "diff_at_last": la[common[-1]] - lb[common[-1]],
            "diffs_at": {str(st): la[st] - lb[st] for st in steps if st in la and st in lb},
            "baseline_final_step": max(lb) if done else None,
            "reaches_baseline_final_at": reach,
            "reach_share": None if reach is None else reach / max(lb),
        }
    finals = [v["diff_at_last"] for v in per_seed.values() if v["finished"]]
    at_steps = {
        str(st): paired([v["diffs_at"][str(st)] for v in per_seed.values() if str(st) in v["diffs_at"]])
        for st in steps
        if any(str(st) in v["diffs_at"] for v in per_seed.values())
    }
    return {
        "seeds": [int(k) for k in per_seed],
        "finished_seeds": [int(k) for k, v in per_seed.items() if v["finished"]],
        "per_seed": per_seed,
        "at_steps": at_steps,
        "final": paired(finals),
        "verdict": verdict(-1.0, finals),
    }


def glue_pairs(glue: dict[str, Any]) -> dict[str, Any]:
    """Per task and pair of GLUE_PAIRS both scored: the difference paired by pre-training seed and its verdict."""
    out: dict[str, Any] = {}
    for task, found in glue.items():
        scores = found["scores"]
        rows = {}
        for a, b in GLUE_PAIRS:
            if a not in scores or b not in scores:
                continue
            seeds = sorted(set(scores[a]) & set(scores[b]))
            diffs = [scores[a][k] - scores[b][k] for k in seeds]
            paper = PAPER_GLUE.get(task, {})
            paper_diff = paper[a] - paper[b] if a in paper and b in paper else None
            rows[f"{a} - {b}"] = {
                "seeds": seeds,
                **paired(diffs),
                "paper": paper_diff,
                "verdict": "-" if paper_diff is None else verdict(paper_diff, diffs),
            }
        out[task] = rows
    average = _average_pairs(glue)
    if average:
        out[AVERAGE] = average
    return out


def _average_pairs(glue: dict[str, Any]) -> dict[str, Any]:
    """Each pair of GLUE_PAIRS over the tasks (two or more) both schemes have for the same seeds: per seed the
    mean over those tasks, paired; the paper's difference of its means over the same tasks."""
    rows = {}
    for a, b in GLUE_PAIRS:
        tasks = [t for t, f in glue.items() if a in f["scores"] and b in f["scores"]]
        seeds = sorted(
            set.intersection(*[set(glue[t]["scores"][a]) & set(glue[t]["scores"][b]) for t in tasks])
            if tasks
            else set()
        )
        if len(tasks) < 2 or not seeds:
            continue
        diffs = [
            sum(glue[t]["scores"][a][k] - glue[t]["scores"][b][k] for t in tasks) / len(tasks) for k in seeds
        ]
        known = all(a in PAPER_GLUE.get(t, {}) and b in PAPER_GLUE.get(t, {}) for t in tasks)
        paper = sum(PAPER_GLUE[t][a] - PAPER_GLUE[t][b] for t in tasks) / len(tasks) if known else None
        rows[f"{a} - {b}"] = {
            "tasks": tasks,
            "seeds": seeds,
            **paired(diffs),
            "paper": paper,
            "verdict": "-" if paper is None else verdict(paper, diffs),
        }
    return rows


def stage_pairs(study: Path, reference: str, schemes: Sequence[str]) -> dict[str, Any]:
    """Every per-seed reading of study.json (texts, word order, lengths, passkey): each scheme's own mean over
    seeds with its t interval (`own`: is the passkey's copying above 0?), and minus the reference's, paired by seed
    (a seed missing in either is left out)."""
    path = study / "study.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        rows, seeds = data["schemes"], data["seeds"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TupeError(f"{path}: not a study summary ({err})") from None
    if reference not in rows:
        return {}
    keys = [
        key
        for key, v in rows[reference].items()
        if isinstance(v, list)
        and len(v) == len(seeds)
        and not key.startswith(("tokens_per_word", "plateau"))
        and " dev " not in key
    ]
    out: dict[str, Any] = {}
    for key in keys:
        ref = rows[reference][key]
        out[key] = {}
        for s in schemes:
            mine = rows.get(s, {}).get(key)
            if not isinstance(mine, list) or len(mine) != len(seeds):
                continue
            own = paired([x for x in mine if x is not None])  # the scheme's own mean and its interval
            if s == reference:
                out[key][s] = {"own": own}
                continue
            diffs = [x - r for x, r in zip(mine, ref) if x is not None and r is not None]
            out[key][s] = {"own": own, "value": own["mean"], **paired(diffs)}
    return out


def judge(
    study: Path,
    schemes: Sequence[str] = ("bert-a", "tupe-a", "tupe-r", "bert-r"),
    seeds: Sequence[int] = (0, 1, 2),
    reference: str = "bert-a",
    tasks: Sequence[str] = GLUE_TASKS,
    steps: Sequence[int] = DEFAULT_STEPS,
    unigram: float | None = None,
) -> dict[str, Any]:
    """Every claim's reading on the study folder `study` (see the module's docstring)."""
    if not (study / "runs").is_dir():
        raise TupeError(
            f"{study}: no runs/ folder; not a study folder (python -m tupe.comparison.study --out)"
        )
    curves = read_curves(study, schemes, seeds)
    by_scheme: dict[str, dict[int, dict[str, Any]]] = {}
    for (s, k), v in curves.items():
        by_scheme.setdefault(s, {})[k] = v
    if unigram is None:
        from tupe.analysis.baseline import study_unigram

        unigram = study_unigram(study / "runs", [study / "runs" / reference / f"seed-{k}" for k in seeds])
    runs = {}
    for (s, k), run in sorted(curves.items()):
        v = run["valid"]
        exit_step = None if unigram is None else plateau_exit_step(v, unigram)
        runs[f"{s}/seed-{k}"] = {
            "finished": run["finished"],
            "last_step": v[-1]["step"],
            "last_loss": v[-1]["eval_loss"],
            "plateau_exit": exit_step,
            "valid": [[r["step"], r["eval_loss"]] for r in v],  # the curve: claims.json is the whole record
        }
    loss = {
        f"{a} - {b}": loss_pair(by_scheme[a], by_scheme[b], steps)
        for a, b in LOSS_PAIRS
        if a in by_scheme and b in by_scheme
    }
    order = {
        f"{a} - {b}": loss_pair(by_scheme[a], by_scheme[b], steps)
        for a, b in ORDER_PAIRS
        if a in by_scheme and b in by_scheme
    }
    glue = read_glue(study, schemes, seeds, tasks)
    return {
        "study": study.resolve().name,
        "schemes": list(schemes),
        "seeds": list(seeds),
        "reference": reference,
        "unigram_loss": unigram,
        "plateau_margin": PLATEAU_MARGIN,
        "runs": runs,
        "loss": loss,
        "order": order,
        "glue": glue,
        "glue_pairs": glue_pairs(glue),
        "stages": stage_pairs(study, reference, schemes),
    }


def against_record(runs: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """Each run of `runs` (judge's "runs") beside the same run of an earlier claims.json `record`: the steps both
    evaluated, the largest |difference| of validation loss over them and the first step where they differ (None:
    equal at every shared step, the retrained run reproduces the record so far). Runs of the record that the study
    lacks are listed as missing, runs the record lacks as new."""
    theirs = record["runs"]
    rows = {}
    for key, run in runs.items():
        if key not in theirs:
            rows[key] = {"in_record": False}
            continue
        old = dict((int(step), loss) for step, loss in theirs[key]["valid"])
        shared = [(step, loss, old[step]) for step, loss in run["valid"] if step in old]
        differ = [step for step, a, b in shared if a != b]
        rows[key] = {
            "in_record": True,
            "steps_compared": len(shared),
            "record_steps": len(old),
            "last_step_compared": shared[-1][0] if shared else None,
            "max_abs_difference": max((abs(a - b) for _, a, b in shared), default=None),
            "first_step_differing": differ[0] if differ else None,
        }
    missing = sorted(set(theirs) - set(runs))
    return {"runs": rows, "missing": missing}


def read_record(path: Path) -> dict[str, Any]:
    """An earlier claims.json; a file that is not one is a TupeError naming it."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TupeError(f"--against {path}: cannot read it as JSON ({err})") from err
    runs = record.get("runs") if isinstance(record, dict) else None
    if not isinstance(runs, dict) or not all(isinstance(r, dict) and "valid" in r for r in runs.values()):
        raise TupeError(f'--against {path}: not a claims.json (no "runs" with validation curves)')
    return record


# ---------------------------------------------------------------------------------------------- rendering


def _ci(p: dict[str, Any], spec: str = "+.3f", seeds: int | None = None) -> str:
    """Paired differences as "mean [lo, hi]" (`*`: the interval excludes 0; "(n = N)" where fewer than `seeds`),
    "value (1 seed)" without an interval, "-" without data."""
    if p["mean"] is None:
        return "-"
    lo, hi = p["ci95"]
    if lo is None:
        return f"{p['mean']:{spec}} (1 seed)"
    star = " *" if lo > 0 or hi < 0 else ""
    n = len(p["diffs"])
    fewer = f" (n = {n})" if seeds is not None and n < seeds else ""
    return f"{p['mean']:{spec}} [{lo:{spec}}, {hi:{spec}}]{star}{fewer}"


def _runs_md(result: dict[str, Any]) -> list[str]:
    uni = result["unigram_loss"]
    lines = [
        "## The runs",
        "",
        f"Unigram baseline {'-' if uni is None else f'{uni:.3f}'}; off the plateau at {result['plateau_margin']:g} "
        "nat below it (first evaluation at or below).",
        "",
        "| run | last step | last validation loss | left the plateau at |",
        "|---|---:|---:|---:|",
    ]
    for name, r in result["runs"].items():
        exit_step = (
            "-" if uni is None else "not yet" if r["plateau_exit"] is None else f"{r['plateau_exit']:,}"
        )
        lines.append(f"| {name} | {r['last_step']:,} | {r['last_loss']:.3f} | {exit_step} |")
    return lines


def _verdict_cell(verdict_: str, diffs: Sequence[float]) -> str:
    """A verdict, with its number of seeds where there are two: a t interval on one degree of freedom can
    exclude 0 only because two seeds happen to agree, so such a *holds* is weaker than three seeds' (t = 4.30)."""
    return (
        f"{verdict_} (2 seeds)"
        if len(diffs) == 2 and verdict_ in ("holds", "reversed", "direction", "not found")
        else verdict_
    )


def _curve_pairs_md(pairs: dict[str, Any]) -> list[str]:
    """Per pair and seed: below at every evaluation, the share below, from which step; the final difference and
    its verdict; then the difference at each step."""
    lines = [
        "| pair | seeds | below at every step | share below | stays below from | final difference | verdict |",
        "|---|---|---|---|---|---:|---|",
    ]
    for name, p in pairs.items():
        ps = p["per_seed"].values()
        every = ", ".join("y" if v["below_at_every_step"] else "n" for v in ps)
        share = ", ".join(f"{v['share_below']:.2f}" for v in ps)
        stays = ", ".join("-" if v["below_from_step"] is None else f"{v['below_from_step']:,}" for v in ps)
        seeds = ", ".join(f"{k}" + ("" if v["finished"] else " r") for k, v in p["per_seed"].items())
        lines.append(
            f"| {name} | {seeds} | {every} | {share} | {stays} | {_ci(p['final'])} | "
            f"{_verdict_cell(p['verdict'], p['final']['diffs'])} |"
        )
    steps = sorted({int(s) for p in pairs.values() for s in p["at_steps"]})
    if steps:
        lines += ["", "The difference at each step, mean over the seeds that have it [95% t]:", ""]
        lines += ["| pair | " + " | ".join(f"{s:,}" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
        for name, p in pairs.items():
            n = len(p["seeds"])
            cells = [_ci(p["at_steps"][str(s)], seeds=n) if str(s) in p["at_steps"] else "" for s in steps]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _loss_md(result: dict[str, Any]) -> list[str]:
    lines = [
        "## Fig. 5a: TUPE's validation loss below the baselines' at every step",
        "",
        "Per seed both runs have (a seed marked `r` has a run still training: its evaluations so far): below at",
        "every evaluation both have (y/n), the share of evaluations below, the step from which it stays below; the",
        "final difference (TUPE minus baseline) over the seeds whose two runs have finished, mean [95% t]; `*`: the",
        "interval excludes 0.",
        "",
        *_curve_pairs_md(result["loss"]),
    ]
    lines += [
        "",
        "## TUPE reaches the baselines' final loss in about 30% of the steps",
        "",
        "| pair | first evaluation at or below the baseline's final (per seed) | share of the baseline's steps |",
        "|---|---|---|",
    ]
    for name, p in result["loss"].items():
        done = {k: v for k, v in p["per_seed"].items() if v["finished"]}
        if not done:
            lines.append(f"| {name} | (no seed with both runs finished) | |")
            continue
        at = ", ".join(
            f"{k}: "
            + ("never" if v["reaches_baseline_final_at"] is None else f"{v['reaches_baseline_final_at']:,}")
            for k, v in done.items()
        )
        share = ", ".join(
            "-" if v["reach_share"] is None else f"{100 * v['reach_share']:.0f}%" for v in done.values()
        )
        lines.append(f"| {name} | {at} | {share} |")
    if result.get("order"):  # records written before 2026-12-07 17:45 UTC have none
        lines += [
            "",
            "## The paper's other orderings in pre-training: TUPE-R below TUPE-A, BERT-R below BERT-A",
            "",
            "The same readings for each relative variant against its absolute one, which the paper finds below it",
            "(Fig. 5a's curves; Table 1's rows).",
            "",
            *_curve_pairs_md(result["order"]),
        ]
    return lines


def _pairs_md(pairs: dict[str, Any]) -> list[str]:
    lines = ["| pair | found [95% t] | seeds above 0 | paper | verdict |", "|---|---:|---:|---:|---|"]
    for name, p in pairs.items():
        above = f"{sum(d > 0 for d in p['diffs'])}/{len(p['diffs'])}"
        ppr = "-" if p["paper"] is None else f"{p['paper']:+.2f}"
        lines.append(
            f"| {name} | {_ci(p, '+.2f')} | {above} | {ppr} | {_verdict_cell(p['verdict'], p['diffs'])} |"
        )
    return lines


def _glue_md(result: dict[str, Any]) -> list[str]:
    lines = ["## Table 1: GLUE dev", ""]
    if not result["glue"]:
        return [*lines, "No complete GLUE grid yet."]
    lines += [
        "Per pre-training seed: the best learning rate's median over the fine-tuning seeds (x 100); differences",
        "paired by pre-training seed [95% t]; the paper's own difference (BERT-Base, 1M steps; `-mid`: TUPE at",
        "30% of its steps, Table 1's 300k rows) beside it.",
    ]
    for task, found in result["glue"].items():
        paper = PAPER_GLUE.get(task, {})
        lines += ["", f"### {task} ({found['metric']})", ""]
        for grid, runs in found.get("grids", {}).items():
            lines.append(f"- {grid}: {', '.join(runs)}")
        lines += ["", "| scheme | per seed | mean ± std | paper |"]
        lines.append("|---|---|---:|---:|")
        for s, by_seed in found["scores"].items():
            vals = [by_seed[k] for k in sorted(by_seed, key=int)]
            m, sd = mean_std(vals)
            pm = f"{m:.2f}" if sd is None else f"{m:.2f} ± {sd:.2f}"
            per = ", ".join(f"{k}: {by_seed[k]:.2f}" for k in sorted(by_seed, key=int))
            lines.append(f"| {s} | {per} | {pm} | {paper.get(s, '-')} |")
        lines += ["", *_pairs_md(result["glue_pairs"].get(task, {}))]
    average = result["glue_pairs"].get(AVERAGE)
    if average:
        lines += [
            "",
            "### The tasks' average",
            "",
            "Per seed the mean over the tasks both schemes of a pair have:",
        ]
        lines += ["", *_pairs_md({f"{k} ({', '.join(p['tasks'])})": p for k, p in average.items()})]
    return lines


def _stages_md(result: dict[str, Any]) -> list[str]:
    if not result["stages"]:
        return []
    ref = result["reference"]
    schemes = result["schemes"]
    others = [s for s in schemes if s != ref]
    lines = ["## The evaluation stages", "", "Each scheme's own mean over seeds [95% t]:", ""]
    lines += ["| reading | " + " | ".join(schemes) + " |", "|---|" + "---:|" * len(schemes)]
    for key, by_scheme in result["stages"].items():
        cells = [_ci(by_scheme[s]["own"], ".3f") if s in by_scheme else "" for s in schemes]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", f"Minus {ref}, paired by seed [95% t]:", ""]
    lines += ["| reading | " + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
    for key, by_scheme in result["stages"].items():
        cells = [_ci(by_scheme[s]) if s in by_scheme and "diffs" in by_scheme[s] else "" for s in others]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def _against_md(result: dict[str, Any]) -> list[str]:
    against = result.get("against")
    if not against:
        return []
    lines = [
        f"## Against the record `{against['record']}`",
        "",
        "Each run's validation loss at the steps both evaluated; first differing step `-`: equal to the last digit.",
        "",
        "| run | steps compared (of the record's) | largest difference | first step differing |",
        "|---|---:|---:|---:|",
    ]
    for key, row in against["runs"].items():
        if not row["in_record"]:
            lines.append(f"| {key} | not in the record | | |")
            continue
        biggest = row["max_abs_difference"]
        first = row["first_step_differing"]
        lines.append(
            f"| {key} | {row['steps_compared']} ({row['record_steps']}) | "
            f"{'-' if biggest is None else f'{biggest:.3g}'} | {'-' if first is None else first} |"
        )
    if against["missing"]:
        lines += ["", f"In the record, not in the study: {', '.join(against['missing'])}."]
    return lines


def render(result: dict[str, Any]) -> str:
    """claims.md: every section of `judge`'s result as Markdown."""
    head = [
        f"# The paper's claims on `{result['study']}`",
        "",
        f"Schemes {', '.join(result['schemes'])}; seeds {', '.join(map(str, result['seeds']))}. Verdicts against the "
        "paper's sign: holds (interval excludes 0), direction (interval holds 0), not found, reversed; one seed: "
        "no interval; (2 seeds): an interval on one degree of freedom, weaker than three seeds'. Written by "
        "`python -m tupe.comparison.claims`.",
        "",
    ]
    parts = [_runs_md(result), _against_md(result), _loss_md(result), _glue_md(result), _stages_md(result)]
    return "\n".join(head + [line for part in parts if part for line in [*part, ""]]).rstrip() + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from tupe.comparison.compare import parse_schemes, parse_seeds
    from tupe.comparison.study import glue_tasks
    from tupe.scripts import ScriptParser

    p = ScriptParser(
        prog="python -m tupe.comparison.claims",
        description="Judge the paper's claims (Fig. 5a, Table 1) on a study folder, paired by seed: writes "
        "claims.md and claims.json into it.",
    )
    p.add_argument("study", help="the study's --out folder (runs/, glue/, study.json)")
    p.add_argument(
        "--schemes",
        default="bert-a,tupe-a,tupe-r,bert-r",
        type=parse_schemes,
        help="comma-separated schemes of the study to read (default: the paper's four, bert-a,tupe-a,tupe-r,bert-r)",
    )
    p.add_argument("--seeds", default="0,1,2", type=parse_seeds, help="pre-training seeds (default 0,1,2)")
    p.add_argument("--reference", default="bert-a", help="the scheme the stages' readings are paired against")
    p.add_argument(
        "--glue-tasks",
        default=",".join(GLUE_TASKS),
        type=glue_tasks,
        help="GLUE tasks to read, any spelling tupe glue takes (default CoLA,SST-2,MRPC)",
    )
    p.add_argument(
        "--steps",
        default=",".join(map(str, DEFAULT_STEPS)),
        help="pre-training steps at which the loss difference is tabled (default %(default)s)",
    )
    p.add_argument(
        "--unigram",
        type=float,
        default=None,
        help="the unigram loss for the plateau exits (default: tupe compare's record, else the reference's first "
        "finished run)",
    )
    p.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="CLAIMS_JSON",
        help="an earlier claims.json: each run's curve is compared with the record's, step by step (a retrained "
        "run reproduces it when no step differs)",
    )
    args = p.parse_args(argv)
    try:
        args.steps = sorted({int(x) for x in args.steps.split(",")})
    except ValueError:
        p.error(f"--steps: {args.steps!r} is not a comma-separated list of steps")
    if args.reference not in args.schemes:
        p.error(f"--reference {args.reference!r} is not one of --schemes ({', '.join(args.schemes)})")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tupe.io.files import atomic_write_text

    study = Path(args.study)
    record = read_record(args.against) if args.against is not None else None
    result = judge(study, args.schemes, args.seeds, args.reference, args.glue_tasks, args.steps, args.unigram)
    if record is not None:
        result["against"] = {"record": args.against.name, **against_record(result["runs"], record)}
    markdown = render(result)
    atomic_write_text(study / "claims.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(study / "claims.md", markdown)
    print(markdown)
    return result


def main(argv: list[str] | None = None) -> int:
    """The claims; a bad flag or folder is one line `claims: error: ...` and exit code 2."""
    from tupe.scripts import run_script

    return run_script(lambda a: run(parse_args(a)), argv, prog="claims")


if __name__ == "__main__":
    sys.exit(main())
