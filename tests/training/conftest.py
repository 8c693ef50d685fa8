"""Tiny pre-training runs: a slice of the built-in corpus, a 300-entry BPE, a 2 x 32 model, a few steps."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from tupe.data.corpus import DEFAULT_CORPUS_DIR


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_corpus")
    for i, path in enumerate(sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))[:3]):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            lines = [next(fh) for _ in range(80)]
        (d / f"doc{i}.txt").write_text("".join(lines))
    return d


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tupe.data import resolve_corpus, train_tokenizer

    out = tmp_path_factory.mktemp("tok")
    train_tokenizer(resolve_corpus([str(tiny_corpus)]), vocab_size=300, show_progress=False).save_pretrained(
        out
    )
    return out


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


TINY: dict[str, Any] = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_length=32,
    batch_size=8,
    max_steps=4,
    warmup_steps=1,
    learning_rate=2e-3,
    eval_steps=2,
    save_steps=2,
    logging_steps=1,
    valid_every=20,
    dropout=0.1,
    progress=False,
    quiet=True,
)


@pytest.fixture()
def tiny_run(tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path):  # noqa: ANN201
    """Factory: PretrainConfig for a tiny run into `out`, with overrides."""
    from tupe.training.pretrain import PretrainConfig

    def make(out: Path, **over: Any) -> PretrainConfig:
        kw = dict(
            TINY,
            out=str(out),
            corpus=[str(tiny_corpus)],
            tokenizer=str(tiny_tokenizer_dir),
            cache_dir=str(cache_dir),
        )
        kw.update(over)
        return PretrainConfig(**kw)

    return make


def tiny_cli_args(tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path) -> list[str]:
    return [
        "--corpus", str(tiny_corpus), "--tokenizer", str(tiny_tokenizer_dir), "--cache-dir", str(cache_dir),
        "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2", "--intermediate-size", "64",
        "--max-length", "32", "--batch-size", "8", "--warmup-steps", "1", "--lr", "2e-3",
        "--eval-steps", "2", "--save-steps", "2", "--logging-steps", "1", "--valid-every", "20",
        "--no-progress", "--quiet",
    ]  # fmt: skip
