"""Shared test helpers."""

from __future__ import annotations

import tempfile
from pathlib import Path


def train_test_tokenizer(lines: list[str], vocab_size: int):  # noqa: ANN201 - a PreTrainedTokenizerFast
    """A tiny byte-level BPE made by the project's own trainer, so fixtures follow the real tokenizer contract."""
    from tupe.data.corpus import Corpus
    from tupe.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return train_tokenizer(
            Corpus(files=[path]), vocab_size=vocab_size, min_frequency=1, show_progress=False
        )


# A tiny model with every dropout off, small enough for the float64 naive oracle; `**overrides` change any value.
TINY_MODEL = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=40,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
)


def tiny_config(scheme: str, **overrides):  # noqa: ANN201 - a TupeConfig
    from tupe import TupeConfig

    return TupeConfig(**{**TINY_MODEL, "position_scheme": scheme, **overrides})
