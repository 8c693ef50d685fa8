"""Bounded, non-blocking reads of every file tupe reads back (run records, metrics, results, caches, configs).

Why: a run folder or a model folder is user-controlled. A FIFO named `metrics.jsonl` blocks `open()` forever, a
link to `/dev/zero` is endless, a 4 GB `results.json` exhausts memory, a 200,000-deep JSON array overflows the
parser's stack. Every reader here opens regular files only (checked with `os.stat` before `open`, opened with
`O_NONBLOCK` so nothing can block even if the file is swapped in between, checked again with `fstat`), reads at
most a size limit from files that can only be small, and streams line by line with a per-line limit where files
can be large. Every refusal is a one-line `TupeError` naming the file.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tupe.errors import TupeError

KiB, MiB = 1 << 10, 1 << 20
RECORD_LIMIT = 8 * MiB  # tupe_run.json, tupe_files.json, one GLUE run's result.json, meta.json, manifests
CONFIG_LIMIT = 8 * MiB  # a model's config.json, tokenizer_config.json, special_tokens_map.json
RESULTS_LIMIT = 256 * MiB  # results.json of a GLUE grid, analysis.json, compare summaries
TOKENIZER_LIMIT = 512 * MiB  # tokenizer.json, vocab.txt (a 250 k-entry vocabulary is about 20 MB)
LINE_LIMIT = 16 * MiB  # one line of metrics.jsonl or of a JSONL input file


class Refused(TupeError):
    """A file tupe will not read at all (not a regular file, or far too large): unlike garbage content, which a
    caller may treat as 'not written yet', this always stops the command."""


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """'a FIFO (named pipe)', 'a character device', ... for a non-regular file's `st_mode`."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # pragma: no cover


def check_regular(path: str | os.PathLike, what: str = "file") -> os.stat_result:
    """`os.stat` of `path` (following links), refusing anything but a regular file in one line naming it."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise TupeError(f"{path}: cannot read the {what} ({err.strerror or err})") from None
    if not stat.S_ISREG(st.st_mode):
        raise Refused(
            f"{path}: {kind_of(st.st_mode)}, not a regular file ({what}); tupe reads only regular files"
        )
    return st


def open_regular(path: str | os.PathLike, what: str = "file") -> IO[bytes]:
    """Open a regular file for reading in binary mode without ever blocking (see the module docstring)."""
    check_regular(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise TupeError(f"{path}: cannot read the {what} ({err.strerror or err})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
        os.close(fd)
        raise Refused(
            f"{path}: {kind_of(st.st_mode)}, not a regular file ({what}); tupe reads only regular files"
        )
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: str | os.PathLike, limit: int = RECORD_LIMIT, what: str = "file") -> bytes:
    """The bytes of a regular file that must be smaller than `limit`."""
    with open_regular(path, what) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Refused(
            f"{path}: larger than {human_bytes(limit)}, far more than a {what} holds; is it the right file?"
        )
    return data


def decode_utf8(data: bytes, path: str | os.PathLike, what: str = "file") -> str:
    """UTF-8 (a BOM allowed) or a one-line error naming the file and the byte offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TupeError(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}; {what})"
        ) from None


def read_text(path: str | os.PathLike, limit: int = RECORD_LIMIT, what: str = "file") -> str:
    """The UTF-8 text of a regular file smaller than `limit`."""
    return decode_utf8(read_bytes(path, limit, what), path, what)


def line_ends(text: str) -> str:
    """`text` with every line ending as "\n": "\r\n" (Windows) always; a lone "\r" (old Mac) when the text has no
    "\n" at all. Not str.splitlines: it would also end lines at form feeds and Unicode separators inside a
    sentence, and a lone "\r" inside a line of a "\n" file stays part of that line."""
    if "\r" not in text:
        return text
    if "\n" not in text:
        return text.replace("\r", "\n")
    return text.replace("\r\n", "\n")


_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}


def json_type_name(value: Any) -> str:  # noqa: ANN401
    """How JSON calls the type of `value`: 'an object', 'a list', 'a number', 'null', ..."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def parse_json(text: str, path: str | os.PathLike, what: str = "file", expect: type | None = dict) -> Any:  # noqa: ANN401
    """`json.loads` with one-line errors naming the file: invalid JSON (line and column), nesting too deep for
    the parser, or a value of another type than `expect` (None: any)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise TupeError(f"{path}:{err.lineno}: not valid JSON ({err.msg}; {what})") from None
    except RecursionError:
        raise TupeError(f"{path}: JSON nested too deeply to be read ({what})") from None
    if expect is not None and not isinstance(value, expect):
        want = "an object" if expect is dict else json_type_name(expect())
        raise TupeError(f"{path}: expected {want} ({what}), got {json_type_name(value)}")
    return value


def read_json(
    path: str | os.PathLike, what: str = "file", limit: int = RECORD_LIMIT, expect: type | None = dict
) -> Any:  # noqa: ANN401
    """A small JSON file, read with `read_text` (regular file, at most `limit` bytes) and `parse_json`."""
    return parse_json(read_text(path, limit, what), path, what, expect)


def iter_lines(
    path: str | os.PathLike, what: str = "file", line_limit: int = LINE_LIMIT
) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its end) of a regular file of any size, streamed; a line longer than
    `line_limit` is a one-line error naming the file and the line."""
    with open_regular(path, what) as fh:
        lineno = 0
        while True:
            line = fh.readline(line_limit + 1)
            if not line:
                return
            lineno += 1
            if len(line) > line_limit and not line.endswith(b"\n"):
                raise Refused(
                    f"{path}:{lineno}: a line longer than {human_bytes(line_limit)} ({what}); is it the right file?"
                )
            yield lineno, line.rstrip(b"\r\n")


def check_folder_files(folder: str | os.PathLike, names: tuple[str, ...], what: str = "model folder") -> None:
    """Every entry of `names` that exists in `folder` is a regular file (checked before a library opens it,
    since `transformers` and `tokenizers` would block on a FIFO or read a device without end)."""
    folder = Path(folder)
    for name in names:
        p = folder / name
        if os.path.lexists(p):
            check_regular(p, f"{what}'s {name}")


def check_json_rows(path: str | os.PathLike, what: str = "JSON file", head: int = 1 << 20) -> None:
    """Before `datasets` reads a `.json`/`.jsonl` file: a regular file whose values are JSON objects (a list of
    them, or one per line). `datasets`' JSON reader crashes the process (a segmentation fault, no message) on a
    file holding `null`, and fails with a traceback on a number or a string; checked on the first `head` bytes."""
    with open_regular(path, what) as fh:
        data = fh.read(head)
    complete = len(data) < head
    text = data.decode("utf-8-sig", errors="replace")
    body = text.lstrip()
    want = "JSON objects (one per line, or a list of them)"
    if not body:
        raise TupeError(f"{path}: empty ({what}); expected {want}")
    if body[0] == "[":
        rest = body[1:].lstrip()
        if rest and rest[0] not in "{]":
            raise TupeError(f"{path}: a list of {_first_value(rest)}, expected {want}")
        return
    if body[0] != "{":
        raise TupeError(f"{path}: {_first_value(body)}, expected {want}")
    lines = text.split("\n")
    if not complete:
        lines = lines[:-1]  # possibly cut by the head limit
    try:
        first = json.loads(lines[0]) if lines else None
    except (ValueError, RecursionError):
        return  # one object over several lines (pretty-printed): the reader's own errors name the file
    if not isinstance(first, dict):
        return
    for lineno, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("{"):
            raise TupeError(f"{path}:{lineno}: {_first_value(stripped)}, expected a JSON object on each line")


def _first_value(text: str) -> str:
    """'null', 'a number', ... for the JSON value `text` starts with (for messages)."""
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return f"not JSON ({text[:20]!r})"
    return json_type_name(value)


PARQUET_FOOTER_LIMIT = 64 * MiB  # a parquet footer (the schema and row-group index) is kilobytes in practice
PARQUET_ROW_GROUP_LIMIT = (
    2 << 30
)  # uncompressed bytes of one row group: `datasets` materialises a whole group


def check_parquet(path: str | os.PathLike, what: str = "parquet file") -> list[str]:
    """Before `datasets` reads a `.parquet` file: a regular file whose footer is a parquet footer of sane size,
    with no row group too large to hold in memory. Only the footer is read (bounded); returns the column names,
    so that callers can refuse a file without their columns before any row is read."""
    import pyarrow.parquet as pq

    st = check_regular(path, what)
    with open_regular(path, what) as fh:
        if st.st_size < 12:
            raise TupeError(f"{path}: cannot read it as parquet: {st.st_size} bytes, too short ({what})")
        fh.seek(st.st_size - 8)
        tail = fh.read(8)
        if tail[4:] != b"PAR1":
            raise TupeError(f"{path}: cannot read it as parquet: no PAR1 footer ({what})")
        footer = int.from_bytes(tail[:4], "little")
        if footer > min(PARQUET_FOOTER_LIMIT, st.st_size - 12):
            raise Refused(
                f"{path}: cannot read it as parquet: a footer of {human_bytes(footer)}, damaged ({what})"
            )
        fh.seek(0)
        try:
            meta = pq.ParquetFile(fh).metadata
            names = list(meta.schema.to_arrow_schema().names)
        except Exception as err:  # noqa: BLE001 - a damaged footer: one line naming the file
            from tupe.errors import one_line

            raise TupeError(f"{path}: cannot read it as parquet: {one_line(err)}") from None
    for i in range(meta.num_row_groups):
        size = meta.row_group(i).total_byte_size
        if size > PARQUET_ROW_GROUP_LIMIT:
            raise Refused(
                f"{path}: row group {i} holds {human_bytes(size)} uncompressed, more than "
                f"{human_bytes(PARQUET_ROW_GROUP_LIMIT)} ({what}); is it the right file?"
            )
    return names


def first_bad_json_line(path: str | os.PathLike, what: str = "JSON-lines file") -> tuple[int, str] | None:
    """(line number, reason) of the first non-blank line of a JSON-lines file that is not a JSON value, streamed;
    None when every line parses or the file is one JSON list. Why: `datasets`' reader reports a bad line as a row
    of the block it was parsing ("in row 1"), which is not where the user should look."""
    for lineno, raw in iter_lines(path, what):
        if not raw.strip():
            continue
        if lineno == 1 and raw.lstrip().startswith(b"["):
            return None
        try:
            json.loads(raw)
        except json.JSONDecodeError as err:
            return lineno, err.msg
        except (ValueError, RecursionError) as err:
            return lineno, type(err).__name__
    return None
