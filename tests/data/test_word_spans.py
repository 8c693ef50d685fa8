"""Word spans of tupe's byte-level BPE: offsets without the space before a word (a trimming `ByteLevel` step in
the post-processor), decoded text without the space `add_prefix_space` adds, the same ids as before, the same fix
for a tokenizer saved before it, and what reads the spans: `transformers`' whole-word masking collator, the
token-classification pipeline's entities and the question-answering pipeline's answers.

The oracle for a word is the text itself: a maximal run of non-space characters (`\\S+`)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from tupe.data.tokenizer import load_tokenizer, tokenizer_fingerprint, wrap_backend

SENTENCES = [
    "Emma Green lives in Madrid.",
    "The cat sat on the mat,  and then   it slept near the old stone wall of the garden.",
    "Mr. Smith went to Washington; the fox followed him there.",
]


def _words(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\S+", text)]


def _tagged_words(text: str) -> list[tuple[int, int]]:
    """The words a CoNLL file (and tupe's pre-tokenizer) splits a text into: runs of letters, of digits, of other
    characters that are not space ("Madrid", "." of "Madrid.")."""
    return [m.span() for m in re.finditer(r"[^\W\d_]+|\d+|(?:[^\w\s]|_)+", text)]


def _definition(tok) -> dict:  # noqa: ANN001
    """The backend's JSON definition, without the truncation and padding state earlier calls may have left."""
    return {**json.loads(tok.backend_tokenizer.to_str()), "truncation": None, "padding": None}


def _fresh(tok):  # noqa: ANN001, ANN202
    return wrap_backend(Tokenizer.from_str(json.dumps(_definition(tok))))


def _before_the_fix(tok):  # noqa: ANN001, ANN202
    """The same tokenizer as tupe trained it before: a bare template post-processor and a bare ByteLevel decoder."""
    data = _definition(tok)
    assert [p["type"] for p in data["post_processor"]["processors"]] == ["ByteLevel", "TemplateProcessing"]
    assert [d["type"] for d in data["decoder"]["decoders"]] == ["ByteLevel", "Strip"]
    data["post_processor"] = data["post_processor"]["processors"][1]
    data["decoder"] = data["decoder"]["decoders"][0]
    return wrap_backend(Tokenizer.from_str(json.dumps(data)))


def _assert_exact_spans(tok, text: str) -> None:  # noqa: ANN001
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    words = _words(text)
    for (start, end), special in zip(enc["offset_mapping"], enc["special_tokens_mask"]):
        if special or start == end:  # special tokens; a token of white space only covers no text once trimmed
            continue
        assert any(a <= start and end <= b for a, b in words), (text[start:end], text)
    starts = {start for (start, end), sp in zip(enc["offset_mapping"], enc["special_tokens_mask"]) if not sp}
    assert all(a in starts for a, _ in words)  # every word starts a token's span: no span starts at the space


def test_offsets_are_word_spans_and_ids_do_not_change(small_tokenizer) -> None:  # noqa: ANN001
    old = _before_the_fix(small_tokenizer)
    for text in SENTENCES:
        _assert_exact_spans(small_tokenizer, text)
        assert old(text)["input_ids"] == small_tokenizer(text)["input_ids"]
        ids = small_tokenizer(text)["input_ids"]
        # decoding drops only the space add_prefix_space put before the first word
        assert small_tokenizer.decode(ids, skip_special_tokens=True) == text
        assert old.decode(ids, skip_special_tokens=True) == " " + text
    # the defect this fixes: the old offsets of " the" ("\u0120the", one token) start at the space
    text = SENTENCES[1]
    old_spans = old(text, return_offsets_mapping=True)["offset_mapping"]
    new_spans = small_tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    at = text.index(" the ")
    assert (at, at + 4) in old_spans and (at + 1, at + 4) in new_spans
    # ids of pairs, batches and overflowing windows too
    kwargs = dict(truncation="only_second", max_length=48, stride=4, return_overflowing_tokens=True)
    assert (
        old(SENTENCES[:2], SENTENCES[1:], **kwargs)["input_ids"]
        == small_tokenizer(SENTENCES[:2], SENTENCES[1:], **kwargs)["input_ids"]
    )
    assert small_tokenizer.convert_tokens_to_string(["\u0120Madrid"]) == "Madrid"


def test_a_tokenizer_saved_before_is_fixed_when_tupe_loads_it_and_keys_no_cache_anew(
    small_tokenizer, small_corpus_dir: Path, tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    from tupe.data import corpus as corpus_mod
    from tupe.data import tokenizer as tok_mod
    from tupe.io.checkpoints import load_tokenizer as load_model_tokenizer
    from tupe.io.files import sha256_file

    new, old = _fresh(small_tokenizer), _before_the_fix(small_tokenizer)
    # the cache key: the fingerprint leaves out what changes no id, so data packed before is reused, as it is
    assert tokenizer_fingerprint(old) == tokenizer_fingerprint(new)
    assert (
        tokenizer_fingerprint(old) == hashlib.sha256(old.backend_tokenizer.to_str().encode()).hexdigest()[:20]
    )
    old.save_pretrained(tmp_path / "old")
    loaded = [
        load_tokenizer(tmp_path / "old"),
        load_tokenizer(tmp_path / "old" / "tokenizer.json"),
        load_model_tokenizer(tmp_path / "old"),
    ]
    # a tokenizer cached by an older tupe (with its SHA-256 record): reused, not trained again, and fixed
    corpus = corpus_mod.resolve_corpus([str(small_corpus_dir)])
    first = tok_mod.get_or_train_tokenizer(corpus, tmp_path / "cache", 350, log=lambda _m: None)
    (cached,) = (tmp_path / "cache" / "tokenizers").iterdir()
    first = _fresh(first)
    _before_the_fix(first).save_pretrained(cached)
    (cached / tok_mod.CACHE_RECORD).write_text(
        json.dumps({"tokenizer.json": sha256_file(cached / "tokenizer.json")})
    )

    def boom(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("trained again instead of reusing the cache")

    monkeypatch.setattr(tok_mod, "train_tokenizer", boom)
    loaded.append(tok_mod.get_or_train_tokenizer(corpus, tmp_path / "cache", 350, log=lambda _m: None))
    for tok in loaded:
        for text in SENTENCES:
            _assert_exact_spans(tok, text)
    assert [tokenizer_fingerprint(t) for t in loaded[:3]] == [tokenizer_fingerprint(old)] * 3
    assert tokenizer_fingerprint(loaded[3]) == tokenizer_fingerprint(first)


@pytest.fixture(scope="module")
def wider_tokenizer(small_corpus_dir: Path):  # noqa: ANN201
    """A vocabulary of 2,000: words of one to a few tokens, as with a real vocabulary."""
    from tupe.data import resolve_corpus, train_tokenizer

    return train_tokenizer(resolve_corpus([str(small_corpus_dir)]), vocab_size=2000, show_progress=False)


def _masked_shares(tok, rows: list[str], rate: float, length: int):  # noqa: ANN001, ANN202
    """One draw of the collator: (the examples, which tokens it masked, each row's masked share of its tokens)."""
    from transformers import DataCollatorForLanguageModeling

    examples = []
    for text in rows:
        e = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert len(e["input_ids"]) >= length
        examples.append({k: v[: length - 1] + v[-1:] for k, v in e.items()})  # equal lengths, [SEP] last
    with pytest.warns(UserWarning, match="Random token replacement is not supported"):
        collator = DataCollatorForLanguageModeling(tok, whole_word_mask=True, mlm_probability=rate, seed=0)
    masked = collator(examples)["labels"] != -100
    special = torch.tensor([e["special_tokens_mask"] for e in examples]).bool()
    assert not (masked & special).any()
    return examples, masked, masked.sum(1) / (~special).sum(1)


def test_whole_word_masking_masks_whole_words_at_the_requested_rate(wider_tokenizer) -> None:  # noqa: ANN001
    r"""`DataCollatorForLanguageModeling(whole_word_mask=True)` (transformers 5) starts a word where a token's span
    does not begin where the previous one's ends. With the space inside the spans there is no such gap: each row
    was one word, masked all or nothing. Now each row's masked share is within a few points of the rate, and every
    word of the text (the oracle: `\S+`) is masked whole or not at all."""
    from tests.data.conftest import book_lines

    rate, length, per_row = 0.15, 512, 420
    words = " ".join(line for book in book_lines(3, 150) for line in book).split()
    rows = [" ".join(words[i * per_row : (i + 1) * per_row]) for i in range(16)]
    examples, masked, share = _masked_shares(wider_tokenizer, rows, rate, length)
    # ~350 words a row, each masked with probability 0.15: one standard deviation of a row's share is ~2.3 points
    assert (share - rate).abs().max() < 0.075, share
    assert abs(share.mean().item() - rate) < 0.02, share.mean()
    for row, (text, example) in enumerate(zip(rows, examples)):
        spans = _words(text)
        by_word: dict[int, list[bool]] = {}  # each word of the text -> its tokens' masked states
        for k, (start, end) in enumerate(example["offset_mapping"]):
            if example["special_tokens_mask"][k] or start == end:
                continue
            word = next(i for i, (a, b) in enumerate(spans) if a <= start and end <= b)
            by_word.setdefault(word, []).append(bool(masked[row, k]))
        assert all(len(set(states)) == 1 for states in by_word.values()), row  # masked whole or not at all
        assert (
            len(by_word) > 250 and sum(len(states) > 1 for states in by_word.values()) > 25
        )  # words of sub-words
    # the defect, for contrast: the same tokenizer as saved before the fix masks rows all or nothing
    _, _, before = _masked_shares(_before_the_fix(wider_tokenizer), rows, rate, length)
    assert set(before.tolist()) <= {0.0, 1.0}, before


def _token_classifier(tok, labels: list[str], favourite: int):  # noqa: ANN001, ANN202
    from tupe import TupeConfig, TupeForTokenClassification

    config = TupeConfig(
        vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, position_scheme="tupe-a", pad_token_id=0, cls_token_id=1, sep_token_id=2,
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)},
    )  # fmt: skip
    model = TupeForTokenClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.zero_()
        model.classifier.bias[favourite] = 10.0  # every token gets this label
    return model


def test_ner_entities_are_exact_word_spans(wider_tokenizer, tmp_path: Path) -> None:  # noqa: ANN001
    """Every token labelled B-PER: with a word-level strategy each entity is one word of the text as CoNLL splits
    it (punctuation apart: tupe's token-classification pipeline reads the tokenizer's words), `word` equal to
    `text[start:end]`; token by token ("simple") each entity is one token's exact span. A tokenizer saved before
    the fix, loaded by tupe, gives the same. (Single spaces: a run of spaces is a token of its own, which covers no
    text once trimmed.)"""
    from transformers import pipeline

    texts = [SENTENCES[0], SENTENCES[2], "The cat sat on the mat, and then it slept."]
    _before_the_fix(wider_tokenizer).save_pretrained(tmp_path / "old")
    for tok in (wider_tokenizer, load_tokenizer(tmp_path / "old")):
        model = _token_classifier(tok, ["O", "B-PER", "I-PER"], favourite=1)
        ner = pipeline("token-classification", model=model, tokenizer=tok, aggregation_strategy="first")
        for text in texts:
            got = [(e["word"], e["start"], e["end"]) for e in ner(text)]
            assert got == [(text[a:b], a, b) for a, b in _tagged_words(text)]
        simple = pipeline("token-classification", model=model, tokenizer=tok, aggregation_strategy="simple")
        entities = simple(texts[0])
        assert len(entities) == len(tok.tokenize(texts[0]))  # one a token: sub-words too
        for e in entities:
            assert e["word"] == texts[0][e["start"] : e["end"]] and e["word"] == e["word"].strip()


def test_qa_answers_are_exact_spans_without_stripping(small_tokenizer, tmp_path: Path) -> None:  # noqa: ANN001
    """The question-answering pipeline's answers are the context between their tokens' offsets, nothing removed:
    every one of the top 30 begins and ends at a word's characters, never at a space, also with a tokenizer saved
    before the fix and loaded by `transformers` alone (the pipeline gives it the trimming step)."""
    from transformers import AutoTokenizer, pipeline

    import tupe  # noqa: F401  (registers the question-answering pipeline)
    from tupe import TupeConfig, TupeForQuestionAnswering

    _before_the_fix(small_tokenizer).save_pretrained(tmp_path / "old")
    old = AutoTokenizer.from_pretrained(tmp_path / "old")
    context = SENTENCES[1] + " " + SENTENCES[2]
    torch.manual_seed(0)
    config = TupeConfig(
        vocab_size=len(small_tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=128, position_scheme="tupe-a", pad_token_id=0,
        cls_token_id=1, sep_token_id=2,
    )  # fmt: skip
    model = TupeForQuestionAnswering(config).eval()
    for tok in (small_tokenizer, old):
        qa = pipeline("question-answering", model=model, tokenizer=tok)
        answers = qa(question="Where did the cat sit?", context=context, top_k=30, max_answer_len=8)
        assert len(answers) == 30
        for a in answers:
            assert a["answer"] == context[a["start"] : a["end"]] and a["answer"]
            assert not a["answer"][0].isspace() and not a["answer"][-1].isspace(), a


def test_the_fingerprint_ignores_truncation_and_padding_left_by_a_call(small_tokenizer) -> None:  # noqa: ANN001
    """A call with truncation or padding leaves them set in the backend (its JSON holds them); the cache key must
    not change with them, and a tokenizer as loaded keeps the key it always had (the hash of its JSON)."""
    for tok in (_fresh(small_tokenizer), _before_the_fix(small_tokenizer)):
        before = tokenizer_fingerprint(tok)
        tok(SENTENCES[:2], truncation=True, max_length=5, padding="max_length")
        state = json.loads(tok.backend_tokenizer.to_str())
        # the state the key must ignore
        assert state["truncation"] is not None and state["padding"] is not None
        assert tokenizer_fingerprint(tok) == before
    old = _before_the_fix(small_tokenizer)
    as_loaded = hashlib.sha256(old.backend_tokenizer.to_str().encode()).hexdigest()[:20]
    assert tokenizer_fingerprint(old) == as_loaded


def test_whole_word_masking_keeps_a_character_s_byte_tokens_in_its_word() -> None:
    r"""Issue 49: a curly quote the BPE has no token for becomes byte tokens with the same span (one character);
    transformers' collator starts a word at the second of them (its span does not begin where the previous one
    ends) and masks half a word. `tupe.data.whole_word.WholeWordMaskCollator` keeps tokens whose spans touch or
    overlap in one word: every word of the text (the oracle: `\S+`) is masked whole or not at all."""
    from transformers import DataCollatorForLanguageModeling

    from tests.data.conftest import book_lines
    from tests.helpers import train_test_tokenizer
    from tupe.data.whole_word import WholeWordMaskCollator

    ascii_lines = [line.encode("ascii", "ignore").decode() for book in book_lines(3, 150) for line in book]
    tok = train_test_tokenizer(ascii_lines, 400)  # it never saw a curly quote: byte tokens
    enc = tok("don\u2019t", return_offsets_mapping=True)
    assert enc["offset_mapping"].count((3, 4)) >= 2  # the quote's bytes, in tokens of one character's span
    words = " ".join(ascii_lines).split()
    quoted = ["don\u2019t", "it\u2019s", "\u2018well\u2019", "Smith\u2019s", "caf\u00e9"]
    rows = [" ".join(w if k % 4 else quoted[(k // 4) % 5] for k, w in enumerate(words[i * 120 : (i + 1) * 120]))
            for i in range(16)]  # fmt: skip
    examples = []
    for text in rows:
        e = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        examples.append({k: v[:127] + v[-1:] for k, v in e.items()})

    def split_words(collator_class: type) -> int:
        """How many words of the text the collator masked in part, over the rows."""
        with pytest.warns(UserWarning, match="Random token replacement is not supported"):
            collator = collator_class(tok, whole_word_mask=True, mlm_probability=0.3, seed=0)
        masked = collator(examples)["labels"] != -100
        split = whole = 0
        for row, (text, example) in enumerate(zip(rows, examples)):
            spans = _words(text)
            by_word: dict[int, set[bool]] = {}
            for k, (start, end) in enumerate(example["offset_mapping"]):
                if example["special_tokens_mask"][k] or start == end:
                    continue
                word = next(i for i, (a, b) in enumerate(spans) if a <= start and end <= b)
                by_word.setdefault(word, set()).add(bool(masked[row, k]))
            split += sum(len(states) > 1 for states in by_word.values())
            whole += sum(states == {True} for states in by_word.values())
        assert whole > 50  # it masks words at all
        return split

    assert split_words(WholeWordMaskCollator) == 0
    assert split_words(DataCollatorForLanguageModeling) > 0  # the library's words, for contrast
