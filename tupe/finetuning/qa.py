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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.finetuning.family import Family, read_data_file
from tupe.finetuning.metrics import squad_scores
from tupe.io.reading import json_type_name


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
    text = read_data_file(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TupeError(
            f"{path}:{err.lineno}: not JSON ({err.msg}); question answering reads the official SQuAD JSON"
        ) from None
    except RecursionError:
        raise TupeError(
            f"{path}: JSON nested too deeply to be read (a SQuAD file is 5 levels deep)"
        ) from None
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise TupeError(f"{path}: not a SQuAD file (no top-level 'data' list of articles)")
    out: list[Question] = []
    ids: set[str] = set()
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs", []) if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise TupeError(f"{path}: data[{a}] is not an article with a 'paragraphs' list")
        for p, para in enumerate(paragraphs):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) or "qas" not in para:
                raise TupeError(f"{path}: data[{a}].paragraphs[{p}] has no 'context' and 'qas'")
            if not isinstance(para["qas"], list):
                raise TupeError(f"{path}: data[{a}].paragraphs[{p}].qas is not a list of questions")
            context = para["context"]
            for q, qa in enumerate(para["qas"]):
                if not isinstance(qa, dict):
                    raise TupeError(f"{path}: data[{a}].paragraphs[{p}].qas[{q}] is not a question object")
                qid = qa.get("id", "")
                qid = str(qid) if isinstance(qid, str | int) and not isinstance(qid, bool) else ""
                where = f"{path}: question {qid!r}"
                if not qid or not isinstance(qa.get("question"), str):
                    raise TupeError(
                        f"{path}: data[{a}].paragraphs[{p}].qas[{q}] has no string 'id' or 'question'"
                    )
                if qid in ids:
                    raise TupeError(f"{where} appears twice")
                ids.add(qid)
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                if not isinstance(answers, list):
                    raise TupeError(
                        f"{where}: 'answers' is {json_type_name(answers)}, expected a list of "
                        '{"text", "answer_start"} objects'
                    )
                if not answers and not with_negative:
                    raise TupeError(
                        f"{where} has no answer (a SQuAD v2.0 unanswerable question): add --version-2-with-negative"
                    )
                texts, starts = [], []
                for ans in answers:
                    t = ans.get("text") if isinstance(ans, dict) else None
                    s = ans.get("answer_start") if isinstance(ans, dict) else None
                    if not isinstance(t, str) or not isinstance(s, int) or isinstance(s, bool):
                        raise TupeError(f"{where}: an answer without 'text' and an integer 'answer_start'")
                    if not 0 <= s <= len(context) - len(t):
                        raise TupeError(
                            f"{where}: answer {t[:60]!r} has answer_start {s}, outside its context of "
                            f"{len(context)} characters (an offset from 0 to {max(len(context) - len(t), 0)})"
                        )
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


def encode_windows(
    tokenizer: Any,
    questions: Sequence[str],
    contexts: Sequence[str],
    max_seq_len: int,
    doc_stride: int,
    return_token_type_ids: bool | None = None,
    names: tuple[str, str] = ("--max-seq-len", "--doc-stride"),
    where: Sequence[str] | None = None,
) -> tuple[Any, list[int], list[list[tuple[int, int] | None]]]:
    """run_qa's windows of `[CLS] question [SEP] context [SEP]`, consecutive windows sharing `doc_stride` context
    tokens: (the encoding without its offsets, each window's question index, each window's offsets of its context
    tokens, None for the question and special tokens). `names`: the two settings as errors name them; `where`: each
    question as errors name it. A question that leaves no more than `doc_stride` tokens of the window to the
    context is refused. Shared by `tupe finetune --task qa` and the question-answering pipeline (tupe/pipelines.py)."""
    if not getattr(tokenizer, "is_fast", False):
        raise TupeError("question answering needs a fast tokenizer (offset mapping); this one is not")
    questions = [q.lstrip() for q in questions]  # run_qa: leading white space can make the question too long
    special = tokenizer.num_special_tokens_to_add(pair=True)
    for i, ids in enumerate(tokenizer(questions, add_special_tokens=False, verbose=False)["input_ids"]):
        room = max_seq_len - special - len(ids)
        if room <= doc_stride:
            name = where[i] if where is not None else f"question {questions[i][:60]!r}"
            raise TupeError(
                f"{name} takes {len(ids)} tokens, leaving {room} of a window of {names[0]} {max_seq_len} to the "
                f"context; that must be more than {names[1]} {doc_stride} (raise {names[0]} or lower {names[1]})"
            )
    try:
        enc = tokenizer(
            questions,
            list(contexts),
            truncation="only_second",
            max_length=max_seq_len,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            return_token_type_ids=return_token_type_ids,
        )
    except BaseException as err:  # the tokenizers library panics (a BaseException) on impossible windows
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise TupeError(
            f"cannot cut the contexts into windows of {names[0]} {max_seq_len} with {names[1]} {doc_stride}: "
            f"{str(err).splitlines()[0][:200]}"
        ) from None
    sample = [int(i) for i in enc.pop("overflow_to_sample_mapping")]
    offsets = enc.pop("offset_mapping")
    context_offsets = []
    for i, offs in enumerate(offsets):
        seq = enc.sequence_ids(i)
        context_offsets.append([tuple(o) if seq[k] == 1 else None for k, o in enumerate(offs)])
    return enc, sample, context_offsets


@dataclass(frozen=True)
class Answer:
    """One candidate answer of a question: `context[start:end] == text`; the null answer (SQuAD v2.0) is ""
    at 0..0."""

    text: str
    start: int
    end: int
    logit: float  # start logit + end logit; the null answer's is the lowest [CLS] score over the windows
    probability: float  # softmax of the logits over the n-best candidates, as run_qa's nbest "probability"


def rank_answers(
    windows: Iterable[tuple[np.ndarray, np.ndarray, Sequence[tuple[int, int] | None]]],
    context: str,
    n_best: int,
    max_answer_length: int,
    with_null: bool,
) -> list[Answer]:
    """run_qa's post-processing of one question from its windows' (start logits, end logits, context offsets):
    per window the `n_best` best starts x ends that lie in the context, in order and at most `max_answer_length`
    tokens long, scored start + end logit; the `n_best` best over all windows (a span seen in several windows
    once, with its best score), and with `with_null` the null answer scored by the lowest [CLS] (position 0)
    score over the windows. Best first; on a tie the span found first (and any span before the null answer)."""
    spans: dict[tuple[int, int], Answer] = {}
    null: float | None = None
    for start_logits, end_logits, offs in windows:
        n = len(offs)  # the logits may be padded beyond the window
        st, en = np.asarray(start_logits[:n], dtype=np.float64), np.asarray(end_logits[:n], dtype=np.float64)
        score0 = float(st[0] + en[0])
        null = score0 if null is None or score0 < null else null
        for a in np.argsort(-st, kind="stable")[:n_best]:
            for b in np.argsort(-en, kind="stable")[:n_best]:
                if offs[a] is None or offs[b] is None or b < a or b - a + 1 > max_answer_length:
                    continue
                if offs[a][0] >= offs[a][1] or offs[b][0] >= offs[b][1]:
                    continue  # a token that covers no text (white space, its offsets trimmed) bounds no answer
                # the tokenizer's offsets are the words' exact spans (no space before a word: tupe's tokenizers
                # trim them, tupe.modeling.word_spans.exact_word_spans): the answer is the context between them
                key = (offs[a][0], offs[b][1])
                score = float(st[a] + en[b])
                if key not in spans or score > spans[key].logit:
                    spans[key] = Answer(context[key[0] : key[1]], key[0], key[1], score, 0.0)
    ranked = sorted(spans.values(), key=lambda x: -x.logit)[:n_best]
    if with_null and null is not None:
        ranked = sorted([*ranked, Answer("", 0, 0, null, 0.0)], key=lambda x: -x.logit)
    if not ranked:
        return []
    logits = np.array([x.logit for x in ranked])
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return [Answer(x.text, x.start, x.end, x.logit, float(q)) for x, q in zip(ranked, p)]


class QaFamily(Family):
    name = "qa"
    flattened = None  # padded always: the head's span loss is a softmax over its row, one example per row
    flattened_refusal = (
        "the question-answering head's span loss is a softmax over the whole row (one window per row)"
    )
    metrics = ("f1", "exact_match")
    report_columns = (("QA EM", "exact_match"), ("QA F1", "f1"))
    auto_class = "AutoModelForQuestionAnswering"
    card_kind = "question-answering"

    def read(self, path: Path) -> list[Question]:
        if path.is_dir() or path.suffix.lower() not in {".json", ""}:
            raise TupeError(f"{path}: question answering reads the official SQuAD JSON (a .json file)")
        return read_squad(path, self.settings.version_2_with_negative)

    def _features(self, tokenizer: Any, examples: list[Question]) -> tuple[Any, dict[str, list]]:
        """run_qa's windows: (features with start/end labels, per feature its example and context offsets)."""
        import datasets

        s = self.settings
        enc, sample, context_offsets = encode_windows(
            tokenizer,
            [q.question for q in examples],
            [q.context for q in examples],
            s.max_seq_len,
            s.doc_stride,
            return_token_type_ids=False,
            where=[q.where for q in examples],
        )
        starts, ends = [], []
        for i, offs in enumerate(context_offsets):
            q = examples[sample[i]]
            inside = [k for k, o in enumerate(offs) if o is not None]
            first, last = inside[0], inside[-1]
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
        return ds, {"example": sample, "offsets": context_offsets}

    def encode_train(self, tokenizer: Any, examples: list[Question]) -> Any:
        return self._features(tokenizer, examples)[0]

    def encode_eval(self, tokenizer: Any, examples: list[Question]) -> tuple[Any, Any]:
        return self._features(tokenizer, examples)

    def answers(
        self, start_logits: np.ndarray, end_logits: np.ndarray, aux: dict, examples: list[Question]
    ) -> list[str]:
        """run_qa's post-processing (`rank_answers`): the best span over every window of a question, or "" when
        none is allowed or (v2.0) the null answer scores higher."""
        s = self.settings
        by_example: dict[int, list[int]] = defaultdict(list)
        for f, e in enumerate(aux["example"]):
            by_example[e].append(f)
        out = []
        for e, q in enumerate(examples):
            windows = [(start_logits[f], end_logits[f], aux["offsets"][f]) for f in by_example[e]]
            ranked = rank_answers(
                windows, q.context, s.n_best, s.max_answer_length, with_null=s.version_2_with_negative
            )
            out.append(ranked[0].text if ranked else "")
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
