"""`pipeline("token-classification")` reading words as tupe's tokenizers cut them: transformers' pipeline,
subclassed, for every model the library's code except where the library guesses words.

With a fast tokenizer that has no continuing-subword prefix ("##"), such as tupe's byte-level BPE, the library
takes a token for the start of a word when a space is next to it; a word that the BPE begins with a token of its
space alone ("Ġ", then "A", "l", ...: a rare first letter) becomes two words, the first an entity covering no
text (the space token's offsets are trimmed to nothing), and a word with punctuation after it ("Madrid.") one
word. For a tupe model, or a tokenizer of tupe's layout on any model (`word_spans.byte_level_words`), this
subclass takes words from the tokenizer itself (`word_ids()`: the pre-tokenizer's words, punctuation apart, as
CoNLL files split it and `tupe finetune --task ner` labelled them): a word's first token is the one training
labelled (even a space token), its span runs from its first to its last character (tokens that cover no text add
none; a word of white space alone is no entity), and `word` is `text[start:end]`. Without an
`aggregation_strategy`, a model whose config.json names one (`tupe finetune --task ner` saves the strategy that
matches how its labels were trained) is read with it; the library's default ("none") otherwise. Other models and
tokenizers get exactly the library's result.

Self-contained (transformers, `word_spans.py` beside it): `import tupe` registers this class for the task
(tupe/pipelines.py), and a model folder carries a copy of this file with its modeling code (`auto_map`), which
registers it when the folder is loaded with `trust_remote_code=True` where tupe is not installed
(`serve_token_classification`), so that `pipeline("token-classification", model=FOLDER, trust_remote_code=True)`
gives the entities it gives with tupe.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from transformers.pipelines import token_classification

from .word_spans import byte_level_words, with_exact_word_spans

TASK = "token-classification"


def saved_strategy(model: Any) -> Any:  # noqa: ANN401 - an AggregationStrategy or None
    """The `aggregation_strategy` a model's config names (a name of `AggregationStrategy`), or None."""
    name = getattr(getattr(model, "config", None), "aggregation_strategy", None)
    members = token_classification.AggregationStrategy.__members__
    if isinstance(name, str) and name.upper() in members:
        return members[name.upper()]
    return None


class TokenClassificationPipeline(token_classification.TokenClassificationPipeline):
    """transformers' token-classification pipeline, with words read from the tokenizer for tupe models and
    tokenizers of tupe's layout (the module's docstring says where and why); the library's result otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads_words = _reads_words(self.model, self.tokenizer)
        if self.reads_words:  # exact offsets (a tokenizer saved before them: a copy with the trimming step)
            self.tokenizer = with_exact_word_spans(self.tokenizer)
        saved = saved_strategy(self.model)
        if saved is not None and kwargs.get("aggregation_strategy") is None:
            # the strategy that reads words as the model was trained (`tupe finetune --task ner` saves it)
            self._postprocess_params["aggregation_strategy"] = saved

    def preprocess(
        self, sentence: Any, offset_mapping: Any = None, **preprocess_params: Any
    ) -> Iterator[dict]:
        tokenizer_params = dict(preprocess_params.get("tokenizer_params") or {})
        chunks = super().preprocess(sentence, offset_mapping=offset_mapping, **preprocess_params)
        if not self.reads_words or preprocess_params.get("is_split_into_words"):
            yield from chunks  # the library keeps the word ids of pre-split words itself
            return
        # the word ids of the same encoding, chunk by chunk (the library keeps them for pre-split words only)
        truncation = bool(self.tokenizer.model_max_length and self.tokenizer.model_max_length > 0)
        encoding = self.tokenizer(sentence, truncation=truncation, **tokenizer_params)
        for i, chunk in enumerate(chunks):
            words = encoding.word_ids(i)
            if len(words) != chunk["input_ids"].shape[-1]:  # never: the same text, tokenizer and settings
                raise RuntimeError("token-classification pipeline: the word ids do not match the tokens")
            yield {**chunk, "word_ids": words}

    def gather_pre_entities(
        self,
        sentence: str,
        input_ids: Any,
        scores: Any,
        offset_mapping: Any,
        special_tokens_mask: Any,
        aggregation_strategy: Any,
        word_ids: list[int | None] | None = None,
        word_to_chars_map: list[tuple[int, int]] | None = None,
    ) -> list[dict]:
        ours = self.reads_words and word_ids is not None and offset_mapping is not None
        with warnings.catch_warnings():
            if ours:  # the library's word guess, which `_words` replaces
                warnings.filterwarnings("ignore", "Tokenizer does not support real words", UserWarning)
            pre = super().gather_pre_entities(
                sentence,
                input_ids,
                scores,
                offset_mapping,
                special_tokens_mask,
                aggregation_strategy,
                word_ids=word_ids,
                word_to_chars_map=word_to_chars_map,
            )
        return _words(pre, word_ids, aggregation_strategy) if ours else pre

    def postprocess(
        self, all_outputs: Any, aggregation_strategy: Any = None, ignore_labels: Any = None
    ) -> Any:
        strategy = (
            token_classification.AggregationStrategy.NONE
            if aggregation_strategy is None
            else aggregation_strategy
        )
        entities = super().postprocess(
            all_outputs, aggregation_strategy=strategy, ignore_labels=ignore_labels
        )
        sentence = all_outputs[0].get("sentence")
        if self.reads_words and isinstance(sentence, str):
            for e in entities:  # the text itself, not the tokens decoded
                if e.get("start") is not None:
                    e["word"] = sentence[e["start"] : e["end"]]
        return entities


def _reads_words(model: Any, tokenizer: Any) -> bool:
    """Whether the token-classification pipeline takes words from the tokenizer: a fast tokenizer, and a tupe
    model (tupe's class or a folder's copy of it) or a tokenizer of tupe's layout (a `--scheme hf-bert` model
    fine-tuned by tupe has one)."""
    if not getattr(tokenizer, "is_fast", False):
        return False
    return getattr(getattr(model, "config", None), "model_type", None) == "tupe" or byte_level_words(
        tokenizer
    )


def _words(pre: list[dict], word_ids: list[int | None], strategy: Any) -> list[dict]:
    """The library's per-token records regrouped into the tokenizer's words: `is_subword` from the word ids; a
    token that covers no text (a space token, its offsets trimmed to nothing) is dropped token by token ("none",
    "simple") and kept inside its word by the word strategies, at the word's first character ("first" reads the
    word's first token, the one training labelled); a word that covers no text at all (white space) is dropped."""
    per_token = strategy in (
        token_classification.AggregationStrategy.NONE,
        token_classification.AggregationStrategy.SIMPLE,
    )
    groups: list[list[dict]] = []
    previous: int | None = None
    for e in pre:
        word = word_ids[e["index"]]
        if groups and word is not None and word == previous:
            groups[-1].append(e)
        else:
            groups.append([e])
        previous = word
    kept: list[dict] = []
    for group in groups:
        wide = [e for e in group if e["end"] > e["start"]]
        if not wide:
            continue
        first = True
        for e in group:
            if e["end"] <= e["start"]:
                if per_token:
                    continue
                later = [x for x in wide if x["start"] >= e["start"]]
                at = later[0]["start"] if later else wide[-1]["end"]
                e = {**e, "start": at, "end": at}
            kept.append({**e, "is_subword": not first})
            first = False
    return kept


def register_token_classification() -> None:
    """Serve "token-classification" with `TokenClassificationPipeline` where the registry holds the library's own
    class (the entry's models, default and type kept; a class someone else registered is left alone). Not
    `register_pipeline`: it would mark the class as custom code, and a pipeline saved with `save_pretrained` would
    then ask for trust_remote_code."""
    from transformers.pipelines import PIPELINE_REGISTRY

    entry = PIPELINE_REGISTRY.supported_tasks.get(TASK)
    library = token_classification.TokenClassificationPipeline
    if entry is not None and entry.get("impl") in (library, f"{library.__module__}.{library.__qualname__}"):
        PIPELINE_REGISTRY.supported_tasks[TASK] = {**entry, "impl": TokenClassificationPipeline}
