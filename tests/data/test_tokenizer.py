"""The tokenizer contract every part of tupe relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tupe.data.tokenizer import SPECIAL_TOKENS, check_tokenizer, get_or_train_tokenizer, load_tokenizer
from tupe.errors import TupeError


def test_special_tokens_and_templates(small_tokenizer, tmp_path: Path) -> None:  # noqa: ANN001
    tok = small_tokenizer
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (0, 1, 2, 3)
    enc = tok("the cat", "a dog")
    assert "token_type_ids" not in enc
    ids = enc["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(2) == 2
    single = tok("the cat")["input_ids"]
    assert single[0] == 1 and single[-1] == 2 and single.count(2) == 1
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("the cat", "a dog")["input_ids"] == ids
    assert again.model_input_names == ["input_ids", "attention_mask"]
    # "[MASK]" takes the space before it: the next word keeps its usual " word" piece
    pieces = again.convert_ids_to_tokens(again("the [MASK] sat")["input_ids"])
    assert "[MASK]" in pieces and pieces[pieces.index("[MASK]") - 1] != "\u0120"
    assert len(tok) == 400


def test_load_tokenizer_checks_contract(small_tokenizer, tmp_path: Path) -> None:  # noqa: ANN001
    small_tokenizer.save_pretrained(tmp_path / "ok")
    check_tokenizer(load_tokenizer(tmp_path / "ok"))
    assert load_tokenizer(tmp_path / "ok" / "tokenizer.json").mask_token_id == 3
    from tokenizers import Tokenizer, models

    bad = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}, "[UNK]"))
    bad.save(str(tmp_path / "bad.json"))
    with pytest.raises(TupeError, match=r"special token \[PAD\] has id 1"):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(TupeError, match="not found"):
        load_tokenizer(tmp_path / "missing")


def test_trained_tokenizer_is_cached(small_corpus_dir: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from tupe.data import corpus as corpus_mod
    from tupe.data import tokenizer as tok_mod

    corpus = corpus_mod.resolve_corpus([str(small_corpus_dir)])
    first = get_or_train_tokenizer(corpus, tmp_path, 350, log=lambda _m: None)

    def boom(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("trained again instead of reusing the cache")

    monkeypatch.setattr(tok_mod, "train_tokenizer", boom)
    second = get_or_train_tokenizer(corpus, tmp_path, 350, log=lambda _m: None)
    assert first.get_vocab() == second.get_vocab()
    monkeypatch.setattr(corpus_mod, "MAX_WORD_CHARS", 100)  # another line rule: other training text
    with pytest.raises(AssertionError, match="trained again"):
        get_or_train_tokenizer(corpus, tmp_path, 350, log=lambda _m: None)


def test_a_full_disk_while_caching_the_tokenizer_is_one_line_and_leaves_nothing(
    small_corpus_dir: Path, tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    """The tokenizers library reports a full disk as a plain `Exception` (issue 38): one line, partial files gone."""
    from transformers import PreTrainedTokenizerFast

    from tupe.data import corpus as corpus_mod

    def full(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise Exception("No space left on device (os error 28)")  # noqa: TRY002 - what the library raises

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", full)
    corpus = corpus_mod.resolve_corpus([str(small_corpus_dir)])
    with pytest.raises(TupeError, match="the trained tokenizer was not cached .partial files removed."):
        get_or_train_tokenizer(corpus, tmp_path, 350, log=lambda _m: None)
    assert (tmp_path / "tokenizers").is_dir()
    assert not [p for p in (tmp_path / "tokenizers").rglob("*") if p.name.startswith(".")]


def test_bpe_training_has_a_progress_bar_in_a_log_too(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """Issue 49: the tokenizers library draws its bars on a terminal only, so a logged `tupe pretrain` showed
    nothing while the BPE read the corpus; a tqdm bar over the corpus's bytes shows it (none without progress)."""
    from tupe.data.corpus import Corpus
    from tupe.data.tokenizer import train_tokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat and the dog ran far away\n" * 2000)
    train_tokenizer(Corpus(files=[corpus]), vocab_size=300, min_frequency=1, show_progress=True)
    err = capsys.readouterr().err
    assert "BPE: 100%" in err and f"{corpus.stat().st_size / 1000:.1f}k/" in err, err
    train_tokenizer(Corpus(files=[corpus]), vocab_size=300, min_frequency=1, show_progress=False)
    assert "BPE" not in capsys.readouterr().err
