"""Word and position embedding scales, and the smoothness of the position table, over a run's checkpoints.

Used in docs/RESULTS.md ("Why BERT-A stays on the plateau"). For every checkpoint-N of each run folder given:
the median L2 norm of the word-embedding rows (specials excluded) and of the absolute position rows, and the mean
cosine similarity of neighbouring position vectors (after removing the mean position vector): about 0 for a
random table, clearly positive once positions have a local structure that low-rank attention can use.

    python scripts/results/position_table.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def table_stats(weights: dict[str, torch.Tensor]) -> dict[str, float] | None:
    words = next(v for k, v in weights.items() if k.endswith("word_embeddings.weight")).float()
    keys = [k for k in weights if k.endswith(("positional.embeddings.weight", "position_embeddings.weight"))]
    if not keys:
        return None
    p = weights[keys[0]].float()
    centred = torch.nn.functional.normalize(p - p.mean(0), dim=1)
    cos = centred @ centred.T
    n = cos.shape[0]
    far = cos[torch.ones(n, n).triu(10).bool()]
    return {
        "word_norm": float(words[5:].norm(dim=1).median()),
        "position_norm": float(p.norm(dim=1).median()),
        "cos_neighbour": float(torch.diagonal(cos, 1).mean()),
        "cos_far": float(far.mean()),
    }


def main(runs: list[str]) -> None:
    print("| run | step | word norm | position norm | ratio | cos(p_i, p_i+1) | cos(|i-j| >= 10) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        ckpts = sorted(Path(run).glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
        for ck in ckpts:
            s = table_stats(load_file(ck / "model.safetensors"))
            if s is None:
                continue
            print(
                f"| {run} | {ck.name.rsplit('-', 1)[1]} | {s['word_norm']:.3f} | {s['position_norm']:.3f} | "
                f"{s['position_norm'] / s['word_norm']:.2f} | {s['cos_neighbour']:+.3f} | {s['cos_far']:+.3f} |"
            )


def _command(argv: list[str] | None) -> None:
    from tupe.errors import TupeError
    from tupe.scripts import ScriptParser

    p = ScriptParser(prog="position_table.py", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="`tupe pretrain` folders with checkpoint-N/")
    args = p.parse_args(argv)
    for run in args.runs:
        if not Path(run).is_dir():
            raise TupeError(f"RUN_DIR {run} is not a folder")
    main(args.runs)


if __name__ == "__main__":
    from tupe.scripts import run_script

    raise SystemExit(run_script(_command))
