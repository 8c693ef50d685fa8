"""The unigram baseline: what a masked-LM loss is worth when the model ignores the context entirely.

A model that predicts every masked token from the token frequencies of its training data scores the
cross-entropy of those frequencies on the masked targets. Every number this project reports about pre-training
(compare, demo, evaluate) is printed beside it, because a masked LM first settles just below it, on a plateau
where it predicts from the bag of context words, before it learns to use word order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tupe.data.documents import DocumentBlocks
from tupe.data.packing import PackedCorpus
from tupe.data.tokenizer import SPECIAL_TOKENS
from tupe.errors import TupeError

NUM_SPECIAL = len(SPECIAL_TOKENS)


def block_token_counts(
    packed: PackedCorpus | DocumentBlocks, block_indices: np.ndarray, vocab_size: int
) -> np.ndarray:
    """Occurrences of every token id in the given blocks (the [CLS] that starts each block not counted; document
    blocks: the [CLS] of each piece not counted)."""
    return packed.token_counts(block_indices, vocab_size)


def unigram_log_probs(
    counts: np.ndarray, num_special: int = NUM_SPECIAL, smoothing: float = 0.5
) -> np.ndarray:
    """log p(token) from counts with add-`smoothing` over the non-special vocabulary (specials get -inf:
    they are never masked targets)."""
    c = counts.astype(np.float64).copy()
    c[:num_special] = 0.0
    c[num_special:] += smoothing
    with np.errstate(divide="ignore"):
        return np.log(c) - np.log(c.sum())


def unigram_loss(log_probs: np.ndarray, targets: np.ndarray, num_special: int = NUM_SPECIAL) -> float:
    """Mean negative log-probability of the non-special `targets` (nats per token)."""
    t = np.asarray(targets, dtype=np.int64).reshape(-1)
    t = t[t >= num_special]
    if t.size == 0:
        return float("nan")
    return float(-log_probs[t].mean())


def train_valid_unigram(
    packed: PackedCorpus | DocumentBlocks, valid_every: int, vocab_size: int
) -> dict[str, float | int]:
    """Unigram loss of the training blocks' token frequencies on every non-special token of the validation
    blocks: the expected unigram loss on the validation masked targets, whatever the masks' seed."""
    train_idx, valid_idx = packed.split(valid_every)
    log_probs = unigram_log_probs(block_token_counts(packed, train_idx, vocab_size))
    valid_counts = block_token_counts(packed, valid_idx, vocab_size)
    valid_counts[:NUM_SPECIAL] = 0
    total = int(valid_counts.sum())
    seen = valid_counts > 0
    loss = float(-(valid_counts[seen] * log_probs[seen]).sum() / max(1, total))
    return {"unigram_loss": loss, "valid_tokens": total}


def open_run_blocks(run_dir: str | Path) -> tuple[dict, PackedCorpus | DocumentBlocks]:
    """A finished `tupe pretrain` run's identity (`tupe_run.json`) and its packed blocks, from the data cache
    named in its `pretrain_summary.json` (and, for `--packing documents`, its document layout)."""
    run_dir = Path(run_dir)
    try:
        run = json.loads((run_dir / "tupe_run.json").read_text())
        summary = json.loads((run_dir / "pretrain_summary.json").read_text())
        packed = PackedCorpus.open(summary["data_cache"], int(run["data"]["max_length"]))
        if run["data"].get("packing", "stream") == "documents":
            return run, DocumentBlocks.open(summary["documents_cache"], packed)
        return run, packed
    except (OSError, KeyError, ValueError) as err:
        raise TupeError(
            f"{run_dir}: not a finished `tupe pretrain` run with its data cache ({err})"
        ) from None


def run_unigram(run_dir: str | Path) -> dict[str, float | int] | None:
    """The unigram baseline of a finished `tupe pretrain` run's own train/valid split (None if its data cache
    is gone)."""
    try:
        run, packed = open_run_blocks(run_dir)
    except TupeError:
        return None
    return train_valid_unigram(packed, int(run["data"]["valid_every"]), int(run["model"]["vocab_size"]))


def study_unigram(runs: str | Path, run_dirs: list[Path]) -> float | None:
    """The unigram loss of a comparison's runs (all share one training text): the one `tupe compare` recorded in
    `runs/compare_summary.json`, else that of the first finished run in `run_dirs` whose data cache still exists,
    else None."""
    try:
        recorded = json.loads((Path(runs) / "compare_summary.json").read_text())["stats"]["unigram_loss"]
        if recorded is not None:
            return float(recorded)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for run in run_dirs:
        if (Path(run) / "model.safetensors").exists():
            found = run_unigram(run)
            if found is not None:
                return float(found["unigram_loss"])
    return None
