"""The main job on a laptop: pre-train BERT-A and TUPE-A on the built-in corpus and say what came out.

`tupe demo [--out DIR]` trains a byte-level BPE on the built-in public-domain corpus, packs it once, then
pre-trains `bert-a` and `tupe-a` side by side (one process and one thread each) on identical blocks, masks and
seeds with the `mini` recipe, and prints:

- each model's final validation loss beside the unigram baseline (a model that ignores the context);
- the paired difference with a 95% bootstrap interval over the validation blocks (same blocks, same masks);
- the step at which each model left the "bag of words" plateau and the steps each needed to reach bert-a's
  final loss;
- a closing verdict worded from those numbers, which says that they are measured on held-out blocks of the
  training books; and the loss-curve plot;
- the same models judged on text of another kind (`--eval-text`, by default the shipped out-of-domain book,
  tupe/data/eval_text/): `tupe evaluate`'s loss, paired interval and word-order check.

Running it again reuses finished runs and continues interrupted ones (`--overwrite` starts from scratch).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tupe.training.arguments import DEMO_STEPS
from tupe.training.arguments import add_demo_arguments as add_arguments  # noqa: F401 - the CLI's hook


def _off_plateau(row: dict[str, Any]) -> int | None:
    exits = row.get("plateau_exit_steps") or [None]
    return exits[0]


def verdict(
    stats: dict[str, Any], paired: dict[str, dict[str, float | None]], steps: int, eval_text: bool = False
) -> list[str]:
    """The closing sentences, worded from the measured numbers (they may say that TUPE did not help)."""
    from tupe.evaluation.bootstrap import compared

    ref = stats["reference"]
    rows = stats["schemes"]
    uni = stats["unigram_loss"]
    margin = stats["plateau_margin"]
    lines = []
    for scheme, row in rows.items():
        exit_step = _off_plateau(row)
        below = uni - row["final_mean"] if uni is not None else None
        if exit_step is not None:
            lines.append(
                f"{scheme} left the bag-of-words plateau (validation loss {margin:g} nat below the unigram "
                f"baseline) at step {exit_step} and ended {below:.2f} nats below the baseline."
            )
        elif below is not None and below <= 0:
            lines.append(
                f"{scheme} had not yet learned even the token frequencies after {steps:,} steps "
                f"({-below:.2f} nats above the unigram baseline)."
            )
        elif below is not None:
            lines.append(
                f"{scheme} was still on the plateau after {steps:,} steps ({below:.2f} nats below the unigram "
                "baseline: it predicts from the bag of context words, not yet from their order; "
                "docs/RESULTS.md shows how long each scheme stays there)."
            )
    for scheme in rows:
        if scheme == ref:
            continue
        d = paired.get(f"{scheme} - {ref}")
        if not d or d["low"] is None:
            continue
        lines.append(
            f"{scheme}'s final loss is {compared(d)} {ref}'s: {d['value']:+.3f} nats "
            f"[95% CI {d['low']:+.3f}, {d['high']:+.3f}] on the same validation blocks and masks."
        )
        reach = rows[scheme]["steps_to_reach_reference"][0]
        if reach is not None:
            lines.append(
                f"{scheme} reached {ref}'s final loss at step {reach:,}, {reach / steps:.0%} of {ref}'s steps "
                "(the paper reports about 30% at BERT-Base scale)."
            )
        else:
            lines.append(f"{scheme} never reached {ref}'s final loss in {steps:,} steps.")
    lines.append(
        "All of this is measured on held-out validation blocks of the training corpus (the same books), so it says how well each model fits that kind of text, not text of another kind"
        + (": the evaluation on --eval-text below does." if eval_text else " (--eval-text FILE judges that).")
    )
    return lines


def run(args: argparse.Namespace) -> int:
    from tupe.comparison.compare import check_eval_text, compare, parse_schemes
    from tupe.training.pretrain import PretrainConfig

    schemes = parse_schemes(args.schemes)
    check_eval_text(args)
    t0 = time.perf_counter()
    steps = args.max_steps or DEMO_STEPS
    base = PretrainConfig(
        out=args.out,
        scheme=schemes[0],
        corpus=args.corpus,
        text_column=args.text_column,
        preset="mini",
        max_steps=steps,
        seed=args.seed,
        packing=args.packing,
        cache_dir=args.cache_dir,
        resume=not args.overwrite,
        overwrite=args.overwrite,
        progress=args.progress,
        threads=1,
    )
    from tupe.runtime import hushed_libraries

    with hushed_libraries(args.progress):  # --no-progress: no library bars either
        summary = compare(base, schemes, parallel=max(1, args.parallel))
    stats = summary["stats"]
    paired = summary["paired"]  # one seed: compare measured the paired intervals
    uni = stats["unigram_loss"]
    print()
    packing = "" if args.packing == "stream" else f", --packing {args.packing}"
    print(
        f"Validation masked-LM loss after {steps:,} steps{packing} (nats per masked token, 95% bootstrap CI):"
    )
    if uni is not None:
        print(f"  {'unigram baseline':<22}{uni:8.3f}   (token frequencies of the training blocks)")
    for scheme in schemes:
        p = paired[scheme]
        exit_step = _off_plateau(stats["schemes"][scheme])
        where = f"left the plateau at step {exit_step}" if exit_step is not None else "on the plateau"
        print(f"  {scheme:<22}{p['value']:8.3f}   [{p['low']:.3f}, {p['high']:.3f}]  {where}")
    for scheme in schemes[1:]:
        d = paired[f"{scheme} - {schemes[0]}"]
        print(
            f"  {scheme + ' - ' + schemes[0]:<22}{d['value']:+8.3f}   [{d['low']:+.3f}, {d['high']:+.3f}]  paired"
        )
    print()
    print(summary["table"])
    for line in verdict(stats, paired, steps, eval_text=bool(args.eval_text)):
        print(line)
    if args.eval_text:
        from pathlib import Path

        from tupe.comparison.compare import evaluate_on_text

        with hushed_libraries(args.progress):
            evaluate_on_text(Path(args.out).expanduser(), summary, args.eval_text, args, print)
    minutes = (time.perf_counter() - t0) / 60
    print(f"\nplot: {summary['plot']}")
    if summary.get("warning"):
        print(summary["warning"], file=sys.stderr)
    print(f"demo finished in {minutes:.1f} min; outputs in {args.out}")
    return 0
