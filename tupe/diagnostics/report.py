"""The diagnostics' results per scheme over seeds: accuracy minus chance with a Student-t interval over seeds, for
every task, length and method, and the position probe's R^2 (`tupe diagnose` writes them as Markdown and JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tupe.analysis.seeds import mean_std, t_interval

from .tasks import TASKS


def _cell(values: Sequence[float]) -> dict[str, Any]:
    mean, std = mean_std(values)
    low, high = t_interval(values)
    return {"mean": mean, "std": std, "low": low, "high": high, "seeds": len(values)}


def aggregate(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """By scheme: for each `task@length/method` the per-seed accuracy minus chance and its mean and t interval
    over seeds (over the runs of a scheme's pre-training seeds too, where --model named run folders
    `<scheme>/seed-<k>`); the probe's R^2 likewise. A cell where some seed could not run is left out, and so is
    the probe where some run has none. `results`: `tupe diagnose` jobs' results, or `diagnose_model`'s with a
    `name` ("<group>/seed-<s>") and a `seed` added."""
    by_scheme: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_scheme.setdefault(r["name"].split("/seed-")[0], []).append(r)
    out: dict[str, Any] = {}
    for scheme, runs in by_scheme.items():
        runs = sorted(runs, key=lambda r: (r.get("pretrain_seed", -1), r["seed"]))
        cells: dict[str, Any] = {}
        for key in dict.fromkeys(f"{e['task']}@{e['length']}/{e['method']}" for e in runs[0]["tasks"]):
            found = [
                next(e for e in r["tasks"] if f"{e['task']}@{e['length']}/{e['method']}" == key) for r in runs
            ]
            if all("accuracy" in e for e in found):
                cells[key] = {
                    "above_chance": [e["accuracy"]["value"] - e["chance"] for e in found],
                    "chance": found[0]["chance"],
                    "note": found[0]["note"],
                } | _cell([e["accuracy"]["value"] - e["chance"] for e in found])
            else:
                cells[key] = {"note": next((e["note"] for e in found if "accuracy" not in e), None)}
        # a module of one's own without hidden states has no probe (position_probe None)
        r2 = [r["position_probe"]["r2"] for r in runs if r.get("position_probe")]
        out[scheme] = {
            "seeds": [r["seed"] for r in runs],
            **(
                {"pretrain_seeds": [r["pretrain_seed"] for r in runs]}
                if any("pretrain_seed" in r for r in runs)
                else {}
            ),
            "cells": cells,
            "position_r2": {"values": r2} | (_cell(r2) if len(r2) == len(runs) else {}),
        }
    return out


def _fmt(cell: dict[str, Any]) -> str:
    if "mean" not in cell:
        return "-"
    if cell["low"] is None:
        return f"{cell['mean']:+.2f}"
    return f"{cell['mean']:+.2f} [{cell['low']:+.2f}, {cell['high']:+.2f}]"


def best_method(cells: dict[str, Any], task: str, length: int) -> str | None:
    """The method with the highest mean score at this task and length (None where no method ran)."""
    ran = [
        (c["mean"], k.split("/")[1])
        for k, c in cells.items()
        if k.startswith(f"{task}@{length}/") and "mean" in c
    ]
    return max(ran)[1] if ran else None


def markdown(summary: dict[str, Any], lengths: Sequence[int], settings: dict[str, Any]) -> str:
    """One table per task (rows: schemes; columns: each length with `none`, and with the best extension method where
    one applies), then the position probe."""
    lines = []
    for task in TASKS:
        lines += [f"### {task}", "", "accuracy - chance, mean over seeds [95% t interval]", ""]
        header = ["scheme", f"L={lengths[0]}"]
        for n in lengths[1:]:
            header += [f"{n} (none)", f"{n} (best method)"]
        lines += ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
        for scheme, s in summary.items():
            cells = s["cells"]
            row = [scheme, _fmt(cells.get(f"{task}@{lengths[0]}/none", {}))]
            for n in lengths[1:]:
                row.append(_fmt(cells.get(f"{task}@{n}/none", {})))
                best = best_method(cells, task, n)
                extra = best not in (None, "none")
                row.append(f"{_fmt(cells[f'{task}@{n}/{best}'])} ({best})" if extra else "")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += ["### position probe", "", f"R^2 of a ridge regression from the last hidden state to the position "
              f"(2 .. {lengths[0] - 1}), held-out sequences; mean over seeds [95% t interval]", ""]  # fmt: skip
    lines += ["| scheme | R^2 |", "|---|---:|"]
    lines += [f"| {scheme} | {_fmt(s['position_r2'])} |" for scheme, s in summary.items()]
    return "\n".join(lines) + "\n"
