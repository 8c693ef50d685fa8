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
