"""Named-entity recognition (token classification) as transformers' run_ner does it: a word's label on its first
sub-token and -100 (ignored by the loss) on the others (with --label-all-tokens, as run_ner's label_all_tokens,
on every sub-token: B-X as I-X after the first), the prediction of a word read from its first sub-token, and
entity-level precision, recall and F1 of seqeval.

Files: CoNLL (token first, tag in the last column, whatever is between; a blank line between sentences;
`-DOCSTART-` lines skipped; IOB1 or IOB2 tags), JSON lines / JSON / CSV with `tokens` and `tags` (or `ner_tags`)
columns, or a `datasets` split saved with `save_to_disk` (tags as strings, or ids of a `ClassLabel`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.finetuning.family import Family, csv_records, json_records, one_split, read_data_file
from tupe.finetuning.metrics import entity_scores

_TAG = re.compile(r"^(O|[BIES]-\S+)$")
_TAG_COLUMNS = ("tags", "ner_tags")


@dataclass
class Sentence:
    tokens: list[str]
    tags: list[str]
    where: str  # file:line of the sentence's first token, or the record
    line: int = 0  # CoNLL: the line of the first token (one token a line); 0 for records

    def token_where(self, k: int) -> str:
        """Where token `k` is: its file:line in a CoNLL file, else the record and its position."""
        if self.line:
            return f"{self.where.rsplit(':', 1)[0]}:{self.line + k}"
        return f"{self.where}: token {k + 1} ({self.tokens[k][:40]!r})"


def _check_tags(tags: list[str], where: str) -> None:
    bad = next((t for t in tags if not _TAG.match(t)), None)
    if bad is not None:
        raise TupeError(f"{where}: tag {bad!r} is not an IOB tag (O, B-TYPE, I-TYPE); is this a NER file?")


def read_conll(path: Path) -> list[Sentence]:
    """A CoNLL file: one token per line, the token first and its tag last; sentences end at blank lines."""
    text = read_data_file(path)
    sentences: list[Sentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0

    def close() -> None:
        if tokens:
            sentences.append(Sentence(list(tokens), list(tags), f"{path}:{start}", start))
            tokens.clear()
            tags.clear()

    for lineno, line in enumerate(text.split("\n"), start=1):
        fields = line.split()
        if not fields:
            close()
            continue
        if fields[0] == "-DOCSTART-":
            close()
            continue
        if len(fields) < 2:
            raise TupeError(
                f"{path}:{lineno}: one column ({line.strip()[:60]!r}); a CoNLL line is a token, then its tag "
                "in the last column"
            )
        if not tokens:
            start = lineno
        if not _TAG.match(fields[-1]):
            tagged = [i for i, f in enumerate(fields[1:-1], start=2) if _TAG.match(f) and f != "O"]
            hint = (
                f"column {tagged[-1]} ({fields[tagged[-1] - 1]!r}) looks like one, but the tag must be the last"
                if tagged
                else "is this a NER file?"
            )
            raise TupeError(
                f"{path}:{lineno}: tag {fields[-1]!r} is not an IOB tag (O, B-TYPE, I-TYPE) in the last column; "
                + hint
            )
        tokens.append(fields[0])
        tags.append(fields[-1])
    close()
    if not sentences:
        raise TupeError(f"{path}: no sentences (only -DOCSTART- lines and blank lines)")
    return sentences


def _as_list(value: Any, where: str, column: str) -> list[str]:
    if isinstance(value, str):  # a CSV cell: a JSON list, or words separated by spaces
        value = json.loads(value) if value.lstrip().startswith("[") else value.split()
    if not isinstance(value, list):
        raise TupeError(f"{where}: column {column!r} is not a list")
    return [str(v) for v in value]


def _from_records(records: list[tuple[str, dict]], path: Path) -> list[Sentence]:
    out = []
    for where, r in records:
        tag_col = next((c for c in _TAG_COLUMNS if c in r), None)
        if "tokens" not in r or tag_col is None:
            raise TupeError(f"{where}: needs `tokens` and `tags` columns for NER (has: {', '.join(r)[:200]})")
        try:
            tokens, tags = _as_list(r["tokens"], where, "tokens"), _as_list(r[tag_col], where, tag_col)
        except json.JSONDecodeError as err:
            raise TupeError(f"{where}: not a JSON list ({err.msg})") from None
        if len(tokens) != len(tags):
            raise TupeError(f"{where}: {len(tokens)} tokens but {len(tags)} tags")
        if tokens:
            _check_tags(tags, where)
            out.append(Sentence(tokens, tags, where))
    if not out:
        raise TupeError(f"{path}: no sentences")
    return out


def _from_dataset(path: Path) -> list[Sentence]:
    ds = one_split(path, "sentences")
    tag_col = next((c for c in _TAG_COLUMNS if c in ds.column_names), None)
    if "tokens" not in ds.column_names or tag_col is None:
        raise TupeError(
            f"{path}: needs `tokens` and `tags` (or `ner_tags`) columns (has: {', '.join(ds.column_names)})"
        )
    names = getattr(getattr(ds.features[tag_col], "feature", None), "names", None)  # Sequence(ClassLabel)
    records = []
    for i, (tokens, tags) in enumerate(zip(ds["tokens"], ds[tag_col])):
        tags = [names[t] for t in tags] if names else [str(t) for t in tags]
        records.append((f"{path} row {i}", {"tokens": list(tokens), "tags": tags}))
    return _from_records(records, path)


class NerFamily(Family):
    name = "ner"
    metrics = ("f1", "precision", "recall", "accuracy")
    report_columns = (("NER F1", "f1"),)
    auto_class = "AutoModelForTokenClassification"
    card_kind = "token-classification"

    def read(self, path: Path) -> list[Sentence]:
        if path.is_dir():
            return _from_dataset(path)
        suffix = path.suffix.lower()
        if suffix in {".json", ".jsonl"}:
            return _from_records(json_records(path, read_data_file(path)), path)
        if suffix == ".csv":
            return _from_records(csv_records(path, read_data_file(path)), path)
        return read_conll(path)

    def check(self, train: list[Sentence], dev: list[Sentence], train_path: Path, dev_path: Path) -> None:
        seen = {t for s in train for t in s.tags}
        for s in dev:
            for k, tag in enumerate(s.tags):
                if tag not in seen:
                    kin = sorted(t for t in seen if t[2:] == tag[2:] and t != "O")
                    also = f" (it has {', '.join(kin)})" if kin and tag != "O" else ""
                    raise TupeError(
                        f"{s.token_where(k)}: tag {tag!r} never occurs in the training file {train_path}{also}"
                    )
        # run_ner's order: the labels sorted, so the ids do not depend on the order of the file
        self.labels = sorted(seen)

    def label_names(self) -> list[str]:
        return self.labels

    def aggregation_strategy(self) -> str:
        """The `pipeline("token-classification", aggregation_strategy=...)` that reads words as training labelled
        them: "first" (a word is its first sub-token's label, the others were never trained) by default;
        "average" with --label-all-tokens (every sub-token was trained on the word's label)."""
        return "average" if getattr(self.settings, "label_all_tokens", False) else "first"

    def config_extras(self) -> dict[str, Any]:
        """The aggregation strategy that matches how the labels were trained, in the saved config.json."""
        return {"aggregation_strategy": self.aggregation_strategy()}

    flattened = "token"  # padding-free: a label per token, the examples' labels joined as their tokens are

    def collator(self, tokenizer: Any) -> Any:
        from transformers import DataCollatorForTokenClassification

        return DataCollatorForTokenClassification(tokenizer)

    def _encode(self, tokenizer: Any, examples: list[Sentence]) -> tuple[Any, list[list[int | None]]]:
        import datasets

        if not getattr(tokenizer, "is_fast", False):
            raise TupeError("NER needs a fast tokenizer (word ids of each sub-token); this one is not")
        enc = tokenizer(
            [s.tokens for s in examples],
            is_split_into_words=True,
            truncation=True,
            max_length=self.settings.max_seq_len,
            return_token_type_ids=False,
        )
        ids = {t: i for i, t in enumerate(self.labels)}
        # --label-all-tokens (run_ner's label_all_tokens): a word's later sub-tokens get its label too, B-X as I-X
        # where the training tags have I-X; otherwise only its first sub-token is labelled (-100: no loss)
        inside = {t: ids.get("I-" + t[2:], ids[t]) if t.startswith("B-") else ids[t] for t in self.labels}
        all_tokens = bool(getattr(self.settings, "label_all_tokens", False))
        labels, word_ids = [], []
        for i, s in enumerate(examples):
            words = enc.word_ids(i)
            row, previous = [], None
            for w in words:
                if w is None:
                    row.append(-100)
                elif w != previous:
                    row.append(ids[s.tags[w]])
                else:
                    row.append(inside[s.tags[w]] if all_tokens else -100)
                previous = w
            labels.append(row)
            word_ids.append(words)
        ds = datasets.Dataset.from_dict(
            {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}
        )
        return ds, word_ids

    def encode_train(self, tokenizer: Any, examples: list[Sentence]) -> Any:
        return self._encode(tokenizer, examples)[0]

    def encode_eval(self, tokenizer: Any, examples: list[Sentence]) -> tuple[Any, Any]:
        return self._encode(tokenizer, examples)

    def score(self, output: Any, aux: Any, examples: list[Sentence]) -> tuple[dict[str, float], list[dict]]:
        logits = output.predictions  # (examples, longest, labels), padded by the Trainer
        predicted, rows, cut = [], [], 0
        for i, (s, words) in enumerate(zip(examples, aux)):
            tags = ["O"] * len(s.tokens)  # a word cut off by --max-seq-len is predicted O (and counted)
            best = np.asarray(logits[i]).argmax(-1)
            seen: set[int] = set()
            for j, w in enumerate(words):
                if w is not None and w not in seen:
                    seen.add(w)
                    tags[w] = self.labels[int(best[j])]
            cut += len(s.tokens) - len(seen)
            predicted.append(tags)
            rows.append({"index": i, "where": s.where, "tokens": s.tokens, "tags": s.tags, "predicted": tags})
        scores = entity_scores([s.tags for s in examples], predicted)
        self.words_cut = cut
        return scores, rows

    def baseline(self, train: list[Sentence], dev: list[Sentence]) -> dict[str, Any]:
        return {"all_O": entity_scores([s.tags for s in dev], [["O"] * len(s.tags) for s in dev])}

    def describe_data(self, train: list[Sentence], dev: list[Sentence]) -> dict[str, Any]:
        entities = sorted({t[2:] for s in train for t in s.tags if t != "O"})
        return {
            "entity_types": entities,
            "train_tokens": sum(len(s.tokens) for s in train),
            "dev_tokens": sum(len(s.tokens) for s in dev),
        }
