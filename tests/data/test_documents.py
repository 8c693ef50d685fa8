"""Document blocks (`--packing documents`): checked against the stream they are cut from and a naive best fit."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import pytest

from tupe.data import documents
from tupe.data.corpus import resolve_corpus
from tupe.data.documents import DocumentBlocks, best_fit, load_or_build_documents
from tupe.data.mlm import BlockDataset, MaskedLMCollator
from tupe.data.packing import PackedCorpus, load_or_build_packed, packed_cache_key
from tupe.data.tokenizer import CLS_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS
from tupe.errors import TupeError

L = 48  # block length
EVERY = 7  # --valid-every


def _quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def short_docs_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Many short documents (one to three lines each, blank-line separated) and a few longer than a block."""
    rng = random.Random(0)
    words = "the a man woman dog cat saw met found left near by house river town old new".split()
    docs = []
    for d in range(160):
        lines = 30 if d % 40 == 7 else rng.choice([1, 1, 2, 3])
        docs.append(
            "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(lines))
        )
    path = tmp_path_factory.mktemp("short_docs") / "docs.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.fixture(scope="module")
def stream_and_blocks(short_docs_corpus: Path, small_tokenizer, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    cache = tmp_path_factory.mktemp("cache")
    corpus = resolve_corpus([str(short_docs_corpus)])
    packed = load_or_build_packed(corpus, small_tokenizer, L, cache, progress=False, log=_quiet)
    blocks = load_or_build_documents(packed, L, EVERY, cache, log=_quiet)
    return packed, blocks, cache


def _documents(stream: list[int]) -> list[list[int]]:
    """The documents of a stream, the obvious way: split at every [SEP]."""
    docs, cur = [], []
    for t in stream:
        if t == SEP_ID:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    assert not cur  # the stream ends with a [SEP]
    return docs


def _range_of(p: int, packed) -> tuple[int, int]:  # noqa: ANN001
    """The validation range holding stream position `p` (or an empty one)."""
    for a, b in documents.valid_ranges(packed, EVERY).tolist():
        if a <= p < b:
            return a, b
    return 0, 0


def _pieces_of_block(ids: np.ndarray, pos: np.ndarray) -> list[np.ndarray]:
    starts = np.flatnonzero(pos == 0).tolist() + [len(ids)]
    return [ids[a:b] for a, b in zip(starts[:-1], starts[1:])]


def test_every_piece_starts_with_cls_at_position_zero(stream_and_blocks) -> None:  # noqa: ANN001
    packed, blocks, _ = stream_and_blocks
    edges = set(documents.valid_ranges(packed, EVERY).reshape(-1).tolist())
    for i in range(len(blocks)):
        ids, pos = blocks.block(i), blocks.positions(i)
        assert ids.dtype == np.int64 and pos.shape == ids.shape and 2 <= len(ids) <= L
        assert ids[0] == CLS_ID and pos[0] == 0
        for piece, (start, n) in zip(_pieces_of_block(ids, pos), zip(*blocks._pieces(i))):
            assert piece[0] == CLS_ID and 2 <= len(piece) <= L and len(piece) == n + 1
            assert CLS_ID not in piece[1:].tolist() and SEP_ID not in piece[1:-1].tolist()
            # a piece ends its document ([SEP]) unless it is a full piece of a long one or a validation edge cut it
            assert piece[-1] == SEP_ID or len(piece) == L or start + n in edges
        # positions count up by one inside a piece and restart at 0 exactly at each [CLS]
        assert ((pos[1:] == pos[:-1] + 1) | (pos[1:] == 0)).all()
        assert np.array_equal(pos == 0, ids == CLS_ID)


def test_no_token_lost_or_repeated_and_documents_kept_whole(stream_and_blocks) -> None:  # noqa: ANN001
    packed, blocks, _ = stream_and_blocks
    stream = packed.stream.tolist()
    # every piece with where it came from, put back in stream order: the stream (a [SEP] alone left out)
    starts = np.asarray(blocks.piece_start)
    order = np.argsort(starts, kind="stable")
    contents = [
        piece[1:]
        for i in range(len(blocks))
        for piece in _pieces_of_block(blocks.block(i), blocks.positions(i))
    ]
    assert len(contents) == len(starts)
    flat = np.concatenate([contents[k] for k in order]).tolist()
    assert [t for t in flat if t != SEP_ID] == [t for t in stream if t != SEP_ID]
    covered = {
        p for st, n in zip(starts.tolist(), np.asarray(blocks.piece_len).tolist()) for p in range(st, st + n)
    }
    left_out = [p for p in range(len(stream)) if p not in covered]
    assert flat == [t for p, t in enumerate(stream) if p in covered]  # each covered token once, in order
    assert all(stream[p] == SEP_ID for p in left_out) and len(left_out) < len(stream) // 100  # [SEP]s alone
    # a document is cut only where it must be: a document of at most L - 1 stream tokens ([SEP] included) that
    # no validation edge crosses is one piece
    docs = _documents(stream)
    assert blocks.stats["documents"] == len(docs) == packed.meta["num_documents"]
    pieces = set(zip(starts.tolist(), np.asarray(blocks.piece_len).tolist()))
    edges = documents.valid_ranges(packed, EVERY).reshape(-1)
    at, whole = 0, 0
    for d in docs:
        crossed = ((edges > at) & (edges < at + len(d) + 1)).any()
        if len(d) + 1 <= L - 1 and not crossed:
            assert (at, len(d) + 1) in pieces
            whole += 1
        elif not crossed:  # a long document: pieces of L - 1 stream tokens, as stream blocks cut it
            assert all((at + k, L - 1) in pieces for k in range(0, len(d) + 1 - (L - 1), L - 1))
        at += len(d) + 1
    assert whole > len(docs) // 2 and any(len(d) > L for d in docs)


def test_validation_is_the_text_of_the_stream_validation_blocks(stream_and_blocks) -> None:  # noqa: ANN001
    packed, blocks, _ = stream_and_blocks
    stream = packed.stream.tolist()
    _, stream_valid = packed.split(EVERY)
    want = np.concatenate([packed.block(int(i))[1:] for i in stream_valid])
    want = want[want != SEP_ID].tolist()
    train, valid = blocks.split(EVERY)
    assert len(train) + len(valid) == len(blocks) and train[-1] + 1 == valid[0]
    got = [
        t
        for i in valid
        for piece in _pieces_of_block(blocks.block(int(i)), blocks.positions(int(i)))
        for t in piece[1:]
        if t != SEP_ID
    ]
    assert sorted(got) == sorted(want)
    # exactly the stream positions of those blocks (not only the same tokens), and training holds the rest
    covered = {p for i in valid for s, n in zip(*blocks._pieces(int(i))) for p in range(s, s + n)}
    expect = {
        p
        for a, b in documents.valid_ranges(packed, EVERY).tolist()
        for p in range(a, b)
        if stream[p] != SEP_ID
    }
    assert {p for p in covered if stream[p] != SEP_ID} == expect
    assert all(a <= p < b for p in covered for a, b in [_range_of(p, packed)])
    trained = {p for i in train for s, n in zip(*blocks._pieces(int(i))) for p in range(s, s + n)}
    assert not trained & covered
    assert {p for p in trained | covered if stream[p] != SEP_ID} == {
        p for p, t in enumerate(stream) if t != SEP_ID
    }
    with pytest.raises(TupeError, match="--valid-every 7, asked for 9"):
        blocks.split(9)


def test_packing_efficiency_counts_every_non_padding_token(stream_and_blocks) -> None:  # noqa: ANN001
    _, blocks, _ = stream_and_blocks
    train, valid = blocks.split(EVERY)
    for name, idx in (("train", train), ("valid", valid), ("all", np.arange(len(blocks)))):
        real = sum(len(blocks.block(int(i))) for i in idx)
        document = sum(int((blocks.block(int(i)) >= len(SPECIAL_TOKENS)).sum()) for i in idx)
        stats = blocks.stats[name]
        assert stats["blocks"] == len(idx) and stats["real_tokens"] == real
        assert stats["efficiency"] == pytest.approx(real / (len(idx) * L), abs=1e-6)
        assert stats["content_share"] == pytest.approx(document / (len(idx) * L), abs=1e-6)
    assert blocks.stats["train"]["efficiency"] > 0.9  # best fit fills the blocks with short documents


def _naive_best_fit(sizes: list[int], capacity: int) -> list[int]:
    """The rule read literally: the open block with the least room that holds the item, earliest on a tie."""
    rooms: list[int] = []
    out = []
    for s in sizes:
        fits = [(room, b) for b, room in enumerate(rooms) if room >= s]
        if fits:
            _, b = min(fits)
        else:
            b = len(rooms)
            rooms.append(capacity)
        rooms[b] -= s
        out.append(b)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_best_fit_matches_the_naive_rule(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([8, 32, 128])
    sizes = [rng.choice([3, 4, capacity, rng.randint(3, capacity)]) for _ in range(400)]
    assert best_fit(np.asarray(sizes), capacity).tolist() == _naive_best_fit(sizes, capacity)


def test_long_document_pieces_and_validation_cuts() -> None:
    # a document of 12 tokens + [SEP], blocks of 6: pieces of 5 + 5 + 3 stream tokens, each after its own [CLS];
    # the validation range [14, 15) cuts the next document in two, and the [SEP] left alone after it is dropped
    stream = np.asarray([*range(10, 22), SEP_ID, 30, 31, SEP_ID])
    start, length, is_valid = documents.cut_pieces(stream, np.asarray([[14, 15]]), 6)
    assert start.tolist() == [0, 5, 10, 13, 14] and length.tolist() == [5, 5, 3, 1, 1]
    assert is_valid.tolist() == [False, False, False, False, True]
    order, ptr = documents.pack_pieces(length, 6)
    # best fit: [CLS]+5 and [CLS]+5 fill a block each; [CLS]+3 opens a third, [CLS]+1 fits beside it
    assert [order[ptr[b] : ptr[b + 1]].tolist() for b in range(len(ptr) - 1)] == [[0], [1], [2, 3], [4]]


def test_collator_keeps_positions_and_never_masks_specials(stream_and_blocks) -> None:  # noqa: ANN001
    _, blocks, _ = stream_and_blocks
    ds = BlockDataset(blocks, np.arange(len(blocks)), split=0)
    examples = [ds[k] for k in range(16)]
    batch = MaskedLMCollator(400, seed=3, mlm_probability=0.99)(examples)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "position_ids"}
    assert batch["position_ids"].dtype == batch["input_ids"].dtype
    for r, ex in enumerate(examples):
        n = len(ex["input_ids"])
        ids = np.asarray(ex["input_ids"])
        pos = batch["position_ids"][r].numpy()
        assert np.array_equal(pos[:n], ex["position_ids"])
        # padding: attention 0, [PAD], continuing the last document's positions (never a new document)
        assert batch["attention_mask"][r, n:].sum() == 0 and (batch["input_ids"][r, n:] == PAD_ID).all()
        assert (pos[n:] == pos[n - 1] + 1 + np.arange(len(pos) - n)).all()
        special = ids < len(SPECIAL_TOKENS)
        labels = batch["labels"][r, :n].numpy()
        assert (labels[special] == -100).all()  # the inner [CLS]/[SEP] too
        assert np.array_equal(batch["input_ids"][r, :n].numpy()[special], ids[special])
        assert (labels[~special] != -100).mean() > 0.9
    stream_like = [{"input_ids": e["input_ids"], "mask_key": e["mask_key"]} for e in examples]
    plain = MaskedLMCollator(400, seed=3, mlm_probability=0.99)(stream_like)
    assert "position_ids" not in plain  # stream blocks: the batch it always was
    assert all((plain[k] == batch[k]).all() for k in plain)  # the same masks with and without positions
    with pytest.raises(ValueError, match="1 of 2 examples have position_ids"):
        MaskedLMCollator(400)([examples[0], stream_like[1]])


def test_cache_kept_apart_from_the_stream_and_rebuilt_when_damaged(stream_and_blocks) -> None:  # noqa: ANN001
    packed, blocks, cache = stream_and_blocks
    assert packed.path == cache / "packed" / packed.path.name  # the stream's entry is where it always was
    assert blocks.path.parent == cache / "documents"
    meta = json.loads((blocks.path / "meta.json").read_text())
    assert meta["stream"] == packed.path.name and meta["block_size"] == L and meta["valid_every"] == EVERY
    again = load_or_build_documents(packed, L, EVERY, cache, log=_quiet)
    assert again.path == blocks.path and np.array_equal(again.block_ptr, blocks.block_ptr)
    other = load_or_build_documents(packed, 32, EVERY, cache, log=_quiet)
    assert other.path != blocks.path  # the block length is part of the key
    view = PackedCorpus(packed.path, packed.stream, 32, packed.meta)  # the stream as blocks of 32
    ranges = documents.valid_ranges(view, EVERY).tolist()  # validation: the stream's blocks of that length
    want = sum(b - a - int((packed.stream[a:b] == SEP_ID).sum()) for a, b in ranges)
    assert other.stats["valid"]["document_tokens"] == want
    (other.path / "piece_len.npy").write_bytes(b"\x93NUMPY garbage")
    msgs: list[str] = []
    rebuilt = load_or_build_documents(packed, 32, EVERY, cache, log=msgs.append)
    assert any("made" in m for m in msgs) and len(rebuilt) == len(other)
    with pytest.raises(TupeError, match="another token stream"):
        meta["stream_sha256"] = "0" * 64
        (rebuilt.path / "meta.json").write_text(json.dumps(meta))
        DocumentBlocks.open(rebuilt.path, packed)


def test_stream_cache_key_unchanged(small_tokenizer, short_docs_corpus: Path) -> None:  # noqa: ANN001
    """The stream's cache key is made as before --packing existed (a recorded key: runs keep their cache)."""
    import hashlib

    from tupe.data.corpus import text_rule
    from tupe.data.tokenizer import tokenizer_fingerprint

    corpus = resolve_corpus([str(short_docs_corpus)])
    parts = ["stream-v1", corpus.fingerprint(), text_rule(), tokenizer_fingerprint(small_tokenizer)]
    assert (
        packed_cache_key(corpus, small_tokenizer)
        == hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]
    )


def test_packings_defined_once_and_checked_where_the_data_config_is_made() -> None:
    """One `PACKINGS` (tupe.data.config): the parsers and the GPU studies hold that tuple
    itself, and `DataConfig` (which `prepare_data` makes) refuses another value in one line."""
    from tupe.bench import gpu_studies
    from tupe.data.config import DEFAULT_PACKING, PACKINGS, DataConfig
    from tupe.data.prepare import prepare_data
    from tupe.training import arguments, flags

    assert PACKINGS == ("stream", "documents") and DEFAULT_PACKING == "stream"
    assert flags.PACKINGS is PACKINGS and gpu_studies.PACKINGS is PACKINGS
    parser = argparse.ArgumentParser()
    arguments.add_packing_argument(parser)
    assert tuple(parser._actions[-1].choices) == PACKINGS
    with pytest.raises(TupeError, match="^unknown --packing 'rows'; choose one of: stream, documents$"):
        DataConfig(32, 20, packing="rows")
    with pytest.raises(TupeError, match="unknown --packing 'rows'"):
        prepare_data(None, 32, 20, packing="rows")  # before any work: no corpus is read


def test_token_counts_are_those_of_the_blocks(stream_and_blocks) -> None:  # noqa: ANN001
    """What the unigram baseline counts: every token of the given blocks but their [CLS]s."""
    _, blocks, _ = stream_and_blocks
    rng = np.random.default_rng(0)
    for idx in (np.arange(len(blocks)), rng.permutation(len(blocks))[:9], np.asarray([3, 3 + 1, 0])):
        want = np.zeros(400, dtype=np.int64)
        for i in idx:
            ids = blocks.block(int(i))
            want += np.bincount(ids[ids != CLS_ID], minlength=400)
        assert np.array_equal(blocks.token_counts(idx, 400), want)
