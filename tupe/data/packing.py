"""Tokenize a corpus once into a flat token stream on disk and view it as RoBERTa "full-sentences" blocks.

The stream is the concatenation over documents of `tokens(document) + [SEP]` (the extra separator between
documents of RoBERTa's FULL-SENTENCES). Block `i` of length `L` is `[CLS] + stream[i*(L-1) : (i+1)*(L-1)]`: blocks
cross document boundaries, every token of the stream is in exactly one block, and only the last block can be
shorter (it is padded by the collator). The train/valid split is by block: every `valid_every`-th block
(index % valid_every == valid_every - 1) is validation, i.e. 199:1 by default; deterministic and independent of
seeds, so every scheme of a comparison is trained and evaluated on identical data.

The stream is cached in `CACHE/packed/KEY/` (KEY = hash of corpus content + line rule + tokenizer definition) and written
atomically (temp folder, then rename), so concurrent runs and later runs reuse it. The block length only changes
the view, not the stream, so it is applied at load time.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tupe.data.corpus import text_rule
from tupe.data.tokenizer import CLS_ID, SEP_ID, tokenizer_fingerprint
from tupe.errors import TupeError
from tupe.io.files import failed_writes_reported, sha256_file

PACK_VERSION = "stream-v1"
_GROUP_CHARS = 4096  # lines of one document are joined (with " ") into encoder inputs of about this size


def default_cache_dir() -> Path:
    """`$TUPE_CACHE` if set, else `~/.cache/tupe`."""
    return Path(os.environ.get("TUPE_CACHE") or Path.home() / ".cache" / "tupe")


_DTYPES = ("uint16", "uint32", "int32", "int64")


def packed_problem(path: Path, deep: bool = True) -> str | None:
    """None if `path` is a complete packed stream as tupe wrote it, else what is wrong: `meta.json` of the wrong
    shape, `stream.bin` not a regular file, of another size than `num_tokens` says, or (`deep`) not matching its
    recorded SHA-256 (random bytes in a stream give ids beyond the vocabulary, an IndexError mid-training)."""
    from tupe.io.reading import check_regular, read_json

    try:
        meta = read_json(path / "meta.json", "packed stream metadata")
        stream = path / "stream.bin"
        size = check_regular(stream, "packed token stream").st_size
    except TupeError as err:
        return str(err)
    n, dtype = meta.get("num_tokens"), meta.get("dtype")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or dtype not in _DTYPES:
        return "meta.json: num_tokens or dtype missing or invalid"
    if size != n * np.dtype(dtype).itemsize:
        return f"stream.bin has {size} bytes, {n} tokens of {dtype} need {n * np.dtype(dtype).itemsize} (truncated?)"
    want = meta.get("stream_sha256")
    if deep and want is not None and want != sha256_file(stream):
        return "stream.bin does not match its recorded SHA-256 (changed or corrupt)"
    return None


@dataclass
class PackedCorpus:
    """A token stream on disk viewed as blocks of `block_size` tokens (the first one [CLS])."""

    path: Path
    stream: np.ndarray
    block_size: int
    meta: dict

    @classmethod
    def open(cls, path: str | os.PathLike, block_size: int) -> PackedCorpus:
        """The cached stream in `path` (a folder written by `load_or_build_packed`) as blocks of `block_size`."""
        path = Path(path)
        problem = packed_problem(path, deep=False)  # sizes; load_or_build_packed checks the SHA-256
        if problem is not None:
            raise TupeError(f"{path}: not a usable packed token stream ({problem})")
        meta = json.loads((path / "meta.json").read_text())
        if meta["num_tokens"] == 0:
            raise TupeError(f"corpus {meta.get('corpus', path)} produced no tokens")
        stream = np.memmap(
            path / "stream.bin", dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["num_tokens"],)
        )
        return cls(path=path, stream=stream, block_size=block_size, meta=meta)

    @property
    def content_len(self) -> int:
        return self.block_size - 1

    @property
    def num_tokens(self) -> int:
        return int(self.stream.shape[0])

    def __len__(self) -> int:
        return -(-self.num_tokens // self.content_len)

    def block(self, i: int) -> np.ndarray:
        """Block `i` as int64 ids: [CLS] followed by up to `block_size - 1` stream tokens."""
        c = self.content_len
        body = self.stream[i * c : (i + 1) * c]
        out = np.empty(body.shape[0] + 1, dtype=np.int64)
        out[0] = CLS_ID
        out[1:] = body
        return out

    def positions(self, i: int) -> None:
        """Stream blocks carry no position ids (the model counts 0, 1, ... from each block's [CLS]); document
        blocks (`DocumentBlocks.positions`) do."""
        return None

    def token_counts(self, block_indices: np.ndarray, vocab_size: int) -> np.ndarray:
        """Occurrences of every token id in the given blocks (the [CLS] that starts each block not counted)."""
        c = self.content_len
        counts = np.zeros(vocab_size, dtype=np.int64)
        blocks = np.asarray(block_indices, dtype=np.int64)
        if blocks.size == len(self) and np.array_equal(blocks, np.arange(len(self))):
            return np.bincount(np.asarray(self.stream), minlength=vocab_size)[:vocab_size].astype(np.int64)
        # runs of consecutive blocks are one slice of the stream
        breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
        for run in np.split(blocks, breaks):
            if run.size:
                part = np.asarray(self.stream[int(run[0]) * c : (int(run[-1]) + 1) * c])
                counts += np.bincount(part, minlength=vocab_size)[:vocab_size]
        return counts

    def split(self, valid_every: int = 200) -> tuple[np.ndarray, np.ndarray]:
        """Deterministic (train block indices, valid block indices); 1 in `valid_every` blocks is validation."""
        n = len(self)
        if n < 2:
            raise TupeError(
                f"corpus too small: {self.num_tokens} tokens make {n} block(s) of {self.block_size}; need at least 2"
            )
        idx = np.arange(n)
        is_valid = (idx % valid_every) == (valid_every - 1)
        if not is_valid.any():  # tiny corpus: hold out the last full block
            is_valid[n - 2 if n * self.content_len > self.num_tokens else n - 1] = True
        return idx[~is_valid], idx[is_valid]


def _group_lines(lines: list[str], ends: list[bool]) -> tuple[list[str], list[bool]]:
    """Join consecutive lines of one document with spaces into ~4 KB encoder inputs.

    With a byte-level BPE that adds a prefix space, encoding `"a b"` equals encoding `"a"` then `"b"`, so this
    changes no token; it only cuts the per-input overhead of the fast tokenizer (hard-wrapped text has ~60-char
    lines).
    """
    items: list[str] = []
    item_ends: list[bool] = []
    cur: list[str] = []
    size = 0
    for s, e in zip(lines, ends):
        cur.append(s)
        size += len(s) + 1
        if e or size >= _GROUP_CHARS:
            items.append(" ".join(cur))
            item_ends.append(e)
            cur, size = [], 0
    if cur:
        items.append(" ".join(cur))
        item_ends.append(False)
    return items, item_ends


def encode_to_stream(corpus, tokenizer, out_file: Path, progress: bool = True, sep_id: int = SEP_ID) -> dict:  # noqa: ANN001
    """Tokenize every document (batch fast tokenizer, parallel in Rust; a slow tokenizer line by line), append
    ids + [SEP] to `out_file`.

    `sep_id`: the separator's id, for tokenizers outside the project's contract (a BERT WordPiece)."""
    from tqdm.auto import tqdm

    from tupe.data.corpus import iter_line_batches

    backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
    if backend is not None and hasattr(backend.model, "_resize_cache"):
        backend.model._resize_cache(1 << 20)  # BPE word cache: most words repeat, this saves most merges
    vocab = len(tokenizer)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.int32
    n_tokens = n_docs = n_chars = 0
    t0 = time.perf_counter()
    total = corpus.total_bytes or None
    bar = tqdm(
        total=total, unit="B", unit_scale=True, desc="tokenize+pack", disable=not progress, leave=False
    )
    with out_file.open("wb") as fh:
        for lines, ends, done in iter_line_batches(corpus):
            if backend is not None:
                items, item_ends = _group_lines(lines, ends)
                encs = [e.ids for e in backend.encode_batch_fast(items, add_special_tokens=False)]
            else:
                # a slow (Python) tokenizer, e.g. the released TUPE pipeline's Moses + BPE: line by line, since
                # Moses reads a line as a sentence and joining lines would change its tokens
                items, item_ends = lines, ends
                encs = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(x)) for x in items]
            lens = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
            flat = np.fromiter(itertools.chain.from_iterable(encs), dtype=dtype, count=int(lens.sum()))
            # a [SEP] after the last piece of every document
            doc_end_pos = np.cumsum(lens)[np.asarray(item_ends, dtype=bool)]
            flat = np.insert(flat, doc_end_pos, np.asarray(sep_id, dtype=dtype))
            flat.tofile(fh)
            n_tokens += int(flat.shape[0])
            n_docs += int(doc_end_pos.shape[0])
            n_chars += sum(map(len, lines))
            if total:
                bar.n = done
                bar.refresh()
    bar.close()
    seconds = time.perf_counter() - t0
    return {
        "num_tokens": n_tokens,
        "num_documents": n_docs,
        "num_chars": n_chars,
        "dtype": np.dtype(dtype).name,
        "seconds": round(seconds, 3),
        "tokens_per_second": round(n_tokens / max(seconds, 1e-9)),
    }


def packed_cache_key(corpus, tokenizer, sep_id: int = SEP_ID) -> str:  # noqa: ANN001
    """The cache entry of a token stream: corpus content, the rule cutting it into lines (which changes the
    tokens when a bound changes), the tokenizer's full definition and the separator."""
    parts = [PACK_VERSION, corpus.fingerprint(), text_rule(), tokenizer_fingerprint(tokenizer)]
    src = json.dumps(parts if sep_id == SEP_ID else [*parts, sep_id])
    return hashlib.sha256(src.encode()).hexdigest()[:20]


def cache_entry(
    target: Path,
    problem: Callable[[Path], str | None],
    build: Callable[[Path], dict],
    what: str,
    redo: str,
    entry: str,
) -> dict | None:
    """A cache folder made once and shared by every process. One that `problem` finds damaged is removed (a
    warning says `what` and `redo`) and made again, never trusted; a missing one is built by `build(tmp)` in a
    temporary sibling folder, which, with the dict it returns as `meta.json`, is moved into place in one rename (a
    process that finishes first wins; theirs is identical). Returns that dict when this call made the entry, None
    when it reused one. A failed write removes the partial files and names the entry (`entry`)."""
    if os.path.lexists(target / "meta.json"):
        found = problem(target)
        if found is not None:  # a damaged cache entry is rebuilt, never trusted
            print(f"warning: {what} {target}: {found}; {redo}", file=sys.stderr, flush=True)
            shutil.rmtree(target, ignore_errors=True)
    if (target / "meta.json").exists():
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    kept = f"{entry} {target} was not made (partial files removed): free space or use another --cache-dir"
    try:
        with failed_writes_reported(tmp, kept):
            meta = build(tmp)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            try:
                os.replace(tmp, target)
            except OSError:  # another process finished first; theirs is identical
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def load_or_build_packed(
    corpus,  # noqa: ANN001 - tupe.data.corpus.Corpus
    tokenizer,  # noqa: ANN001
    block_size: int,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    log=print,  # noqa: ANN001
    sep_id: int = SEP_ID,
) -> PackedCorpus:
    """Return the packed corpus, tokenizing only if no cached stream exists for (corpus, tokenizer)."""
    if block_size < 2:
        raise TupeError(f"block size (max length) must be at least 2, got {block_size}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = packed_cache_key(corpus, tokenizer, sep_id)
    target = cache_dir / "packed" / key

    def build(tmp: Path) -> dict:
        log(f"data: tokenizing {corpus.describe()}")
        meta = encode_to_stream(corpus, tokenizer, tmp / "stream.bin", progress=progress, sep_id=sep_id)
        meta.update(
            stream_sha256=sha256_file(tmp / "stream.bin"),
            corpus=corpus.describe(),
            corpus_fingerprint=corpus.fingerprint(),
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            text_rule=text_rule(),
            version=PACK_VERSION,
        )
        return meta

    meta = cache_entry(
        target, packed_problem, build, "cached token stream", "tokenizing again", "the data cache entry"
    )
    if meta is not None:
        log(
            f"data: {meta['num_tokens']:,} tokens from {meta['num_documents']:,} documents in {meta['seconds']:.1f} s "
            f"({meta['tokens_per_second']:,} tokens/s), cached in {target}"
        )
    else:
        log(f"data: reusing cached token stream {target}")
    return PackedCorpus.open(target, block_size)
