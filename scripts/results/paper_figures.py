"""The paper's Fig. 2 and Fig. 6 readings of several `tupe analyze` outputs as one table (docs/RESULTS.md G.5).

    # copy each analysis (analysis.json with its paths made relative; two figures as 8-bit palette PNGs)
    python scripts/results/paper_figures.py collect runs/paper6k/analysis docs/results/regime/paper6k/analysis
    # the tables, from the collected analysis.json files alone
    python scripts/results/paper_figures.py table docs/results/regime/paper6k/analysis

`table` writes `figures.md` in the folder:

- **Fig. 2**: per model the first-layer logits split into the four terms (word->word, word->position,
  position->word, position->position): each term's row std (how much it varies across keys; per head, then the
  mean over the text's blocks, and for single inputs) and its share of the total's, as `tupe analyze` prints them;
- **Fig. 6**: per model with a content-free positional term (TUPE, and BERT-R's relative bias) each head's
  label and the mass of its content-free attention at the previous and next token and within +-2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

# the figures RESULTS G.5 shows: Fig. 2 of a BERT-A, Fig. 6 of a TUPE-A (the numbers of every model are in its JSON)
DEFAULT_FIGURES = ("bert-a-s0-6000/decomposition.png", "tupe-a-s0-6000/patterns_zoom.png")
TERMS = ("word_word", "word_pos", "pos_word", "pos_pos")
NAMES = {"word_word": "word->word", "word_pos": "word->pos", "pos_word": "pos->word", "pos_pos": "pos->pos"}


def collect(src: Path, dest: Path, figures: Sequence[str] = DEFAULT_FIGURES) -> int:
    """Every `tupe analyze` folder under `src` (one holding analysis.json) into `dest/<its name>/`: analysis.json
    with machine paths made relative (`tupe.io.results.anonymise_paths`), and the figures named in `figures`
    (`<folder>/<file>.png`: docs/results stays small) re-encoded as 8-bit palette PNGs (the colour maps need no
    more); any other figure in `dest` is removed. Returns the folders."""
    from PIL import Image

    from tupe.io.results import anonymise_paths

    folders = sorted(p.parent for p in src.glob("*/analysis.json"))
    for folder in folders:
        out = dest / folder.name
        out.mkdir(parents=True, exist_ok=True)
        (out / "analysis.json").write_text(anonymise_paths((folder / "analysis.json").read_text()))
        for png in out.glob("*.png"):
            png.unlink()
        for name in (f.split("/", 1)[1] for f in figures if f.split("/", 1)[0] == folder.name):
            with Image.open(folder / name) as image:
                image.convert("RGB").quantize(256).save(out / name, optimize=True)
    return len(folders)


def _row(name: str, a: dict) -> str:
    stats = a["decomposition"]["stats"]
    total = stats["total"]["row_std_per_head"]
    cells = [f"{stats[t]['row_std_per_head']:.3f}" for t in TERMS]
    single = [f"{stats[t]['row_std_per_example']:.2f}" for t in TERMS]
    share = stats["pos_pos"]["row_std_per_head"] / total if total else float("nan")
    return f"| {name} | " + " | ".join(cells) + f" | {share:.3f} | " + " / ".join(single) + " |"


def table(folder: Path) -> str:
    """figures.md of the collected analyses (each `<scheme>-s<seed>-<step>/analysis.json`), in folder order."""
    analyses = {p.parent.name: json.loads(p.read_text()) for p in sorted(folder.glob("*/analysis.json"))}
    if not analyses:
        raise SystemExit(f"{folder}: no */analysis.json (run `collect` first)")
    text = next(iter(analyses.values()))
    out = [
        f"Text: `{text['text']}`, {text['num_blocks']} blocks of {text['seq_len']} tokens; first layer.",
        "",
        "### Fig. 2: the four terms of the first layer's attention logits",
        "",
        "Row std: how much a term varies across the keys of a query (per head; the text's mean map, then for "
        "single inputs); share: position->position's part of the total's row std.",
        "",
        "| model | word->word | word->pos | pos->word | pos->pos | pos->pos share | single inputs (same order) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    out += [_row(name, a) for name, a in analyses.items()]
    heads = {name: a["patterns"]["heads"] for name, a in analyses.items() if a.get("patterns")}
    if heads:
        out += [
            "",
            "### Fig. 6: content-free attention per head",
            "",
            "Each head's label (tupe analyze's thresholds), and its content-free attention's mass at the previous "
            "token / the next token / within +-2 (mean over query positions).",
            "",
            "| model | " + " | ".join(f"head {h['head']}" for h in next(iter(heads.values()))) + " |",
            "|---|" + "---|" * len(next(iter(heads.values()))),
        ]
        for name, hs in heads.items():
            cells = [
                f"{h['label']} ({h['previous_mass']:.2f} / {h['next_mass']:.2f} / {h['local_mass']:.2f})"
                for h in hs
            ]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "collect", help="copy tupe analyze folders (small JSON, palette PNGs) into a results folder"
    )
    c.add_argument("src", type=Path)
    c.add_argument("dest", type=Path)
    c.add_argument(
        "--figure",
        action="append",
        metavar="FOLDER/FILE.png",
        help=f"a figure to copy (repeatable; default: {', '.join(DEFAULT_FIGURES)})",
    )
    t = sub.add_parser("table", help="figures.md from a results folder's analysis.json files")
    t.add_argument("folder", type=Path)
    args = p.parse_args(argv)
    if args.command == "collect":
        print(
            f"collected {collect(args.src, args.dest, args.figure or DEFAULT_FIGURES)} analyses into {args.dest}"
        )
    else:
        (args.folder / "figures.md").write_text(table(args.folder))
        print(f"wrote {args.folder / 'figures.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
