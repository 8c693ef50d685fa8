"""Several pre-training seeds per scheme: the statistics `tupe compare --seeds` reports.

A seed changes the initialisation, the data order and the masks, so one run per scheme says little: masked-LM
training sits on a plateau (just below the unigram baseline) for a number of steps that varies from seed to
seed, then drops suddenly. Per scheme this module gives the final validation loss (mean, sample std), the step
at which each run left the plateau, the steps each run needed to reach the reference scheme's final loss of
the same seed, and the paired difference from the reference across seeds with a Student-t interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tupe.analysis.curves import steps_to_reach

PLATEAU_MARGIN = 1.0  # nats below the unigram baseline that count as "off the plateau"


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1; None for fewer than two values)."""
    if not values:
        return None, None
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Two-sided Student-t confidence interval of the mean (None, None for fewer than two values)."""
    from scipy import stats

    m, s = mean_std(values)
    if s is None:
        return None, None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * s / math.sqrt(len(values))
    return m - half, m + half


def plateau_exit_step(valid: Sequence[Mapping[str, Any]], unigram: float, margin: float = PLATEAU_MARGIN):
    """First evaluated step whose validation loss is at least `margin` nats below the unigram baseline."""
    return steps_to_reach(list(valid), unigram - margin)


def aggregate(
    runs: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    reference: str,
    unigram: float | None = None,
    margin: float = PLATEAU_MARGIN,
) -> dict[str, Any]:
    """Statistics of `runs[scheme][seed]` (validation records with `step` and `eval_loss`, sorted by step).

    Differences and steps-to-reach pair each run with the reference scheme's run of the same seed.
    """
    ref_final = {seed: v[-1]["eval_loss"] for seed, v in runs[reference].items() if v}
    out: dict[str, Any] = {"reference": reference, "unigram_loss": unigram, "plateau_margin": margin}
    schemes: dict[str, Any] = {}
    for scheme, by_seed in runs.items():
        seeds = sorted(s for s, v in by_seed.items() if v)
        finals = [by_seed[s][-1]["eval_loss"] for s in seeds]
        mean, std = mean_std(finals)
        row: dict[str, Any] = {
            "seeds": seeds,
            "final_steps": [int(by_seed[s][-1]["step"]) for s in seeds],
            "final_losses": finals,
            "final_mean": mean,
            "final_std": std,
        }
        if unigram is not None:
            exits = [plateau_exit_step(by_seed[s], unigram, margin) for s in seeds]
            done = [e for e in exits if e is not None]
            row["plateau_exit_steps"] = exits
            row["plateau_exit_mean"], row["plateau_exit_std"] = mean_std(done)
            row["left_plateau"] = f"{len(done)}/{len(seeds)}"
        paired = [s for s in seeds if s in ref_final]
        reach = [steps_to_reach(list(by_seed[s]), ref_final[s]) for s in paired]
        reached = [r for r in reach if r is not None]
        row["steps_to_reach_reference"] = reach
        row["steps_to_reach_mean"], row["steps_to_reach_std"] = mean_std(reached)
        row["reached_reference"] = f"{len(reached)}/{len(paired)}"
        diffs = [by_seed[s][-1]["eval_loss"] - ref_final[s] for s in paired]
        row["diff_vs_reference"] = diffs
        row["diff_mean"], row["diff_std"] = mean_std(diffs)
        row["diff_ci95"] = list(t_interval(diffs))
        row["seeds_better_than_reference"] = f"{sum(d < 0 for d in diffs)}/{len(diffs)}"
        schemes[scheme] = row
    out["schemes"] = schemes
    return out


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _pm(mean: float | None, std: float | None, spec: str = ".3f") -> str:
    if mean is None:
        return "-"
    return _fmt(mean, spec) if std is None else f"{_fmt(mean, spec)} ± {_fmt(std, spec)}"


def render_table(summary: Mapping[str, Any]) -> str:
    """The aggregate as a Markdown table (one row per scheme)."""
    ref = summary["reference"]
    uni = summary.get("unigram_loss")
    head = [
        "| scheme | seeds | final valid loss (mean ± std) | "
        + (f"left plateau (≤ unigram − {summary['plateau_margin']:g}) at step | " if uni is not None else "")
        + f"steps to reach {ref}'s final | minus {ref} (mean [95% CI]) | seeds better |",
    ]
    head.append("|---|---:|---:|" + ("---:|" if uni is not None else "") + "---:|---:|---:|")
    lines = list(head)
    for scheme, r in summary["schemes"].items():
        cells = [scheme, str(len(r["seeds"])), _pm(r["final_mean"], r["final_std"])]
        if uni is not None:
            exits = ", ".join("never" if e is None else str(e) for e in r["plateau_exit_steps"])
            cells.append(f"{exits} ({r['left_plateau']})")
        reach = ", ".join("-" if e is None else str(e) for e in r["steps_to_reach_reference"])
        cells.append(f"{reach} ({r['reached_reference']})")
        if scheme == ref:
            cells += ["0", "-"]
        else:
            lo, hi = r["diff_ci95"]
            ci = f" [{_fmt(lo, '+.3f')}, {_fmt(hi, '+.3f')}]" if lo is not None else ""
            cells += [f"{_fmt(r['diff_mean'], '+.3f')}{ci}", r["seeds_better_than_reference"]]
        lines.append("| " + " | ".join(cells) + " |")
    if uni is not None:
        lines += [
            "",
            f"Unigram baseline (training-token frequencies on the validation tokens): {uni:.3f} nats.",
        ]
    return "\n".join(lines) + "\n"
