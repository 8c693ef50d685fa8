"""Corpus resolution and reading: files, folders, globs, .gz, datasets on disk, and one-line errors."""

from __future__ import annotations

import gzip
import json
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


@pytest.fixture()
def hf_cache(tmp_path: Path, monkeypatch) -> Path:  # noqa: ANN001
    """An empty `datasets` cache of this test's own (nothing read from or written to ~/.cache/huggingface)."""
    datasets = pytest.importorskip("datasets")
    cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def _cache_dataset(cache: Path, repo: str, config: str, rows: dict) -> None:
    """What `datasets.load_dataset(repo, config)` leaves in the cache after a download: the prepared Arrow files
    under <namespace>___<name>/<config>/<version>/<hash>/, made here from a local parquet file (no network)."""
    import shutil

    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    namespace, _, name = repo.rpartition("/")
    src = cache.parent / f"{name}-{config}.parquet"
    datasets.Dataset.from_dict(rows).to_parquet(str(src))
    builder = Parquet(
        cache_dir=str(cache), dataset_name=name, config_name=config, config_id=config, hash="0123456789abcdef",
        data_files={"train": str(src)},
    )  # fmt: skip
    builder.download_and_prepare()
    if namespace:
        shutil.move(str(cache / name), str(cache / f"{namespace}___{name}"))


def test_parquet_and_json_files_rows_are_documents(tmp_path: Path, hf_cache: Path) -> None:
    import datasets

    rows = {"text": ["a b\nc", "", "d"], "id": [1, 2, 3]}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "part-0.parquet"))
    (tmp_path / "more.jsonl").write_text('{"text": "e f", "id": 4}\n{"text": "", "id": 5}\n{"text": "g"}\n')
    (tmp_path / "list.json").write_text('[{"body": "h"}, {"body": "i j"}]')
    corpus = resolve_corpus([str(tmp_path / "part-0.parquet"), str(tmp_path / "more.jsonl")])
    assert not corpus.files and [p.name for p in corpus.tables] == ["part-0.parquet", "more.jsonl"]
    assert _docs(corpus) == [["a b", "c"], ["d"], ["e f"], ["g"]]
    assert "2 parquet/JSON file(s)" in corpus.describe() and "column 'text'" in corpus.describe()
    # another column, and a JSON array; a folder holding table files reads them as rows, not as text lines
    assert _docs(resolve_corpus([str(tmp_path / "list.json")], text_column="body")) == [["h"], ["i j"]]
    sub = tmp_path / "folder"
    sub.mkdir()
    (sub / "notes.txt").write_text("plain line\n")
    (sub / "rows.jsonl").write_text('{"text": "from json"}\n')
    mixed = resolve_corpus([str(sub)])
    assert [p.name for p in mixed.files] == ["notes.txt"] and [p.name for p in mixed.tables] == ["rows.jsonl"]
    assert _docs(mixed) == [["plain line"], ["from json"]]
    # the fingerprint follows the rows' bytes
    before = corpus.fingerprint()
    (tmp_path / "more.jsonl").write_text('{"text": "changed"}\n')
    assert (
        resolve_corpus([str(tmp_path / "part-0.parquet"), str(tmp_path / "more.jsonl")]).fingerprint()
        != before
    )
    assert not list(Path(hf_cache).rglob("*.arrow"))  # streamed: no copy of the data in the cache


def test_rows_whose_text_is_not_a_string_are_named_or_skipped_with_a_warning(
    tmp_path: Path, hf_cache: Path, capsys
) -> None:  # noqa: ANN001
    """Issue 49, item 14: rows whose text is null, a number or a list were dropped without a word (307 rows ->
    "300 documents"; a file of only such rows "is empty"). They stop the run, naming the line (JSONL) or row
    (parquet), as undecodable text does; --skip-bad-text drops them with one warning giving the count and the
    first."""
    import datasets

    good = [json.dumps({"text": f"row {i}"}) for i in range(300)]
    bad = ['{"text": null}', '{"text": 5}', '{"text": ["a"]}', '{"text": {"a": 1}}', '{"text": true}']
    lines = good[:3] + bad + good[3:] + bad[:2]  # the first bad row is line 4
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(TupeError, match=r"c\.jsonl:4: 'text' is null, not text; .*--skip-bad-text"):
        _docs(resolve_corpus([str(tmp_path / "c.jsonl")]))
    docs = _docs(resolve_corpus([str(tmp_path / "c.jsonl")], skip_bad_text=True))
    assert len(docs) == 300
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert warnings == [f"warning: corpus file {tmp_path / 'c.jsonl'}: skipped 7 row(s) whose 'text' is not text "
                        "(first at line 4)"]  # fmt: skip
    datasets.Dataset.from_dict({"text": ["a", None, "b"]}).to_parquet(str(tmp_path / "t.parquet"))
    with pytest.raises(TupeError, match=r"t\.parquet row 2: 'text' is null, not text"):
        _docs(resolve_corpus([str(tmp_path / "t.parquet")]))
    (tmp_path / "only.jsonl").write_text('{"text": 1}\n{"text": 2}\n')
    with pytest.raises(TupeError, match=r"only\.jsonl:1: 'text' is a number 1"):
        _docs(resolve_corpus([str(tmp_path / "only.jsonl")]))


def test_missing_text_column_names_the_columns_before_any_work(tmp_path: Path, hf_cache: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"body": ["x"], "id": [1]}).to_parquet(str(tmp_path / "t.parquet"))
    with pytest.raises(
        TupeError, match=r"t\.parquet has no column 'text' \(columns: body, id\); pick one with --text-column"
    ):
        resolve_corpus([str(tmp_path / "t.parquet")])
    (tmp_path / "t.jsonl").write_text('{"content": "x"}\n')
    with pytest.raises(TupeError, match=r"no column 'text' \(columns: content\)"):
        resolve_corpus([str(tmp_path / "t.jsonl")])
    (tmp_path / "bad.jsonl").write_text("not json at all\n")
    with pytest.raises(TupeError, match=r"bad\.jsonl"):
        resolve_corpus([str(tmp_path / "bad.jsonl")])
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(TupeError, match=r"corpus file .*bad\.parquet: cannot read it as parquet"):
        resolve_corpus([str(tmp_path / "bad.parquet")])


def test_a_dataset_name_not_in_the_local_cache_is_one_line_naming_it(hf_cache: Path) -> None:
    with pytest.raises(TupeError) as err:
        resolve_corpus(["someone/not-cached:cfg"])
    message = str(err.value)
    assert "\n" not in message
    assert "no dataset 'someone/not-cached' in the local `datasets` cache" in message
    assert str(hf_cache) in message and "nothing is downloaded" in message
    with pytest.raises(TupeError, match="corpus path not found: nope.txt"):  # a file name is a missing path
        resolve_corpus(["nope.txt"])


def test_a_dataset_in_the_local_cache_is_read_offline(hf_cache: Path) -> None:
    _cache_dataset(hf_cache, "someone/tiny-wiki", "raw", {"text": ["first article\nline two", "second"]})
    _cache_dataset(hf_cache, "plainname", "default", {"body": ["only row"]})
    corpus = resolve_corpus(["someone/tiny-wiki:raw"])
    assert corpus.names == ["someone/tiny-wiki:raw"] and not corpus.files
    assert _docs(corpus) == [["first article", "line two"], ["second"]]
    assert "dataset someone/tiny-wiki:raw" in corpus.describe()
    assert corpus.fingerprint() == resolve_corpus(["someone/tiny-wiki"]).fingerprint()  # its only config
    assert _docs(resolve_corpus(["plainname"], text_column="body")) == [["only row"]]
    with pytest.raises(TupeError, match=r"dataset plainname has no column 'text' \(columns: body\)"):
        resolve_corpus(["plainname"])
    with pytest.raises(TupeError, match="--corpus someone/tiny-wiki:other: .*'other'"):
        resolve_corpus(["someone/tiny-wiki:other"])


def test_an_arrow_file_of_a_saved_dataset_is_read_as_rows(tmp_path: Path, hf_cache: Path, capsys) -> None:  # noqa: ANN001
    """Issue 49: the `.arrow` file inside a `save_to_disk` folder, given as the corpus, was read as text ("is not
    UTF-8 text"; with --skip-bad-text "produced no tokens"). It is read as the dataset's rows (the same documents
    as the folder gives), and one `datasets` cannot read is refused in one line naming the folder to pass."""
    import datasets

    from tupe.cli import main

    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["a b\nc", "", "d"], "id": [1, 2, 3]}).save_to_disk(str(saved))
    (arrow,) = saved.glob("*.arrow")
    corpus = resolve_corpus([str(arrow)])
    assert not corpus.files and corpus.tables == [arrow]
    assert _docs(corpus) == _docs(resolve_corpus([str(saved)])) == [["a b", "c"], ["d"]]
    arrow.write_bytes(b"\xff\xfe not an arrow stream \x00\x01" * 40)  # damaged
    capsys.readouterr()  # save_to_disk's bar
    code = main(["pretrain", "--corpus", str(arrow), "--prepare-only", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert f"corpus file {arrow}: cannot read it as arrow" in err
    assert f"pass the dataset's folder {saved} (written by save_to_disk) instead" in err
