"""The shared I/O layer: one checkpoint loader for every command, and its one-line errors."""

from __future__ import annotations

import pytest
from transformers import BertConfig, BertForMaskedLM

from tupe import TupeForMaskedLM, TupeModel
from tupe.errors import TupeError
from tupe.io import load_model_and_tokenizer

from .helpers import tiny_config, train_test_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_test_tokenizer(["the cat sat on the mat"] * 20 + ["a dog ran past"] * 20, 300)


def test_loads_a_tupe_checkpoint_with_its_kernel_and_tokenizer(tmp_path, tokenizer):
    TupeForMaskedLM(
        tiny_config("tupe-a", vocab_size=len(tokenizer), attention_kernel="fold")
    ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, tok = load_model_and_tokenizer(tmp_path)
    assert isinstance(model, TupeForMaskedLM) and not model.training
    assert model.config.attention_kernel == "fold" and len(tok) == len(tokenizer)
    encoder, _ = load_model_and_tokenizer(tmp_path, TupeModel, attn_implementation="eager")
    assert isinstance(encoder, TupeModel) and encoder.config.attention_kernel == "eager"


def test_converts_a_bert_checkpoint(tmp_path, tokenizer):
    bert = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    BertForMaskedLM(bert).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, _ = load_model_and_tokenizer(tmp_path)
    assert model.config.position_scheme == "bert-a"


def test_missing_tokenizer_is_one_line(tmp_path, tokenizer):
    TupeForMaskedLM(tiny_config("bert-a", vocab_size=len(tokenizer))).save_pretrained(tmp_path)
    with pytest.raises(TupeError, match="no tokenizer files .*--tokenizer DIR"):
        load_model_and_tokenizer(tmp_path)
