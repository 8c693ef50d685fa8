"""Evaluation of finished pre-training runs on another text (`tupe compare/demo --eval-text`): `tupe evaluate`'s
machinery unchanged (loss, paired bootstrap intervals, word-order check), so a verdict about in-domain validation
blocks can be read against text of another kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tupe.data.corpus import BUILTIN_EVAL_TEXT, DEFAULT_EVAL_TEXT_DIR, Corpus, resolve_corpus
from tupe.evaluation.bootstrap import compared

BUILTIN_NAME = (
    "built-in evaluation text (Great Astronomers, R. S. Ball 1895: science exposition, not trained on)"
)
EVAL_TEXT_FILE = "eval_text.json"  # written in the comparison's folder


def resolve_text(paths: Sequence[str], text_column: str = "text", skip_bad_text: bool = False) -> Corpus:
    """Paths as `tupe pretrain --corpus` takes them; `built-in` (where no such file exists) is the shipped
    out-of-domain text (tupe/data/eval_text/PROVENANCE.md)."""
    builtin = [p == BUILTIN_EVAL_TEXT and not Path(p).exists() for p in paths]
    sources = [str(DEFAULT_EVAL_TEXT_DIR) if b else str(p) for p, b in zip(paths, builtin)]
    corpus = resolve_corpus(sources, text_column, skip_bad_text)
    if all(builtin):
        corpus.name = BUILTIN_NAME
    return corpus


def evaluate_runs(
    runs: dict[str, Path],
    texts: Sequence[str],
    seed: int = 0,
    text_column: str = "text",
    cache_dir: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    max_blocks: int | None = None,
) -> dict[str, Any]:
    """`tupe evaluate` of each run folder (named by `runs`' keys, first = reference) on `texts`: its JSON result
    with `names` mapping the run folders back to those keys."""
    from .evaluate import Settings, evaluate, load_eval_model

    corpus = resolve_text(texts, text_column)
    models = []
    for name, path in runs.items():
        m = load_eval_model(path)
        m.name = name
        models.append(m)
    settings = Settings(
        seed=seed,
        pppl_tokens=0,
        cache_dir=cache_dir,
        progress=progress,
        max_blocks=max_blocks,
        text_flag="--eval-text",
    )
    return evaluate(models, corpus, settings, log=log)


def difference(result: dict[str, Any], reference: str, name: str) -> dict[str, float | None] | None:
    """`name - reference` on the evaluated text (paired), or None when they do not share a tokenizer."""
    for g in result["tokenizer_groups"]:
        for d in g["differences"]:
            if (d["a"], d["b"]) == (reference, name):
                loss = d["loss"]
                low, high = loss["low"], loss["high"]
                return {
                    "value": -loss["value"],
                    "low": None if high is None else -high,
                    "high": None if low is None else -low,
                }
    return None


def verdict_lines(result: dict[str, Any], reference: str) -> list[str]:
    """Sentences worded from the evaluation on the other text: each model's loss and word-order use, and each
    paired difference from the reference with whether its interval excludes 0."""
    text = result["text"]["description"]
    models = {m["name"]: m for m in result["models"]}
    cuts = [f"{g['tokens_per_word']:.2f}" for g in result["tokenizer_groups"] if g.get("tokens_per_word")]
    lines = [f"On {text}" + (f" ({'/'.join(cuts)} tokens per word):" if cuts else ":")]
    for name, m in models.items():
        w = m["word_order_delta"]
        lines.append(
            f"  {name}: loss {m['loss']['value']:.3f}; shuffling its context costs it {w['value']:+.3f} nat "
            + (
                "(it uses word order)"
                if w["low"] is not None and w["low"] > 0
                else "(no measurable use of word order)"
            )
        )
    for name in models:
        if name == reference:
            continue
        d = difference(result, reference, name)
        if d is None or d["low"] is None:
            continue
        lines.append(
            f"  {name}'s loss is {compared(d)} {reference}'s there: {d['value']:+.3f} nats [95% CI {d['low']:+.3f}, "
            f"{d['high']:+.3f}], paired on the same blocks and masks."
        )
    return lines
