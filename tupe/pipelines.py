"""`pipeline("question-answering")` for extractive question answering, which transformers 5 removed, and
`pipeline("token-classification")` reading words as tupe's tokenizers cut them.

`import tupe` registers the question-answering pipeline (through `transformers.pipelines.PIPELINE_REGISTRY`)
only when the installed transformers has no "question-answering" task of its own, so it never replaces the
library's; transformers 5 also lists the task as removed, an entry the registration takes out so that
`pipeline()` reaches the registry. It works for any `AutoModelForQuestionAnswering` model with a fast tokenizer
(tupe's heads, BERT, ...).

It cuts a long context into overlapping windows and picks the answer exactly as `tupe finetune --task qa` scores
its predictions (tupe/finetuning/qa.py `encode_windows`, `rank_answers`: run_qa's n-best spans of at most
`max_answer_len` tokens, start + end logit, best over every window; the null answer with
`handle_impossible_answer`), so for the same model, question and settings it gives the answer `tupe finetune`
wrote to predictions.jsonl. `score` is run_qa's n-best "probability": the softmax of the candidates' logits.

The token-classification pipeline is the library's own, subclassed to read words as tupe's tokenizers cut them
(tupe/modeling/token_classification.py says where and why; model folders carry a copy of it for users without
tupe); registered here in place of the library's class.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from transformers.pipelines.base import ChunkPipeline

from tupe.errors import TupeError
from tupe.finetuning.qa import encode_windows, rank_answers
from tupe.modeling.token_classification import TokenClassificationPipeline, register_token_classification
from tupe.modeling.word_spans import with_exact_word_spans

TASK = "question-answering"


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"question-answering pipeline: {name} must be a positive integer, not {value!r}")
    return value


class QuestionAnsweringPipeline(ChunkPipeline):
    """Extractive question answering: `qa(question=..., context=...)` -> `{"score", "start", "end", "answer"}`
    with `context[start:end] == answer`; a list for several questions (`question=[...]`, `context=[...]` or a
    list of `{"question", "context"}` dicts), and a list of the `top_k` best per question when `top_k > 1`.

    Settings (at `pipeline(...)` or per call): `top_k` (1), `max_seq_len` (tokens per window: min(384, the
    model's positions)), `doc_stride` (tokens shared by consecutive windows: min(128, max_seq_len // 4)),
    `max_answer_len` (30 tokens), `n_best` (20 start and end candidates per window; raised to `top_k`),
    `handle_impossible_answer` (False; True for SQuAD v2.0 models: the empty answer "" at 0..0 competes with
    the spans). The defaults are `tupe finetune --task qa`'s."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.tokenizer is None or not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                "the question-answering pipeline needs a fast tokenizer (its offsets map answers back to the "
                f"context); got {type(self.tokenizer).__name__}"
            )
        # answers are the context between the offsets of their first and last tokens: a tupe tokenizer saved
        # before its offsets left out the space before a word is given the trimming step (ids unchanged), on a
        # copy: the tokenizer the user passed is left as it was
        self.tokenizer = with_exact_word_spans(self.tokenizer)
        from transformers import MODEL_FOR_QUESTION_ANSWERING_MAPPING

        head = MODEL_FOR_QUESTION_ANSWERING_MAPPING.get(type(self.model.config), None)
        if head is None or not isinstance(self.model, head):
            raise ValueError(
                f"the question-answering pipeline needs a question-answering head (AutoModelForQuestionAnswering); "
                f"got {type(self.model).__name__}"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`qa(question=..., context=...)`, `qa(question, context)`, `qa({"question", "context"})` or a list."""
        question, context = kwargs.pop("question", None), kwargs.pop("context", None)
        if args and (question is not None or context is not None):
            raise ValueError("question-answering pipeline: give question= and context=, or positional inputs")
        if len(args) == 2:
            question, context = args
        elif len(args) == 1:
            return super().__call__(_as_examples(args[0]), **kwargs)
        elif args:
            raise ValueError(
                f"question-answering pipeline: {len(args)} positional inputs (question, context)"
            )
        if question is None or context is None:
            raise ValueError("question-answering pipeline: needs a question and a context")
        if isinstance(question, str) and isinstance(context, str):
            return super().__call__(_as_examples({"question": question, "context": context}), **kwargs)
        questions = _strings(question, "question")
        contexts = _strings(context, "context")
        if len(questions) == 1 and len(contexts) > 1:
            questions = questions * len(contexts)
        if len(contexts) == 1 and len(questions) > 1:
            contexts = contexts * len(questions)
        if len(questions) != len(contexts):
            raise ValueError(
                f"question-answering pipeline: {len(questions)} questions but {len(contexts)} contexts"
            )
        examples = [{"question": q, "context": c} for q, c in zip(questions, contexts)]
        return super().__call__(_as_examples(examples), **kwargs)

    def _sanitize_parameters(
        self,
        top_k: int | None = None,
        max_seq_len: int | None = None,
        doc_stride: int | None = None,
        max_answer_len: int | None = None,
        n_best: int | None = None,
        handle_impossible_answer: bool | None = None,
        **unknown: Any,
    ) -> tuple[dict, dict, dict]:
        if unknown:
            raise TypeError(f"question-answering pipeline: unknown setting(s) {', '.join(sorted(unknown))}")
        pre: dict[str, Any] = {}
        post: dict[str, Any] = {}
        if max_seq_len is not None:
            pre["max_seq_len"] = _check_count("max_seq_len", max_seq_len)
        if doc_stride is not None:
            pre["doc_stride"] = _check_count("doc_stride", doc_stride)
        for name, value in (("top_k", top_k), ("max_answer_len", max_answer_len), ("n_best", n_best)):
            if value is not None:
                post[name] = _check_count(name, value)
        if handle_impossible_answer is not None:
            post["handle_impossible_answer"] = bool(handle_impossible_answer)
        return pre, {}, post

    def _windows(self, max_seq_len: int | None, doc_stride: int | None) -> tuple[int, int]:
        """(max_seq_len, doc_stride) with `tupe finetune --task qa`'s defaults and limits for this model."""
        from tupe.finetuning.arguments import FinetuneSettings

        positions = int(getattr(self.model.config, "max_position_embeddings", 512))
        try:
            s = FinetuneSettings(task="qa", max_seq_len=max_seq_len, doc_stride=doc_stride).resolved(
                positions, None
            )
        except TupeError as err:
            raise ValueError(
                "question-answering pipeline: "
                + str(err).replace("--max-seq-len", "max_seq_len").replace("--doc-stride", "doc_stride")
            ) from None
        assert s.max_seq_len is not None and s.doc_stride is not None
        return s.max_seq_len, s.doc_stride

    def preprocess(
        self, example: dict[str, str], max_seq_len: int | None = None, doc_stride: int | None = None
    ) -> Iterator[dict[str, Any]]:
        length, stride = self._windows(max_seq_len, doc_stride)
        try:
            enc, _, offsets = encode_windows(
                self.tokenizer,
                [example["question"]],
                [example["context"]],
                length,
                stride,
                names=("max_seq_len", "doc_stride"),
            )
        except TupeError as err:
            raise ValueError(f"question-answering pipeline: {err}") from None
        for i, offs in enumerate(offsets):
            yield {
                **{k: torch.tensor([enc[k][i]]) for k in enc.keys()},
                "offsets": offs,
                "context": example["context"],
                "is_last": i == len(offsets) - 1,
            }

    def _forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        keep = {k: inputs.pop(k) for k in ("offsets", "context", "is_last")}
        out = self.model(**inputs)
        return {"start_logits": out.start_logits, "end_logits": out.end_logits, **keep}

    def postprocess(
        self,
        windows: list[dict[str, Any]],
        top_k: int = 1,
        max_answer_len: int | None = None,
        n_best: int | None = None,
        handle_impossible_answer: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        from tupe.finetuning.arguments import FinetuneSettings

        defaults = FinetuneSettings(task="qa")
        context = windows[0]["context"]
        ranked = rank_answers(
            [
                (w["start_logits"][0].float().numpy(), w["end_logits"][0].float().numpy(), w["offsets"])
                for w in windows
            ],
            context,
            max(n_best or defaults.n_best, top_k),
            max_answer_len or defaults.max_answer_length,
            with_null=handle_impossible_answer,
        )
        answers = [
            {"score": a.probability, "start": a.start, "end": a.end, "answer": a.text} for a in ranked[:top_k]
        ]
        if not answers:  # no span fits max_answer_len: the empty answer, as `tupe finetune` predicts then
            answers = [{"score": 0.0, "start": 0, "end": 0, "answer": ""}]
        return answers[0] if top_k == 1 else answers


def _as_examples(inputs: Any) -> Any:
    """A `{"question", "context"}` dict or a list of them, each checked; other iterables (a dataset, a
    generator) pass through to the pipeline's streaming."""
    if isinstance(inputs, dict):
        question, context = inputs.get("question"), inputs.get("context")
        if not isinstance(question, str) or not isinstance(context, str):
            raise ValueError(
                'question-answering pipeline: an input is a dict with a "question" and a "context" string'
            )
        if not question.strip() or not context.strip():
            raise ValueError(
                f"question-answering pipeline: empty {'question' if not question.strip() else 'context'}"
            )
        return {"question": question, "context": context}
    if isinstance(inputs, (list, tuple)):
        return [_as_examples(x) for x in inputs]
    return inputs


def register_pipelines() -> None:
    """Register "question-answering" when transformers has no such task of its own (transformers 5 removed it),
    and the token-classification subclass in place of the library's class (the same class for every other model)."""
    from transformers import AutoModelForQuestionAnswering, pipelines

    registry = pipelines.PIPELINE_REGISTRY
    register_token_classification()
    if (
        TASK in registry.supported_tasks or TASK in registry.task_aliases
    ):  # the library's own, or done already
        return
    registry.register_pipeline(
        TASK, pipeline_class=QuestionAnsweringPipeline, pt_model=AutoModelForQuestionAnswering, type="text"
    )
    getattr(pipelines, "REMOVED_TASKS", {}).pop(
        TASK, None
    )  # else pipeline() refuses the name before the registry


__all__ = ["QuestionAnsweringPipeline", "TokenClassificationPipeline", "register_pipelines"]


def _strings(value: object, what: str) -> list[str]:
    """A string or a list/tuple of strings as a list; anything else refused naming what was given."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(
        f"question-answering pipeline: {what} must be a string or a non-empty list of strings, "
        f"got {type(value).__name__} {value!r:.60}"
    )


register_pipelines()  # where the classes are defined: importing this module registers them (idempotent)
