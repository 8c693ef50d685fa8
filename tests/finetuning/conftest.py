from pathlib import Path

import pytest

from ..glue.fixtures import make_checkpoint, make_tokenizer

DATA = Path(__file__).resolve().parents[1] / "data" / "finetune"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Small files of every format `tupe finetune` reads (tests/data/finetune)."""
    return DATA


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny pre-trained-looking tupe-a checkpoint (64 positions) with its byte-level BPE tokenizer."""
    return make_checkpoint(tmp_path_factory.mktemp("model") / "tiny-tupe-a")


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()
