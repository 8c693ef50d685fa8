"""The tokenizer of the authors' released TUPE pipeline: Moses, then fastBPE codes, then the fairseq dictionary.

Released pipeline (`guolinke/TUPE`, `preprocess/`): `tokenizer.perl -no-escape -l en` (Moses), `fastbpe applybpe`
with the learned codes (a piece that continues a word ends in `@@`; in the codes file `</w>` marks a word's
end), then `fairseq preprocess` maps pieces to the ids of `dict.txt`, and the model reads `<s> ... </s>`
(pairs `<s> A </s> </s> B </s>`, the fine-tuning's `--init-token 0 --separator-token 2`).

`FairseqMosesBPETokenizer` is `transformers`' own `XLMTokenizer` (sacremoses + the fastBPE merge rule, the same
greedy lowest-rank merges as `fastBPE::process_bpe`) with the released choices: no punctuation normalisation in the
tokenizer, no accent removal, optional plain lower-casing, the fairseq special tokens and pair layout. Its vocabulary
file is the fairseq dictionary in XLM's spelling (`piece@@` -> `piece`, word-final `piece` -> `piece</w>`), so ids
are the dictionary's.

This module imports only the standard library and `transformers` (sacremoses when a tokenizer is built): saved
folders carry a copy of it, so `AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)` works without `tupe`.
"""

from __future__ import annotations

from transformers.models.xlm.tokenization_xlm import XLMTokenizer

# The released fork's `fairseq.data.Dictionary` puts these first; stock fairseq has only the first four.
FAIRSEQ_SPECIALS: tuple[str, ...] = ("<s>", "<pad>", "</s>", "<unk>")
RELEASED_EXTRA_SPECIALS: tuple[str, ...] = ("<file>", "<email>", "<url>")
MASK = "<mask>"


def fairseq_to_xlm_piece(piece: str) -> str:
    """fastBPE output spelling -> XLM vocabulary spelling: `th@@` -> `th`, `the` (word-final) -> `the</w>`."""
    if piece.endswith("@@") and len(piece) > 2:
        return piece[:-2]
    return piece + "</w>"


def xlm_to_fairseq_piece(piece: str) -> str:
    """The inverse of `fairseq_to_xlm_piece` (special tokens pass unchanged)."""
    if piece.endswith("</w>"):
        return piece[: -len("</w>")]
    return piece + "@@"


class FairseqMosesBPETokenizer(XLMTokenizer):
    """Moses (`tokenizer.perl -no-escape -l en`) + fastBPE + fairseq dictionary, as the released TUPE code.

    Args:
        vocab_file: JSON map from XLM-spelled pieces (and special tokens) to the fairseq dictionary's ids.
        merges_file: the fastBPE codes (`first second [count]` per line, rank = line order).
        lowercase: lower-case the text before Moses. The released clean-up scripts lower-case everything before
            Moses (pre-training and GLUE), so a model trained on their output has an uncased dictionary.
    """

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        merges_file: str,
        lowercase: bool = False,
        unk_token: str = "<unk>",
        bos_token: str = "<s>",
        eos_token: str = "</s>",
        sep_token: str = "</s>",
        pad_token: str = "<pad>",
        cls_token: str = "<s>",
        mask_token: str = MASK,
        additional_special_tokens: list[str] | None = None,
        **kwargs,
    ):
        kwargs.pop("do_lowercase_and_remove_accent", None)
        kwargs.pop("extra_special_tokens", None)
        self.lowercase = bool(lowercase)
        super().__init__(
            vocab_file=vocab_file,
            merges_file=merges_file,
            unk_token=unk_token,
            bos_token=bos_token,
            eos_token=eos_token,
            sep_token=sep_token,
            pad_token=pad_token,
            cls_token=cls_token,
            mask_token=mask_token,
            additional_special_tokens=list(additional_special_tokens or []),
            do_lowercase_and_remove_accent=False,
            lowercase=self.lowercase,
            **kwargs,
        )

    @property
    def do_lower_case(self) -> bool:
        return self.lowercase

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        """Lower-case (if configured), Moses-tokenize without escaping, split each word with the BPE codes."""
        if self.lowercase:
            text = text.lower()
        pieces: list[str] = []
        for word in self.moses_tokenize(text, "en"):  # XLM's: escape=False, no aggressive dash splits
            if word:
                pieces.extend(self.bpe(word).split(" "))
        return pieces

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Pieces joined into Moses-tokenized text (no detokenisation, as fairseq's `--remove-bpe`)."""
        return "".join(tokens).replace("</w>", " ").strip()

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        """`<s> A </s>`, and for pairs `<s> A </s> </s> B </s>` (the released fine-tuning's layout)."""
        cls, sep = [self.cls_token_id], [self.sep_token_id]
        if token_ids_1 is None:
            return cls + token_ids_0 + sep
        return cls + token_ids_0 + sep + sep + token_ids_1 + sep

    def get_special_tokens_mask(
        self,
        token_ids_0: list[int],
        token_ids_1: list[int] | None = None,
        already_has_special_tokens: bool = False,
    ) -> list[int]:
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, already_has_special_tokens=True)
        if token_ids_1 is None:
            return [1] + [0] * len(token_ids_0) + [1]
        return [1] + [0] * len(token_ids_0) + [1, 1] + [0] * len(token_ids_1) + [1]

    def create_token_type_ids_from_sequences(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        """All zeros: the released model has no segment embeddings."""
        return [0] * len(self.build_inputs_with_special_tokens(token_ids_0, token_ids_1))

    def fairseq_pieces(self, text: str) -> list[str]:
        """The pieces as fastBPE writes them (`th@@ e`), for comparing with the released preprocessing's files."""
        specials = set(self.all_special_tokens)
        return [t if t in specials else xlm_to_fairseq_piece(t) for t in self.tokenize(text)]
