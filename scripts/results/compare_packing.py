"""`--packing stream` against `--packing documents`: the tables of docs/RESULTS.md Part D, from one record per run.

    # as runs finish (again and again: a run with a complete record is skipped), in each packing's `tupe compare`
    # output folder; the record is a small JSON kept in the repository, so a finished run's measures outlive the
    # machine it trained on (its checkpoint does not need to)
    python scripts/results/compare_packing.py record --runs RUNS_STREAM --packing stream \
        --records docs/results/packing/records [--sst2-data GLUE_ROOT --sst2-seeds 0]
    # the tables, from whatever records there are (a run not yet recorded: a blank cell)
    python scripts/results/compare_packing.py report --records docs/results/packing/records \
        --out docs/results/packing

RUNS is the `--out` of `tupe compare --packing P` (its runs in `RUNS/SCHEME/seed-K`). A record
(`records/P/SCHEME-seed-K.json`) holds, for one finished run:

1. pre-training: the final validation loss, the validation curve, the step the run left the bag-of-words plateau
   (1 nat below the unigram of its validation blocks), the packing efficiency;
2. `tupe evaluate` on the built-in out-of-domain text (*Great Astronomers*): loss, tokens per word, word-order
   delta (the study's `ood` stage for one run);
3. [CLS], on `--blocks` blocks of the built-in evaluation text (the run's training length, [CLS] at position 0, as
   both packings train): the attention every other token pays to [CLS], per layer (mean over heads and queries), in the model's
   real attention; for schemes with a content-free term the same mass in the content-free attention alone
   (`tupe analyze`'s `to[CLS]`, mean and largest head); for TUPE's [CLS] reset the two learned values theta_1
   ([CLS] as query) and theta_2 (others to [CLS]) beside the mean of the content-free logits they replace;
4. with `--sst2-data`, for runs of `--sst2-seeds`: SST-2 as the study's `glue` stage runs it (the 8,000-sentence
   subset, the small-model grid, fine-tuning seeds 1,2,3; the best learning rate's median).

The report pairs documents with stream by seed (the same seed gives both runs the same initialisation; the data
order and masks differ with the blocks), with a 95% t interval.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tupe.data.config import PACKINGS
from tupe.io.results import recorded_path

SST2_SEEDS = "1,2,3"  # the fine-tuning seeds of the study's glue stage
SST2_SAMPLES = 8000  # the study's SST-2 subset (RESULTS A.7)


def finished_runs(runs: Path) -> dict[tuple[str, int], Path]:
    """Every finished run (config.json written) of a `tupe compare` folder, by (scheme, seed): `SCHEME/seed-K/` of
    a comparison of several seeds, `SCHEME/` of one seed (its seed read from `compare_run.json`). None found is a
    one-line error naming the folder (it used to do nothing, exit 0)."""
    from tupe.errors import TupeError
    from tupe.io.reading import read_json
    from tupe.validators import check_path_kind

    check_path_kind("--runs", runs, "folder")
    found = {}
    for cfg in sorted(runs.glob("*/seed-*/config.json")):
        d = cfg.parent
        found[(d.parent.name, int(d.name.split("-", 1)[1]))] = d
    single = sorted(runs.glob("*/config.json"))
    if single:
        record = runs / "compare_run.json"
        seeds = read_json(record, "comparison record").get("seeds") if record.is_file() else None
        if not isinstance(seeds, list) or len(seeds) != 1:
            raise TupeError(
                f"--runs {runs}: runs of one seed ({single[0].parent.name}/) but no compare_run.json naming that "
                "seed; not the --out of a `tupe compare`"
            )
        found |= {(cfg.parent.name, int(seeds[0])): cfg.parent for cfg in single}
    if not found:
        raise TupeError(
            f"--runs {runs}: no finished run (SCHEME/seed-K/config.json, or SCHEME/config.json for one seed); "
            "not the --out of a finished `tupe compare`"
        )
    return found


def pretraining(run: Path) -> dict[str, Any]:
    """Final validation loss, validation curve, plateau exit and packing efficiency of a finished run."""
    from tupe.analysis.baseline import run_unigram
    from tupe.analysis.curves import read_metrics
    from tupe.analysis.seeds import plateau_exit_step

    u = run_unigram(run)
    unigram = None if u is None else float(u["unigram_loss"])
    summary = json.loads((run / "pretrain_summary.json").read_text())
    valid = read_metrics(run)[1]
    return {
        "final_loss": float(summary["final_eval_loss"]),
        "valid_curve": [[int(r["step"]), float(r["eval_loss"])] for r in valid if "eval_loss" in r],
        "plateau_exit": None if unigram is None else plateau_exit_step(valid, unigram),
        "unigram": unigram,
        "packing_efficiency": summary.get("packing_efficiency"),
    }


def out_of_domain(run: Path, name: str) -> dict[str, Any]:
    """`tupe evaluate` of one run on the built-in out-of-domain text: loss, tokens per word, word-order delta."""
    from tupe.evaluation.runs import evaluate_runs

    result = evaluate_runs({name: run}, ["built-in"], progress=False, log=lambda _m: None)
    (m,) = result["models"]
    return {
        "text": "built-in",
        "loss": m["loss"],
        "tokens_per_word": m.get("tokens_per_word"),
        "word_order_delta": m["word_order_delta"],
    }


def sst2(run: Path, glue_root: Path, out: Path) -> dict[str, Any] | None:
    """SST-2 as the study's glue stage runs it (`tupe glue` resumes what it finds in `out`); None: incomplete."""
    argv = [sys.executable, "-m", "tupe", "glue", "--model", str(run), "--task", "SST-2", "--data-dir",
            str(glue_root), "--out", str(out), "--seeds", SST2_SEEDS, "--max-train-samples", str(SST2_SAMPLES),
            "--threads", "1", "--no-progress"]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "glue.log", "ab") as fh:
        rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    path = out / "results.json"
    if rc != 0 or not path.exists():
        print(f"[record] tupe glue failed on {run} (rc {rc}; log {out / 'glue.log'})", flush=True)
        return None
    result = json.loads(path.read_text())
    if not result.get("complete"):
        return None
    best = result["best"]
    return {
        "accuracy": 100 * best["main_median"],
        "best": {k: v for k, v in best.items() if isinstance(v, (int, float, str))},
        "dev_majority": 100 * result["data"]["dev_majority_accuracy"]["dev"],
        "command": " ".join(argv[1:]),
    }


@torch.no_grad()
def cls_measures(run: Path, corpus: Any, n_blocks: int) -> dict[str, Any]:
    """Attention on [CLS] (position 0) from the other tokens of `n_blocks` blocks of `corpus` at the run's own
    training length, per layer; content-free and theta."""
    from tupe.analysis.patterns import head_patterns
    from tupe.evaluation.evaluate import load_eval_model, make_blocks
    from tupe.modeling.positional import scheme_class

    m = load_eval_model(run, device="cpu")
    length = min(m.train_length or m.max_length, m.max_length)
    blocks = make_blocks(corpus, m.tokenizer, length, max_blocks=n_blocks, log=lambda _m: None)
    ids = torch.from_numpy(np.stack([blocks.ids(k) for k in range(min(n_blocks, len(blocks)))])).long()
    mass = [0.0] * m.model.config.num_hidden_layers
    for start in range(0, ids.shape[0], 8):
        x = ids[start : start + 8]
        out = m.model.tupe(x, attention_mask=torch.ones_like(x), output_attentions=True, return_dict=True)
        for layer, a in enumerate(out.attentions):  # (b, h, n, n)
            mass[layer] += float(a[:, :, 1:, 0].mean(dim=(1, 2)).sum())
    result: dict[str, Any] = {"block_length": length, "attention_to_cls": [v / ids.shape[0] for v in mass]}
    # (h, n, n) content-free logits after the [CLS] reset; None: the scheme has no such term
    logits = m.model.tupe.positional_logits(ids.shape[1])
    if logits is not None:
        to_cls = [h.to_cls for h in head_patterns(logits)]
        result["content_free_to_cls"] = {"mean": float(np.mean(to_cls)), "max": float(np.max(to_cls))}
        if getattr(scheme_class(m.model.config.position_scheme), "resets_cls", False):
            # the reset's values as the term holds them (theta_1 on row 0, theta_2 on column 0; tupe-r adds its
            # relative bucket for [CLS]), per head, beside the mean logit between the other tokens
            result["theta"] = {
                "theta_1": [float(v) for v in logits[:, 0, 1:].mean(-1)],
                "theta_2": [float(v) for v in logits[:, 1:, 0].mean(-1)],
                "mean_logit_replaced": [float(v) for v in logits[:, 1:, 1:].mean(dim=(1, 2))],
            }
    return result


def t_cell(diffs: list[float]) -> str:
    from tupe.analysis.seeds import t_interval

    if not diffs:
        return ""
    m = sum(diffs) / len(diffs)
    lo, hi = t_interval(diffs)
    return f"{m:+.3f}" + ("" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]")


def mean_std_cell(values: list[float]) -> str:
    from tupe.analysis.seeds import mean_std

    m, s = mean_std(values)
    return "" if m is None else f"{m:.3f}" + ("" if s is None else f" ± {s:.3f}")


def record(args: argparse.Namespace) -> int:
    """Measure every finished run of `--runs` that has no complete record yet and write its record."""
    from tupe.errors import TupeError
    from tupe.evaluation.command import versions
    from tupe.evaluation.runs import resolve_text
    from tupe.io.files import atomic_write_text

    runs = finished_runs(args.runs)  # none: one line, before any folder is made
    folder = args.records / args.packing
    folder.mkdir(parents=True, exist_ok=True)
    sst2_seeds = {int(x) for x in args.sst2_seeds.split(",")} if args.sst2_data else set()
    corpus = None
    for (scheme, seed), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        path = folder / f"{scheme}-seed-{seed}.json"
        rec = json.loads(path.read_text()) if path.exists() else {}
        if rec.get("run", {}).get("packing") not in (None, args.packing):
            raise TupeError(f"{path}: a record of packing {rec['run']['packing']}, not {args.packing}")
        trained = json.loads((run / "pretrain_summary.json").read_text()).get("packing", "stream")
        if trained != args.packing:  # a stream run's summary names no packing
            raise TupeError(f"{run}: trained with --packing {trained}, not {args.packing}")
        wanted = {"pretraining", "ood", "cls"} | ({"sst2"} if seed in sst2_seeds else set())
        if wanted <= set(rec):
            continue
        name = f"{scheme}/seed-{seed}"
        print(f"[record] {args.packing} {name}: {', '.join(sorted(wanted - set(rec)))}", flush=True)
        rec["run"] = {
            "scheme": scheme,
            "seed": seed,
            "packing": args.packing,
            "folder": recorded_path(run, folder),
        }
        if "pretraining" not in rec:
            rec["pretraining"] = pretraining(run)
        if "ood" not in rec:
            rec["ood"] = out_of_domain(run, name)
        if "cls" not in rec:
            if corpus is None:
                corpus = resolve_text(["built-in"])
            rec["cls"] = cls_measures(run, corpus, args.blocks)
        rec["machine"] = f"{platform.machine()}, {os.cpu_count()} CPU cores; the measures at 1 torch thread"
        rec["versions"] = versions()
        # the cheap measures first: kept if SST-2 fails
        atomic_write_text(path, json.dumps(rec, indent=1) + "\n")
        if "sst2" in wanted and "sst2" not in rec:
            glue_out = args.runs / "glue" / f"SST-2-{scheme}-seed-{seed}"
            result = sst2(run, args.sst2_data, glue_out)
            if result is not None:
                rec["sst2"] = result
                atomic_write_text(path, json.dumps(rec, indent=1) + "\n")
        print(f"[record] wrote {path}", flush=True)
    return 0


def read_records(folder: Path) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
    """The records by packing and (scheme, seed); a missing folder, or one without any record, is a one-line error
    (it used to write empty tables, exit 0), and so is a record that is not whole."""
    from tupe.errors import TupeError
    from tupe.io.reading import read_json
    from tupe.validators import check_path_kind

    check_path_kind("--records", folder, "folder")
    out: dict[str, dict[tuple[str, int], dict[str, Any]]] = {k: {} for k in PACKINGS}
    for k in PACKINGS:
        for path in sorted((folder / k).glob("*-seed-*.json")):
            rec = read_json(path, "packing record")
            try:
                out[k][(rec["run"]["scheme"], int(rec["run"]["seed"]))] = rec
            except (KeyError, TypeError, ValueError):
                raise TupeError(f"{path}: no run.scheme / run.seed; not a record of this script") from None
    if not any(out.values()):
        raise TupeError(
            f"--records {folder}: no record ({'/ or '.join(PACKINGS)}/SCHEME-seed-K.json); run `record` first"
        )
    return out


def report(args: argparse.Namespace) -> int:
    recs = read_records(args.records)
    found = {s for k in PACKINGS for s, _ in recs[k]}
    schemes = [s for s in args.schemes.split(",") if s in found] + sorted(
        found - set(args.schemes.split(","))
    )
    seeds = sorted({seed for k in PACKINGS for _, seed in recs[k]})

    def values(k: str, s: str, get: Any) -> list[float | None]:
        return [get(recs[k][(s, seed)]) if (s, seed) in recs[k] else None for seed in seeds]

    lines = [
        "| scheme | stream: final loss (seeds) | documents: final loss (seeds) | documents - stream, by seed "
        "[95% t] | left the plateau at, stream | documents |",
        "|---|---|---|---:|---|---|",
    ]
    rows: dict[str, Any] = {}
    for s in schemes:
        loss = {k: values(k, s, lambda r: r["pretraining"]["final_loss"]) for k in PACKINGS}
        diffs = [
            d - st for st, d in zip(loss["stream"], loss["documents"]) if st is not None and d is not None
        ]
        exits = {k: values(k, s, lambda r: r["pretraining"]["plateau_exit"] or "not left") for k in PACKINGS}
        rows[s] = {"final_loss": loss, "documents_minus_stream": diffs, "plateau_exit": exits}
        cells = {
            k: f"{mean_std_cell([v for v in loss[k] if v is not None])} "
            f"({', '.join('-' if v is None else f'{v:.3f}' for v in loss[k])})"
            for k in PACKINGS
        }
        left = {k: ", ".join("-" if v is None else str(v) for v in exits[k]) for k in PACKINGS}
        lines.append(
            f"| {s} | {cells['stream']} | {cells['documents']} | {t_cell(diffs)} | {left['stream']} | "
            f"{left['documents']} |"
        )
    tables = ["## Pre-training", "", f"Seeds: {', '.join(map(str, seeds))}.", "", *lines, ""]

    cols = [
        ("Great Astronomers: loss", lambda r: r["ood"]["loss"]["value"]),
        ("word order", lambda r: r["ood"]["word_order_delta"]["value"]),
        ("SST-2", lambda r: r["sst2"]["accuracy"] if "sst2" in r else None),
    ]
    head = "| scheme | " + " | ".join(f"{t}, {k}" for t, _ in cols for k in PACKINGS) + " |"
    out = [head, "|---" + "|---:" * (2 * len(cols)) + "|"]
    for s in schemes:
        cells = []
        for t, get in cols:
            for k in PACKINGS:
                xs = [v for v in values(k, s, get) if v is not None]
                rows[s].setdefault(t, {})[k] = xs
                cells.append(mean_std_cell(xs) + (f" ({len(xs)})" if xs else ""))
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    majority = {r["sst2"]["dev_majority"] for k in PACKINGS for r in recs[k].values() if "sst2" in r}
    tables += [
        "## Word order, *Great Astronomers*, SST-2",
        "",
        "Mean ± standard deviation over pre-training seeds (their count in brackets). "
        + (
            f"SST-2 dev majority class: {', '.join(f'{m:.2f}' for m in sorted(majority))}."
            if majority
            else ""
        ),
        "",
        *out,
        "",
    ]

    each = [
        "| run | packing | attention on [CLS], layer 1 | layer 2 | content-free on [CLS]: mean head | "
        "largest head | theta_1 (mean over heads) | theta_2 | mean logit replaced |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = [
        "| scheme | packing | runs | attention on [CLS], layer 1 | layer 2 | content-free on [CLS], mean head "
        "| theta_2 minus the mean logit it replaces |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in schemes:
        for k in PACKINGS:
            rs = [recs[k][(s, seed)]["cls"] for seed in seeds if (s, seed) in recs[k]]
            if not rs:
                continue
            cells = [mean_std_cell([r["attention_to_cls"][layer] for r in rs]) for layer in (0, 1)]
            cf = [r["content_free_to_cls"]["mean"] for r in rs if "content_free_to_cls" in r]
            th = [
                float(np.mean(r["theta"]["theta_2"]) - np.mean(r["theta"]["mean_logit_replaced"]))
                for r in rs
                if "theta" in r
            ]
            cells += [mean_std_cell(cf), mean_std_cell(th)]
            summary.append(f"| {s} | {k} | {len(rs)} | " + " | ".join(cells) + " |")
        for seed in seeds:
            for k in PACKINGS:
                if (s, seed) not in recs[k]:
                    continue
                r = recs[k][(s, seed)]["cls"]
                cf, th = r.get("content_free_to_cls"), r.get("theta")
                cells = [f"{v:.3f}" for v in r["attention_to_cls"][:2]]
                cells += [f"{cf['mean']:.3f}", f"{cf['max']:.3f}"] if cf else ["", ""]
                cells += [f"{np.mean(th[x]):+.2f}" for x in ("theta_1", "theta_2", "mean_logit_replaced")] if th else [
                    "", "", ""]  # fmt: skip
                each.append(f"| {s}/seed-{seed} | {k} | " + " | ".join(cells) + " |")
    sizes = sorted({r["cls"]["block_length"] for k in PACKINGS for r in recs[k].values()})
    uniform = "; ".join(f"{1 / n:.4f} over a {n}-token block" for n in sizes)
    tables += ["## [CLS]", "", f"Uniform attention: {uniform}.", "", *summary, ""]
    tables += ["Each run:", "", *each, ""]

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "packing.md").write_text("\n".join(tables))
    payload = {"command": " ".join(["python", *sys.argv]), "seeds": seeds, "schemes": rows}
    (args.out / "packing.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n".join(tables))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`record` or `report`; a bad flag or folder is one line and exit code 2."""
    from tupe.scripts import ScriptParser, run_script
    from tupe.validators import int_range

    def parsed_and_run(argv: list[str] | None) -> int:
        args = p.parse_args(argv)
        torch.set_num_threads(1)
        return record(args) if args.command == "record" else report(args)

    p = ScriptParser(prog="compare_packing.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="write a record for each finished run of one packing")
    r.add_argument("--runs", type=Path, required=True, help="the --out folder of `tupe compare --packing P`")
    r.add_argument("--packing", choices=PACKINGS, required=True, help="the packing those runs trained with")
    r.add_argument("--records", type=Path, required=True, help="records folder (one sub-folder per packing)")
    r.add_argument(
        "--blocks", type=int_range(1), default=64, help="evaluation-text blocks for the [CLS] measures"
    )
    r.add_argument("--sst2-data", type=Path, help="GLUE root with SST-2/: fine-tune the runs of --sst2-seeds")
    r.add_argument("--sst2-seeds", default="0", help="pre-training seeds whose runs get SST-2 (default 0)")
    q = sub.add_parser("report", help="the tables of docs/RESULTS.md Part D from the records")
    q.add_argument("--records", type=Path, required=True)
    q.add_argument("--out", type=Path, required=True, help="folder for packing.json and packing.md")
    q.add_argument(
        "--schemes", default="bert-a,tupe-a,tupe-r,rope,alibi,deberta", help="row order (others follow)"
    )
    return run_script(parsed_and_run, argv, prog="compare_packing.py")


if __name__ == "__main__":
    sys.exit(main())
