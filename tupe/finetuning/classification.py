"""Sentence (or sentence-pair) classification of users' own files: GLUE's readers and `[CLS] A [SEP] B [SEP]`
encoding (tupe/finetuning/glue/) on a task made from the files themselves, run by the pipeline `tupe glue` runs on
(tupe/finetuning/pipeline/) and summarised, like every `tupe finetune` family, by the mean over seeds. The text
is the `text` column (or `sentence`, `text_a`, `sentence1`, `premise`, `question`), a second text `text_b` (or
`sentence2`, `hypothesis`) makes pairs, and the label set is the training file's `label` values. Files: .csv, .tsv (quoting off), .json/.jsonl, .parquet, or a saved `datasets` split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.finetuning.family import Family, read_data_file
from tupe.finetuning.glue.encoding import encode_split, to_dataset
from tupe.finetuning.glue.tasks import ANY_LABEL, GlueTask, Split, read_split_file
from tupe.finetuning.metrics import accuracy

FIRST = ("text", "sentence", "text_a", "sentence1", "premise", "question")
SECOND = ("text_b", "sentence2", "hypothesis")


def _columns(path: Path) -> list[str]:
    """The column names of a file (its header, its first record's keys, or the dataset's columns)."""
    suffix = path.suffix.lower()
    if path.is_dir() or suffix == ".parquet":
        if path.is_dir():
            from tupe.finetuning.family import one_split

            return list(one_split(path, "examples").column_names)
        from tupe.io.reading import check_parquet

        return check_parquet(path, "data file")  # the footer's column names; no row read yet
    text = read_data_file(path)
    if suffix in {".json", ".jsonl"}:
        from tupe.finetuning.family import json_records

        return list(json_records(path, text)[0][1])
    from tupe.finetuning.glue.tasks import csv_rows, tsv_rows

    rows = csv_rows(path, text) if suffix == ".csv" else tsv_rows(text)
    return [h.strip() for h in rows[0][1]]


def _sort_key(label: str) -> tuple[int, float | str]:
    try:
        return (0, float(label))
    except ValueError:
        return (1, label)


class ClassificationFamily(Family):
    name = "classification"
    metrics = ("accuracy",)
    report_columns = (("CLS acc", "accuracy"),)
    auto_class = "AutoModelForSequenceClassification"

    def read(self, path: Path) -> list[Any]:
        columns = _columns(path)
        first = next((c for c in FIRST if c in columns), None)
        if first is None or "label" not in columns:
            raise TupeError(
                f"{path}: classification needs a `text` (or {', '.join(FIRST[1:])}) column and a `label` column "
                f"(has: {', '.join(columns)[:200]})"
            )
        second = next((c for c in SECOND if c in columns), None)
        task = GlueTask(
            name="classification", text_columns=(first, second) if second else (first,), tsv_labels=ANY_LABEL
        )
        split = read_split_file(task, path)
        return [
            {
                "text_a": split.text_a[i],
                "text_b": None if split.text_b is None else split.text_b[i],
                "label": split.labels[i],
                "where": f"{path}:{split.index[i]}" if not path.is_dir() else f"{path} row {split.index[i]}",
            }
            for i in range(len(split))
        ]

    def check(self, train: list[dict], dev: list[dict], train_path: Path, dev_path: Path) -> None:
        if (train[0]["text_b"] is None) != (dev[0]["text_b"] is None):
            raise TupeError(
                f"{dev_path}: sentence pairs in one file and single sentences in the other ({train_path})"
            )
        seen = {ex["label"] for ex in train}
        for ex in dev:
            if ex["label"] not in seen:
                raise TupeError(
                    f"{ex['where']}: label {ex['label']!r} never occurs in the training file {train_path}"
                )
        self.labels = sorted(seen, key=_sort_key)
        if len(self.labels) < 2:
            raise TupeError(
                f"{train_path}: one label ({self.labels[0]!r}) in the whole file; nothing to classify"
            )

    def label_names(self) -> list[str]:
        return self.labels

    def _split(self, examples: list[dict]) -> Split:
        ids = {n: i for i, n in enumerate(self.labels)}
        return Split(
            "",
            [ex["text_a"] for ex in examples],
            None if examples[0]["text_b"] is None else [ex["text_b"] for ex in examples],
            [ids[ex["label"]] for ex in examples],
            list(range(len(examples))),
        )

    def encode_train(self, tokenizer: Any, examples: list[dict]) -> Any:
        return to_dataset(
            encode_split(tokenizer, self._split(examples), self.settings.max_seq_len, False), False
        )

    def encode_eval(self, tokenizer: Any, examples: list[dict]) -> tuple[Any, Any]:
        return self.encode_train(tokenizer, examples), None

    def score(self, output: Any, aux: Any, examples: list[dict]) -> tuple[dict[str, float], list[dict]]:
        preds = np.asarray(output.predictions).argmax(-1).tolist()
        rows = [
            {"index": i, "where": ex["where"], "label": ex["label"], "prediction": self.labels[p]}
            for i, (ex, p) in enumerate(zip(examples, preds))
        ]
        return accuracy([ex["label"] for ex in examples], [self.labels[p] for p in preds]), rows

    def baseline(self, train: list[dict], dev: list[dict]) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for ex in train:
            counts[ex["label"]] = counts.get(ex["label"], 0) + 1
        most = max(counts, key=lambda k: counts[k])
        return {"most_frequent_train_label": accuracy([ex["label"] for ex in dev], [most] * len(dev))}
