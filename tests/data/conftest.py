"""Small corpora cut from the built-in default corpus (tests never need the shared data folder)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tupe.data.corpus import DEFAULT_CORPUS_DIR


def book_lines(n_books: int = 3, lines_per_book: int = 150) -> list[list[str]]:
    """The first paragraphs of the first few built-in books (one paragraph per line)."""
    out = []
    for path in sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))[:n_books]:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            out.append([next(fh).rstrip("\n") for _ in range(lines_per_book)])
    return out


@pytest.fixture(scope="session")
def small_corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three plain-text files; each has a blank line in the middle (so two documents per file)."""
    d = tmp_path_factory.mktemp("corpus")
    for i, lines in enumerate(book_lines()):
        half = len(lines) // 2
        (d / f"book{i}.txt").write_text("\n".join(lines[:half]) + "\n\n" + "\n".join(lines[half:]) + "\n")
    return d


@pytest.fixture(scope="session")
def small_tokenizer(small_corpus_dir: Path):  # noqa: ANN201
    from tupe.data import resolve_corpus, train_tokenizer

    return train_tokenizer(resolve_corpus([str(small_corpus_dir)]), vocab_size=400, show_progress=False)
