"""The paper's pre-training pairs on the final validation losses a chunked study records, paired by seed
(docs/RESULTS.md Part H's demo-recipe column).

    python scripts/results/final_pairs.py docs/results/length          # Part E: its four chunks' study.json
    python scripts/results/final_pairs.py FOLDER --pairs tupe-a:bert-a,rope:bert-a

The chunks' `FOLDER/length-*/study.json` (`python -m tupe.comparison.study`'s summaries), read as
`combine_length.py` reads them (the chunks share their seeds, a scheme is in one chunk), give each scheme's
`final_losses`, one per seed. For each pair
`A:B` (default: `tupe.comparison.claims`' Fig. 5a pairs and the paper's other orderings) the table has A - B per
seed, the mean with its 95% t interval, and the verdict against the paper's sign (A below B) as `claims` judges
it. Prints the table (markdown); `--out FILE` also writes it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tupe.comparison.claims import LOSS_PAIRS, ORDER_PAIRS, paired, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, as when run as a script
from combine_length import read_chunks  # noqa: E402


def final_losses(folder: Path) -> tuple[list[int], dict[str, list[float]]]:
    """The seeds and each scheme's final validation losses of the chunks in `folder`."""
    seeds, rows, _ = read_chunks(folder)
    return seeds, {s: [float(v) for v in r["final_losses"]] for s, r in rows.items() if r.get("final_losses")}


def table(seeds: Sequence[int], losses: dict[str, list[float]], pairs: Sequence[tuple[str, str]]) -> str:
    """One markdown row per pair whose two schemes the studies have."""
    lines = [
        f"Final validation loss, A - B paired by seed (seeds {', '.join(map(str, seeds))}), mean [95% t]; verdict"
        " against the paper's sign (A below B).",
        "",
        "| pair | per seed | mean [95% t] | verdict |",
        "|---|---|---:|---|",
    ]
    for a, b in pairs:
        if a not in losses or b not in losses:
            continue
        diffs = [x - y for x, y in zip(losses[a], losses[b], strict=True)]
        p = paired(diffs)
        lo, hi = p["ci95"]
        ci = "" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]"
        per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
        lines.append(f"| {a} - {b} | {per_seed} | {p['mean']:+.3f}{ci} | {verdict(-1.0, diffs)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a folder of length-*/study.json chunks")
    ap.add_argument(
        "--pairs",
        default=",".join(f"{a}:{b}" for a, b in (*LOSS_PAIRS, *ORDER_PAIRS)),
        help="comma-separated A:B pairs, A expected below B (default: the Fig. 5a pairs and the paper's orderings)",
    )
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args(argv)
    pairs = []
    for item in args.pairs.split(","):
        a, sep, b = item.partition(":")
        if not sep or not a or not b:
            ap.error(f"--pairs: {item!r} is not A:B")
        pairs.append((a, b))
    seeds, losses = final_losses(args.folder)
    text = table(seeds, losses, pairs)
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
