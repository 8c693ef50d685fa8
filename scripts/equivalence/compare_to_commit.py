"""Outputs and gradients of this checkout against another commit's, bit for bit, in float64 (a reviewer's tool).

The same seeded cases run twice, each in a fresh process: once with the baseline checkout first on `PYTHONPATH`,
once with this checkout; every output (loss, logits, last hidden state) and every parameter gradient is compared
with `torch.equal`. The cases:

- `TupeForMaskedLM` (sparse prediction, so the one-pass masked-LM loss runs): every scheme x every kernel the
  baseline's registry applies to it (eager, sdpa, fused, fold, flex on CPU) x the inputs below x gradient
  checkpointing off / `use_reentrant=False` / `use_reentrant=True`; dropout on (hidden and attention, 0.1) where
  the kernel trains on CPU with it, else (flex) the outputs of a pass in eval mode without gradients;
- `TupeForSequenceClassification` (one label per document) and `TupeForMultipleChoice`: every scheme, "auto".

Inputs: padding only; shifted `position_ids` (one document per row); packed documents at positions 0..m-1 (with
padding), and with a document that starts mid-way (block-diagonal mask); `seq_idx`; `cu_seq_lens_q` (one row).
Weights are drawn per parameter name, so they do not depend on the order a model is built in. A case the baseline
refuses must be refused with the same exception type. A `use_reentrant=True` case may instead equal the baseline's
`use_reentrant=False` result (counted apart): such a request now runs non-reentrant.

    PYTHONPATH=$PWD python scripts/equivalence/compare_to_commit.py /path/to/baseline-checkout [--schemes a,b]

Prints the number of cases and every difference; exits 1 if any.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import warnings
import zlib
from pathlib import Path

import torch

SIZE = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=40,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    position_buckets=8,
    max_relative_positions=16,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
)
N = 13


def _inputs() -> dict[str, dict[str, torch.Tensor]]:
    """The input variants (input_ids and attention_mask are added per case)."""
    r = torch.arange(N)
    packed = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3]])
    partial = torch.tensor([[4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]])
    seq_idx = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2], [5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7]])
    return {
        "padding": {},
        "shifted": {"position_ids": torch.stack([r + 3, r])},
        "packed": {"position_ids": packed},
        "partial": {"position_ids": partial},
        "seq_idx": {"seq_idx": seq_idx},
        "cu_seq_lens": {"cu_seq_lens_q": torch.tensor([0, 4, 9, N], dtype=torch.int32)},
    }


def _documents(variant: str, inputs: dict[str, torch.Tensor]) -> int:
    """How many documents (rows of the sequence-classification head) a variant has."""
    if "cu_seq_lens_q" in inputs:
        return inputs["cu_seq_lens_q"].numel() - 1
    if "seq_idx" in inputs:
        s = inputs["seq_idx"]
        return int((s[:, 1:] != s[:, :-1]).sum()) + s.shape[0]
    if "position_ids" in inputs:
        p = inputs["position_ids"]
        return int((p[:, 1:] == 0).sum()) + p.shape[0]
    return 2


def _fill(model: torch.nn.Module) -> None:
    """Deterministic weights per parameter name (norm weights around 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(1 + 0.1 * noise if "norm" in name.lower() and name.endswith("weight") else 0.3 * noise)


def _run(cls_name: str, scheme: str, kernel: str, variant: str, ckpt: bool | None, train: bool) -> dict:
    import tupe

    torch.manual_seed(0)
    config = tupe.TupeConfig(position_scheme=scheme, sparse_prediction=True, num_labels=3, **SIZE)
    model = getattr(tupe, cls_name)(config).double()
    _fill(model)
    model.train(train)
    if kernel != "auto":
        model.set_attn_implementation(kernel)
    if ckpt is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": ckpt})
    extra = _inputs()[variant]
    b = 1 if "cu_seq_lens_q" in extra else 2
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (b, N), generator=g)
    mask = torch.ones(b, N, dtype=torch.long)
    if b == 2:
        mask[1, N - 2 :] = 0
    batch = dict(input_ids=ids, attention_mask=mask, **extra)
    if cls_name == "TupeForMaskedLM":
        labels = torch.full_like(ids, -100)
        labels[:, 1::3] = ids[:, 1::3]
        batch["labels"] = labels
    elif cls_name == "TupeForSequenceClassification":
        batch["labels"] = torch.arange(_documents(variant, extra)) % 3
    else:  # multiple choice: the two rows are the two choices of one question
        batch = {k: v[None] for k, v in batch.items()} | {"labels": torch.tensor([1])}
        if "position_ids" in extra:
            batch["position_ids"] = extra["position_ids"][0]  # one row for every choice
    torch.manual_seed(2)
    with torch.set_grad_enabled(train):
        out = model(**batch, output_hidden_states=True)
    grads = {}
    if train:
        weights = torch.randn(out.hidden_states[-1].shape, generator=g, dtype=torch.float64)
        (out.loss + (out.hidden_states[-1] * weights).sum()).backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
    return {"outputs": [out.loss, out.logits, out.hidden_states[-1]], "grads": grads}


def _cases(schemes: list[str]) -> list[tuple]:
    import tupe
    from tupe.modeling.positional import scheme_class

    try:
        from tupe.modeling.kernel_registry import get_attention_kernel
    except ImportError:  # e1cb602: the registry was in kernels.py
        from tupe.modeling.kernels import get_attention_kernel

    cases = []
    for scheme in schemes or list(tupe.POSITION_SCHEMES):
        for kernel in scheme_class(scheme).kernels():
            if kernel == "auto":
                continue
            entry = get_attention_kernel(kernel)
            train = entry.dropout and entry.train_devices in (None, ("cpu",))
            for variant in _inputs():
                for ckpt in (None, False, True) if train else (None,):
                    cases.append(("TupeForMaskedLM", scheme, kernel, variant, ckpt, train))
        for variant in _inputs():
            cases.append(("TupeForSequenceClassification", scheme, "auto", variant, None, True))
            cases.append(("TupeForSequenceClassification", scheme, "auto", variant, False, True))
        for variant in ("padding", "shifted"):
            cases.append(("TupeForMultipleChoice", scheme, "auto", variant, None, True))
    return cases


def worker(out: Path, schemes: list[str]) -> None:
    warnings.simplefilter("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.get_logger("tupe").setLevel(logging.ERROR)  # the reentrant request's warning, once per case
    results = {}
    for case in _cases(schemes):
        try:
            results[case] = _run(*case)
        except Exception as err:  # noqa: BLE001 - a refusal is a result too (compared by type)
            results[case] = {"error": f"{type(err).__name__}: {err}"}
    torch.save(results, out)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _differences(case: tuple, a: dict, b: dict) -> list[str]:
    """What differs between two results of one case (a refusal matches a refusal of the same exception type)."""
    if "error" in a or "error" in b:
        kinds = [x.get("error", "ran").split(":")[0] for x in (a, b)]
        return (
            []
            if kinds[0] == kinds[1]
            else [f"{case}: baseline {a.get('error', 'ran')!r}, now {b.get('error', 'ran')!r}"]
        )
    found = [
        f"{case}: output {i} differs"
        for i, (x, y) in enumerate(zip(a["outputs"], b["outputs"]))
        if not _same(x, y)
    ]
    if a["grads"].keys() != b["grads"].keys():
        found.append(f"{case}: parameter names differ")
    return found + [
        f"{case}: gradient of {n} differs" for n in a["grads"] if not _same(a["grads"][n], b["grads"].get(n))
    ]


def compare(base: dict, new: dict) -> tuple[list[str], int]:
    """(differences, how many `use_reentrant=True` cases equal the baseline's `use_reentrant=False` result but not
    its reentrant one: such a request now runs non-reentrant)."""
    problems, mapped = [], 0
    for case in sorted(set(base) | set(new), key=str):
        if case not in base or case not in new:
            problems.append(f"{case}: only in the {'baseline' if case in base else 'current code'}")
            continue
        found = _differences(case, base[case], new[case])
        if found and case[4] is True:
            plain = (*case[:4], False, *case[5:])
            if plain in base and not _differences(case, base[plain], new[case]):
                mapped += 1
                continue
        problems += found
    return problems, mapped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "baseline", nargs="?", help="path of the baseline checkout (e.g. a worktree of e1cb602)"
    )
    parser.add_argument("--schemes", default="", help="comma-separated schemes (default: all)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    schemes = [s for s in args.schemes.split(",") if s]
    if args.worker:
        worker(Path(args.worker), schemes)
        return 0
    if not args.baseline:
        parser.error("give the path of the baseline checkout")
    here = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for label, root in (("baseline", Path(args.baseline).resolve()), ("current", here)):
            files[label] = Path(folder) / f"{label}.pt"
            env = dict(
                os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")
            )
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(files[label])]
            if schemes:
                command += ["--schemes", ",".join(schemes)]
            subprocess.run(command, env=env, cwd=folder, check=True)
        base, new = (torch.load(files[k], weights_only=False) for k in ("baseline", "current"))
    problems, mapped = compare(base, new)
    refused = sum("error" in r for r in base.values())
    print(f"{len(base)} cases ({len(base) - refused} run, {refused} refused by the baseline), {len(new)} now")
    if mapped:
        print(
            f"{mapped} use_reentrant=True cases equal the baseline's use_reentrant=False result, not its reentrant "
            "one (the request now runs non-reentrant)"
        )
    for line in problems:
        print(line)
    print("all equal" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
