"""Multiple choice as transformers' run_swag does it: each choice is encoded `[CLS] context [SEP] start ending
[SEP]`, the model scores every choice and the highest is the answer; accuracy.

Files: SWAG-style CSV (`sent1` the context, `sent2` the start of the continuation, `ending0` ... `endingN-1`, `label`
the index of the right ending), or the same columns as JSON lines / JSON, or a `datasets` split saved with
`save_to_disk`. Every example has the same number of endings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.finetuning.family import Family, csv_records, json_records, one_split, read_data_file
from tupe.finetuning.metrics import accuracy

_ENDING = re.compile(r"^ending(\d+)$")


@dataclass
class Choice:
    context: str
    start: str
    endings: list[str]
    label: int
    where: str


def _from_records(records: list[tuple[str, dict]], path: Path) -> list[Choice]:
    out: list[Choice] = []
    for where, r in records:
        endings = sorted((int(m.group(1)), k) for k in r if (m := _ENDING.match(k)))
        if "sent1" not in r or "label" not in r or len(endings) < 2:
            raise TupeError(
                f"{where}: needs SWAG columns sent1, (sent2,) ending0, ending1, ..., label for multiple choice "
                f"(has: {', '.join(r)[:200]})"
            )
        if [i for i, _ in endings] != list(range(len(endings))):
            raise TupeError(f"{where}: endings must be numbered ending0 .. ending{len(endings) - 1}")
        try:
            label = int(str(r["label"]).strip())
        except ValueError:
            raise TupeError(f"{where}: label {r['label']!r} is not the index of an ending") from None
        if not 0 <= label < len(endings):
            raise TupeError(f"{where}: label {label} is not an ending index (0..{len(endings) - 1})")
        if out and len(endings) != len(out[0].endings):
            raise TupeError(f"{where}: {len(endings)} endings, the first example has {len(out[0].endings)}")
        out.append(
            Choice(str(r["sent1"]), str(r.get("sent2") or ""), [str(r[k]) for _, k in endings], label, where)
        )
    if not out:
        raise TupeError(f"{path}: no examples")
    return out


class ChoiceFamily(Family):
    name = "multiple-choice"
    metrics = ("accuracy",)
    report_columns = (("MC acc", "accuracy"),)
    auto_class = "AutoModelForMultipleChoice"
    card_kind = "multiple-choice"

    def read(self, path: Path) -> list[Choice]:
        if path.is_dir():
            ds = one_split(path, "examples")
            return _from_records([(f"{path} row {i}", dict(r)) for i, r in enumerate(ds)], path)
        suffix = path.suffix.lower()
        if suffix in {".json", ".jsonl"}:
            return _from_records(json_records(path, read_data_file(path)), path)
        if suffix != ".csv":
            raise TupeError(
                f"{path}: multiple choice reads SWAG-style .csv, .json/.jsonl or a saved dataset folder"
            )
        return _from_records(csv_records(path, read_data_file(path)), path)

    def check(self, train: list[Choice], dev: list[Choice], train_path: Path, dev_path: Path) -> None:
        if len(train[0].endings) != len(dev[0].endings):
            raise TupeError(
                f"{dev_path}: {len(dev[0].endings)} endings per example, the training file has {len(train[0].endings)}"
            )

    flattened = None  # padded always: each choice is scored from its own row
    flattened_refusal = "the multiple-choice head scores each choice from its own row of (batch, choices, n)"

    def collator(self, tokenizer: Any) -> Any:
        from transformers import DataCollatorForMultipleChoice

        return DataCollatorForMultipleChoice(tokenizer)

    def _encode(self, tokenizer: Any, examples: list[Choice]) -> Any:
        import datasets

        n = len(examples[0].endings)
        firsts = [ex.context for ex in examples for _ in range(n)]
        seconds = [f"{ex.start} {e}".strip() for ex in examples for e in ex.endings]
        enc = tokenizer(
            firsts,
            seconds,
            truncation="longest_first",
            max_length=self.settings.max_seq_len,
            return_token_type_ids=False,
        )
        group = lambda xs: [xs[i : i + n] for i in range(0, len(xs), n)]  # noqa: E731
        return datasets.Dataset.from_dict(
            {
                "input_ids": group(enc["input_ids"]),
                "attention_mask": group(enc["attention_mask"]),
                "labels": [ex.label for ex in examples],
            }
        )

    def encode_train(self, tokenizer: Any, examples: list[Choice]) -> Any:
        return self._encode(tokenizer, examples)

    def encode_eval(self, tokenizer: Any, examples: list[Choice]) -> tuple[Any, Any]:
        return self._encode(tokenizer, examples), None

    def score(self, output: Any, aux: Any, examples: list[Choice]) -> tuple[dict[str, float], list[dict]]:
        preds = np.asarray(output.predictions).argmax(-1).tolist()
        rows = [
            {"index": i, "where": ex.where, "label": ex.label, "prediction": int(p)}
            for i, (ex, p) in enumerate(zip(examples, preds))
        ]
        return accuracy([ex.label for ex in examples], preds), rows

    def baseline(self, train: list[Choice], dev: list[Choice]) -> dict[str, Any]:
        counts = np.bincount([ex.label for ex in train], minlength=len(train[0].endings))
        most = int(counts.argmax())
        return {"most_frequent_train_label": accuracy([ex.label for ex in dev], [most] * len(dev))}
