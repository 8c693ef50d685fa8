"""Host synchronisations of one packed forward pass, per scheme: the calls that need a tensor's value on the host.

On a GPU each of these waits for the device (a device -> host copy); on CPU nothing waits, so they are counted by
wrapping, during one forward pass, every function and method that reads a tensor's value into Python or sizes an
output by the values: `item`, `tolist`, `bool` / `int` / `float` / `index` of a tensor, `torch.equal`, `allclose`,
`nonzero`, `masked_select`, indexing with a boolean tensor, `bincount`, `unique`, `repeat_interleave` with
tensor repeats, `cpu` and `numpy`. A wrapped call made inside another wrapped call counts once.

The cases: `TupeForMaskedLM` in eval mode (the "auto" kernel: SDPA on CPU), 2 rows of 32 tokens holding 3 and 4
documents given as `position_ids` restarting at 0, as `seq_idx`, as `cu_seq_lens_q` (one row of 64), and
`TupeForSequenceClassification` on the packed rows (one label per document); the last column is one
training-mode forward of the masked LM on the packed rows (the "fused" kernel on CPU).

    PYTHONPATH=$PWD python scripts/host_syncs.py [--schemes tupe-a,rope,deberta,t5]

Runs under any checkout (`PYTHONPATH=/path/to/other/checkout`): the numbers before and after a change.
"""

from __future__ import annotations

import argparse
import collections
import functools
import warnings

import torch

COUNTS: collections.Counter = collections.Counter()
_DEPTH = [0]


def _counted(name: str, fn, when=None):  # noqa: ANN001, ANN202 - a wrapper of any callable
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = _DEPTH[0] == 0 and (when is None or when(*args, **kwargs))
        if outer:
            COUNTS[name] += 1
        _DEPTH[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1

    return wrapper


def _boolean_index(self, index) -> bool:  # noqa: ANN001
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _tensor_repeats(*args, **kwargs) -> bool:
    """`repeat_interleave(input, repeats)` with a tensor of repeats, or `repeat_interleave(repeats)`, without
    `output_size`: the output's size is the repeats' sum, read on the host."""
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
    given = kwargs.get("output_size") is not None
    return isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and not given


PATCHES = {
    torch.Tensor: {
        "item": None,
        "tolist": None,
        "__bool__": None,
        "__int__": None,
        "__float__": None,
        "__index__": None,
        "nonzero": None,
        "masked_select": None,
        "cpu": None,
        "numpy": None,
        "equal": None,
        "__getitem__": _boolean_index,
        "repeat_interleave": _tensor_repeats,
    },
    torch: {
        "equal": None,
        "allclose": None,
        "nonzero": None,
        "masked_select": None,
        "bincount": None,
        "unique": None,
        "repeat_interleave": _tensor_repeats,
    },
}


def counting():  # noqa: ANN201 - a context manager
    import contextlib

    @contextlib.contextmanager
    def patched():
        saved = []
        for owner, names in PATCHES.items():
            for name, when in names.items():
                original = getattr(owner, name)
                saved.append((owner, name, original))
                setattr(owner, name, _counted(name, original, when))
        COUNTS.clear()
        try:
            yield COUNTS
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    return patched()


N = 32
PACKED = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
          [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]]  # fmt: skip


def _cases() -> dict[str, dict]:
    packed = torch.tensor(PACKED)
    seq_idx = torch.cumsum((packed == 0).long(), dim=1)
    return {
        "position_ids": {"position_ids": packed},
        "seq_idx": {"seq_idx": seq_idx},
        "cu_seq_lens_q": {"cu_seq_lens_q": torch.tensor([0, 12, 22, 32, 40, 52, 58, 64], dtype=torch.int32)},
    }


def count(scheme: str) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Per case: the number of host synchronisations, and what they were."""
    import tupe

    config = tupe.TupeConfig(
        position_scheme=scheme, vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, num_labels=2, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, position_buckets=8, max_relative_positions=16,
    )  # fmt: skip
    torch.manual_seed(0)
    mlm = tupe.TupeForMaskedLM(config).eval()
    classifier = tupe.TupeForSequenceClassification(config).eval()
    row, details = {}, {}
    for label, extra in _cases().items():
        b = 1 if "cu_seq_lens_q" in extra else 2
        ids = torch.randint(5, 50, (b, 64 // b))
        mlm(input_ids=ids, **extra)  # once before counting: caches (the resolved kernel) filled
        with torch.no_grad(), counting() as counts:
            mlm(input_ids=ids, **extra)
        row[label], details[label] = sum(counts.values()), dict(counts)
    ids = torch.randint(5, 50, (2, N))
    labels = torch.zeros(7, dtype=torch.long)
    classifier(input_ids=ids, position_ids=torch.tensor(PACKED), labels=labels)
    with torch.no_grad(), counting() as counts:
        classifier(input_ids=ids, position_ids=torch.tensor(PACKED), labels=labels)
    row["classifier"], details["classifier"] = sum(counts.values()), dict(counts)
    mlm.train()
    mlm(input_ids=ids, position_ids=torch.tensor(PACKED))
    with counting() as counts:
        mlm(input_ids=ids, position_ids=torch.tensor(PACKED))
    row["training"], details["training"] = sum(counts.values()), dict(counts)
    return row, details


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", default="tupe-a,rope,deberta,t5", help="comma-separated schemes")
    parser.add_argument("--detail", action="store_true", help="also print what was counted, per case")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import tupe

    print(f"tupe from {tupe.__file__}")
    columns = [*_cases(), "classifier", "training"]
    print("| scheme | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for scheme in args.schemes.split(","):
        row, details = count(scheme)
        print(f"| {scheme} | " + " | ".join(str(row[c]) for c in columns) + " |")
        if args.detail:
            print(details)


if __name__ == "__main__":
    main()
