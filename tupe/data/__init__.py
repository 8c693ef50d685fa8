"""Pre-training data: corpus reading, the byte-level BPE tokenizer, packing into blocks, masked-LM batches."""

from tupe.data.corpus import DEFAULT_CORPUS_DIR, Corpus, resolve_corpus
from tupe.data.mlm import BlockDataset, EpochShuffleSampler, MaskedLMCollator
from tupe.data.packing import PackedCorpus, default_cache_dir, load_or_build_packed
from tupe.data.tokenizer import (
    SPECIAL_TOKENS,
    get_or_train_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "DEFAULT_CORPUS_DIR",
    "SPECIAL_TOKENS",
    "BlockDataset",
    "Corpus",
    "EpochShuffleSampler",
    "MaskedLMCollator",
    "PackedCorpus",
    "default_cache_dir",
    "get_or_train_tokenizer",
    "load_or_build_packed",
    "load_tokenizer",
    "resolve_corpus",
    "train_tokenizer",
]
