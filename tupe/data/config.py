"""The data part of a pre-training run's configuration, and the data it builds: corpus -> tokenizer -> packed
blocks -> train/valid split.

`PACKINGS` (the values of `--packing`) is defined here, once, for every layer above (the parsers, pre-training,
the benchmarks). `DataConfig` checks its values once, where it is made; `DataConfig.build` makes the
`PreparedData`, which carries the packing it was built with. Importing this module imports neither numpy nor
torch (the command line's parsers read it): the steps are imported when the data is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tupe.errors import TupeError

if TYPE_CHECKING:
    import numpy as np

    from tupe.data.corpus import Corpus
    from tupe.data.documents import DocumentBlocks
    from tupe.data.packing import PackedCorpus

# `--packing`: stream is RoBERTa's FULL-SENTENCES (tupe.data.packing), documents keeps each document apart
# (tupe.data.documents)
PACKINGS = ("stream", "documents")
DEFAULT_PACKING = PACKINGS[0]


def check_packing(value: str) -> str:
    """`--packing`: one of `PACKINGS`, else a one-line error naming the value."""
    if value not in PACKINGS:
        raise TupeError(f"unknown --packing {value!r}; choose one of: {', '.join(PACKINGS)}")
    return value


@dataclass(frozen=True)
class DataConfig:
    """How a run's data is built: the corpus, the tokenizer, the block length, the packing, the validation share
    and the masking rate. Checked once, when made.

    `corpus`: a `Corpus`, or paths / folders / globs / saved `datasets` folders (None: the built-in corpus)."""

    max_length: int
    valid_every: int
    corpus: Any = None
    text_column: str = "text"
    skip_bad_text: bool = False
    tokenizer: str | os.PathLike | None = None
    vocab_size: int = 32768
    tokenizer_max_mb: float | None = None
    cache_dir: str | os.PathLike | None = None
    packing: str = DEFAULT_PACKING
    mlm_probability: float = 0.15

    def __post_init__(self) -> None:
        check_packing(self.packing)
        for flag, value in (("--max-seq-len", self.max_length), ("--vocab-size", self.vocab_size)):
            if value is not None and int(value) <= 0:
                raise TupeError(f"{flag} must be positive, got {value}")

    def build(self, log: Callable[[str], None] = print, progress: bool = True) -> PreparedData:
        """Tokenizer (given folder/`tokenizer.json`, or a byte-level BPE trained once on the corpus and cached) and
        packed blocks of `max_length` ids; every `valid_every`-th block is held out for validation (`packing`
        "documents": the text of those blocks, packed as document blocks, `tupe.data.documents`). Each step is
        cached on disk."""
        from tupe.data.corpus import Corpus, resolve_corpus
        from tupe.data.documents import load_or_build_documents
        from tupe.data.packing import default_cache_dir, load_or_build_packed
        from tupe.data.tokenizer import get_or_train_tokenizer, load_tokenizer

        corpus = self.corpus
        if not isinstance(corpus, Corpus):
            corpus = resolve_corpus(corpus, self.text_column, skip_bad_text=self.skip_bad_text)
        cache_dir = Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()
        if self.tokenizer:
            tok = load_tokenizer(self.tokenizer)
        else:
            max_bytes = int(self.tokenizer_max_mb * 1e6) if self.tokenizer_max_mb else None
            tok = get_or_train_tokenizer(
                corpus, cache_dir, self.vocab_size, max_bytes=max_bytes, log=log, progress=progress
            )
        stream = load_or_build_packed(corpus, tok, self.max_length, cache_dir, progress=progress, log=log)
        packed: PackedCorpus | DocumentBlocks = stream
        if self.packing == "documents":
            packed = load_or_build_documents(stream, self.max_length, self.valid_every, cache_dir, log=log)
        train_idx, valid_idx = packed.split(self.valid_every)
        return PreparedData(corpus, tok, packed, train_idx, valid_idx, self.packing, stream)


@dataclass
class PreparedData:
    """A tokenizer and the packed blocks of a corpus, split into train and valid block indices. `packing` is the
    `--packing` it was built with: `packed` is a `PackedCorpus` for "stream", a `DocumentBlocks` for "documents";
    `stream` is the `PackedCorpus` of the cached token stream either way (None: `packed`)."""

    corpus: Corpus
    tokenizer: Any  # PreTrainedTokenizerFast
    packed: PackedCorpus | DocumentBlocks
    train_idx: np.ndarray
    valid_idx: np.ndarray
    packing: str = DEFAULT_PACKING
    stream: PackedCorpus | None = None

    def __post_init__(self) -> None:
        if self.stream is None:
            self.stream = self.packed

    @property
    def stream_path(self) -> Path:
        """The cached token stream (the same entry for both packings)."""
        return self.stream.path

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
        if self.packing == "documents":
            out.update(
                packing="documents", documents_cache=str(self.packed.path), packing_stats=self.packed.stats
            )
        return out
