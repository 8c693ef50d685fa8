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


def validation_block_losses(run_dir: str | Path, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray, int]:
    """(per validation block: sum of -log p over masked targets, masked-target count, number of blocks) of a
    finished run's final model, with the masks its own evaluation used (run seed, validation keys)."""
    from tupe.analysis.baseline import NUM_SPECIAL, open_run_blocks
    from tupe.data.mlm import VALID_SPLIT, MaskedLMCollator
    from tupe.evaluation.evaluate import load_model

    run, packed = open_run_blocks(run_dir)
    _, valid_idx = packed.split(int(run["data"]["valid_every"]))
    model = load_model(run_dir)
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
            batch = collator(
                [{"input_ids": packed.block(int(valid_idx[k])), "mask_key": (VALID_SPLIT, k)} for k in rows]
            )
            if not bool(batch["attention_mask"].all()):  # a short last block: score it alone, unpadded
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


def paired_comparison(
    runs: dict[str, str | Path], reference: str, resamples: int = 2000, seed: int = 0
) -> dict[str, dict[str, float | None]]:
    """Each run's final validation loss and each run minus `reference`, with 95% bootstrap intervals over the
    shared validation blocks (`{name: {"value", "low", "high"}}`, differences named `"a - ref"`)."""
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
    return bootstrap(stats, int(n_blocks or 0), resamples, seed)
