"""Every scheme without a learned table computes any position: saved at max_position_embeddings 64 and loaded the
documented way, `from_pretrained(path, max_position_embeddings=N)`, it runs N tokens with finite outputs, gives the
saved model's outputs within the old limit, and its positional terms (so its outputs, on a longer input padded
after them) at the first positions do not depend on the input length, except FIRE's (normalised by it)."""

from __future__ import annotations

import pytest
import torch

from tupe import TupeForMaskedLM
from tupe.modeling.positional import SCHEMES

from ..helpers import tiny_config

SAVED, LONGER = 64, 160
ANY_LENGTH = [name for name, cls in SCHEMES.items() if cls.report.position_table is None]
LENGTH_DEPENDENT = {"fire"}  # psi(max(N, L)): the input length N normalises every offset


def test_the_schemes_the_docs_name_run_at_any_length():
    assert {"rope", "alibi", "t5", "deberta", "fire", "kerple-log", "kerple-power"} <= set(ANY_LENGTH)


@pytest.mark.parametrize("scheme", ANY_LENGTH)
def test_from_pretrained_with_a_larger_max_position_embeddings_runs_beyond(tmp_path, scheme):
    torch.manual_seed(0)
    # FIRE's threshold L below the lengths here, so that its normaliser psi(max(N, L)) follows N
    model = TupeForMaskedLM(tiny_config(scheme, max_position_embeddings=SAVED, fire_threshold=8.0)).eval()
    with torch.no_grad():
        for p in model.tupe.positional.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(tmp_path)
    longer = TupeForMaskedLM.from_pretrained(tmp_path, max_position_embeddings=LONGER).eval()
    assert longer.config.max_position_embeddings == LONGER
    ids = torch.randint(5, 50, (2, LONGER), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = longer(ids).logits
        assert out.shape == (2, LONGER, 50) and torch.isfinite(out).all()
        # within the saved limit: the saved model's outputs
        torch.testing.assert_close(longer(ids[:, :SAVED]).logits, model(ids[:, :SAVED]).logits)
        # the first SAVED tokens of a longer input, the rest padding: the same outputs where the terms do not
        # depend on the input length (FIRE normalises by the padded length: its outputs move, as its term below)
        mask = torch.zeros_like(ids)
        mask[:, :SAVED] = 1
        padded = longer(ids, attention_mask=mask).logits[:, :SAVED]
    assert torch.isfinite(padded).all()
    if scheme not in LENGTH_DEPENDENT:
        torch.testing.assert_close(padded, model(ids[:, :SAVED]).logits, atol=1e-5, rtol=1e-5)
    # the positional terms of the first SAVED positions within a longer input: the same, but FIRE's
    with torch.no_grad():
        short, long = longer.tupe.positional(SAVED), longer.tupe.positional(LONGER)
    leading = {
        "content_free": lambda t: t[..., :SAVED, :SAVED],
        "rotary": lambda t: tuple(x[:SAVED] for x in t),
        "input_embedding": lambda t: t[:SAVED],
    }
    compared = [f for f in leading if getattr(short, f, None) is not None]
    same = all(_equal(leading[f](getattr(long, f)), getattr(short, f)) for f in compared)
    assert same == (scheme not in LENGTH_DEPENDENT), (scheme, compared)


def _equal(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return torch.allclose(a, b, atol=1e-6, rtol=1e-6)
