"""One entry point from a corpus to training data: corpus -> tokenizer -> packed blocks -> train/valid split
(`prepare_data`: its settings make a `tupe.data.config.DataConfig`, whose `build` does the work).

`packing`: "stream" (RoBERTa's FULL-SENTENCES blocks of `tupe.data.packing`, the default) or "documents" (every
document from its own [CLS] at position 0, `tupe.data.documents`; made from the same cached token stream).

Each step is visited once and cached on disk (the tokenizer per corpus and settings, the token stream per corpus
and tokenizer), so pre-training, `tupe pretrain --prepare-only` and evaluation share one call and one cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tupe.data.config import DEFAULT_PACKING, DataConfig, PreparedData
from tupe.data.corpus import Corpus

__all__ = ["PreparedData", "prepare_data"]


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
    The settings are a `DataConfig` (checked before any work); `DataConfig.build` is the same call.
    """
    config = DataConfig(
        max_length,
        valid_every,
        corpus=corpus,
        text_column=text_column,
        skip_bad_text=skip_bad_text,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        tokenizer_max_mb=tokenizer_max_mb,
        cache_dir=cache_dir,
        packing=packing,
    )
    return config.build(log=log, progress=progress)
