"""Pre-training data: corpus -> byte-level BPE tokenizer -> packed blocks (`prepare_data`) -> masked-LM batches.

The names below are imported on first use: `tupe.data.config` (`PACKINGS`, `DataConfig`), which the command line's
parsers read, imports neither numpy nor torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this package that defines it
_PUBLIC = {
    "DEFAULT_CORPUS_DIR": "corpus",
    "Corpus": "corpus",
    "resolve_corpus": "corpus",
    "BlockDataset": "mlm",
    "EpochShuffleSampler": "mlm",
    "MaskedLMCollator": "mlm",
    "PackedCorpus": "packing",
    "default_cache_dir": "packing",
    "load_or_build_packed": "packing",
    "PreparedData": "prepare",
    "prepare_data": "prepare",
    "SPECIAL_TOKENS": "tokenizer",
    "get_or_train_tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "train_tokenizer": "tokenizer",
    "PACKINGS": "config",
    "DataConfig": "config",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
