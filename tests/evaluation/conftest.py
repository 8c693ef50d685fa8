"""Tiny text, tokenizer and checkpoints for `tupe evaluate` tests, all made here (nothing from a hub)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tupe import TupeConfig, TupeForMaskedLM

from ..helpers import torch_threads

TOPICS = tuple(
    tuple(pair.split())
    for pair in (
        "cat dog", "horse cow", "sheep goat", "red blue", "green yellow", "black white",
        "bread milk", "cheese apple", "rice fish", "car bus", "train boat", "plane bike",
    )
)  # fmt: skip
WORDS = sorted({w for topic in TOPICS for w in topic})


def make_documents(n_docs: int = 40, seed: int = 0) -> list[str]:
    """Documents of 30-60 words drawn from one two-word topic each: the other words of a block tell the topic, so
    a model that reads the context beats the text's unigram distribution within a few hundred steps (even a
    bag-of-words model does; word order carries no information here)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        topic = TOPICS[rng.randrange(len(TOPICS))]
        words = [rng.choice(topic) for _ in range(rng.randrange(30, 60))]
        docs.append("\n".join(" ".join(words[i : i + 10]) for i in range(0, len(words), 10)))
    return docs


def write_text(path: Path, n_docs: int = 40, seed: int = 0) -> Path:
    path.write_text(
        "\n\n".join(make_documents(n_docs, seed)) + "\n", encoding="utf-8"
    )  # blank line: new document
    return path


def tiny_config(vocab_size: int, scheme: str = "tupe-a", max_len: int = 32, **over) -> TupeConfig:
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=max_len,
        position_scheme=scheme,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    kwargs.update(over)
    return TupeConfig(**kwargs)


def save_tupe(path: Path, tokenizer, scheme: str = "tupe-a", seed: int = 0, max_len: int = 32) -> Path:
    torch.manual_seed(seed)
    model = TupeForMaskedLM(tiny_config(len(tokenizer), scheme, max_len))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train_tupe(path: Path, tokenizer, text: Path, steps: int = 250, max_len: int = 32, seed: int = 0) -> Path:
    """A briefly trained tiny model: pre-training's packing and masking, plain Adam, a few seconds on one core."""
    from tupe.data.corpus import resolve_corpus
    from tupe.data.mlm import TRAIN_SPLIT, MaskedLMCollator
    from tupe.data.packing import load_or_build_packed

    torch.manual_seed(seed)
    packed = load_or_build_packed(
        resolve_corpus([str(text)]),
        tokenizer,
        max_len,
        path.parent / "train-cache",
        progress=False,
        log=lambda m: None,
    )
    full = packed.num_tokens // packed.content_len
    blocks = [packed.block(i) for i in range(full)]
    collator = MaskedLMCollator(len(tokenizer), seed=seed)
    model = TupeForMaskedLM(tiny_config(len(tokenizer), "tupe-a", max_len))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    model.train()
    for step in range(steps):
        pick = rng.integers(0, len(blocks), size=8)
        batch = collator(
            [{"input_ids": blocks[i], "mask_key": (TRAIN_SPLIT, step * 8 + j)} for j, i in enumerate(pick)]
        )
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_bert(path: Path, seed: int = 0, max_len: int = 32) -> Path:
    """A tiny transformers BertForMaskedLM with a WordPiece BertTokenizerFast (specials at BERT-like ids, not 0..4)."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    vocab = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [c for c in "abcdefghijklmnopqrstuvwxyz"] + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)})
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=max_len,
        pad_token_id=0,
    )
    BertForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tokenizer():
    from ..helpers import train_test_tokenizer

    return train_test_tokenizer(make_documents(40, seed=1), vocab_size=400)


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    return write_text(tmp_path_factory.mktemp("text") / "text.txt")


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory, tokenizer, text_file, _one_thread) -> Path:
    return train_tupe(tmp_path_factory.mktemp("trained") / "model", tokenizer, text_file)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUPE_CACHE", str(tmp_path / "cache"))  # never the user's ~/.cache/tupe


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """These models are tiny: a second thread only adds synchronisation (and is slow on a shared machine)."""
    with torch_threads(1):
        yield
