"""Synthetic tasks that only positions can answer, for `tupe diagnose`.

Every example is one sequence of `n` tokens, `[CLS] TASK ...`, built from a seeded random stream, with the tokens
that matter inside a window of at most `L` (the training length) placed anywhere in the sequence: at `n > L` a task
asks for the same computation at positions the model never trained on, not over longer distances.

- `copy`: positions 2 .. n-1 hold distinct random symbols; `QUERIES` of them, inside one window, are replaced by
  [MASK], and the answer at a masked position `q` is the symbol at `q - OFFSET` (never itself masked). A model
  that does not know where tokens are (no positions, or a bag of symbols) sees the same tokens whatever their order
  and can only guess one of the visible symbols: chance = 1 / (visible symbols) = 1 / (n - 2 - QUERIES).
- `order`: random symbols (repeats allowed) at 2 .. n-1, two of them replaced by one marker token `M` at positions
  `i < j` of one window (`j - i` uniform in 1 .. L/2); the answer at `i` is "first", at `j` "second". The two
  markers are the same token in the same multiset: a model without positions gives both the same answer (one
  right: chance = 1/2), and so does one that knows distance but not direction (symmetric ALiBi, KERPLE).
- `distance`: as `order`, the answer at both markers is `j - i` in four equal buckets of 1 .. L/2 (for L = 32:
  1-4, 5-8, 9-12, 13-16), the k-th sequence of a batch from bucket k mod 4, the distance uniform inside it:
  chance = 1/4, exactly what a constant answer scores on a test set of a multiple of 4 sequences, and a model
  without positions is held at it (its tokens do not depend on the distance).

The fourth diagnostic, the linear probe of absolute position from the last hidden states, needs no task of its
own (tupe/diagnostics/run.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

TASKS = ("copy", "order", "distance")
OFFSET = 3  # copy: the answer is the symbol this many positions to the left
QUERIES = 4  # copy: masked positions per sequence
BUCKETS = 4  # distance: answer classes
DIAGNOSE_STREAM = 105  # second seed word of the random streams (passkey 104, bootstrap 103)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Which token ids play which part: the model's own [CLS] and [MASK], and ids for the task tokens, the two
    markers, the answers and the symbols, none of them a special token of the model."""

    cls: int
    mask: int
    task: dict[str, int]
    marker: int
    answers: tuple[int, ...]  # order uses the first two, distance all four
    symbols: np.ndarray  # (V,)
    size: int  # the model's vocabulary size (every id above is below it)

    @classmethod
    def build(
        cls, vocab_size: int, special: Sequence[int], cls_id: int, mask_id: int, symbols: int
    ) -> Vocabulary:
        """Ids in order from the lowest id that is not special: 3 task tokens, the marker, 4 answers, `symbols`."""
        free = [i for i in range(vocab_size) if i not in set(special)]
        need = len(TASKS) + 1 + BUCKETS + symbols
        if len(free) < need:
            raise ValueError(f"the tasks need {need} ordinary token ids; the vocabulary has {len(free)}")
        task = dict(zip(TASKS, free[:3]))
        return cls(cls_id, mask_id, task, free[3], tuple(free[4:8]), np.asarray(free[8:need]), vocab_size)


def symbols_needed(max_length: int) -> int:
    """Distinct symbols the copy task needs at the longest test length."""
    return max_length - 2


@dataclasses.dataclass
class Batch:
    """`inputs` (b, n); `labels` (b, n): the answer's token id where a question is asked, else -100; `candidates`:
    the ids among which the answer is picked (the argmax of the model's logits over these)."""

    inputs: np.ndarray
    labels: np.ndarray
    candidates: np.ndarray
    chance: float


def _window(rng: np.random.Generator, first: int, n: int, span: int) -> int:
    """Start of a window of `span` positions inside [first, n)."""
    return int(rng.integers(first, n - span + 1))


def copy_batch(rng: np.random.Generator, vocab: Vocabulary, b: int, n: int, train_length: int) -> Batch:
    span = min(train_length, n) - 2  # the window holding the queries and what they copy
    inputs = np.empty((b, n), dtype=np.int64)
    labels = np.full((b, n), -100, dtype=np.int64)
    for r in range(b):
        inputs[r, 0], inputs[r, 1] = vocab.cls, vocab.task["copy"]
        inputs[r, 2:] = rng.choice(vocab.symbols, size=n - 2, replace=False)
        start = _window(rng, 2, n, span)
        # queries among the window's positions that have their source inside the window, none a source of another
        candidates = np.arange(start + OFFSET, start + span)
        queries: list[int] = []
        for q in rng.permutation(candidates):
            if len(queries) == QUERIES:
                break
            if all(abs(int(q) - p) != OFFSET for p in queries):
                queries.append(int(q))
        at = np.asarray(queries)
        labels[r, at] = inputs[r, at - OFFSET]
        inputs[r, at] = vocab.mask
    return Batch(inputs, labels, vocab.symbols, 1.0 / (n - 2 - QUERIES))


def _pair_batch(
    rng: np.random.Generator, vocab: Vocabulary, b: int, n: int, train_length: int, task: str
) -> Batch:
    half = train_length // 2  # the distance: 1 .. half
    inputs = rng.choice(vocab.symbols, size=(b, n)).astype(np.int64)
    inputs[:, 0], inputs[:, 1] = vocab.cls, vocab.task[task]
    labels = np.full((b, n), -100, dtype=np.int64)
    width = half // BUCKETS  # distances per bucket
    for r in range(b):
        if task == "distance":  # the buckets in turn (a constant answer scores exactly 1/4 on B*k sequences)
            d = int(rng.integers(1, width + 1)) + (r % BUCKETS) * width
        else:
            d = int(rng.integers(1, half + 1))
        i = _window(rng, 2, n, d + 1)
        j = i + d
        inputs[r, i] = inputs[r, j] = vocab.marker
        if task == "order":
            labels[r, i], labels[r, j] = vocab.answers[0], vocab.answers[1]
        else:
            labels[r, i] = labels[r, j] = vocab.answers[(d - 1) // width]
    k = 2 if task == "order" else BUCKETS
    return Batch(inputs, labels, np.asarray(vocab.answers[:k]), 1.0 / k)


def make_batch(
    task: str, rng: np.random.Generator, vocab: Vocabulary, b: int, n: int, train_length: int
) -> Batch:
    """`b` examples of `task` at length `n` for a model trained at `train_length`."""
    if task == "copy":
        return copy_batch(rng, vocab, b, n, train_length)
    if task in ("order", "distance"):
        return _pair_batch(rng, vocab, b, n, train_length, task)
    raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")


def task_rng(seed: int, purpose: int, *words: int) -> np.random.Generator:
    """The random stream of one use: `purpose` 0 for training batches, 1 for test sets, 2 for the position probe."""
    return np.random.default_rng([seed, DIAGNOSE_STREAM, purpose, *words])
