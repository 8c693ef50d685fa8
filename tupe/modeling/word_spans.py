"""Exact word spans of a byte-level BPE tokenizer (tupe's), and whether a tokenizer's words are only known to its
pre-tokenizer: what the token-classification pipeline (`token_classification.py`), the question-answering
pipeline and tupe's tokenizer loading read.

Self-contained (the standard library, `tokenizers`): a model folder carries a copy of this file with its
modeling code (`auto_map`), for users without tupe.
"""

from __future__ import annotations

import json
from typing import Any


def _part(component: Any, name: str) -> dict | None:
    """The settings of a `tokenizers` component (pre-tokenizer, post-processor) of type `name`, itself or in its
    Sequence; None if it has none."""
    if component is None or not hasattr(component, "__getstate__"):
        return None
    state = json.loads(component.__getstate__())
    parts = state.get("pretokenizers") or state.get("processors") or [state]
    return next((part for part in parts if isinstance(part, dict) and part.get("type") == name), None)


def _span_steps(tok: Any) -> tuple[Any, Any]:
    """(the post-processor, the decoder) that give `tok` exact word spans, each None where `tok`'s own is right
    already (see `exact_word_spans`); (None, None) for any tokenizer other than a byte-level BPE."""
    backend = getattr(tok, "backend_tokenizer", None)
    byte_level = _part(backend.pre_tokenizer, "ByteLevel") if backend is not None else None
    if byte_level is None:
        return None, None
    from tokenizers import decoders, processors

    prefix_space = bool(byte_level.get("add_prefix_space"))
    post = decoder = None
    if type(backend.post_processor).__name__ == "TemplateProcessing":
        # add_prefix_space as the pre-tokenizer's: it tells the trimming whether the first word's space is in the text
        trim = processors.ByteLevel(add_prefix_space=prefix_space, trim_offsets=True)
        post = processors.Sequence([trim, backend.post_processor])
    if prefix_space and type(backend.decoder).__name__ == "ByteLevel":
        decoder = decoders.Sequence([backend.decoder, decoders.Strip(" ", 1, 0)])
    return post, decoder


def exact_word_spans(tok: Any) -> bool:
    """Give a byte-level BPE tokenizer word spans without the space before each word, in place; True if it changed.

    A byte-level pre-tokenizer keeps the space in front of a word inside its token ("Ġworld"). Its offsets cover
    that space unless the post-processor has a trimming `ByteLevel(trim_offsets=True)` step, and with
    `add_prefix_space` (a space put before the first word, not in the text) its decoder gives every text, and every
    entity's `word`, a leading space unless a `Strip` of one leading space follows it. tupe's tokenizers trained
    before they had both lacked them (a bare `TemplateProcessing`, a bare ByteLevel decoder); the steps are added
    as tupe now trains them. Offsets and decoded text change, never ids. Any other tokenizer (WordPiece, one whose
    post-processor is not a bare template or whose decoder is not a bare ByteLevel) is left as it is. For a
    tokenizer that is not tupe's own to change (a user's, handed to a pipeline), `with_exact_word_spans`."""
    post, decoder = _span_steps(tok)
    if post is not None:
        tok.backend_tokenizer.post_processor = post
    if decoder is not None:
        tok.backend_tokenizer.decoder = decoder
    return post is not None or decoder is not None


def with_exact_word_spans(tok: Any) -> Any:
    """`tok` itself when its word spans are exact already (or it is no byte-level BPE), else a copy of it with the
    steps of `exact_word_spans`: the caller's tokenizer is never changed."""
    if _span_steps(tok) == (None, None):
        return tok
    import copy

    tok = copy.deepcopy(tok)
    exact_word_spans(tok)
    return tok


def byte_level_words(tok: Any) -> bool:
    """True for a fast byte-level BPE tokenizer of tupe's layout (a byte-level pre-tokenizer, a [CLS]/[SEP]
    template post-processor, no continuing-subword prefix): the tokenizers whose words only their pre-tokenizer
    knows (`word_ids()`), which `transformers`' token-classification pipeline guesses from the spaces around
    each token instead."""
    backend = getattr(tok, "backend_tokenizer", None)
    if (
        not getattr(tok, "is_fast", False)
        or backend is None
        or _part(backend.pre_tokenizer, "ByteLevel") is None
    ):
        return False
    if getattr(backend.model, "continuing_subword_prefix", None):
        return False
    return _part(backend.post_processor, "TemplateProcessing") is not None
