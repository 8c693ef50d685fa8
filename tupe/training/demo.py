"""The main job on a laptop: pre-train BERT-A and TUPE-A (mini preset) on the built-in corpus and compare them.

`tupe demo [--out DIR]` trains a byte-level BPE on the built-in public-domain corpus, packs it once, pre-trains
`bert-a` then `tupe-a` on identical data, masks and seeds, and prints the validation-loss table and the path of
the curve plot. About 3-4 minutes on 2 free CPU cores (longer when they are shared). Running it again reuses finished runs and continues an
interrupted one (pass --overwrite to start from scratch).
"""

from __future__ import annotations

import argparse
import time

from tupe.training.arguments import add_demo_arguments as add_arguments  # noqa: F401 (torch-free parser)
from tupe.training.compare import compare, parse_schemes
from tupe.training.pretrain import PretrainConfig


def run(args: argparse.Namespace) -> int:
    schemes = parse_schemes(args.schemes)
    t0 = time.perf_counter()
    base = PretrainConfig(
        out=args.out,
        scheme=schemes[0],
        corpus=args.corpus,
        preset="mini",
        max_steps=args.max_steps,
        seed=args.seed,
        cache_dir=args.cache_dir,
        resume=not args.overwrite,
        overwrite=args.overwrite,
        progress=args.progress,
        threads=args.threads,
    )
    summary = compare(base, schemes)
    minutes = (time.perf_counter() - t0) / 60
    print()
    print(summary["table"])
    print(f"plot: {summary['plot']}")
    print(f"demo finished in {minutes:.1f} min; outputs in {args.out}")
    return 0
