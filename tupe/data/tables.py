"""Corpus text held in rows, read with the `datasets` library: a dataset saved with `save_to_disk`, parquet and
JSON / JSON-lines files (streamed, so nothing is copied into a cache), and a dataset named as on the Hub
(`NAME` or `NAME:CONFIG`) taken from the local `datasets` cache only.

Only the local cache is used for a name, as with `HF_DATASETS_OFFLINE=1`: a command never downloads, and a name
that is not there is a one-line error saying so. A dataset gets into the cache the usual way, by
`datasets.load_dataset(NAME)` once where the Hub is reachable (or by copying `~/.cache/huggingface/datasets`).
Each row of the text column is one document.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tupe.errors import TupeError, one_line

# suffix -> `datasets` builder that reads it (".arrow": a file of a `save_to_disk` folder, Arrow's stream format)
TABLE_SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow"}
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?$")
_TEXT_SUFFIXES = {".txt", ".gz", ".text", ".md", ".csv", ".tsv"}  # a missing file, not a dataset name


def is_table_file(path: Path) -> bool:
    """A parquet, JSON or Arrow file: read as rows of a text column, not as lines of text."""
    return path.suffix.lower() in TABLE_SUFFIXES


def is_saved_dataset(path: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    return path.is_dir() and any((path / n).exists() for n in ("state.json", "dataset_dict.json"))


def looks_like_dataset_name(spec: str) -> bool:
    """`wikitext`, `Salesforce/wikitext`, `Salesforce/wikitext:wikitext-2-raw-v1`: a Hub name, optionally with a
    configuration; never something with a text or table file suffix (that is a misspelled path)."""
    return bool(_NAME.match(spec)) and Path(spec.partition(":")[0]).suffix.lower() not in (
        _TEXT_SUFFIXES | set(TABLE_SUFFIXES)
    )


@contextlib.contextmanager
def _datasets_quiet_offline() -> Iterator[Any]:
    """The `datasets` module in offline mode and without its own log lines (every failure becomes our one-line
    error; "Using the latest cached version" is what was asked for, not news), both restored afterwards."""
    import datasets
    import huggingface_hub.constants as hub

    saved = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE, datasets.logging.get_verbosity())
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield datasets
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved[:2]
        datasets.logging.set_verbosity(saved[2])


def _train_split(ds: Any, what: str) -> Any:  # noqa: ANN401 - a datasets (Iterable)Dataset(Dict)
    import datasets

    if isinstance(ds, datasets.DatasetDict | datasets.IterableDatasetDict):
        if not ds:
            raise TupeError(f"{what} has no split")
        return ds["train" if "train" in ds else next(iter(ds))]
    return ds


def open_saved(path: Path) -> Any:  # noqa: ANN401 - datasets.Dataset
    """A dataset saved with `save_to_disk` (its train split, or its first)."""
    with _datasets_quiet_offline() as datasets:
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as err:  # noqa: BLE001 - any failure here is a bad user path
            raise TupeError(f"{path}: cannot load as a `datasets` dataset ({one_line(err)})") from err
    return _train_split(ds, str(path))


def open_file(path: Path) -> Any:  # noqa: ANN401 - datasets.IterableDataset
    """A parquet, JSON / JSON-lines or Arrow file, streamed by the `datasets` reader of its kind. An Arrow file
    (one of a `save_to_disk` folder's `data-*.arrow`) is read as rows; one `datasets` cannot read is refused
    naming its folder, which is what to pass."""
    builder = TABLE_SUFFIXES[path.suffix.lower()]
    if builder == "json":
        from tupe.io.reading import check_json_rows

        check_json_rows(path, "corpus file")  # null or a number would crash datasets' reader (a segfault)
    with _datasets_quiet_offline() as datasets:
        try:
            ds = datasets.load_dataset(builder, data_files=[str(path)], split="train", streaming=True)
        except Exception as err:  # noqa: BLE001 - not parquet / not JSON: one line naming the file
            hint = ""
            if builder == "arrow" and is_saved_dataset(path.parent):
                hint = f"; pass the dataset's folder {path.parent} (written by save_to_disk) instead"
            raise TupeError(
                f"corpus file {path}: cannot read it as {builder}: {one_line(err)}{hint}"
            ) from None
    if builder == "json":
        _JSON_FILES[ds] = path
    return ds


_JSON_FILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a streamed JSON dataset -> its file


def _read_error(ds: Any, what: str, err: Exception) -> TupeError:  # noqa: ANN401
    """The one-line error for a failure while reading rows: for a JSON-lines file, the real line number of the
    first line that is not JSON (the reader names only a row of its current block)."""
    try:
        path = _JSON_FILES.get(ds)
    except TypeError:  # not weak-referenceable or not hashable: not one of ours
        path = None
    if path is not None:
        from tupe.io.reading import first_bad_json_line

        try:
            bad = first_bad_json_line(path, "corpus file")
        except TupeError:
            bad = None
        if bad is not None:
            return TupeError(f"{what}:{bad[0]}: not JSON ({bad[1]})")
    return TupeError(f"{what}: cannot read it: {one_line(err)}")


def cache_dir() -> str:
    """Where `datasets` keeps prepared datasets (HF_DATASETS_CACHE)."""
    import datasets

    return str(datasets.config.HF_DATASETS_CACHE)


def open_cached(spec: str) -> Any:  # noqa: ANN401 - datasets.Dataset
    """`NAME[:CONFIG]` from the local `datasets` cache (its train split, or its first); never downloads."""
    name, _, config = spec.partition(":")
    with _datasets_quiet_offline() as datasets:
        try:
            ds = datasets.load_dataset(name, config or None)
        except (ConnectionError, FileNotFoundError) as err:
            raise TupeError(
                f"--corpus {spec}: no such file or folder, and no dataset {name!r} in the local `datasets` cache "
                f"({cache_dir()}); nothing is downloaded here: run datasets.load_dataset({name!r}"
                f"{', ' + repr(config) if config else ''}) once where the Hub is reachable, or point "
                "HF_DATASETS_CACHE at a cache that holds it"
            ) from err
        except Exception as err:  # noqa: BLE001 - e.g. a configuration that is not cached: one line
            raise TupeError(f"--corpus {spec}: {one_line(err)}") from None
    return _train_split(ds, spec)


def column_names(ds: Any, what: str) -> list[str]:  # noqa: ANN401
    """The columns of a dataset; for a JSON stream (no schema up front), those of its first rows."""
    names = ds.column_names
    if names is None:
        with _datasets_quiet_offline():
            try:
                first = next(iter(ds.iter(batch_size=1)), {})
            except Exception as err:  # noqa: BLE001 - a malformed file
                raise _read_error(ds, what, err) from None
        names = list(first)
    return list(names)


def check_text_column(ds: Any, column: str, what: str) -> None:  # noqa: ANN401
    """A clear error before any work starts when the text column is missing."""
    names = column_names(ds, what)
    if column not in names:
        raise TupeError(
            f"{what} has no column {column!r} (columns: {', '.join(names) or 'none'}); pick one with --text-column"
        )


def iter_texts(ds: Any, column: str, what: str, batch_size: int = 2000) -> Iterator[list[Any]]:  # noqa: ANN401
    """Batches of the text column's values (rows that are not strings are returned as they are). The offline,
    quiet `datasets` settings hold while a batch is read, not while the caller works on it."""
    check_text_column(ds, column, what)
    with _datasets_quiet_offline():
        batches = iter(ds.iter(batch_size=batch_size))
    while True:
        with _datasets_quiet_offline():
            try:
                batch = next(batches, None)
            except Exception as err:  # noqa: BLE001 - a malformed row further down a file
                raise _read_error(ds, what, err) from None
        if batch is None:
            return
        yield batch[column]
