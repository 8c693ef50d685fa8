"""`SchemeReport.position_table` names the only length-dependent state of a model: what `tupe evaluate
--lengths` resizes (or refuses to go beyond) is asked of this attribute, never of the scheme's name."""

from __future__ import annotations

import pytest
import torch

from tupe import TupeConfig, TupeForMaskedLM
from tupe.modeling.positional import SCHEMES


def _state(scheme: str, max_len: int) -> dict[str, torch.Size]:
    config = TupeConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=max_len,
        position_scheme=scheme,
    )
    return {k: v.shape for k, v in TupeForMaskedLM(config).state_dict().items()}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_position_table_is_the_only_state_whose_shape_depends_on_the_length(scheme):
    short, long = _state(scheme, 16), _state(scheme, 24)
    assert short.keys() == long.keys()
    differ = sorted(k for k in short if short[k] != long[k])
    table = SCHEMES[scheme].report.position_table
    if table is None:
        assert differ == []
    else:
        key = f"tupe.positional.{table}.weight"
        assert differ == [key]
        assert (short[key][0], long[key][0]) == (16, 24)
