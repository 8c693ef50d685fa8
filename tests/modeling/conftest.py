import pytest

from tupe import TupeConfig


def tiny_config(scheme: str, **overrides) -> TupeConfig:
    """A tiny model with every dropout off, small enough for the float64 naive oracle."""
    kwargs = dict(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
        position_scheme=scheme,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    kwargs.update(overrides)
    return TupeConfig(**kwargs)


@pytest.fixture
def make_config():
    return tiny_config
