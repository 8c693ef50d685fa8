"""`--packing stream` against `--packing documents`: the tables of docs/RESULTS.md Part D.

    python docs/results/packing/compare_packing.py --stream STUDY_S --documents STUDY_D --out docs/results/packing

STUDY_S and STUDY_D are `python -m tupe.comparison.study` folders of the same schemes and seeds, one per packing
(their runs in `STUDY/runs/SCHEME/seed-K`). The script reads what each has so far (a run not yet finished, a stage
not yet run: a blank cell) and writes `packing.json` and `packing.md`:

1. pre-training: final validation loss per seed and packing, documents minus stream paired by seed (the same
   seed gives both runs the same initialisation; the data order and masks differ with the blocks), 95% t
   interval; the step each run left the bag-of-words plateau (1 nat below the unigram of its validation blocks);
2. from each study's `study.json` (stages ood, glue, summary): the loss on the built-in out-of-domain text
   (*Great Astronomers*), its word-order delta, and SST-2 (best learning rate's median over fine-tuning seeds);
3. [CLS]: for each finished run, computed here on `--blocks` blocks of the built-in evaluation text (128 tokens,
   [CLS] at position 0, as both packings train): the attention every other token pays to [CLS], per layer (mean
   over heads and queries), in the model's real attention; and for schemes with a content-free term, the same
   mass in the content-free attention alone (`tupe analyze`'s `to[CLS]`, mean and largest head), and for TUPE's
   [CLS] reset the two learned values theta_1 ([CLS] as query) and theta_2 (others to [CLS]) beside the mean of
   the content-free logits they replace.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

PACKINGS = ("stream", "documents")


def runs_of(study: Path) -> dict[tuple[str, int], Path]:
    """Every finished run (config.json written) of a study folder, by (scheme, seed)."""
    found = {}
    for cfg in sorted((study / "runs").glob("*/seed-*/config.json")):
        d = cfg.parent
        found[(d.parent.name, int(d.name.split("-", 1)[1]))] = d
    return found


def pretraining(study: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Final validation loss and plateau exit of each finished run."""
    from tupe.analysis.baseline import run_unigram
    from tupe.analysis.curves import read_metrics
    from tupe.analysis.seeds import plateau_exit_step

    out: dict[tuple[str, int], dict[str, Any]] = {}
    unigram: float | None = None
    for key, d in runs_of(study).items():
        if unigram is None:
            u = run_unigram(d)
            unigram = None if u is None else float(u["unigram_loss"])
        summary = json.loads((d / "pretrain_summary.json").read_text())
        valid = read_metrics(d)[1]
        out[key] = {
            "final_loss": float(summary["final_eval_loss"]),
            "plateau_exit": None if unigram is None else plateau_exit_step(valid, unigram),
            "unigram": unigram,
            "packing_efficiency": summary.get("packing_efficiency"),
        }
    return out


def scheme_order(study: Path) -> list[str]:
    """The schemes in the order the study's `tupe compare` was given them (its reference first)."""
    path = study / "runs" / "compare_run.json"
    return list(json.loads(path.read_text()).get("schemes", [])) if path.exists() else []


def study_values(study: Path) -> dict[str, dict[str, list[float | None]]]:
    path = study / "study.json"
    return json.loads(path.read_text())["schemes"] if path.exists() else {}


@torch.no_grad()
def cls_measures(run: Path, blocks: Any, n_blocks: int) -> dict[str, Any]:
    """Attention on [CLS] (position 0) from the other tokens of `blocks`, per layer; content-free and theta."""
    from tupe.analysis.patterns import head_patterns
    from tupe.evaluation.evaluate import load_eval_model
    from tupe.modeling.positional import scheme_class

    m = load_eval_model(run, device="cpu")
    ids = torch.from_numpy(np.stack([blocks.ids(k) for k in range(min(n_blocks, len(blocks)))])).long()
    mass = [0.0] * m.model.config.num_hidden_layers
    for start in range(0, ids.shape[0], 8):
        x = ids[start : start + 8]
        out = m.model.tupe(x, attention_mask=torch.ones_like(x), output_attentions=True, return_dict=True)
        for layer, a in enumerate(out.attentions):  # (b, h, n, n)
            mass[layer] += float(a[:, :, 1:, 0].mean(dim=(1, 2)).sum())
    result: dict[str, Any] = {"attention_to_cls": [v / ids.shape[0] for v in mass]}
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stream", type=Path, required=True, help="the study folder of --packing stream")
    p.add_argument("--documents", type=Path, required=True, help="the study folder of --packing documents")
    p.add_argument("--out", type=Path, required=True, help="folder for packing.json and packing.md")
    p.add_argument("--blocks", type=int, default=64, help="evaluation-text blocks for the [CLS] measures")
    p.add_argument(
        "--no-cls", action="store_true", help="leave out the [CLS] measures (they load every model)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    studies = {"stream": args.stream, "documents": args.documents}
    pre = {k: pretraining(v) for k, v in studies.items()}
    extra = {k: study_values(v) for k, v in studies.items()}
    found = {s for k in PACKINGS for s, _ in pre[k]}
    order = [s for k in PACKINGS for s in scheme_order(studies[k])]
    schemes = [s for s in dict.fromkeys(order) if s in found] + sorted(found - set(order))
    seeds = sorted({seed for k in PACKINGS for _, seed in pre[k]})
    cls: dict[str, dict[str, Any]] = {k: {} for k in PACKINGS}
    if not args.no_cls:
        from tupe.evaluation.evaluate import make_blocks
        from tupe.evaluation.runs import resolve_text
        from tupe.io.checkpoints import load_tokenizer

        corpus = resolve_text(["built-in"])
        for k in PACKINGS:
            for (s, seed), d in sorted(runs_of(studies[k]).items()):
                tok = load_tokenizer(d)
                blocks = make_blocks(corpus, tok, 128, max_blocks=args.blocks, log=lambda _m: None)
                cls[k][f"{s}/seed-{seed}"] = cls_measures(d, blocks, args.blocks)
                print(
                    f"[cls] {k} {s}/seed-{seed}: {cls[k][f'{s}/seed-{seed}']['attention_to_cls']}", flush=True
                )

    lines = [
        "| scheme | stream: final loss (seeds) | documents: final loss (seeds) | documents - stream, by seed "
        "[95% t] | left the plateau at, stream | documents |",
        "|---|---|---|---:|---|---|",
    ]
    rows: dict[str, Any] = {}
    for s in schemes:
        per = {k: [pre[k].get((s, seed)) for seed in seeds] for k in PACKINGS}
        loss = {k: [r["final_loss"] if r else None for r in per[k]] for k in PACKINGS}
        diffs = [
            d - st for st, d in zip(loss["stream"], loss["documents"]) if st is not None and d is not None
        ]
        exits = {k: [r["plateau_exit"] if r else "-" for r in per[k]] for k in PACKINGS}
        rows[s] = {"final_loss": loss, "documents_minus_stream": diffs, "plateau_exit": exits}

        cells = {
            k: f"{mean_std_cell([v for v in loss[k] if v is not None])} "
            f"({', '.join('-' if v is None else f'{v:.3f}' for v in loss[k])})"
            for k in PACKINGS
        }
        left = {k: ", ".join("not left" if v is None else str(v) for v in exits[k]) for k in PACKINGS}
        lines.append(
            f"| {s} | {cells['stream']} | {cells['documents']} | {t_cell(diffs)} | {left['stream']} | "
            f"{left['documents']} |"
        )
    tables = ["## Pre-training", "", f"Seeds: {', '.join(map(str, seeds))}.", "", *lines, ""]

    cols = [
        ("ood:built-in", "Great Astronomers: loss"),
        ("word_order:built-in", "word order"),
        ("sst2", "SST-2"),
    ]
    if any(extra.values()):
        head = "| scheme | " + " | ".join(f"{t}, {k}" for _, t in cols for k in PACKINGS) + " |"
        out = [head, "|---" + "|---:" * (2 * len(cols)) + "|"]
        for s in schemes:
            cells = []
            for c, _ in cols:
                for k in PACKINGS:
                    xs = [v for v in extra[k].get(s, {}).get(c, []) if v is not None]
                    cells.append(mean_std_cell(xs) + (f" ({len(xs)})" if c == "sst2" and xs else ""))
            out.append(f"| {s} | " + " | ".join(cells) + " |")
        tables += ["## Word order, *Great Astronomers*, SST-2", "", *out, ""]

    if not args.no_cls:
        out = [
            "| run | packing | attention on [CLS], layer 1 | layer 2 | content-free on [CLS]: mean head | "
            "largest head | theta_1 (mean over heads) | theta_2 | mean logit replaced |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in sorted(
            {n for k in PACKINGS for n in cls[k]}, key=lambda n: (schemes.index(n.split("/")[0]), n)
        ):
            for k in PACKINGS:
                r = cls[k].get(name)
                if r is None:
                    continue
                att = r["attention_to_cls"]
                cf = r.get("content_free_to_cls")
                th = r.get("theta")
                cells = [f"{v:.3f}" for v in att[:2]] + (
                    [f"{cf['mean']:.3f}", f"{cf['max']:.3f}"] if cf else ["", ""]
                )
                cells += [f"{np.mean(th[x]):+.2f}" for x in ("theta_1", "theta_2", "mean_logit_replaced")] if th else [
                    "", "", ""]  # fmt: skip
                out.append(f"| {name} | {k} | " + " | ".join(cells) + " |")
        summary = [
            "| scheme | packing | runs | attention on [CLS], layer 1 | layer 2 | content-free on [CLS], mean head "
            "| theta_2 minus the mean logit it replaces |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for s in schemes:
            for k in PACKINGS:
                rs = [r for n, r in cls[k].items() if n.split("/")[0] == s]
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
        tables += [
            "## [CLS]",
            "",
            f"Uniform attention over a 128-token block: {1 / 128:.4f}.",
            "",
            *summary,
            "",
        ]
        tables += ["Each run:", "", *out, ""]

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "packing.md").write_text("\n".join(tables))
    payload = {
        "command": " ".join(["python", *sys.argv]),
        "seeds": seeds,
        "schemes": rows,
        "study": extra,
        "cls": cls,
    }
    (args.out / "packing.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
