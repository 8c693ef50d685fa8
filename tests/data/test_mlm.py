"""Masking statistics (15%, 80/10/10), specials and padding never masked, determinism, the epoch sampler."""

from __future__ import annotations

import math

import numpy as np
import torch

from tupe.data.mlm import EpochShuffleSampler, MaskedLMCollator

V = 1000


def _examples(n: int, length: int, rng: np.random.Generator) -> list[dict]:
    out = []
    for k in range(n):
        ids = rng.integers(5, V, size=length)
        ids[0] = 1  # [CLS]
        ids[rng.integers(1, length, size=3)] = 2  # [SEP]s inside the block
        ids = ids[: rng.integers(length // 2, length + 1)]  # ragged: the collator pads
        out.append({"input_ids": ids, "mask_key": (0, k)})
    return out


def _within(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_masking_rates_and_specials() -> None:
    coll = MaskedLMCollator(V, seed=3)
    exs = _examples(400, 128, np.random.default_rng(0))
    batch = coll(exs)
    orig = torch.zeros_like(batch["input_ids"])
    for r, e in enumerate(exs):
        orig[r, : len(e["input_ids"])] = torch.as_tensor(e["input_ids"])
    att = batch["attention_mask"].bool()
    labels, inp = batch["labels"], batch["input_ids"]
    selected = labels != -100
    special = orig < 5
    assert not (selected & ~att).any(), "padding is never a target"
    assert not (selected & special).any(), "special tokens are never targets"
    assert (inp[~att] == 0).all() and (inp[special & att] == orig[special & att]).all()
    assert (labels[selected] == orig[selected]).all()
    eligible = int((att & ~special).sum())
    n_sel = int(selected.sum())
    assert _within(n_sel, eligible, 0.15)
    masked = int((inp[selected] == 3).sum())
    same = int((inp[selected] == orig[selected]).sum())
    random_ = n_sel - masked - same
    assert _within(masked, n_sel, 0.8)
    # "unchanged" also catches the 1/(V-5) random draws that hit the original token
    assert _within(same, n_sel, 0.1 + 0.1 / (V - 5))
    assert _within(random_, n_sel, 0.1 - 0.1 / (V - 5))
    assert (inp[selected & (inp != 3)] >= 5).all(), "random replacements are never special tokens"


def test_masks_depend_only_on_seed_and_key() -> None:
    exs = _examples(8, 64, np.random.default_rng(1))
    a = MaskedLMCollator(V, seed=0)(exs)
    b = MaskedLMCollator(V, seed=0)(exs[:4])
    c = MaskedLMCollator(V, seed=0)(exs[4:])
    assert torch.equal(
        a["labels"][:4, : b["labels"].shape[1]], b["labels"]
    )  # batch composition is irrelevant
    assert torch.equal(a["labels"][4:, : c["labels"].shape[1]], c["labels"])
    d = MaskedLMCollator(V, seed=1)(exs)
    assert not torch.equal(a["labels"], d["labels"])
    shifted = [{**e, "mask_key": (0, e["mask_key"][1] + 100)} for e in exs]  # same block, another epoch
    assert not torch.equal(a["labels"], MaskedLMCollator(V, seed=0)(shifted)["labels"])


def test_epoch_sampler_permutes_each_epoch_deterministically() -> None:
    s = list(EpochShuffleSampler(10, epochs=3, seed=5))
    assert len(s) == 30
    for e in range(3):
        assert sorted(s[e * 10 : (e + 1) * 10]) == list(range(e * 10, (e + 1) * 10))
    assert s == list(EpochShuffleSampler(10, epochs=3, seed=5))
    assert s != list(EpochShuffleSampler(10, epochs=3, seed=6))
    assert [x % 10 for x in s[:10]] != [x % 10 for x in s[10:20]]
