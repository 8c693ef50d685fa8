"""Whole-word masking for tupe's byte-level BPE: `transformers.DataCollatorForLanguageModeling(whole_word_mask=True)`
with one change, where the library's words are wrong for a byte-level tokenizer.

The library starts a word at every token whose span does not begin where the previous token's ends. A character of
several UTF-8 bytes that the BPE has no single token for (a curly quote ’, an accented or non-Latin letter) becomes
two or more byte tokens, each with the span of that one character: the second starts *before* the first ends, so
the library cuts the word there ("don’t" becomes "don" + the quote's first byte, and its second byte + "t") and
masks half a character. Here a new word starts only after a gap: a token whose span touches or overlaps the
previous token's (the same character's bytes) stays in its word, as every other part of the word does.

    from tupe.data.whole_word import WholeWordMaskCollator

    collator = WholeWordMaskCollator(tokenizer, mlm_probability=0.15)  # whole_word_mask=True by default
    batch = collator([tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True) for text in texts])

Everything else (the arguments, the 80/10/10 replacement, the seed) is the library's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import DataCollatorForLanguageModeling


@dataclass
class WholeWordMaskCollator(DataCollatorForLanguageModeling):
    """`DataCollatorForLanguageModeling` with `whole_word_mask=True` (the default here) whose words keep the byte
    tokens of one character together (the module's docstring)."""

    whole_word_mask: bool = True

    @staticmethod
    def _calc_word_ids_and_prob_mask(offsets: Any, special_tokens_mask: Any) -> tuple[Any, Any]:  # noqa: ANN401
        """(word id of each token, -1 for special tokens; True where a token may not be drawn: all but the first
        token of each word), as the library's method returns them; a word starts after a gap between spans."""
        starts, ends = offsets[:, :, 0], offsets[:, :, 1]
        previous_ends = np.roll(ends, 1, axis=1)
        previous_ends[:, 0] = -1
        special = special_tokens_mask.astype(bool)
        previous_special = np.roll(special, 1, axis=1)
        previous_special[:, 0] = False
        new_word = ~special & ((starts > previous_ends) | previous_special)
        word_ids = np.cumsum(new_word, axis=1)
        word_ids[special] = -1
        return word_ids, ~new_word
