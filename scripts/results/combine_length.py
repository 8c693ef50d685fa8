"""The length study's chunks as one report: the tables of docs/RESULTS.md Part E.

    python scripts/results/combine_length.py docs/results/length

The study ran in chunks of four schemes (`length-1` ... `length-4`, `tupe.bench.gpu_studies.length_chunks`), each
a `python -m tupe.comparison.study` folder whose results were copied here by `tupe.bench.gpu_studies.collect`.
Every chunk used seeds 0-4, and a seed gives every scheme the same data order and masks whichever chunk it ran in,
so differences between schemes are paired by seed across chunks. This script reads each chunk's `study.json`
(per-seed values) and writes `length.md` and `length.json` beside them:

1. pre-training: final validation loss (mean +- std, per seed), minus bert-a paired by seed with the 95% t
   interval, the step each seed left the plateau;
2. every out-of-domain text: loss, tokens per word, word order, minus bert-a;
3. loss at each length and each extension method that applies to the scheme, and at 8x minus bert-a's;
4. passkey: accuracy of recovering the masked key minus the same blocks' guess without the key (token use), per
   distance and method, mean over seeds with the 95% t interval of the mean (is it above 0?), and where the chunks
   ran the order-aware probe, copying (accuracy minus accuracy with the key's digits deranged) likewise;
5. the verdict per scheme at the longest length, with the method that does best there: its loss minus its own loss
   at the shortest (does it keep its loss?) and minus bert-a's, paired by seed, and the passkey distances where the
   model uses the key beyond its guess, and copies it in order (does it use distant context?); and `length.png`,
   loss against length for every scheme with that method.

    python scripts/results/combine_length.py docs/results/length --passkey docs/results/length-passkey

takes the passkey columns from a re-run of that stage instead (the same chunks and seeds, models trained again by
the same commands; Part E's re-run with the order-aware probe), and reports how far its models' final losses are
from the originals', paired by seed.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from tupe.analysis.seeds import mean_std as _mean_and_std
from tupe.analysis.seeds import t_interval as _t_bounds
from tupe.io.results import load_result

REFERENCE = "bert-a"


def read_chunks(folder: Path) -> tuple[list[int], dict[str, dict[str, Any]], list[str]]:
    seeds: list[int] | None = None
    rows: dict[str, dict[str, Any]] = {}
    chunks = []
    for path in sorted(folder.glob("length-*/study.json"), key=lambda p: int(p.parent.name.split("-")[1])):
        data = load_result(path, whole=False)
        if seeds is None:
            seeds = data["seeds"]
        elif data["seeds"] != seeds:
            raise SystemExit(f"{path}: seeds {data['seeds']}, the other chunks' {seeds}")
        chunks.append(path.parent.name)
        for scheme, row in data["schemes"].items():
            if scheme in rows:
                raise SystemExit(f"{path}: {scheme} is in two chunks")
            rows[scheme] = row
    if seeds is None:
        raise SystemExit(f"{folder}: no length-*/study.json")
    return seeds, rows, chunks


def read_unigram(folder: Path) -> dict[int, float]:
    """The unigram loss of the evaluated blocks at each length (training-token frequencies; the same blocks and
    tokenizer for every run), as `tupe evaluate --lengths` records it per length and tokenizer group in the chunks'
    `lengths-*.json`; a length with two different values is left out."""
    seen: dict[int, set[float]] = {}
    for path in sorted(folder.glob("length-*/lengths-*.json")):
        for run in load_result(path, whole=False)["runs"]:
            for group in run["tokenizer_groups"]:
                seen.setdefault(run["length"], set()).add(round(group["unigram"]["loss"]["value"], 6))
    return {n: next(iter(v)) for n, v in sorted(seen.items()) if len(v) == 1}


def _values(xs: list[float | None]) -> list[float]:
    return [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]


def mean_std(xs: list[float | None], digits: int = 3) -> str:
    v = _values(xs)
    m, sd = _mean_and_std(v)
    if m is None:
        return ""
    if sd is None:
        return f"{m:.{digits}f} (1)"
    note = "" if len(v) == len(xs) else f" ({len(v)})"
    return f"{m:.{digits}f} ± {sd:.{digits}f}{note}"


def t_interval(xs: list[float]) -> tuple[float, float, float] | None:
    """Mean and the 95% t interval of the mean (tupe.analysis.seeds, as `tupe compare` reports); None below 2."""
    lo, hi = _t_bounds(xs)
    return None if lo is None else (_mean_and_std(xs)[0], lo, hi)


def fmt_interval(ci: tuple[float, float, float] | None, digits: int = 3) -> str:
    if ci is None:
        return ""
    m, lo, hi = ci
    mark = " *" if lo > 0 or hi < 0 else ""
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]{mark}"


def paired(a: list[float | None], b: list[float | None]) -> tuple[float, float, float] | None:
    """a - b paired by seed (seeds where both have a value)."""
    return t_interval([x - y for x, y in zip(a, b) if x is not None and y is not None])


def report(
    seeds: list[int],
    rows: dict[str, dict[str, Any]],
    chunks: list[str],
    unigram: dict[int, float] | None = None,
) -> str:
    unigram = unigram or {}
    ref = rows.get(REFERENCE, {})
    schemes = list(rows)
    out: list[str] = [
        f"Chunks: {', '.join(chunks)}; seeds {', '.join(map(str, seeds))}. `*`: the 95% t interval excludes 0.",
        "",
    ]

    out += ["## Pre-training", ""]
    out += [f"| scheme | final validation loss | seeds {', '.join(map(str, seeds))} | minus {REFERENCE} [95% t] "
            "| left the plateau at step |", "|---|---:|---|---:|---|"]  # fmt: skip
    for s in schemes:
        r = rows[s]
        losses = r.get("final_losses", [])
        exits = r.get("plateau_exit_steps") or []
        out.append(
            f"| {s} | {mean_std(losses)} | {', '.join(f'{x:.3f}' for x in _values(losses))} | "
            f"{'' if s == REFERENCE else fmt_interval(paired(losses, ref.get('final_losses', [])))} | "
            f"{', '.join('never' if x is None else f'{x:,}' for x in exits)} |"
        )

    texts = sorted({k.split(":", 1)[1] for r in rows.values() for k in r if k.startswith("ood:")})
    for text in texts:
        out += ["", f"## Out of domain: {text}", ""]
        out += [f"| scheme | loss | minus {REFERENCE} [95% t] | tokens per word | word order | "
                f"word order minus {REFERENCE} [95% t] |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for s in schemes:
            r = rows[s]
            loss, order = r.get(f"ood:{text}", []), r.get(f"word_order:{text}", [])
            tpw = _values(r.get(f"tokens_per_word:{text}", []))
            loss_diff = "" if s == REFERENCE else fmt_interval(paired(loss, ref.get(f"ood:{text}", [])))
            order_diff = (
                "" if s == REFERENCE else fmt_interval(paired(order, ref.get(f"word_order:{text}", [])))
            )
            tpw_cell = f"{_mean_and_std(tpw)[0]:.3f}" if tpw else ""
            out.append(
                f"| {s} | {mean_std(loss)} | {loss_diff} | {tpw_cell} | {mean_std(order)} | {order_diff} |"
            )

    length_cols = [_column_key(LENGTH, k) for r in rows.values() for k in r if LENGTH.fullmatch(k)]
    methods = sorted({m for m, _ in length_cols})
    lengths = lengths_of(rows)
    if length_cols:
        out += ["", "## Beyond the training length", ""]
        out += ["Loss per masked token; a blank: the method does not apply to the scheme. Last column: the loss at "
                f"the longest length minus {REFERENCE}'s (interpolated table), paired by seed.", ""]  # fmt: skip
        longest = lengths[-1]
        ref_long = ref.get(f"L={longest} (interpolate)", [])
        out += ["| scheme | method | " + " | ".join(f"{n:,}" for n in lengths) + f" | {longest:,} minus {REFERENCE} |",
                "|---|---|" + "---:|" * (len(lengths) + 1)]  # fmt: skip
        for s in schemes:
            for m in methods:
                cells = [rows[s].get(f"L={n} ({m})", []) for n in lengths]
                if not any(_values(c) for c in cells):
                    continue
                last = cells[-1]
                diff = "" if s == REFERENCE else fmt_interval(paired(last, ref_long))
                out.append(f"| {s} | {m} | " + " | ".join(mean_std(c) for c in cells) + f" | {diff} |")
        if any(n in unigram for n in lengths):
            cells = [f"{unigram[n]:.3f}" if n in unigram else "" for n in lengths]
            out.append("| unigram of the evaluated blocks | | " + " | ".join(cells) + " | |")

    pk_cols = [_column_key(PASSKEY, k) for r in rows.values() for k in r if PASSKEY.fullmatch(k)]
    if pk_cols:
        methods = sorted({m for m, _ in pk_cols})
        distances = sorted({d for _, d in pk_cols})
        copying = any(COPYING.fullmatch(k) for r in rows.values() for k in r)
        out += ["", "## Passkey", ""]
        if _rerun(rows):
            out += _rerun_section(rows, seeds)
        out += ["Accuracy of the masked key's digits minus the same blocks' accuracy with the first key replaced "
                "(the guess), mean over seeds [95% t interval of the mean]"
                + (": *token use*, the key's digits used somewhere in the block." if copying else "."), ""]  # fmt: skip
        out += _passkey_table(rows, schemes, methods, distances, "passkey")
        if copying:
            out += ["", "*Copying*: accuracy with the key minus accuracy with the key's own digits deranged (none "
                    "in its place), paired by block; 0 for a model that knows which digits occur but not where "
                    "(a model without positions), 1 for an exact copier. Mean over seeds [95% t interval].", ""]  # fmt: skip
            out += _passkey_table(rows, schemes, methods, distances, "copying")
    if length_cols:
        out += _verdict(rows, lengths, unigram)
    return "\n".join(out) + "\n"


def _passkey_table(
    rows: dict[str, dict[str, Any]], schemes: list[str], methods: list[str], distances: list[int], what: str
) -> list[str]:
    """One row per scheme and method: the `what d=<distance> (<method>)` columns, mean [95% t] over seeds."""
    out = ["| scheme | method | " + " | ".join(f"d={d:,}" for d in distances) + " |",
           "|---|---|" + "---:|" * len(distances)]  # fmt: skip
    for s in schemes:
        for m in methods:
            cells = [_values(rows[s].get(f"{what} d={d} ({m})", [])) for d in distances]
            if any(cells):
                out.append(f"| {s} | {m} | " + " | ".join(fmt_interval(t_interval(c)) for c in cells) + " |")
    return out


def merge_passkey(rows: dict[str, dict[str, Any]], rerun: dict[str, dict[str, Any]]) -> None:
    """Every scheme's passkey columns replaced by those of a re-run of the stage (`--passkey`), whose models were
    trained again by the same commands; their final losses kept as `rerun_final_losses` beside the original's."""
    for s, r in rows.items():
        for k in [k for k in r if PASSKEY.fullmatch(k) or COPYING.fullmatch(k)]:
            del r[k]
        again = rerun.get(s, {})
        r.update({k: v for k, v in again.items() if PASSKEY.fullmatch(k) or COPYING.fullmatch(k)})
        r["rerun_final_losses"] = again.get("final_losses", [])


def _rerun(rows: dict[str, dict[str, Any]]) -> bool:
    return any("rerun_final_losses" in r for r in rows.values())


def _rerun_section(rows: dict[str, dict[str, Any]], seeds: list[int]) -> list[str]:
    """How close the re-run's models are to the ones the other sections evaluated: final validation loss, paired
    by seed."""
    out = ["The probe ran on models trained again by the same commands (`--passkey`); their final validation loss "
           "against the originals', paired by seed:", "",
           f"| scheme | re-run final loss | seeds {', '.join(map(str, seeds))} | minus the original [95% t] "
           "| largest difference |", "|---|---:|---|---:|---:|"]  # fmt: skip
    for s, r in rows.items():
        again, before = r.get("rerun_final_losses", []), r.get("final_losses", [])
        if not _values(again):
            out.append(f"| {s} | not in the re-run | | | |")
            continue
        diffs = [a - b for a, b in zip(again, before) if a is not None and b is not None]
        largest = f"{max(diffs, key=abs):+.2g}" if diffs else ""  # 2 significant digits: drift can be 1e-7
        out.append(
            f"| {s} | {mean_std(again)} | {', '.join(f'{x:.3f}' for x in _values(again))} | "
            f"{fmt_interval(paired(again, before))} | {largest} |"
        )
    return out + [""]


def lengths_of(rows: dict[str, dict[str, Any]]) -> list[int]:
    """The lengths of the study's "L=<length> (<method>)" columns, shortest first."""
    return sorted({_column_key(LENGTH, k)[1] for r in rows.values() for k in r if LENGTH.fullmatch(k)})


def best_methods(rows: dict[str, dict[str, Any]], lengths: list[int]) -> dict[str, str]:
    """Per scheme, the extension method with the lowest mean loss at the longest length (that has a value there)."""
    best: dict[str, str] = {}
    for s, r in rows.items():
        means = {}
        for col in r:
            if LENGTH.fullmatch(col) and _column_key(LENGTH, col)[1] == lengths[-1]:
                m, _ = _mean_and_std(_values(r[col]))
                if m is not None:
                    means[_column_key(LENGTH, col)[0]] = m
        if means:
            best[s] = min(means, key=lambda k: (means[k], k))
    return best


def _verdict(rows: dict[str, dict[str, Any]], lengths: list[int], unigram: dict[int, float]) -> list[str]:
    shortest, longest = lengths[0], lengths[-1]
    drift = (
        f" The text's own unigram goes from {unigram[shortest]:.3f} to {unigram[longest]:.3f} "
        f"({unigram[longest] - unigram[shortest]:+.3f}; the blocks differ by length): a change that size is none."
        if shortest in unigram and longest in unigram
        else ""
    )
    ref_long = rows.get(REFERENCE, {}).get(f"L={longest} (interpolate)", [])
    copying = any(COPYING.fullmatch(k) for r in rows.values() for k in r)
    out = ["", f"## Verdict per scheme at {longest:,} tokens", ""]
    out += [f"Each scheme with the method that does best at {longest:,} (a scheme whose every method stops at the "
            f"training length has no row). Change: the loss at {longest:,} minus the same model's at {shortest:,}, "
            "paired by seed (a model that keeps its loss has an interval around 0 or below). Passkey: the distances "
            f"whose interval of accuracy minus guess lies above 0 with that method"
            + (" (token use), and those whose interval of copying does (copies the key in order)"
               if copying else "") + f".{drift}", ""]  # fmt: skip
    out += [f"| scheme | method | {shortest:,} | {longest:,} | change [95% t] | minus {REFERENCE} [95% t] | "
            + ("token use above 0 at | copies the key at |" if copying else "passkey above the guess at |"),
            "|---|---|---:|---:|---:|---:|---|" + ("---|" if copying else "")]  # fmt: skip
    for s, m in best_methods(rows, lengths).items():
        r = rows[s]
        first, last = r.get(f"L={shortest} ({m})", []), r.get(f"L={longest} ({m})", [])
        diff = "" if s == REFERENCE else fmt_interval(paired(last, ref_long))
        cells = [_above(r, PASSKEY, m)] + ([_above(r, COPYING, m)] if copying else [])
        if "rerun_final_losses" in r and not _values(r["rerun_final_losses"]):
            cells = ["not in the re-run"] * len(cells)  # "none" would read as "probed, above 0 nowhere"
        out.append(
            f"| {s} | {m} | {mean_std(first)} | {mean_std(last)} | {fmt_interval(paired(last, first))} | {diff} | "
            + " | ".join(cells)
            + " |"
        )
    return out


def _above(r: dict[str, Any], pattern: re.Pattern[str], method: str) -> str:
    """The distances whose column (`pattern`, with `method`) has a 95% t interval above 0, with the interval."""
    above = [
        f"{d:,}: {fmt_interval(ci).removesuffix(' *')}"
        for col in r
        if pattern.fullmatch(col) and _column_key(pattern, col)[0] == method
        for d in [_column_key(pattern, col)[1]]
        if (ci := t_interval(_values(r[col]))) is not None and ci[1] > 0
    ]
    return ", ".join(above) or "none"


def plot(rows: dict[str, dict[str, Any]], path: Path, unigram: dict[int, float] | None = None) -> None:
    """Mean loss against length (± std over seeds), each scheme with its best method at the longest length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = lengths_of(rows)
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (s, m) in enumerate(best_methods(rows, lengths).items()):
        xs, ys, es = [], [], []
        for n in lengths:
            mean, sd = _mean_and_std(_values(rows[s].get(f"L={n} ({m})", [])))
            if mean is not None:
                xs.append(n)
                ys.append(mean)
                es.append(sd or 0.0)
        style = "-" if i < 10 else "--"  # the colour cycle has 10 colours
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=2, linestyle=style, label=f"{s} ({m})")
    if unigram:
        ns = [n for n in lengths if n in unigram]
        ax.plot(ns, [unigram[n] for n in ns], ":", color="grey", label="unigram of the blocks")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
    ax.set_xlabel("block length (tokens; trained at the first)")
    ax.set_ylabel("masked-LM loss (nats), mean ± std over seeds")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# the study's column names (tupe.comparison.study.summarize): "L=<length> (<method>)", "passkey d=<distance> (<method>)",
# "copying d=<distance> (<method>)" (the order-aware probe's, since 2026-12-07)
LENGTH = re.compile(r"L=(\d+) \((.+)\)")
PASSKEY = re.compile(r"passkey d=(\d+) \((.+)\)")  # token use: accuracy minus the guess
COPYING = re.compile(r"copying d=(\d+) \((.+)\)")  # accuracy minus accuracy with the key deranged


def _column_key(pattern: re.Pattern[str], col: str) -> tuple[str, int]:
    """(method, length or distance) of a study column."""
    m = pattern.fullmatch(col)
    return m.group(2), int(m.group(1))


def main(argv: list[str] | None = None) -> int:
    from tupe.scripts import ScriptParser

    p = ScriptParser(prog="combine_length.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "folder", type=Path, help="the folder holding length-1/, length-2/, ... (each with study.json)"
    )
    p.add_argument(
        "--passkey",
        type=Path,
        metavar="FOLDER",
        help="a re-run of the passkey stage, chunked the same way (FOLDER/length-*/study.json, models trained again "
        "by the same commands): its token use and copying replace the chunks' passkey columns, and its models' "
        "final losses are compared with the originals'",
    )
    args = p.parse_args(argv)
    for folder in [args.folder] + ([args.passkey] if args.passkey else []):
        if not sorted(folder.glob("length-*/study.json")):
            from tupe.errors import TupeError

            raise TupeError(f"{folder} holds no length-*/study.json (the study's chunks, collected)")
    seeds, rows, chunks = read_chunks(args.folder)
    if args.passkey:
        again_seeds, again, _ = read_chunks(args.passkey)
        if again_seeds != seeds:
            raise SystemExit(f"{args.passkey}: seeds {again_seeds}, the chunks' {seeds}")
        merge_passkey(rows, again)
    unigram = read_unigram(args.folder)
    (args.folder / "length.md").write_text(report(seeds, rows, chunks, unigram))
    (args.folder / "length.json").write_text(json.dumps({"seeds": seeds, "schemes": rows}, indent=1) + "\n")
    plot(rows, args.folder / "length.png", unigram)
    print(f"wrote {args.folder / 'length.md'}")
    return 0


if __name__ == "__main__":
    from tupe.scripts import run_script

    raise SystemExit(run_script(main))
