"""Corpus resolution and reading: files, folders, globs, .gz, datasets on disk, and one-line errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tupe.data.corpus import DEFAULT_CORPUS_DIR, iter_line_batches, resolve_corpus
from tupe.errors import TupeError


def _docs(corpus, batch_lines: int = 20000) -> list[list[str]]:  # noqa: ANN001
    docs, cur = [], []
    for lines, ends, _ in iter_line_batches(corpus, batch_lines=batch_lines):
        for s, e in zip(lines, ends):
            cur.append(s)
            if e:
                docs.append(cur)
                cur = []
    assert cur == [], "the last line of the corpus must close a document"
    return docs


def test_default_corpus_is_shipped_and_readable() -> None:
    corpus = resolve_corpus(None)
    assert corpus.files and all(p.parent == DEFAULT_CORPUS_DIR for p in corpus.files)
    assert (DEFAULT_CORPUS_DIR / "PROVENANCE.md").exists()
    assert all(p.suffix == ".gz" for p in corpus.files)  # PROVENANCE.md is not training text
    first = next(iter_line_batches(corpus))[0]
    assert not any("gutenberg" in line.lower() and "license" in line.lower() for line in first)


def test_documents_end_at_blank_lines_and_file_ends(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n\n\nthree\r\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("\ufefffour\n  \nfive\nsix")
    corpus = resolve_corpus([str(tmp_path)])
    assert [p.name for p in corpus.files] == ["a.txt", "b.txt.gz"]
    expected = [["one", "two"], ["three"], ["four"], ["five", "six"]]
    assert _docs(corpus) == expected
    assert _docs(corpus, batch_lines=1) == expected  # batching never moves a boundary


def test_globs_and_duplicates(tmp_path: Path) -> None:
    for n in ("x.txt", "y.txt", "z.dat"):
        (tmp_path / n).write_text(n + "\n")
    corpus = resolve_corpus([str(tmp_path / "*.txt"), str(tmp_path / "x.txt")])
    assert [p.name for p in corpus.files] == ["x.txt", "y.txt"]


def test_dataset_on_disk_rows_are_documents(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"text": ["a b\nc", "", "d"], "id": [1, 2, 3]}).save_to_disk(
        str(tmp_path / "ds")
    )
    corpus = resolve_corpus([str(tmp_path / "ds")])
    assert corpus.datasets and not corpus.files
    assert _docs(corpus) == [["a b", "c"], ["d"]]
    with pytest.raises(TupeError, match="no column 'body'"):
        _docs(resolve_corpus([str(tmp_path / "ds")], text_column="body"))


def test_fingerprint_follows_content_not_path(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "t.txt").write_text("same text\n")
    (tmp_path / "b" / "u.txt").write_text("same text\n")
    fa = resolve_corpus([str(tmp_path / "a")]).fingerprint()
    assert fa == resolve_corpus([str(tmp_path / "b")]).fingerprint()
    (tmp_path / "b" / "u.txt").write_text("other text\n")
    assert fa != resolve_corpus([str(tmp_path / "b")]).fingerprint()


def test_missing_empty_and_bad_utf8_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TupeError, match="not found: .*nope.txt"):
        resolve_corpus([str(tmp_path / "nope.txt")])
    with pytest.raises(TupeError, match="matches no file"):
        resolve_corpus([str(tmp_path / "*.none")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TupeError, match="holds no text file"):
        resolve_corpus([str(tmp_path / "empty")])
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(TupeError, match=r"blank.txt is empty"):
        list(iter_line_batches(resolve_corpus([str(tmp_path / "blank.txt")])))
    (tmp_path / "latin1.txt").write_bytes(b"good line\ncaf\xe9\n")
    with pytest.raises(TupeError) as err:
        list(iter_line_batches(resolve_corpus([str(tmp_path / "latin1.txt")])))
    msg = str(err.value)
    assert "latin1.txt" in msg and "byte offset 13" in msg and "\n" not in msg
    with gzip.open(tmp_path / "bad.txt.gz", "wb") as fh:
        fh.write(b"ok\n\xff\n")
    with pytest.raises(TupeError, match=r"bad.txt.gz is not UTF-8.*byte offset 3 \(decompressed\)"):
        list(iter_line_batches(resolve_corpus([str(tmp_path / "bad.txt.gz")])))
