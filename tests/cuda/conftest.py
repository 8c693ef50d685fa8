"""The tiny corpus, tokenizer and cache of tests/training, for the CUDA `tupe pretrain` run."""

from tests.training.conftest import cache_dir, tiny_corpus, tiny_tokenizer_dir  # noqa: F401
