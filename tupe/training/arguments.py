"""Command-line options of `tupe pretrain`, `tupe compare` and `tupe demo`.

Kept apart from the training code and free of torch and transformers imports, so that the parsers (and so
`tupe pretrain --help`) are built in a fraction of a second; `tupe.cli` builds them from here.
"""

from __future__ import annotations

import argparse

from tupe.training.presets import PRESETS


def add_model_data_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments shared by `pretrain` and `compare` (everything except --scheme/--out)."""
    g = p.add_argument_group("data")
    g.add_argument(
        "--corpus",
        nargs="+",
        metavar="PATH",
        help="text files, folders, globs (.gz too) or a `datasets` folder; default: the built-in corpus",
    )
    g.add_argument("--text-column", default="text", help="column of a `datasets` corpus (default: text)")
    g.add_argument(
        "--skip-bad-text",
        action="store_true",
        help="drop corpus lines that are not UTF-8 (one warning per file) instead of stopping",
    )
    g.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="use this tokenizer (folder or tokenizer.json) instead of training a BPE",
    )
    g.add_argument(
        "--vocab-size", type=int, help="BPE vocabulary size to train (preset: 8192 mini, 32768 base/paper)"
    )
    g.add_argument("--tokenizer-max-mb", type=float, help="train the BPE on the first N MB of text only")
    g.add_argument("--max-length", type=int, help="block length in tokens ([CLS] included)")
    g.add_argument("--valid-every", type=int, help="1 block in N is validation (default 200: 199:1)")
    g.add_argument("--mlm-probability", type=float, help="fraction of tokens to predict (default 0.15)")
    g.add_argument(
        "--cache-dir",
        help="where tokenizers and packed data are cached (default $TUPE_CACHE or ~/.cache/tupe)",
    )
    m = p.add_argument_group("model")
    m.add_argument(
        "--preset", default="mini", choices=sorted(PRESETS), help="size and budget (default: mini)"
    )
    m.add_argument("--hidden-size", type=int)
    m.add_argument("--num-layers", dest="num_hidden_layers", type=int)
    m.add_argument("--num-heads", dest="num_attention_heads", type=int)
    m.add_argument("--intermediate-size", type=int)
    m.add_argument("--dropout", type=float)
    m.add_argument(
        "--dense-prediction",
        action="store_true",
        help="LM head on every position (default: masked positions only)",
    )
    m.add_argument("--attn-implementation", choices=["sdpa", "eager"])
    o = p.add_argument_group("optimisation")
    o.add_argument(
        "--batch-size", type=int, help="global batch (sequences per optimizer step, all processes)"
    )
    o.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps (default 1)")
    o.add_argument("--max-steps", type=int)
    o.add_argument("--lr", dest="learning_rate", type=float, help="peak learning rate")
    o.add_argument("--warmup-steps", type=int)
    o.add_argument("--weight-decay", type=float)
    o.add_argument("--adam-beta1", type=float)
    o.add_argument("--adam-beta2", type=float)
    o.add_argument("--adam-epsilon", type=float)
    o.add_argument("--max-grad-norm", type=float, help="gradient clipping (default 1.0)")
    o.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="auto: bf16 (or fp16) on GPUs, fp32 on CPU",
    )
    o.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("evaluation, checkpoints, logging")
    r.add_argument("--eval-steps", type=int, help="validate every N steps")
    r.add_argument("--eval-batch-size", type=int)
    r.add_argument("--save-steps", type=int, help="checkpoint every N steps")
    r.add_argument(
        "--save-at",
        type=lambda s: [int(x) for x in s.split(",") if x],
        metavar="N,N,...",
        help="also checkpoint at these steps",
    )
    r.add_argument("--save-total-limit", type=int, help="keep only the N newest checkpoints")
    r.add_argument("--logging-steps", type=int)
    r.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    r.add_argument("--quiet", action="store_true", help="print nothing but errors")
    r.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch (default: all cores; 1 is faster on a busy machine)",
    )


def add_pretrain_arguments(p: argparse.ArgumentParser) -> None:
    """`tupe pretrain`."""
    p.add_argument(
        "--scheme",
        default="tupe-a",
        help="positional scheme: bert-a, bert-r, bert-a-d, tupe-a, tupe-r, "
        "tupe-a-tie-cls, tupe-r-tie-cls, rope (default tupe-a)",
    )
    p.add_argument(
        "--out", required=True, help="output folder (model, tokenizer, checkpoints, metrics.jsonl)"
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true", help="start again even if --out holds a run")
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="only train/load the tokenizer and tokenize+pack "
        "the corpus into the cache, then stop (prints the throughput)",
    )
    p.add_argument(
        "--skip-nonfinite",
        action="store_true",
        help="skip (and count) batches whose loss is NaN/inf instead of stopping the run",
    )
    add_model_data_arguments(p)


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """`tupe compare`."""
    p.add_argument(
        "--schemes",
        required=True,
        help="comma-separated schemes; the first is the reference, e.g. bert-a,tupe-a",
    )
    p.add_argument("--out", required=True, help="output folder (one sub-folder per scheme)")
    p.add_argument("--resume", action="store_true", help="keep finished schemes, continue an interrupted one")
    p.add_argument("--overwrite", action="store_true", help="start every scheme again")
    add_model_data_arguments(p)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """`tupe demo`."""
    p.add_argument("--out", default="tupe-demo", help="output folder (default: ./tupe-demo)")
    p.add_argument("--schemes", default="bert-a,tupe-a", help="schemes to compare (default: bert-a,tupe-a)")
    p.add_argument("--max-steps", type=int, help="steps per scheme (default: the mini preset's)")
    p.add_argument("--corpus", nargs="+", metavar="PATH", help="another corpus (default: the built-in one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", help="tokenizer/data cache (default $TUPE_CACHE or ~/.cache/tupe)")
    p.add_argument("--overwrite", action="store_true", help="start again instead of reusing runs in --out")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the mini model gains "
        "little from more, and a busy machine loses a lot with them)",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
