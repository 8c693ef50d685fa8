"""Document blocks (`--packing documents`): every document starts at its own [CLS], position 0.

The packed token stream of `tupe.data.packing` (`tokens(document) + [SEP]` per document, the cache entry shared with
`--packing stream`) is cut into *pieces* and the pieces are packed into blocks of `block_size` tokens:

- **Documents** are what the stream separates with [SEP]: in text files a blank line or the end of a file, in
  parquet/JSON/`datasets` corpora a row (`tupe.data.corpus`). A [SEP] written literally in the text is tokenized as
  [SEP] and ends a document too, as it already separates documents in `--packing stream`.
- **Pieces.** A document is its stream tokens, `tokens + [SEP]`. Up to `block_size - 1` of them make one piece
  `[CLS] + tokens + [SEP]`; a longer document is cut into consecutive pieces of `block_size - 1` stream tokens (the
  last one shorter), each with its own `[CLS]` in front: `[CLS] + part`, the last `[CLS] + part + [SEP]` (a last
  part that would be the [SEP] alone is left out: it holds no token to predict). So a document of one block's
  length or more is cut exactly as `--packing stream` cuts a document that starts a block. Every piece has the
  position ids `0, 1, ..., len - 1`.
- **Blocks.** Pieces are packed in corpus order by *best fit*: each piece goes into the open block with the least
  room that still holds it (the earliest such block on a tie), or opens a new block; a block is closed when less
  room is left than the shortest possible piece (2 tokens, [CLS] and one). A piece is never split across blocks; pieces sit one
  after another from the start of the block, so the only padding is at its end (attention mask 0, position ids
  continuing the last piece's). Blocks are numbered in the order they were opened.
- **Train / validation.** The validation text is exactly the text of `--packing stream`'s validation blocks:
  stream block `i` covers stream tokens `[i (L-1), (i+1) (L-1))` and is validation when `i % valid_every ==
  valid_every - 1` (`PackedCorpus.split`). Those token ranges are cut out of the stream, cut at document ends into
  pieces as above and packed into the validation blocks; everything else is packed into the training blocks. So a
  `stream` run and a `documents` run of one corpus, tokenizer, block length and `--valid-every` are validated on
  the same document tokens (the same non-special targets at the same stream positions; the masks differ, since
  the blocks do); a document that crosses the edge of a validation range is cut there into two pieces, each
  starting with [CLS] at position 0, as a long document is.
- **Packing efficiency** = tokens that are not padding ([CLS] and [SEP] of each piece included) / (blocks x
  `block_size`), recorded in `meta.json` per split and overall; `content_share` counts document tokens only.

The layout (piece start and length in the stream, and where each block's pieces begin) is cached in
`CACHE/documents/KEY/` (KEY = the stream's cache key, block length, `valid_every` and this rule's version),
written atomically beside the stream's entry and checked (sizes, SHA-256) before use.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tupe.data.packing import PackedCorpus, cache_entry
from tupe.data.tokenizer import CLS_ID, SEP_ID
from tupe.errors import TupeError
from tupe.io.files import sha256_file

DOCUMENTS_VERSION = "documents-v1"
MIN_PIECE = 2  # [CLS] + one token
_LAYOUT_FILES = ("piece_start.npy", "piece_len.npy", "block_ptr.npy")
_SCAN = 1 << 24  # stream tokens read at a time when finding the [SEP]s


def _sep_positions(stream: np.ndarray, sep_id: int) -> np.ndarray:
    """Positions of every [SEP] of the stream, read in bounded chunks (no stream-sized temporary)."""
    found = []
    for start in range(0, stream.shape[0], _SCAN):
        found.append(np.flatnonzero(np.asarray(stream[start : start + _SCAN]) == sep_id) + start)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def valid_ranges(packed: PackedCorpus, valid_every: int) -> np.ndarray:
    """(k, 2) stream ranges [start, end) of `--packing stream`'s validation blocks, in order."""
    _, valid_idx = packed.split(valid_every)
    c = packed.content_len
    starts = valid_idx.astype(np.int64) * c
    return np.stack([starts, np.minimum(starts + c, packed.num_tokens)], axis=1)


def cut_pieces(
    stream: np.ndarray, ranges: np.ndarray, block_size: int, sep_id: int = SEP_ID
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(piece start, piece length in stream tokens, is validation) of every piece, in stream order; a piece is
    `[CLS] + stream[start : start + length]`.

    Cuts: after every [SEP] (a document's end), at the edges of the validation `ranges`, and every `block_size - 1`
    tokens of a longer run; a piece that would be a [SEP] alone is left out."""
    n = int(stream.shape[0])
    seps = _sep_positions(stream, sep_id)
    edges = ranges.reshape(-1)
    bounds = np.unique(np.concatenate([[0, n], seps + 1, edges]).astype(np.int64))
    bounds = bounds[(bounds >= 0) & (bounds <= n)]
    starts, ends = bounds[:-1], bounds[1:]
    keep = ends > starts
    starts, lengths = starts[keep], (ends - starts)[keep]
    width = block_size - 1
    counts = -(-lengths // width)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    k = np.arange(int(counts.sum()), dtype=np.int64) - first  # index of a piece within its segment
    seg_start = np.repeat(starts, counts)
    seg_len = np.repeat(lengths, counts)
    piece_start = seg_start + k * width
    piece_len = np.minimum(width, seg_len - k * width)
    alone = (piece_len == 1) & np.isin(piece_start, seps)  # a [SEP] alone: no token to predict
    piece_start, piece_len, k = piece_start[~alone], piece_len[~alone], k[~alone]
    # a piece lies in one range (edges are cuts): validation if its start is inside one
    i = np.searchsorted(ranges[:, 0], piece_start, side="right") - 1
    is_valid = (
        (i >= 0) & (piece_start < ranges[np.maximum(i, 0), 1]) if len(ranges) else np.zeros_like(k, bool)
    )
    return piece_start, piece_len.astype(np.int64), is_valid


def best_fit(sizes: np.ndarray, block_size: int) -> np.ndarray:
    """The block of every item (sizes in tokens, in order) under best fit: each goes into the open block with the
    least room that still holds it (the earliest opened on a tie), else into a new block; blocks are numbered in
    the order they were opened. A block with less than `MIN_PIECE` room left is closed."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size and (sizes.min() < 1 or sizes.max() > block_size):
        raise ValueError(f"item sizes must be in [1, {block_size}]")
    block = np.empty(sizes.shape[0], dtype=np.int64)
    rooms: dict[int, deque[int]] = {}
    nonempty: list[int] = []  # sorted room sizes that have open blocks
    opened = 0
    for j, s in enumerate(sizes.tolist()):
        i = bisect.bisect_left(nonempty, s)
        if i < len(nonempty):
            room = nonempty[i]
            b = rooms[room].popleft()
            if not rooms[room]:
                del nonempty[i]
        else:
            room, b = block_size, opened
            opened += 1
        block[j] = b
        left = room - s
        if left >= MIN_PIECE:
            queue = rooms.setdefault(left, deque())
            if not queue:
                bisect.insort(nonempty, left)
            queue.append(b)
    return block


def pack_pieces(piece_len: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(order of the pieces grouped by block, block_ptr): block `b` holds pieces `order[block_ptr[b]:
    block_ptr[b+1]]`, in corpus order."""
    block = best_fit(piece_len + 1, block_size)
    order = np.argsort(block, kind="stable")
    n_blocks = int(block.max()) + 1 if block.size else 0
    ptr = np.zeros(n_blocks + 1, dtype=np.int64)
    np.cumsum(np.bincount(block, minlength=n_blocks), out=ptr[1:])
    return order, ptr


def _stats(piece_len: np.ndarray, ends_document: np.ndarray, n_blocks: int, block_size: int) -> dict:
    real = int(piece_len.sum()) + int(piece_len.shape[0])  # a [CLS] each
    document = int(piece_len.sum()) - int(ends_document.sum())  # without the [SEP]s
    slots = n_blocks * block_size
    return {
        "blocks": n_blocks,
        "pieces": int(piece_len.shape[0]),
        "real_tokens": real,
        "document_tokens": document,
        "efficiency": round(real / slots, 6) if slots else None,
        "content_share": round(document / slots, 6) if slots else None,
    }


def build_layout(packed: PackedCorpus, block_size: int, valid_every: int, sep_id: int = SEP_ID) -> dict:
    """Pieces and blocks of the stream (the module docstring's rule): arrays `piece_start`, `piece_len` (pieces
    grouped by block, training blocks first), `block_ptr`, and the counts `train_blocks` and `stats`."""
    packed = PackedCorpus(
        packed.path, packed.stream, block_size, packed.meta
    )  # the stream as blocks of this length
    ranges = valid_ranges(packed, valid_every)
    start, length, is_valid = cut_pieces(packed.stream, ranges, block_size, sep_id)
    ends = np.asarray(packed.stream[start + length - 1]) == sep_id if start.size else np.zeros(0, bool)
    starts, lens, ptrs, stats = [], [], [np.zeros(1, dtype=np.int64)], {}
    offset = 0
    for name, sel in (("train", ~is_valid), ("valid", is_valid)):
        s, n = start[sel], length[sel]
        order, ptr = pack_pieces(n, block_size)
        starts.append(s[order])
        lens.append(n[order])
        ptrs.append(ptr[1:] + offset)
        offset += int(ptr[-1])
        stats[name] = _stats(n, ends[sel], len(ptr) - 1, block_size)
    stats["all"] = _stats(length, ends, stats["train"]["blocks"] + stats["valid"]["blocks"], block_size)
    stats["documents"] = int(_sep_positions(packed.stream, sep_id).shape[0])
    return {
        "piece_start": np.concatenate(starts).astype(np.int64),
        "piece_len": np.concatenate(lens).astype(np.int32),
        "block_ptr": np.concatenate(ptrs),
        "train_blocks": stats["train"]["blocks"],
        "stats": stats,
    }


def documents_cache_key(packed: PackedCorpus, block_size: int, valid_every: int) -> str:
    """The cache entry of a layout: the stream's own cache key (its folder name), the block length, the
    validation rule and this module's rule version."""
    parts = [DOCUMENTS_VERSION, packed.path.name, packed.meta.get("stream_sha256"), block_size, valid_every]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def layout_problem(path: Path, deep: bool = True) -> str | None:
    """None if `path` is a complete layout as written here, else what is wrong with it."""
    from tupe.io.reading import check_regular, read_json

    try:
        meta = read_json(path / "meta.json", "document layout metadata")
        for name in _LAYOUT_FILES:
            check_regular(path / name, "document layout")
    except TupeError as err:
        return str(err)
    hashes = meta.get("sha256")
    if not isinstance(hashes, dict) or set(hashes) != set(_LAYOUT_FILES):
        return "meta.json: sha256 of the layout files missing"
    if deep:
        for name in _LAYOUT_FILES:
            if hashes[name] != sha256_file(path / name):
                return f"{name} does not match its recorded SHA-256 (changed or corrupt)"
    return None


@dataclass
class DocumentBlocks:
    """A packed stream viewed as document blocks (module docstring): the interface of `PackedCorpus` that
    training and evaluation read (`len`, `block`, `split`, `num_tokens`, `path`, `meta`), plus `positions`."""

    path: Path
    packed: PackedCorpus
    block_size: int
    meta: dict
    piece_start: np.ndarray
    piece_len: np.ndarray
    block_ptr: np.ndarray

    @classmethod
    def open(cls, path: str | os.PathLike, packed: PackedCorpus) -> DocumentBlocks:
        """The layout cached in `path` over the stream `packed`; refused when it was made from another stream."""
        path = Path(path)
        problem = layout_problem(path, deep=False)
        if problem is not None:
            raise TupeError(f"{path}: not a usable document layout ({problem})")
        layout_meta = json.loads((path / "meta.json").read_text())
        if layout_meta.get("stream_sha256") != packed.meta.get("stream_sha256"):
            raise TupeError(
                f"{path}: this document layout was made from another token stream than {packed.path}"
            )
        arrays = {name: np.load(path / name, mmap_mode="r") for name in _LAYOUT_FILES}
        ptr = np.asarray(arrays["block_ptr.npy"])
        if ptr.ndim != 1 or ptr.size < 1 or ptr[-1] != arrays["piece_start.npy"].shape[0]:
            raise TupeError(f"{path}: not a usable document layout (block_ptr.npy does not match the pieces)")
        return cls(
            path=path,
            packed=packed,
            block_size=int(layout_meta["block_size"]),
            meta={**packed.meta, "documents": layout_meta},
            piece_start=arrays["piece_start.npy"],
            piece_len=arrays["piece_len.npy"],
            block_ptr=ptr,
        )

    @property
    def stream(self) -> np.ndarray:
        return self.packed.stream

    @property
    def num_tokens(self) -> int:
        return self.packed.num_tokens

    @property
    def train_blocks(self) -> int:
        return int(self.meta["documents"]["train_blocks"])

    @property
    def stats(self) -> dict:
        """Blocks, pieces, real and document tokens, efficiency and content share: per split and `all`."""
        return self.meta["documents"]["stats"]

    def __len__(self) -> int:
        return int(self.block_ptr.shape[0]) - 1

    def _pieces(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.block_ptr[i]), int(self.block_ptr[i + 1])
        return np.asarray(self.piece_start[a:b]), np.asarray(self.piece_len[a:b], dtype=np.int64)

    def block(self, i: int) -> np.ndarray:
        """Block `i` as int64 ids, unpadded: its pieces `[CLS] + stream tokens` one after another."""
        starts, lens = self._pieces(i)
        out = np.empty(int(lens.sum()) + len(lens), dtype=np.int64)
        at = 0
        for s, n in zip(starts.tolist(), lens.tolist()):
            out[at] = CLS_ID
            out[at + 1 : at + 1 + n] = self.packed.stream[s : s + n]
            at += n + 1
        return out

    def positions(self, i: int) -> np.ndarray:
        """Position ids of block `i`: 0, 1, ... from each piece's [CLS]."""
        _, lens = self._pieces(i)
        sizes = lens + 1
        return np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)

    def split(self, valid_every: int) -> tuple[np.ndarray, np.ndarray]:
        """(train block indices, valid block indices): the training blocks come first."""
        made = int(self.meta["documents"]["valid_every"])
        if int(valid_every) != made:
            raise TupeError(
                f"{self.path}: document blocks made with --valid-every {made}, asked for {valid_every}"
            )
        n, t = len(self), self.train_blocks
        if t == 0 or n == t:
            raise TupeError(
                f"corpus too small: {self.num_tokens} tokens make {t} training and {n - t} validation document "
                f"block(s) of {self.block_size}; need at least one of each"
            )
        return np.arange(t), np.arange(t, n)

    def token_counts(self, block_indices: np.ndarray, vocab_size: int) -> np.ndarray:
        """Occurrences of every token id in the stream tokens of the given blocks (no [CLS]; the [SEP]s that end
        documents counted, as `tupe.analysis.baseline` counts a stream block)."""
        blocks = np.asarray(block_indices, dtype=np.int64)
        first, last = self.block_ptr[blocks], self.block_ptr[blocks + 1]
        sizes = last - first
        pieces = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        pieces += np.repeat(first, sizes)
        starts = np.asarray(self.piece_start)[pieces]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], starts[order] + np.asarray(self.piece_len)[pieces][order]
        # pieces that follow one another in the stream are one slice of it (bincount per run, not per piece)
        new_run = np.ones(len(starts), dtype=bool)
        new_run[1:] = starts[1:] != ends[:-1]
        run_start, run_end = starts[new_run], ends[np.r_[new_run[1:], True]]
        counts = np.zeros(vocab_size, dtype=np.int64)
        for a, b in zip(run_start.tolist(), run_end.tolist()):
            counts += np.bincount(np.asarray(self.packed.stream[a:b]), minlength=vocab_size)[:vocab_size]
        return counts


def load_or_build_documents(
    packed: PackedCorpus,
    block_size: int,
    valid_every: int,
    cache_dir: str | os.PathLike,
    log=print,  # noqa: ANN001
) -> DocumentBlocks:
    """The document blocks of `packed` from the cache, or made (seconds: numpy and one pass over the pieces) and
    cached in `cache_dir/documents/KEY/`."""
    if block_size < 2:
        raise TupeError(f"block size (max length) must be at least 2, got {block_size}")
    key = documents_cache_key(packed, block_size, valid_every)
    target = Path(cache_dir) / "documents" / key

    def build(tmp: Path) -> dict:
        t0 = time.perf_counter()
        layout = build_layout(packed, block_size, valid_every)
        for name in _LAYOUT_FILES:
            np.save(tmp / name, layout[name.removesuffix(".npy")])
        return {
            "version": DOCUMENTS_VERSION,
            "rule": "best fit in corpus order; pieces [CLS] + at most block_size - 1 stream tokens",
            "stream": packed.path.name,
            "stream_sha256": packed.meta.get("stream_sha256"),
            "block_size": block_size,
            "valid_every": valid_every,
            "train_blocks": layout["train_blocks"],
            "stats": layout["stats"],
            "seconds": round(time.perf_counter() - t0, 3),
            "sha256": {name: sha256_file(tmp / name) for name in _LAYOUT_FILES},
        }

    meta = cache_entry(
        target, layout_problem, build, "cached document layout", "making it again", "the document layout"
    )
    if meta is not None:
        log(f"data: document blocks made in {meta['seconds']:.1f} s, cached in {target}")
    else:
        log(f"data: reusing cached document blocks {target}")
    return DocumentBlocks.open(target, packed)


def undivided_files_warning(blocks: DocumentBlocks, corpus: Any) -> str | None:
    """A warning for `--packing documents` on text files without a single blank line: each file is then one
    document, cut into pieces of a block (a file of one document a line, the habit of many corpora, becomes "1
    document in 1,811 pieces"), which is rarely what the flag was asked for. None where the files have blank lines
    (the built-in corpus: a blank line after each book), rows give the documents, or no document is cut."""
    s = blocks.stats
    if not corpus.files or corpus.datasets or corpus.tables or corpus.names:
        return None
    if s["documents"] > len(corpus.files) or s["all"]["pieces"] <= s["documents"]:
        return None
    documents = f"{s['documents']:,} document{'' if s['documents'] == 1 else 's'}"
    return (
        f"warning: --packing documents: {documents} in {s['all']['pieces']:,} pieces: no text file of the corpus "
        "has a blank line, so each file is one document, cut into pieces of a block. Documents end at a blank "
        "line (and at the end of a file): for one document a line, put a blank line after each, or give a "
        "JSON-lines/parquet file or a datasets folder (a row is a document)"
    )


def describe_packing(blocks: DocumentBlocks) -> str:
    """One line for the console: blocks, pieces, documents and the packing efficiency."""
    s = blocks.stats
    documents = f"{s['documents']:,} document{'' if s['documents'] == 1 else 's'}"
    return (
        f"data: --packing documents: {documents} in {s['all']['pieces']:,} pieces, best fit into "
        f"{s['all']['blocks']:,} blocks of {blocks.block_size}; packing efficiency {s['all']['efficiency']:.1%} "
        f"(train {s['train']['efficiency']:.1%}, valid {s['valid']['efficiency']:.1%}) of block tokens are not "
        f"padding, {s['all']['content_share']:.1%} are document tokens"
    )
