"""What a task family of `tupe finetune` provides to the shared grid: its reader, its encoding for the model, its
head, its metrics and its predictions. One subclass per family (ner.py, qa.py, choice.py, classification.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

from tupe.errors import TupeError


class Family:
    """A task family: the files it reads, how it encodes them, its head and how it scores predictions."""

    name: ClassVar[str]
    metrics: ClassVar[tuple[str, ...]]  # reported in results.json, x 100; the first picks the learning rate
    # (column, metric) of `tupe report`
    report_columns: ClassVar[tuple[tuple[str, str], ...]]
    auto_class: ClassVar[str]  # the transformers Auto class of the head

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    # -- data
    def read(self, path: Path) -> list[Any]:
        """The examples of one file; a file that is not this family's format is a one-line error."""
        raise NotImplementedError

    def check(self, train: list[Any], dev: list[Any], train_path: Path, dev_path: Path) -> None:
        """Refuse what cannot be scored (a validation label never seen in training)."""

    def label_names(self) -> list[str] | None:
        return None

    def fingerprint(self, train: list[Any], dev: list[Any]) -> str:
        """A hash of the exact examples, so resumed runs are known to be comparable."""
        h = hashlib.sha256()
        for name, examples in (("train", train), ("dev", dev)):
            h.update(name.encode())
            for ex in examples:
                record = dict(asdict(ex) if is_dataclass(ex) else ex)
                record.pop("where", None)  # where it was read from: moving the files changes nothing
                record.pop("line", None)
                h.update(json.dumps(record, sort_keys=True).encode() + b"\n")
        return h.hexdigest()

    # -- model
    def model_class(self) -> Any:
        import transformers

        import tupe.modeling  # noqa: F401  (registers the tupe classes with the Auto classes)

        return getattr(transformers, self.auto_class)

    def model_kwargs(self) -> dict[str, Any]:
        names = self.label_names()
        if names is None:
            return {}
        return {
            "num_labels": len(names),
            "id2label": dict(enumerate(names)),
            "label2id": {n: i for i, n in enumerate(names)},
        }

    def config_extras(self) -> dict[str, Any]:
        """Values set on the fine-tuned model's config (saved in its config.json), e.g. NER's pipeline
        aggregation strategy."""
        return {}

    def collator(self, tokenizer: Any) -> Any:
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    # -- encoding and scoring
    def encode_train(self, tokenizer: Any, examples: list[Any]) -> Any:
        """A `datasets.Dataset` of model inputs with labels."""
        raise NotImplementedError

    def encode_eval(self, tokenizer: Any, examples: list[Any]) -> tuple[Any, Any]:
        """(a `datasets.Dataset` with labels, for the validation loss, whatever `score` needs to map back)."""
        raise NotImplementedError

    def score(self, output: Any, aux: Any, examples: list[Any]) -> tuple[dict[str, float], list[dict]]:
        """(metrics x 100, one prediction record per validation example) from `Trainer.predict`'s output."""
        raise NotImplementedError

    def baseline(self, train: list[Any], dev: list[Any]) -> dict[str, Any]:
        """A trivial predictor's scores on the validation set, to read small models by."""
        return {}

    def describe_data(self, train: list[Any], dev: list[Any]) -> dict[str, Any]:
        return {}


def one_split(path: Path, what: str) -> Any:
    """A `datasets.Dataset` saved with `save_to_disk` (one split); a `DatasetDict` must be named by split."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - a damaged or foreign folder: one line for the user
        from tupe.errors import one_line

        raise TupeError(
            f"{path}: cannot load it as a dataset saved with save_to_disk: {one_line(err)}"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        raise TupeError(
            f"{path}: a DatasetDict with splits {', '.join(ds)}; give the split's own folder ({path}/train)"
        )
    if len(ds) == 0:
        raise TupeError(f"{path}: no {what}")
    return ds


DATA_LIMIT = 4 * 1024**3  # a training file larger than this is not a text file of examples


def read_text(path: Path) -> str:
    """A data file's text (a regular file, UTF-8, byte-order mark dropped, every line ending as "\n": `\n`,
    `\r\n` and CR-only `\r` files read the same); empty or unreadable is one line."""
    from tupe.io.reading import line_ends
    from tupe.io.reading import read_text as read_bounded

    text = line_ends(read_bounded(path, DATA_LIMIT, "data file"))
    if not text.strip():
        raise TupeError(f"{path}: empty file")
    return text


def json_records(path: Path, text: str) -> list[tuple[str, dict]]:
    """(location, record) of a JSON list/object of records or of JSON lines."""
    try:
        if path.suffix.lower() == ".jsonl":
            raise json.JSONDecodeError("JSON lines", text, 0)
        data = json.loads(text)
        if isinstance(data, dict):  # an object of records ({"0": {...}}), or one record
            data = list(data.values()) if all(isinstance(v, dict) for v in data.values()) else [data]
        if not isinstance(data, list):
            raise TupeError(f"{path}: expected JSON records (a list, or one object per line)")
        records = [(f"{path} record {i}", r) for i, r in enumerate(data)]
    except json.JSONDecodeError:
        records = []
        for lineno, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    records.append((f"{path}:{lineno}", json.loads(line)))
                except json.JSONDecodeError as err:
                    raise TupeError(f"{path}:{lineno}: not JSON ({err.msg})") from None
    for where, r in records:
        if not isinstance(r, dict):
            raise TupeError(f"{where}: expected a JSON object")
    return records


def csv_records(path: Path, text: str) -> list[tuple[str, dict]]:
    """(path:line, record) of a CSV file with a header."""
    from tupe.glue.tasks import csv_rows

    rows = csv_rows(path, text)
    header = [h.strip() for h in rows[0][1]]
    out = []
    for lineno, fields in rows[1:]:
        if fields == [""]:
            continue
        if len(fields) != len(header):
            raise TupeError(
                f"{path}:{lineno}: {len(fields)} comma-separated fields, the header has {len(header)}"
            )
        out.append((f"{path}:{lineno}", dict(zip(header, fields))))
    return out
