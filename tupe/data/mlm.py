"""Masked-LM examples: block datasets, a per-epoch shuffling sampler and a deterministic masking collator.

Masking (BERT/RoBERTa): each non-special, non-padding token is selected with probability 15%; a selected token
becomes [MASK] with probability 80%, a random non-special token with 10%, and stays unchanged with 10%. Labels are
the original ids at selected positions and -100 elsewhere.

Every random choice is a pure function of (seed, split, example key), where the key of a training example is its
position in the sampler's stream (epoch * num_blocks + block). So the masks do not depend on the batch size, on the
number of processes, on data-loader prefetching or on where a run was resumed: a resumed run and a 2-process run see
exactly the masks the single uninterrupted run saw, and each epoch masks a block differently (dynamic masking).

Document blocks (`--packing documents`, `tupe.data.documents`) carry `position_ids` (0 at each document's [CLS]);
the collator keeps them through masking and padding (a padded slot continues the last document's positions, with
attention mask 0), and the extra [CLS] and [SEP] inside a block are special tokens like the first: never
selected, never put in place of a token.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from tupe.data.documents import DocumentBlocks
from tupe.data.packing import PackedCorpus
from tupe.data.tokenizer import MASK_ID, PAD_ID, SPECIAL_TOKENS

TRAIN_SPLIT, VALID_SPLIT = 0, 1


class BlockDataset(torch.utils.data.Dataset):
    """`epochs` passes over the given blocks; item `k` is block `indices[k % n]` with mask key `k` (and, for
    document blocks, its `position_ids`)."""

    def __init__(
        self, packed: PackedCorpus | DocumentBlocks, indices: np.ndarray, split: int, epochs: int = 1
    ) -> None:
        self.packed = packed
        self.indices = np.asarray(indices, dtype=np.int64)
        self.split = split
        self.epochs = max(1, int(epochs))

    def __len__(self) -> int:
        return len(self.indices) * self.epochs

    def __getitem__(self, k: int) -> dict:
        i = int(self.indices[k % len(self.indices)])
        item = {"input_ids": self.packed.block(i), "mask_key": (self.split, int(k))}
        positions = self.packed.positions(i)  # document blocks only
        if positions is not None:
            item["position_ids"] = positions
        return item


class EpochShuffleSampler(torch.utils.data.Sampler[int]):
    """Yields, for each epoch `e`, a seeded permutation of that epoch's items `e*n .. e*n+n-1`.

    Stateless (the order is a function of the seed only), so skipping the first batches on resume replays exactly
    the original order.
    """

    def __init__(self, num_blocks: int, epochs: int, seed: int) -> None:
        self.n = num_blocks
        self.epochs = max(1, int(epochs))
        self.seed = seed

    def __len__(self) -> int:
        return self.n * self.epochs

    def __iter__(self) -> Iterator[int]:
        for e in range(self.epochs):
            perm = np.random.default_rng([self.seed, 7919, e]).permutation(self.n) + e * self.n
            yield from perm.tolist()


class MaskedLMCollator:
    """Pads blocks (right, with [PAD]) and masks them; deterministic per example (see module docstring).

    Examples with `position_ids` (all of a batch or none) give a `position_ids` (b, n) LongTensor too."""

    def __init__(
        self,
        vocab_size: int,
        seed: int = 0,
        mlm_probability: float = 0.15,
        mask_fraction: float = 0.8,
        random_fraction: float = 0.1,
        num_special: int = len(SPECIAL_TOKENS),
        pad_to_multiple_of: int | None = None,
    ) -> None:
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm probability must be in (0, 1), got {mlm_probability}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.p = mlm_probability
        self.mask_fraction = mask_fraction
        self.random_fraction = random_fraction
        self.num_special = num_special  # ids 0..num_special-1 are special and never masked nor sampled
        self.pad_to_multiple_of = pad_to_multiple_of

    def mask_one(self, ids: np.ndarray, key: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Return (masked input ids, labels) for one unpadded sequence."""
        rng = np.random.default_rng([self.seed, key[0], key[1]])
        n = ids.shape[0]
        eligible = ids >= self.num_special
        selected = (rng.random(n) < self.p) & eligible
        action = rng.random(n)
        random_tokens = rng.integers(self.num_special, self.vocab_size, size=n)
        labels = np.where(selected, ids, -100)
        out = ids.copy()
        to_mask = selected & (action < self.mask_fraction)
        to_random = (
            selected & (action >= self.mask_fraction) & (action < self.mask_fraction + self.random_fraction)
        )
        out[to_mask] = MASK_ID
        out[to_random] = random_tokens[to_random]
        return out, labels

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        length = max(len(e["input_ids"]) for e in examples)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        b = len(examples)
        input_ids = np.full((b, length), PAD_ID, dtype=np.int64)
        labels = np.full((b, length), -100, dtype=np.int64)
        attention = np.zeros((b, length), dtype=np.int64)
        with_positions = sum("position_ids" in e for e in examples)
        if with_positions not in (0, b):
            raise ValueError(f"{with_positions} of {b} examples have position_ids: all or none must")
        positions = np.zeros((b, length), dtype=np.int64) if with_positions else None
        for r, ex in enumerate(examples):
            ids = np.asarray(ex["input_ids"], dtype=np.int64)
            masked, lab = self.mask_one(ids, ex["mask_key"])
            input_ids[r, : len(ids)] = masked
            labels[r, : len(ids)] = lab
            attention[r, : len(ids)] = 1
            if positions is not None:
                pos = np.asarray(ex["position_ids"], dtype=np.int64)
                if pos.shape != ids.shape:
                    raise ValueError(f"position_ids of shape {pos.shape} for input_ids of shape {ids.shape}")
                positions[r, : len(ids)] = pos
                # padding continues the last document's positions: a pad never looks like a new document
                last = pos[-1] if len(pos) else -1
                positions[r, len(ids) :] = np.arange(last + 1, last + 1 + length - len(ids))
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention),
            "labels": torch.from_numpy(labels),
        }
        if positions is not None:
            batch["position_ids"] = torch.from_numpy(positions)
        return batch
