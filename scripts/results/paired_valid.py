"""Paired uncertainty of the final validation losses (docs/RESULTS.md).

Every model is evaluated on exactly the validation blocks and masks that `tupe pretrain` uses (same packed
corpus, same deterministic collator), per block; a bootstrap over blocks gives a 95% interval for each model's
loss and for its difference from the first model. Also reports the loss of a unigram model (token frequencies of
the training blocks, add-0.5 smoothing) on the same masked tokens: the level a model reaches without context.

Usage: python scripts/results/paired_valid.py RUN_DIR/compare CORPUS CACHE_DIR bert-a bert-r tupe-a ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from tupe import TupeForMaskedLM
from tupe.data.corpus import resolve_corpus
from tupe.data.mlm import VALID_SPLIT, BlockDataset, MaskedLMCollator
from tupe.data.packing import load_or_build_packed
from tupe.data.tokenizer import load_tokenizer


def main(compare: Path, corpus: str, cache: str, schemes: list[str], valid_every: int = 50) -> dict:
    tok = load_tokenizer(compare / schemes[0])
    packed = load_or_build_packed(resolve_corpus([corpus]), tok, 128, cache_dir=cache, progress=False)
    train_idx, valid_idx = packed.split(valid_every)
    ds = BlockDataset(packed, valid_idx, VALID_SPLIT)
    collate = MaskedLMCollator(len(tok), seed=0)
    batches = [collate([ds[j] for j in range(i, min(i + 32, len(ds)))]) for i in range(0, len(ds), 32)]

    counts = np.zeros(len(tok))
    for i in train_idx:
        counts += np.bincount(packed.block(int(i))[1:], minlength=len(tok))
    logp = np.log((counts + 0.5) / (counts + 0.5).sum())

    per_block: dict[str, np.ndarray] = {}
    n_tok = np.concatenate([(b["labels"] != -100).sum(1).numpy() for b in batches]).astype(float)
    uni = []
    for b in batches:
        lab = b["labels"].numpy()
        uni.append(np.where(lab != -100, -logp[np.clip(lab, 0, None)], 0.0).sum(1))
    per_block["unigram"] = np.concatenate(uni)
    for s in schemes:
        model = TupeForMaskedLM.from_pretrained(compare / s).eval()
        sums = []
        with torch.no_grad():
            for b in batches:
                logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                ce = torch.nn.functional.cross_entropy(
                    logits.float().transpose(1, 2), b["labels"], ignore_index=-100, reduction="none"
                )
                sums.append(ce.sum(1).double().numpy())
        per_block[s] = np.concatenate(sums)

    rng = np.random.default_rng(0)
    boot = rng.integers(0, len(n_tok), size=(2000, len(n_tok)))
    out = {"valid_blocks": len(n_tok), "masked_tokens": int(n_tok.sum()), "models": {}}
    ref = schemes[0]
    for name, v in per_block.items():
        loss = v.sum() / n_tok.sum()
        bl = v[boot].sum(1) / n_tok[boot].sum(1)
        diff = v - per_block[ref]
        bd = diff[boot].sum(1) / n_tok[boot].sum(1)
        out["models"][name] = {
            "loss": float(loss),
            "ci95": [float(np.percentile(bl, 2.5)), float(np.percentile(bl, 97.5))],
            f"minus_{ref}": float(diff.sum() / n_tok.sum()),
            f"minus_{ref}_ci95": [float(np.percentile(bd, 2.5)), float(np.percentile(bd, 97.5))],
        }
    return out


def _arguments(argv: list[str] | None = None) -> tuple[Path, str, str, list[str]]:
    from tupe.errors import TupeError
    from tupe.modeling import POSITION_SCHEMES
    from tupe.scripts import ScriptParser

    p = ScriptParser(prog="paired_valid.py", description=__doc__.splitlines()[0])
    p.add_argument("compare_dir", type=Path, metavar="RUN_DIR/compare", help="a `tupe compare` folder")
    p.add_argument("corpus", help="the corpus the runs were trained on")
    p.add_argument("cache_dir", help="their data cache")
    p.add_argument(
        "schemes", nargs="+", metavar="SCHEME", help="the runs to compare, the first the reference"
    )
    args = p.parse_args(argv)
    if not args.compare_dir.is_dir():
        raise TupeError(f"RUN_DIR/compare {args.compare_dir} is not a folder")
    for s in args.schemes:
        if s not in POSITION_SCHEMES:
            raise TupeError(f"unknown scheme {s!r}; choose from: {', '.join(POSITION_SCHEMES)}")
    return args.compare_dir, args.corpus, args.cache_dir, args.schemes


if __name__ == "__main__":
    from tupe.errors import TupeError, one_line

    try:
        arguments = _arguments()
    except TupeError as err:
        print(f"paired_valid.py: error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    result = main(*arguments)
    print(json.dumps(result, indent=1))
    (Path(__file__).resolve().parents[2] / "docs" / "results" / "paired_valid.json").write_text(
        json.dumps(result, indent=1)
    )
