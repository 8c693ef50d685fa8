"""One entry point from a corpus to training data: corpus -> tokenizer -> packed blocks -> train/valid split.

`packing`: "stream" (RoBERTa's FULL-SENTENCES blocks of `tupe.data.packing`, the default) or "documents" (every
document from its own [CLS] at position 0, `tupe.data.documents`; made from the same cached token stream).

Each step is visited once and cached on disk (the tokenizer per corpus and settings, the token stream per corpus
and tokenizer), so pre-training, `tupe pretrain --prepare-only` and evaluation share one call and one cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tupe.data.corpus import Corpus, resolve_corpus
from tupe.data.documents import DEFAULT_PACKING, DocumentBlocks, check_packing, load_or_build_documents
from tupe.data.packing import PackedCorpus, default_cache_dir, load_or_build_packed
from tupe.data.tokenizer import get_or_train_tokenizer, load_tokenizer


@dataclass
class PreparedData:
    """A tokenizer and the packed blocks of a corpus, split into train and valid block indices. `packed` is a
    `PackedCorpus` (`--packing stream`) or a `DocumentBlocks` (`--packing documents`, whose `packed` is the
    `PackedCorpus`)."""

    corpus: Corpus
    tokenizer: Any  # PreTrainedTokenizerFast
    packed: PackedCorpus | DocumentBlocks
    train_idx: np.ndarray
    valid_idx: np.ndarray

    @property
    def packing(self) -> str:
        return "documents" if isinstance(self.packed, DocumentBlocks) else "stream"

    @property
    def stream_path(self) -> Path:
        """The cached token stream (the same entry for both packings)."""
        return self.packed.packed.path if isinstance(self.packed, DocumentBlocks) else self.packed.path

    def describe(self) -> dict[str, Any]:
        """What `tupe pretrain --prepare-only` prints: sizes, cache folder, tokenization speed (and, for
        `--packing documents`, the layout's cache folder and its packing statistics)."""
        out = {
            "tokens": self.packed.num_tokens,
            "blocks": len(self.packed),
            "train_blocks": int(len(self.train_idx)),
            "valid_blocks": int(len(self.valid_idx)),
            "data_cache": str(self.stream_path),
            "tokenize_pack_seconds": self.packed.meta.get("seconds"),
            "tokenize_pack_tokens_per_second": self.packed.meta.get("tokens_per_second"),
        }
        if isinstance(self.packed, DocumentBlocks):
            out.update(
                packing="documents", documents_cache=str(self.packed.path), packing_stats=self.packed.stats
            )
        return out


def prepare_data(
    corpus: Corpus | list[str] | str | None,
    max_length: int,
    valid_every: int,
    *,
    tokenizer: str | os.PathLike | None = None,
    vocab_size: int = 32768,
    tokenizer_max_mb: float | None = None,
    cache_dir: str | os.PathLike | None = None,
    text_column: str = "text",
    skip_bad_text: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = True,
    packing: str = DEFAULT_PACKING,
) -> PreparedData:
    """Tokenizer (given folder/`tokenizer.json`, or a byte-level BPE trained once on the corpus and cached) and
    packed blocks of `max_length` ids; every `valid_every`-th block is held out for validation (`packing`
    "documents": the text of those blocks, packed as document blocks, `tupe.data.documents`).

    `corpus`: a `Corpus`, or paths / folders / globs / saved `datasets` folders (None: the built-in corpus).
    """
    check_packing(packing)  # before any work
    if not isinstance(corpus, Corpus):
        corpus = resolve_corpus(corpus, text_column, skip_bad_text=skip_bad_text)
    cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if tokenizer:
        tok = load_tokenizer(tokenizer)
    else:
        max_bytes = int(tokenizer_max_mb * 1e6) if tokenizer_max_mb else None
        tok = get_or_train_tokenizer(
            corpus, cache_dir, vocab_size, max_bytes=max_bytes, log=log, progress=progress
        )
    packed = load_or_build_packed(corpus, tok, max_length, cache_dir, progress=progress, log=log)
    if packing == "documents":
        packed = load_or_build_documents(packed, max_length, valid_every, cache_dir, log=log)
    train_idx, valid_idx = packed.split(valid_every)
    return PreparedData(corpus, tok, packed, train_idx, valid_idx)
