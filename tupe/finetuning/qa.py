"""Extractive question answering on SQuAD-format files, as transformers' run_qa does it.

A question and its context are encoded `[CLS] question [SEP] context [SEP]`; a context longer than
`--max-seq-len` is cut into windows that overlap by `--doc-stride` tokens, each a training feature whose answer
span is labelled where the whole answer lies inside it and `[CLS]` (position 0) where it does not. At evaluation
the `--n-best` start and end logits of every window are combined into spans no longer than `--max-answer-length`
tokens, mapped back to text through the tokenizer's offsets; the best span over all windows is the answer. With
`--version-2-with-negative` (SQuAD v2.0) the answer is empty when the best window's `[CLS]` score (start + end)
beats the best span's.

Files: the official SQuAD v1.1 / v2.0 JSON (`{"data": [{"title", "paragraphs": [{"context", "qas": [{"id",
"question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.finetuning.family import Family, read_text
from tupe.finetuning.metrics import squad_scores


@dataclass
class Question:
    id: str
    question: str
    context: str
    answers: list[str]  # gold answer texts; [] for an unanswerable question (v2.0)
    starts: list[int]  # their character offsets in the context
    where: str


def read_squad(path: Path, with_negative: bool) -> list[Question]:
    """The questions of an official SQuAD JSON file; every answer is checked to be at its `answer_start`."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TupeError(
            f"{path}:{err.lineno}: not JSON ({err.msg}); question answering reads the official SQuAD JSON"
        ) from None
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise TupeError(f"{path}: not a SQuAD file (no top-level 'data' list of articles)")
    out: list[Question] = []
    ids: set[str] = set()
    for a, article in enumerate(articles):
        for p, para in enumerate(article.get("paragraphs", []) if isinstance(article, dict) else []):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) or "qas" not in para:
                raise TupeError(f"{path}: data[{a}].paragraphs[{p}] has no 'context' and 'qas'")
            context = para["context"]
            for qa in para["qas"]:
                qid = str(qa.get("id", ""))
                where = f"{path}: question {qid!r}"
                if not qid or not isinstance(qa.get("question"), str):
                    raise TupeError(
                        f"{path}: data[{a}].paragraphs[{p}] has a question without 'id' or 'question'"
                    )
                if qid in ids:
                    raise TupeError(f"{where} appears twice")
                ids.add(qid)
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                if not answers and not with_negative:
                    raise TupeError(
                        f"{where} has no answer (a SQuAD v2.0 unanswerable question): add --version-2-with-negative"
                    )
                texts, starts = [], []
                for ans in answers:
                    t, s = ans.get("text"), ans.get("answer_start")
                    if not isinstance(t, str) or not isinstance(s, int):
                        raise TupeError(f"{where}: an answer without 'text' and an integer 'answer_start'")
                    if context[s : s + len(t)] != t:
                        raise TupeError(
                            f"{where}: answer {t[:60]!r} is not at its answer_start {s} (the context there reads "
                            f"{context[s : s + len(t)][:60]!r})"
                        )
                    texts.append(t)
                    starts.append(s)
                out.append(Question(qid, qa["question"], context, texts, starts, where))
    if not out:
        raise TupeError(f"{path}: no questions")
    return out


class QaFamily(Family):
    name = "qa"
    metrics = ("f1", "exact_match")
    report_columns = (("QA EM", "exact_match"), ("QA F1", "f1"))
    auto_class = "AutoModelForQuestionAnswering"

    def read(self, path: Path) -> list[Question]:
        if path.is_dir() or path.suffix.lower() not in {".json", ""}:
            raise TupeError(f"{path}: question answering reads the official SQuAD JSON (a .json file)")
        return read_squad(path, self.settings.version_2_with_negative)

    def _features(self, tokenizer: Any, examples: list[Question]) -> tuple[Any, dict[str, list]]:
        """run_qa's windows: (features with start/end labels, per feature its example and context offsets)."""
        import datasets

        s = self.settings
        if not getattr(tokenizer, "is_fast", False):
            raise TupeError("question answering needs a fast tokenizer (offset mapping); this one is not")
        try:
            enc = tokenizer(
                [q.question.lstrip() for q in examples],
                [q.context for q in examples],
                truncation="only_second",
                max_length=s.max_seq_len,
                stride=s.doc_stride,
                return_overflowing_tokens=True,
                return_offsets_mapping=True,
                return_token_type_ids=False,
            )
        except Exception as err:  # noqa: BLE001 - e.g. a question longer than the window
            raise TupeError(
                f"cannot cut the contexts into windows of --max-seq-len {s.max_seq_len} with --doc-stride "
                f"{s.doc_stride}: {str(err).splitlines()[0][:200]}"
            ) from None
        sample = enc.pop("overflow_to_sample_mapping")
        offsets = enc.pop("offset_mapping")
        starts, ends, context_offsets = [], [], []
        for i, offs in enumerate(offsets):
            seq = enc.sequence_ids(i)
            q = examples[sample[i]]
            context_offsets.append([o if seq[k] == 1 else None for k, o in enumerate(offs)])
            first = seq.index(1)
            last = len(seq) - 1 - seq[::-1].index(1)
            start = end = 0  # [CLS]: the answer is not (wholly) in this window, or there is none
            if q.answers:
                a, b = q.starts[0], q.starts[0] + len(q.answers[0])
                if offs[first][0] <= a and offs[last][1] >= b:
                    start, end = first, last
                    while start <= last and offs[start][0] <= a:
                        start += 1
                    start -= 1
                    while end >= first and offs[end][1] >= b:
                        end -= 1
                    end += 1
            starts.append(start)
            ends.append(end)
        ds = datasets.Dataset.from_dict(
            {
                "input_ids": enc["input_ids"],
                "attention_mask": enc["attention_mask"],
                "start_positions": starts,
                "end_positions": ends,
            }
        )
        return ds, {"example": list(sample), "offsets": context_offsets}

    def encode_train(self, tokenizer: Any, examples: list[Question]) -> Any:
        return self._features(tokenizer, examples)[0]

    def encode_eval(self, tokenizer: Any, examples: list[Question]) -> tuple[Any, Any]:
        return self._features(tokenizer, examples)

    def answers(
        self, start_logits: np.ndarray, end_logits: np.ndarray, aux: dict, examples: list[Question]
    ) -> list[str]:
        """run_qa's post-processing: the best span over every window of a question, or "" (v2.0)."""
        s = self.settings
        by_example: dict[int, list[int]] = defaultdict(list)
        for f, e in enumerate(aux["example"]):
            by_example[e].append(f)
        out = []
        for e, q in enumerate(examples):
            best_score, best_text, null_score = -np.inf, "", None
            for f in by_example[e]:
                st, en, offs = start_logits[f], end_logits[f], aux["offsets"][f]
                n = len(offs)
                score0 = float(st[0] + en[0])
                null_score = score0 if null_score is None or score0 < null_score else null_score
                for a in np.argsort(st[:n])[::-1][: s.n_best]:
                    for b in np.argsort(en[:n])[::-1][: s.n_best]:
                        if offs[a] is None or offs[b] is None or b < a or b - a + 1 > s.max_answer_length:
                            continue
                        score = float(st[a] + en[b])
                        if score > best_score:
                            best_score, best_text = score, q.context[offs[a][0] : offs[b][1]].strip()
            if s.version_2_with_negative and null_score is not None and null_score > best_score:
                best_text = ""
            out.append(best_text)
        return out

    def score(self, output: Any, aux: Any, examples: list[Question]) -> tuple[dict[str, float], list[dict]]:
        start_logits, end_logits = output.predictions[:2]
        preds = self.answers(np.asarray(start_logits), np.asarray(end_logits), aux, examples)
        rows = [
            {"id": q.id, "question": q.question, "answers": q.answers, "prediction": p}
            for q, p in zip(examples, preds)
        ]
        return squad_scores([q.answers for q in examples], preds), rows

    def baseline(self, train: list[Question], dev: list[Question]) -> dict[str, Any]:
        if not any(not q.answers for q in dev):
            return {}
        return {"always_empty": squad_scores([q.answers for q in dev], [""] * len(dev))}

    def describe_data(self, train: list[Question], dev: list[Question]) -> dict[str, Any]:
        return {
            "train_unanswerable": sum(not q.answers for q in train),
            "dev_unanswerable": sum(not q.answers for q in dev),
        }
