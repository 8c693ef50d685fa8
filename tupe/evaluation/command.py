"""Masked-LM loss, perplexity and pseudo-perplexity of one or more checkpoints on text files, with a unigram
baseline, a word-order check and bootstrap confidence intervals (paired between models sharing a tokenizer).

Reads `tupe pretrain` checkpoints and `transformers` BERT folders (BertForMaskedLM, run with transformers' own
code). Text is tokenised, packed and masked exactly as in pre-training. Definitions: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from tupe.errors import TupeError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        nargs="+",
        required=True,
        metavar="PATH",
        help="checkpoint folder(s): written by `tupe pretrain`, or a transformers BERT folder (BertForMaskedLM)",
    )
    p.add_argument(
        "--text",
        nargs="+",
        required=True,
        metavar="PATH",
        help="text file(s), folders of them (recursive), globs; .gz allowed; all together are one text",
    )
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer for model folders that hold none")
    p.add_argument(
        "--max-blocks",
        type=int,
        metavar="N",
        help="evaluate at most N blocks, evenly spaced over the text (default: every full block)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        metavar="L",
        help="block length (default: the smallest max length of the models sharing a tokenizer)",
    )
    p.add_argument("--batch-size", type=int, default=16, help="blocks per forward pass (default 16)")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of masks, shuffles, samples, resamples (default 0)"
    )
    p.add_argument(
        "--mlm-probability",
        type=float,
        default=0.15,
        help="share of tokens masked (default 0.15, as pre-training)",
    )
    p.add_argument(
        "--pppl-tokens",
        type=int,
        default=2000,
        metavar="N",
        help="pseudo-perplexity on a random sample of N tokens (one forward pass each; default 2000, 0 = off)",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="R",
        help="bootstrap resamples of blocks for the 95%% intervals (default 1000, 0 = no intervals)",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--cache-dir", help="where tokenised text is cached (default $TUPE_CACHE or ~/.cache/tupe)"
    )
    p.add_argument(
        "--skip-bad-text", action="store_true", help="drop lines that are not UTF-8 instead of stopping"
    )
    p.add_argument("--json", metavar="PATH", help="write every number, the command and versions to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--quiet", action="store_true", help="print the table only (no log lines, no progress bars)"
    )


def command_line(args: argparse.Namespace) -> str:
    """The command as the parsed options say it (so it is exact however the command was started)."""
    parts = ["tupe", "evaluate", "--model", *args.model, "--text", *args.text]
    for opt in (
        "tokenizer",
        "max_blocks",
        "max_length",
        "batch_size",
        "seed",
        "mlm_probability",
        "pppl_tokens",
        "bootstrap",
        "threads",
        "cache_dir",
        "json",
    ):
        value = getattr(args, opt, None)
        if value is not None:
            parts += [f"--{opt.replace('_', '-')}", str(value)]
    for flag in ("skip_bad_text", "no_progress", "quiet"):
        if getattr(args, flag, False):
            parts.append(f"--{flag.replace('_', '-')}")
    return " ".join(shlex.quote(p) for p in parts)


def versions() -> dict[str, str]:
    import numpy
    import tokenizers
    import torch
    import transformers

    import tupe

    return {
        "tupe": tupe.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": numpy.__version__,
    }


def run(args: argparse.Namespace) -> int:
    import torch

    from tupe.data.corpus import resolve_corpus

    from .evaluate import Settings, evaluate, format_report, load_model

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    if args.threads is not None:
        if args.threads <= 0:
            raise TupeError(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    seen: set[Path] = set()
    for m in args.model:
        resolved = Path(m).expanduser().resolve()
        if resolved in seen:
            raise TupeError(f"--model {m} is given twice")
        seen.add(resolved)
    corpus = resolve_corpus(list(args.text), skip_bad_text=args.skip_bad_text)
    models = []
    for path in args.model:
        models.append(load_model(path, args.tokenizer))
        log(f"model: {path}: {models[-1].description}, {models[-1].num_parameters / 1e6:.2f} M parameters")
    settings = Settings(
        seed=args.seed,
        mlm_probability=args.mlm_probability,
        max_blocks=args.max_blocks,
        max_length=args.max_length,
        batch_size=args.batch_size,
        pppl_tokens=args.pppl_tokens,
        bootstrap=args.bootstrap,
        cache_dir=args.cache_dir,
        progress=not (args.no_progress or args.quiet),
    )
    result = evaluate(models, corpus, settings, log=log)
    result = {"command": command_line(args), "versions": versions(), **result}
    print(format_report(result))
    if args.json:
        write_json(Path(args.json).expanduser(), result)
        log(f"wrote {args.json}")
    return 0


def write_json(path: Path, result: dict[str, Any]) -> None:
    from tupe.io.files import atomic_write_text

    atomic_write_text(path, json.dumps(_finite(result), indent=1, allow_nan=False) + "\n")


def _finite(value: Any) -> Any:  # noqa: ANN401
    """The result with NaN/inf numbers as null, so the file is strict JSON."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
