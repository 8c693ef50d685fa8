"""Finding and reading a pre-training corpus.

A corpus is a list of *sources*: plain-text files (`.gz` allowed), folders of them (read recursively), glob patterns,
parquet and JSON / JSON-lines files (rows of `--text-column`), a `datasets` dataset saved with `save_to_disk`, or a
`datasets` name (`NAME[:CONFIG]`) from the local cache (tupe/data/tables.py reads the last four with `datasets`).
Text is read as a stream of lines in bounded chunks so a corpus larger than memory works, and every problem
(missing, empty, not UTF-8, no such column) is a one-line `TupeError` naming the file or dataset.

Document boundaries (where the packer puts a [SEP]): a blank line or the end of a file; for rows (a dataset,
parquet, JSON) each row is one document. The built-in default corpus stores one paragraph per line and one book per file, so there
one book is one document, as in RoBERTa's input format (one sentence or paragraph per line, blank line between
documents).
"""

from __future__ import annotations

import functools
import glob
import gzip
import hashlib
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tupe.data import tables
from tupe.errors import TupeError

DEFAULT_CORPUS_DIR = Path(__file__).parent / "default_corpus"
BUILTIN_EVAL_TEXT = "built-in"  # the name `--eval-text` takes for the text below
DEFAULT_EVAL_TEXT_DIR = (
    Path(__file__).parent / "eval_text"
)  # out-of-domain text, never trained on (PROVENANCE.md)
_READ_CHUNK = 8 << 20  # bytes per read; lines never straddle chunks (we cut at the last newline)
_TEXT_SUFFIXES_SKIPPED = {".md"}  # PROVENANCE.md and similar notes next to a corpus are not training text
# Bounds that keep memory and time independent of line length: a line longer than MAX_LINE_CHARS is split (at a
# space when one is near) into several lines of one document, and a run of MAX_WORD_CHARS characters without
# whitespace is cut, before tokenizer training and encoding (the built-in corpus's longest line is 12,603 chars).
MAX_LINE_CHARS = 16384
MAX_WORD_CHARS = 256
_BATCH_CHARS = 4 << 20  # characters per batch of lines handed to the tokenizer
TEXT_RULE_VERSION = "lines-v1"  # bump when the way text becomes lines changes in a way the bounds do not show
_BINARY_MAGIC = {
    b"\x7fELF": "an ELF executable",
    b"MZ\x90\x00": "a Windows executable",
    b"\xca\xfe\xba\xbe": "a Java class or Mach-O file",
    b"\xcf\xfa\xed\xfe": "a Mach-O executable",
    b"PK\x03\x04": "a zip archive",
    b"%PDF-": "a PDF file",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"SQLite format 3\x00": "an SQLite database",
}


@dataclass
class Corpus:
    """Resolved corpus: text files, saved `datasets` folders, parquet/JSON files and cached dataset names, each in
    a fixed (sorted) order."""

    files: list[Path] = field(default_factory=list)
    datasets: list[Path] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)  # parquet / JSON / JSON-lines files
    names: list[str] = field(default_factory=list)  # NAME[:CONFIG] in the local `datasets` cache
    text_column: str = "text"
    name: str = ""
    skip_bad_text: bool = False  # drop lines that are not UTF-8 (with a warning) instead of stopping

    @property
    def total_bytes(self) -> int:
        """Bytes on disk of the text files (compressed size for `.gz`); used for progress bars only."""
        return sum(p.stat().st_size for p in self.files)

    def fingerprint(self) -> str:
        """Content hash of the whole corpus (not of its paths), so identical text reuses the same caches."""
        h = hashlib.sha256(b"tupe-corpus-v1")
        if self.skip_bad_text:  # the same bytes read another way are other data: keep the caches apart
            h.update(b"skip-bad-text")
        for path in self.files:
            fh = hashlib.sha256()
            with _open_raw(path) as f:
                while chunk := f.read(1 << 22):
                    fh.update(chunk)
            h.update(b"file:" + fh.digest())
        for path in self.datasets:
            ds = tables.open_saved(path)
            h.update(f"dataset:{ds._fingerprint}:{self.text_column}".encode())
        for path in self.tables:
            fh = hashlib.sha256()
            with _open_raw(path) as f:
                while chunk := f.read(1 << 22):
                    fh.update(chunk)
            h.update(b"table:" + fh.digest() + f":{path.suffix.lower()}:{self.text_column}".encode())
        for spec in self.names:
            ds = tables.open_cached(spec)
            h.update(f"cached:{ds._fingerprint}:{self.text_column}".encode())  # content, not the name
        return h.hexdigest()[:20]

    def describe(self) -> str:
        parts = []
        if self.files:
            parts.append(f"{len(self.files)} text file(s), {self.total_bytes / 1e6:.1f} MB")
        if self.tables:
            size = sum(p.stat().st_size for p in self.tables) / 1e6
            parts.append(f"{len(self.tables)} parquet/JSON file(s), {size:.1f} MB")
        if self.datasets:
            parts.append(f"{len(self.datasets)} saved dataset(s)")
        if self.names:
            parts.append("dataset " + ", ".join(self.names))
        column = f" (column {self.text_column!r})" if self.tables or self.datasets or self.names else ""
        return (self.name + ": " if self.name else "") + ", ".join(parts) + column

    def row_sources(self) -> Iterator[tuple[str, object]]:
        """(description, `datasets` dataset) of every source held in rows, in corpus order."""
        for path in self.datasets:
            yield f"dataset {path}", tables.open_saved(path)
        for path in self.tables:
            yield f"corpus file {path}", tables.open_file(path)
        for spec in self.names:
            yield f"dataset {spec}", tables.open_cached(spec)


def _files_in(folder: Path) -> list[Path]:
    """The text files under `folder`, recursively, following symbolic links to folders (a linked subfolder of a
    corpus is part of it) with loop protection: a folder already read (a link back up the tree, two links to one
    place) is skipped with a warning naming it."""
    out = []
    seen: set[tuple[int, int]] = set()
    for root, dirs, names in os.walk(folder, followlinks=True):
        try:
            st = os.stat(root)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            _warn_once(f"corpus folder {root}: a symbolic link to a folder already read; skipped (no loop)")
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in sorted(names):
            p = Path(root) / n
            if n.startswith(".") or p.suffix.lower() in _TEXT_SUFFIXES_SKIPPED:
                continue
            _check_regular(p)
            out.append(p)
    return out


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _check_regular(path: Path) -> None:
    """Only regular files (or links to them) are read: a FIFO, a device or a link to one would hang or never end."""
    try:
        st = os.stat(path)
    except OSError as err:
        link = " (a broken symbolic link)" if path.is_symlink() else ""
        raise TupeError(f"corpus file {path}{link}: cannot read it ({err.strerror or err})") from None
    if not stat.S_ISREG(st.st_mode):
        via = f" (a symbolic link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise TupeError(
            f"corpus path {path}{via} is {_kind(st.st_mode)}, not a regular file; only regular files are read"
        )


def resolve_corpus(
    sources: list[str] | str | None, text_column: str = "text", skip_bad_text: bool = False
) -> Corpus:
    """Turn user-given paths/folders/globs into a `Corpus`; `None` or `[]` means the built-in default corpus."""
    if sources is None or sources == []:
        corpus = resolve_corpus([str(DEFAULT_CORPUS_DIR)], text_column, skip_bad_text)
        corpus.name = "built-in default corpus"
        return corpus
    if isinstance(sources, str | os.PathLike):
        sources = [str(sources)]
    corpus = Corpus(text_column=text_column, skip_bad_text=skip_bad_text)
    seen: set[Path] = set()

    def add_file(f: Path) -> None:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            (corpus.tables if tables.is_table_file(f) else corpus.files).append(f)

    for src in sources:
        src = os.path.expanduser(str(src))
        if any(ch in src for ch in "*?[") and not os.path.lexists(src):  # an existing file's name is literal
            matches = sorted(Path(m) for m in glob.glob(src, recursive=True))
            if not matches:
                raise TupeError(f"corpus pattern {src!r} matches no file")
        else:
            path = Path(src)
            if not path.exists() and not path.is_symlink() and tables.looks_like_dataset_name(src):
                if src not in corpus.names:
                    tables.open_cached(src)  # not in the local cache: the one-line error now
                    corpus.names.append(src)
                continue
            if not path.exists():
                raise TupeError(f"corpus path not found: {src}")
            matches = [path]
        for m in matches:
            if tables.is_saved_dataset(m):
                corpus.datasets.append(m)
            elif m.is_dir():
                files = _files_in(m)
                if not files:
                    raise TupeError(f"corpus folder {m} holds no text file")
                for f in files:
                    add_file(f)
            else:
                _check_regular(m)
                add_file(m)
    if not corpus.files and not corpus.datasets and not corpus.tables and not corpus.names:
        raise TupeError(f"corpus {sources!r} holds no text")
    for what, ds in corpus.row_sources():  # a missing --text-column: before any work starts
        tables.check_text_column(ds, corpus.text_column, what)
    return corpus


def _open_raw(path: Path):  # noqa: ANN202 - a binary file object
    """Open without blocking (a FIFO swapped in after the folder was listed would block `open`) and check that what
    was opened is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise TupeError(f"cannot read corpus file {path}: {err.strerror or err}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TupeError(
                f"corpus path {path} is {_kind(mode)}, not a regular file; only regular files are read"
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_binary(path: Path):  # noqa: ANN202 - a binary file object
    raw = _open_raw(path)
    if path.suffix == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def _sniff_binary(head: bytes) -> str | None:
    """What a file that is not text looks like (magic number, NUL bytes, control characters), or None."""
    for magic, what in _BINARY_MAGIC.items():
        if head.startswith(magic):
            return what
    sample = head[:65536]
    if b"\x00" in sample:
        return None  # reported as a NUL byte at its offset by the UTF-8 check
    controls = sum(1 for b in sample if b < 32 and b not in b"\t\n\r\f\v\x1b")
    if sample and controls > max(8, len(sample) // 100):
        return f"binary data ({controls} control bytes in the first {len(sample)})"
    return None


def text_rule() -> str:
    """How text becomes the lines the tokenizer sees (universal line ends, stripped lines, blank line = end of
    document, the read chunk and the line and word bounds). Part of every cache key made from a corpus (trained
    BPE, packed stream): the same bytes cut by another rule are other tokens, so a changed bound never reuses a
    cache entry made under the old one."""
    return f"{TEXT_RULE_VERSION}:chunk={_READ_CHUNK}:line={MAX_LINE_CHARS}:word={MAX_WORD_CHARS}"


@functools.lru_cache(maxsize=4)
def _long_word(n: int) -> re.Pattern[str]:
    """A run of `n` characters without whitespace, starting a word."""
    return re.compile(r"(?<!\S)\S{" + str(n) + "}")


def split_long_line(line: str) -> list[str]:
    """Cut a line into pieces of at most MAX_LINE_CHARS (at a space when one is in the second half), and a run
    of MAX_WORD_CHARS characters without whitespace into pieces of that length: tokenizer memory and time then do
    not depend on how long a line or a "word" is. Lines within the bounds are returned as they are."""
    long_word = _long_word(MAX_WORD_CHARS)
    if len(line) <= MAX_WORD_CHARS or (len(line) <= MAX_LINE_CHARS and not long_word.search(line)):
        return [line]
    out: list[str] = []
    i, n = 0, len(line)
    while i < n:
        j = min(i + MAX_LINE_CHARS, n)
        m = long_word.search(line[i:j])
        if m is not None:
            if m.start() > 0:
                j = i + m.start()
            else:
                j = i + MAX_WORD_CHARS
        elif j < n:
            k = line.rfind(" ", i + MAX_LINE_CHARS // 2, j)
            if k > i:
                j = k
        piece = line[i:j].strip()
        if piece:
            out.append(piece)
        i = j
    return out


_warned: set[str] = set()  # one warning per file and process, although a corpus is read twice (BPE, packing)


def _decode_skipping(body: bytes, offset: int) -> tuple[str, int, int]:
    """Decode line by line, dropping lines that are not UTF-8: (text, lines dropped, offset of the first bad byte)."""
    kept: list[str] = []
    dropped, first, pos = 0, -1, 0
    for raw in body.split(b"\n"):
        try:
            if b"\x00" in raw:
                raise UnicodeDecodeError("utf-8", raw, raw.index(b"\x00"), raw.index(b"\x00") + 1, "NUL byte")
            kept.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            dropped += 1
            first = offset + pos + err.start if first < 0 else first
        pos += len(raw) + 1
    return "\n".join(kept), dropped, first


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _line_cut(data: bytes) -> int | None:
    """Where to cut `data` (a chunk and what was pending) after its last line end; None: no line end yet and less
    than a chunk, keep reading. Universal line ends: \\n, \\r\\n and a lone \\r (old Mac files); a \\r at the
    very end is held back in case the next chunk starts with its \\n."""
    cut = max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1
    if cut == 0:
        if len(data) < _READ_CHUNK:
            return None
        # a line longer than the chunk: cut it (at a space if there is one, else before a UTF-8 lead byte), so
        # memory stays bounded; `split_long_line` bounds the pieces further
        cut = data.rfind(b" ", len(data) // 2) + 1
        if cut == 0:
            cut = len(data) - 1
            while cut > len(data) - 4 and 0x80 <= data[cut] < 0xC0:
                cut -= 1
    return cut


def _decode_lines(path: Path, body: bytes, offset: int, skip_bad_text: bool) -> tuple[str, int, int]:
    """(text, lines dropped, offset of the first dropped) of `body`, which starts at byte `offset` of the file: not
    UTF-8 (or a NUL byte) is one line naming the offset, or with `skip_bad_text` those lines are dropped."""
    nul = body.find(b"\x00")  # valid UTF-8, but never in text: a binary file, or UTF-16 without BOM
    try:
        text = body.decode("utf-8") if nul < 0 else body[:nul].decode("utf-8")
        if nul >= 0:
            raise UnicodeDecodeError("utf-8", body, nul, nul + 1, "NUL byte")
    except UnicodeDecodeError as err:
        if not skip_bad_text:
            raise TupeError(
                f"corpus file {path} is not UTF-8 text: invalid byte 0x{body[err.start]:02x} at byte offset "
                f"{offset + err.start}{' (decompressed)' if path.suffix == '.gz' else ''}; fix or remove "
                "it, or pass --skip-bad-text to drop lines that are not UTF-8"
            ) from None
        return _decode_skipping(body, offset)
    return text, 0, -1


def iter_file_lines(path: Path, skip_bad_text: bool = False) -> Iterator[list[str]]:
    """Yield lists of lines of one file (decoded, CRLF removed), reading bounded chunks.

    Raises a one-line `TupeError` with the byte offset (in the decompressed stream for `.gz`) if the file is not
    UTF-8, and one if it holds no text at all. With `skip_bad_text`, lines that are not UTF-8 are dropped instead,
    with one warning per file (count and first offset); a file with no UTF-8 text at all is then skipped.
    """
    offset = 0  # byte offset of `pending` in the (decompressed) file
    pending = b""
    any_text = False
    dropped, first_bad = 0, -1
    with _open_binary(path) as fh:
        while True:
            try:
                chunk = fh.read(_READ_CHUNK)
            except (OSError, EOFError, gzip.BadGzipFile) as err:
                raise TupeError(f"cannot read corpus file {path}: {err}") from err
            if offset == 0 and not pending:
                what = _sniff_binary(chunk)
                if what is not None:
                    if not skip_bad_text:
                        raise TupeError(
                            f"corpus file {path} is {what}, not text; remove it, or pass --skip-bad-text to skip it"
                        )
                    _warn_once(f"corpus file {path}: {what}, not text; file skipped")
                    return
            data = pending + chunk
            if not data:
                break
            if chunk:
                cut = _line_cut(data)
                if cut is None:  # no line end yet: keep reading
                    pending = data
                    continue
                body, pending = data[:cut], data[cut:]
            else:
                body, pending = data, b""
            if offset == 0 and body.startswith(b"\xef\xbb\xbf"):
                body = body[3:]
                offset = 3
            text, n_bad, first = _decode_lines(path, body, offset, skip_bad_text)
            if n_bad:
                dropped += n_bad
                first_bad = first if first_bad < 0 else first_bad
            offset += len(body)
            lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            if not any_text and any(ln.strip() for ln in lines):
                any_text = True
            yield lines
            if not chunk:
                break
    if dropped:
        where = f"byte offset {first_bad}{' (decompressed)' if path.suffix == '.gz' else ''}"
        what = f"skipped {dropped} line(s) that are not UTF-8 (first at {where})"
        _warn_once(f"corpus file {path}: {what}" + ("; no text left, file skipped" if not any_text else ""))
        if not any_text:
            return
    if not any_text:
        raise TupeError(f"corpus file {path} is empty (no text)")


def _json_kind(value: object) -> str:
    """`null`, `a number 5`, `a list`: what a row holds instead of text, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool | int | float):
        return f"a number {value!r}" if not isinstance(value, bool) else f"a boolean {value!r}"
    return {list: "a list", dict: "an object"}.get(type(value), f"a {type(value).__name__}")


def _row_line(what: str, index: int) -> int | None:
    """The line of a JSON-lines corpus file that holds its `index`-th record (blank lines are not records), or
    None for other sources (CSV, parquet, `datasets` folders: rows)."""
    prefix = "corpus file "
    path = Path(what.removeprefix(prefix))
    if not what.startswith(prefix) or path.suffix.lower() != ".jsonl":
        return None
    try:
        with open(path, "rb") as fh:
            seen = -1
            for number, line in enumerate(fh, 1):
                seen += bool(line.strip())
                if seen == index:
                    return number
    except OSError:
        pass
    return None


def _row_place(what: str, index: int) -> str:
    """`corpus file F.jsonl:LINE`, else `WHAT row N` (1-based)."""
    line = _row_line(what, index)
    return f"{what}:{line}" if line is not None else f"{what} row {index + 1}"


def iter_line_batches(
    corpus: Corpus, batch_lines: int = 20000
) -> Iterator[tuple[list[str], list[bool], int]]:
    """Yield `(lines, ends_document, bytes_done)`: non-empty stripped lines, whether each closes a document.

    A document ends at a blank line, at the end of a file and at the end of a dataset row. `bytes_done` is the
    progress in on-disk bytes of the text files (for progress bars).
    """
    lines_out: list[str] = []
    ends: list[bool] = []
    done = 0
    n_chars = 0  # a batch is also bounded in characters (long lines make few lines a lot of text)
    for path in corpus.files:
        for lines in iter_file_lines(path, corpus.skip_bad_text):
            for raw in lines:
                s = raw.strip()
                if s:
                    for piece in split_long_line(s):
                        lines_out.append(piece)
                        n_chars += len(piece)
                        ends.append(False)
                elif ends and not ends[-1]:
                    ends[-1] = True
            if len(lines_out) > batch_lines or (n_chars > _BATCH_CHARS and len(lines_out) > 1):
                # hold the last line back: it may still turn out to close the document (end of file)
                yield lines_out[:-1], ends[:-1], done
                lines_out, ends = lines_out[-1:], ends[-1:]
                n_chars = len(lines_out[0])
        if ends:
            ends[-1] = True
        done += path.stat().st_size
        if len(lines_out) >= batch_lines or n_chars > _BATCH_CHARS:
            yield lines_out, ends, done
            lines_out, ends, n_chars = [], [], 0
    for what, ds in corpus.row_sources():
        n_rows = 0
        index = -1
        bad: list[
            int
        ] = []  # rows whose text is not a string (null, a number, a list), dropped by --skip-bad-text
        for texts in tables.iter_texts(ds, corpus.text_column, what):
            for row in texts:
                index += 1
                if not isinstance(row, str):
                    if not corpus.skip_bad_text:
                        raise TupeError(
                            f"{_row_place(what, index)}: {corpus.text_column!r} is {_json_kind(row)}, not text; fix or "
                            "remove the row, or pass --skip-bad-text to drop rows that are not text"
                        )
                    bad.append(index)
                    continue
                row_lines = [
                    p for s in (ln.strip() for ln in row.split("\n")) if s for p in split_long_line(s)
                ]
                if row_lines:
                    n_rows += 1
                    lines_out.extend(row_lines)
                    ends.extend([False] * (len(row_lines) - 1) + [True])
            if len(lines_out) >= batch_lines:
                yield lines_out, ends, done
                lines_out, ends = [], []
        if bad:
            _warn_once(
                f"{what}: skipped {len(bad)} row(s) whose {corpus.text_column!r} is not text (first at "
                + (f"line {line})" if (line := _row_line(what, bad[0])) is not None else f"row {bad[0] + 1})")
            )
        if n_rows == 0:
            raise TupeError(f"{what} is empty (no text in column {corpus.text_column!r})")
    if lines_out:
        yield lines_out, ends, done
