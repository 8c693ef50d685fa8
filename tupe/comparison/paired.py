"""Final models of one seed compared on identical validation blocks and masks, with bootstrap intervals.

The training runs' own evaluation gives one number per run; the difference between two schemes needs its
uncertainty. Runs of one comparison share the validation blocks and (for one seed) the masks, so each final
model's masked-token loss is recomputed per validation block and the paired difference is resampled by block
(`tupe.evaluation.bootstrap`, the method of `tupe evaluate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tupe.errors import TupeError

# Fewer validation blocks than this and the block bootstrap's intervals are unreliable (they undercover: a
# percentile bootstrap needs enough independent units to resample; 100 blocks of 128 tokens are ~1,900 masked
# tokens, where a per-token loss spread of ~2.5 nats gives one loss a standard error of ~0.06 nats).
# `tupe compare` and `tupe demo` warn below it.
MIN_VALID_BLOCKS = 100


def validation_block_losses(run_dir: str | Path, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray, int]:
    """(per validation block: sum of -log p over masked targets, masked-target count, number of blocks) of a
    finished run's final model, with the masks its own evaluation used (run seed, validation keys). Document
    blocks (`--packing documents`) are scored one document piece at a time, each from position 0."""
    from tupe.analysis.baseline import NUM_SPECIAL, open_run_blocks
    from tupe.data.mlm import MaskedLMCollator
    from tupe.evaluation.evaluate import load_eval_model

    run, packed = open_run_blocks(run_dir)
    _, valid_idx = packed.split(int(run["data"]["valid_every"]))
    model = load_eval_model(run_dir)
    collator = MaskedLMCollator(
        int(run["model"]["vocab_size"]),
        seed=int(run["optim"]["seed"]),
        mlm_probability=float(run["data"]["mlm_probability"]),
        num_special=NUM_SPECIAL,
    )
    num = np.zeros(len(valid_idx))
    den = np.zeros(len(valid_idx))
    with torch.inference_mode():
        for start in range(0, len(valid_idx), batch_size):
            rows = range(start, min(start + batch_size, len(valid_idx)))
            batch = collator([block_example(packed, int(valid_idx[k]), k) for k in rows])
            if "position_ids" in batch:  # document blocks: each document piece scored alone, from position 0
                nll = torch.stack(
                    [
                        _pieces_nll(model, ids[: int(m.sum())], lab[: int(m.sum())], pos[: int(m.sum())])
                        for ids, lab, pos, m in zip(
                            batch["input_ids"],
                            batch["labels"],
                            batch["position_ids"],
                            batch["attention_mask"],
                        )
                    ]
                )
            elif not bool(batch["attention_mask"].all()):  # a short last block: score it alone, unpadded
                nll = torch.cat(
                    [
                        model.target_nll(
                            batch["input_ids"][i : i + 1, : int(m.sum())], lab[None, : int(m.sum())]
                        )
                        for i, (m, lab) in enumerate(zip(batch["attention_mask"], batch["labels"]))
                    ]
                )
            else:
                nll = model.target_nll(batch["input_ids"], batch["labels"])
            num[start : start + len(rows)] = nll.numpy()
            den[start : start + len(rows)] = (batch["labels"] != -100).sum(dim=1).numpy()
    return num, den, len(valid_idx)


def block_example(packed: Any, i: int, key: int) -> dict[str, Any]:
    """Validation block `i` as the collator takes it, with mask key `key` (and its position ids for document
    blocks), as the run's own evaluation made it (`tupe.data.mlm.BlockDataset`)."""
    from tupe.data.mlm import VALID_SPLIT, BlockDataset

    return BlockDataset(packed, np.asarray([i]), VALID_SPLIT)[0] | {"mask_key": (VALID_SPLIT, key)}


def _pieces_nll(model: Any, ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Sum of -log p over the masked targets of one document block, each document piece (from a position 0 to
    the next) scored as a row of its own: what the packed row gives when attention stays inside each document."""
    starts = torch.nonzero(positions == 0).flatten().tolist() + [int(ids.shape[0])]
    return sum(
        model.target_nll(ids[None, a:b], labels[None, a:b])[0] for a, b in zip(starts[:-1], starts[1:])
    )


def paired_comparison(
    runs: dict[str, str | Path], reference: str, resamples: int = 2000, seed: int = 0
) -> dict[str, dict[str, float | None]]:
    """Each run's final validation loss and each run minus `reference`, with 95% bootstrap intervals over the
    shared validation blocks (`{name: {"value", "low", "high"}}`, differences named `"a - ref"`), and the size
    of what was resampled under `"validation"`: `{"blocks", "masked_tokens"}`."""
    from tupe.evaluation.bootstrap import Ratio, bootstrap

    ratios = {}
    n_blocks = None
    for name, run_dir in runs.items():
        num, den, n = validation_block_losses(run_dir)
        if n_blocks not in (None, n):
            raise TupeError(f"{run_dir}: {n} validation blocks, not {n_blocks} like the other runs")
        n_blocks = n
        ratios[name] = Ratio(num, den)
    stats: dict[str, Any] = {name: [(1.0, r)] for name, r in ratios.items()}
    for name, r in ratios.items():
        if name != reference:
            stats[f"{name} - {reference}"] = [(1.0, r), (-1.0, ratios[reference])]
    out: dict[str, Any] = bootstrap(stats, int(n_blocks or 0), resamples, seed)
    out["validation"] = {"blocks": int(n_blocks or 0), "masked_tokens": int(ratios[reference].den.sum())}
    return out


def validation_warning(
    blocks: int, masked_tokens: int | None = None, paired: dict[str, Any] | None = None
) -> str | None:
    """One line when the validation set is too small for what is reported: fewer than MIN_VALID_BLOCKS blocks,
    or a paired difference whose 95% interval includes 0 (the set cannot tell the schemes apart); else None."""
    size = f"{blocks:,} validation blocks" + (
        f", {masked_tokens:,} masked tokens" if masked_tokens is not None else ""
    )
    unresolved = [
        f"{name} = {d['value']:+.3f} [95% CI {d['low']:+.3f}, {d['high']:+.3f}]"
        for name, d in (paired or {}).items()
        if " - " in name and d.get("low") is not None and d["low"] <= 0 <= d["high"]
    ]
    if blocks >= MIN_VALID_BLOCKS and not unresolved:
        return None
    why = []
    if blocks < MIN_VALID_BLOCKS:
        why.append(f"under {MIN_VALID_BLOCKS} blocks the intervals are unreliable")
    if unresolved:
        why.append(f"too few to resolve {'; '.join(unresolved)}")
    return (
        f"warning: small validation set ({size}): {'; '.join(why)}; use more text or a lower --valid-every "
        "(1 block in N is held out)"
    )
