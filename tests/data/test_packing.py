"""Full-sentences packing: no token lost, [CLS] first, [SEP] between documents, blocks cross documents, cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tupe.data import packing
from tupe.data.corpus import iter_line_batches, resolve_corpus
from tupe.data.packing import load_or_build_packed
from tupe.data.tokenizer import CLS_ID, SEP_ID
from tupe.errors import TupeError


def _reference_stream(corpus, tok) -> list[int]:  # noqa: ANN001
    """Tokenize line by line, the slow obvious way, with [SEP] after every document."""
    out: list[int] = []
    for lines, ends, _ in iter_line_batches(corpus):
        for s, e in zip(lines, ends):
            out += tok(s, add_special_tokens=False)["input_ids"]
            if e:
                out.append(SEP_ID)
    return out


@pytest.fixture()
def packed(small_corpus_dir: Path, small_tokenizer, tmp_path: Path):  # noqa: ANN001, ANN201
    corpus = resolve_corpus([str(small_corpus_dir)])
    return corpus, load_or_build_packed(
        corpus, small_tokenizer, 64, tmp_path, progress=False, log=lambda _m: None
    )


def test_stream_is_every_token_plus_document_separators(packed, small_tokenizer) -> None:  # noqa: ANN001
    corpus, pk = packed
    ref = _reference_stream(corpus, small_tokenizer)
    assert pk.stream.tolist() == ref  # grouping lines into bigger encoder inputs changed no token
    assert pk.meta["num_documents"] == 6 == ref.count(SEP_ID)


def test_blocks_cover_the_stream_exactly_and_cross_documents(packed) -> None:  # noqa: ANN001
    _, pk = packed
    blocks = [pk.block(i) for i in range(len(pk))]
    assert all(b[0] == CLS_ID for b in blocks)
    assert all(len(b) == 64 for b in blocks[:-1]) and 2 <= len(blocks[-1]) <= 64
    assert np.concatenate([b[1:] for b in blocks]).tolist() == pk.stream.tolist()  # nothing lost or repeated
    # a document boundary inside a block: [SEP] followed by the next document's tokens in the same block
    inner = [b for b in blocks if SEP_ID in b[1:-1].tolist()]
    assert inner, "blocks must cross document boundaries"
    assert all(CLS_ID not in b[1:].tolist() for b in blocks)


def test_split_is_deterministic_199_to_1(packed) -> None:  # noqa: ANN001
    _, pk = packed
    train, valid = pk.split(valid_every=5)
    assert len(train) + len(valid) == len(pk)
    assert not set(train) & set(valid)
    assert (valid % 5 == 4).all() and len(valid) == len(pk) // 5
    t2, v2 = pk.split(valid_every=5)
    assert (t2 == train).all() and (v2 == valid).all()
    t3, v3 = pk.split()  # default: 199:1
    assert len(v3) == len(pk) // 200 and (v3 % 200 == 199).all()
    t4, v4 = pk.split(valid_every=10**9)  # fewer blocks than that: one full block is held out anyway
    assert len(v4) == 1 and len(t4) == len(pk) - 1 and len(pk.block(int(v4[0]))) == 64


def test_cache_is_reused_and_keyed_by_tokenizer(
    small_corpus_dir: Path,
    small_tokenizer,
    tmp_path: Path,  # noqa: ANN001
    monkeypatch,
) -> None:  # noqa: ANN001
    corpus = resolve_corpus([str(small_corpus_dir)])
    first = load_or_build_packed(corpus, small_tokenizer, 64, tmp_path, progress=False, log=lambda _m: None)

    def boom(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("tokenized again instead of reusing the cache")

    monkeypatch.setattr(packing, "encode_to_stream", boom)
    again = load_or_build_packed(corpus, small_tokenizer, 32, tmp_path, progress=False, log=lambda _m: None)
    assert again.path == first.path and len(again) > len(first)
    assert [p.name for p in (tmp_path / "packed").iterdir()] == [first.path.name]  # no temp folder left
    from tupe.data.tokenizer import train_tokenizer

    other = train_tokenizer(corpus, vocab_size=300, show_progress=False)
    with pytest.raises(AssertionError, match="tokenized again"):
        load_or_build_packed(corpus, other, 64, tmp_path, progress=False, log=lambda _m: None)


def test_too_small_corpus(tmp_path: Path, small_tokenizer) -> None:  # noqa: ANN001
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "t.txt").write_text("hi\n")
    pk = load_or_build_packed(
        resolve_corpus([str(tmp_path / "c")]),
        small_tokenizer,
        64,
        tmp_path / "cache",
        progress=False,
        log=lambda _m: None,
    )
    with pytest.raises(TupeError, match="corpus too small"):
        pk.split()


def test_a_changed_line_rule_never_reuses_the_cache(small_tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The bounds that cut long lines and words change the tokens, so they key the cache with the corpus."""
    from tupe.data import corpus as corpus_mod

    (tmp_path / "c").mkdir()
    word = "".join(chr(97 + (i * 7) % 26) for i in range(600))  # a 600-character "word" (a URL, a DNA string)
    (tmp_path / "c" / "t.txt").write_text(("some words " + word + " more words\n") * 20)
    corpus = resolve_corpus([str(tmp_path / "c")])
    logs: list[str] = []
    first = load_or_build_packed(
        corpus, small_tokenizer, 64, tmp_path / "cache", progress=False, log=logs.append
    )
    monkeypatch.setattr(corpus_mod, "MAX_WORD_CHARS", 100)  # another word bound: other pieces, other tokens
    logs.clear()
    second = load_or_build_packed(
        corpus, small_tokenizer, 64, tmp_path / "cache", progress=False, log=logs.append
    )
    assert second.path != first.path and not any("reusing" in m for m in logs)
    assert second.stream.tolist() != first.stream.tolist()
    assert second.meta["text_rule"].endswith(":word=100") and first.meta["text_rule"].endswith(":word=256")
    monkeypatch.setattr(corpus_mod, "MAX_LINE_CHARS", 8192)  # the line bound is part of the key as well
    assert packing.packed_cache_key(corpus, small_tokenizer) != second.path.name
    monkeypatch.undo()
    logs.clear()
    again = load_or_build_packed(
        corpus, small_tokenizer, 64, tmp_path / "cache", progress=False, log=logs.append
    )
    assert again.path == first.path and any("reusing" in m for m in logs)
