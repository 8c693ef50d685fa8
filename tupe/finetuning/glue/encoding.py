"""GLUE data for the Trainer: tokenised splits, their fingerprint, and the train/dev files of a task."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.finetuning.glue.tasks import GlueTask, Split, TaskData, load_task, read_split_file

# ------------------------------------------------------------------------------------------------------ encoding


@dataclass
class Encoded:
    features: dict[str, list]  # input_ids, attention_mask, labels
    at_max_length: int  # examples that hit max_seq_len (truncated, or exactly that long)


def encode_split(tokenizer: Any, split: Split, max_seq_len: int, regression: bool) -> Encoded:
    """Tokenize `[CLS] A [SEP] B [SEP]` with the model's tokenizer, truncating the longer side first."""
    from transformers.utils import logging as hf_logging

    # slow (Python) tokenizers warn once per truncated pair that overflowing tokens are not returned; truncation
    # is counted below (`at_max_length`) and reported once
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        enc = tokenizer(
            split.text_a,
            split.text_b,
            truncation="longest_first",
            max_length=max_seq_len,
            padding=False,
            return_token_type_ids=False,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    labels = [float(x) for x in split.labels] if regression else [int(x) for x in split.labels]
    ids = enc["input_ids"]
    return Encoded(
        {"input_ids": ids, "attention_mask": enc["attention_mask"], "labels": labels},
        sum(len(x) >= max_seq_len for x in ids),
    )


def to_dataset(encoded: Encoded, regression: bool) -> Any:
    import datasets

    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "attention_mask": datasets.Sequence(datasets.Value("int8")),
            "labels": datasets.Value("float32" if regression else "int64"),
        }
    )
    return datasets.Dataset.from_dict(encoded.features, features=features)


def data_fingerprint(data: TaskData) -> str:
    """A hash of the exact examples (texts and labels) used, so resumed runs are known to be comparable."""
    h = hashlib.sha256()
    for name, split in [("train", data.train), *sorted(data.dev.items())]:
        h.update(name.encode())
        for i in range(len(split)):
            h.update(split.text_a[i].encode())
            h.update(b"\t")
            if split.text_b is not None:
                h.update(split.text_b[i].encode())
            h.update(f"\t{split.labels[i]!r}\n".encode())
    return h.hexdigest()


def load_data(
    task: GlueTask, data_dir: str | None, train_file: str | None, dev_files: Sequence[str] | None
) -> TaskData:
    if train_file or dev_files:
        if not (train_file and dev_files):
            raise TupeError("--train-file and --dev-file go together")
        names = list(task.hf_dev_splits)
        if len(dev_files) > len(names):
            raise TupeError(
                f"{len(dev_files)} --dev-file given; {task.name} has {len(names)} dev split(s): {', '.join(names)}"
            )
        return TaskData(
            task,
            read_split_file(task, train_file),
            {name: read_split_file(task, f) for name, f in zip(names, dev_files)},
            f"{train_file} + {' + '.join(dev_files)}",
        )
    if data_dir is None:
        raise TupeError("give --data-dir (or --train-file and --dev-file)")
    return load_task(task, data_dir)


def subsample(split: Split, n: int | None) -> Split:
    """A fixed random subset (seed 0, the same for every run of the grid), kept in file order."""
    if n is None or n >= len(split):
        return split
    if n <= 0:
        raise TupeError(f"sample limit must be positive, got {n}")
    rows = sorted(np.random.default_rng(0).choice(len(split), size=n, replace=False).tolist())
    return split.subset(rows)
