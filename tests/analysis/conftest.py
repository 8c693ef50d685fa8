"""Tiny tokenizer, text and model directories made on the fly (nothing from a hub, nothing from the shared data folder)."""

from __future__ import annotations

import pytest
import torch

from tupe import TupeForMaskedLM

from .. import helpers

WORDS = (
    "the cat sat on the mat while a dog ran past the old house and the children laughed at the birds "
    "in the garden near a river where boats moved slowly under grey clouds before the evening rain"
).split()


def make_text(num_words: int = 4000, seed: int = 0) -> str:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(WORDS), (num_words,), generator=g).tolist()
    sentences, cur = [], []
    for k, i in enumerate(idx):
        cur.append(WORDS[i])
        if k % 11 == 10:
            sentences.append(" ".join(cur).capitalize() + ".")
            cur = []
    return " ".join(sentences)


def make_tokenizer(vocab_size: int = 300):
    """Byte-level BPE following the project's tokenizer contract ([PAD]=0 [CLS]=1 [SEP]=2 [MASK]=3 [UNK]=4)."""
    from ..helpers import train_test_tokenizer

    return train_test_tokenizer([make_text(2000, seed=1)], vocab_size)


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Give every parameter (LayerNorm gains and biases too) generic values, so no term vanishes by accident."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight") or name.endswith("_norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def tiny_config(scheme: str, **overrides):  # noqa: ANN201
    """The shared tiny model, a little wider: the analysis draws per-head patterns over 64 positions."""
    sizes = dict(vocab_size=300, hidden_size=32, num_attention_heads=4, intermediate_size=64)
    return helpers.tiny_config(scheme, max_position_embeddings=64, **{**sizes, **overrides})


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "sample.txt"
    path.write_text(make_text())
    return path


@pytest.fixture
def tupe_dir(tmp_path, tokenizer):
    """Save a tiny randomised TUPE model (+ tokenizer) of the given scheme; returns its directory."""

    def make(scheme: str, with_tokenizer: bool = True, seed: int = 0):
        torch.manual_seed(seed)
        model = TupeForMaskedLM(tiny_config(scheme))
        randomise(model, seed)
        path = tmp_path / scheme
        model.save_pretrained(path)
        if with_tokenizer:
            tokenizer.save_pretrained(path)
        return path

    return make


@pytest.fixture
def bert_dir(tmp_path, tokenizer):
    """A tiny randomised transformers BertForMaskedLM saved to disk with a tokenizer, as a user would have."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    model = BertForMaskedLM(config).eval()
    randomise(model, 3)
    path = tmp_path / "bert"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
