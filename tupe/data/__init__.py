"""Pre-training data: corpus -> byte-level BPE tokenizer -> packed blocks (`prepare_data`) -> masked-LM batches."""

from tupe.data.corpus import DEFAULT_CORPUS_DIR, Corpus, resolve_corpus
from tupe.data.mlm import BlockDataset, EpochShuffleSampler, MaskedLMCollator
from tupe.data.packing import PackedCorpus, default_cache_dir, load_or_build_packed
from tupe.data.prepare import PreparedData, prepare_data
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
    "PreparedData",
    "default_cache_dir",
    "get_or_train_tokenizer",
    "load_or_build_packed",
    "load_tokenizer",
    "prepare_data",
    "resolve_corpus",
    "train_tokenizer",
]
