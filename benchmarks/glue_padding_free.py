"""`tupe glue` padding-free against padded batches: examples per second of a fine-tuning step (issue 36, item 5's
second target: padding-free >= 1.5x the padded path on CPU at the paper's batch size, 32, and the `base` shape).

For each task, the training split is read and encoded as `tupe glue` encodes it (`[CLS] A [SEP] B [SEP]`, cut at
the preset's length: 128 for `mini`, 512 for `base`) and put in a seeded random order, in batches of `--batch-size`.
First the padding share of those batches: padding tokens / batch tokens when each batch is padded to its longest
example, over the whole training set. Then two copies of one freshly initialised `TupeForSequenceClassification`
at the preset's shape (dropout 0.1, as fine-tuning runs) each take one training step per round (forward with the
loss, backward, clipping, AdamW) on the round's batch, one from `DataCollatorWithPadding` (what `--padding` runs)
and one from `FlattenedBatches` (what `tupe glue` runs by default), in alternating order; reported: the median
step time of each, examples per second, and the ratio padding-free / padded with the target.

No tokenizer ships with the script: `--tokenizer DIR` (a checkpoint's), or a byte-level BPE of the preset's
vocabulary size trained on the tasks' training text (a few seconds). The result of each task is written to
`--json` as it finishes, and a task already there is skipped, so a slow shape can be measured a task at a time.

Usage, from the repository root (docs/benchmarks.md, docs/glue.md):

    python benchmarks/glue_padding_free.py --data-dir GLUE_DIR [--tasks CoLA,SST-2] [--preset mini]
        [--scheme tupe-a] [--batch-size 32] [--steps 20] [--warmup 2] [--threads 1] [--tokenizer DIR]
        [--json OUT.json] [--share-only] [--device cuda --autocast bfloat16]

On a GPU (`--device cuda`, issue 36 item 5's GPU figure at base/512 in bf16: the `packing-speed` stage of
benchmarks/gpu/run.sh) each step is timed between two `torch.cuda.synchronize()`s, under bf16 autocast with
`--autocast bfloat16`; the result's key in `--json` then names the device and dtype.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET = 1.5  # issue 36: padding-free >= 1.5 x the padded path's examples per second


def _tokenizer(args: argparse.Namespace, vocab_size: int, texts: list[str]) -> Any:
    if args.tokenizer:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(args.tokenizer)
    from tupe.data.corpus import resolve_corpus
    from tupe.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "train.txt"
        path.write_text("\n".join(texts) + "\n", encoding="utf-8")
        return train_tokenizer(resolve_corpus([str(path)]), vocab_size=vocab_size, show_progress=False)


def _order(n: int, batch_size: int, seed: int) -> list[list[int]]:
    import numpy as np

    perm = np.random.default_rng(seed).permutation(n)
    return [perm[i : i + batch_size].tolist() for i in range(0, n, batch_size)]


def padding_share(lengths: list[int], batches: list[list[int]]) -> float:
    """Padding tokens / batch tokens when each batch is padded to its longest example."""
    real = sum(lengths[i] for b in batches for i in b)
    total = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1 - real / total


def _earlier_results(path: Path) -> dict[str, Any]:
    """`--json`'s results of earlier runs (a task there is skipped): an existing file must be this script's (an
    object of results by task), read whole; a file of the user's or a damaged one is refused in one line."""
    from tupe.errors import TupeError
    from tupe.io.reading import read_json
    from tupe.scripts import claim_output_file
    from tupe.validators import check_out_file

    check_out_file("--json", path)
    if path.is_file() and not path.is_symlink():
        results = read_json(path, "results of glue_padding_free.py")
        if not all(isinstance(v, dict) and "task" in v for v in results.values()):
            raise TupeError(
                f"--json {path} holds something other than this script's results; choose another file"
            )
        return results
    claim_output_file("--json", path, "glue_padding_free.py")
    return {}


def main(argv: list[str] | None = None) -> dict:
    """The benchmark; a bad flag is a `TupeError` (one line, exit 2 from the command line) before any work."""
    from tupe.finetuning.glue.tasks import get_task
    from tupe.scripts import ScriptParser, check_device
    from tupe.training.model import check_scheme
    from tupe.training.presets import get_preset
    from tupe.validators import MAX_THREADS, check_path_kind, int_range

    p = ScriptParser(prog="glue_padding_free.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="the GLUE root (TASK/train.tsv, ...)")
    p.add_argument("--tasks", default="CoLA,SST-2")
    p.add_argument("--preset", default="mini", help="the model shape and length (mini: 128, base: 512)")
    p.add_argument("--scheme", default="tupe-a")
    p.add_argument("--batch-size", type=int_range(1), default=32, help="default 32, the paper's")
    p.add_argument(
        "--steps", type=int_range(1), default=20, help="timed rounds (one step of each; default 20)"
    )
    p.add_argument("--warmup", type=int_range(0), default=2, help="untimed rounds first (default 2)")
    p.add_argument("--threads", type=int_range(1, MAX_THREADS), default=1)
    p.add_argument("--max-seq-len", type=int_range(2), default=None, help="default: the preset's length")
    p.add_argument(
        "--tokenizer", default=None, help="a tokenizer folder (default: a BPE trained on the tasks)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--share-only", action="store_true", help="the padding shares only, no timing")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--autocast", choices=("bfloat16", "float16"), default=None, help="autocast dtype (default none)"
    )
    p.add_argument("--json", default=None, help="results by task, kept across runs (a task there is skipped)")
    args = p.parse_args(argv)
    check_device("--device", args.device)
    check_scheme(args.scheme)
    get_preset(args.preset)
    check_path_kind("--data-dir", args.data_dir, "folder")
    if args.tokenizer:
        check_path_kind("--tokenizer", args.tokenizer, "folder")
    for name in args.tasks.split(","):
        get_task(name)
    earlier = _earlier_results(Path(args.json)) if args.json else {}

    import torch

    import tupe
    from tupe.bench.flops import preset_shape
    from tupe.finetuning.glue.encoding import encode_split
    from tupe.finetuning.glue.tasks import get_task, load_task
    from tupe.finetuning.pipeline.batches import FlattenedBatches
    from tupe.runtime import tune_cpu_allocator
    from tupe.training.presets import get_preset

    tune_cpu_allocator()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    autocast = getattr(torch, args.autocast) if args.autocast else None
    shape = preset_shape(args.preset)
    length = args.max_seq_len or get_preset(args.preset)["max_length"]
    out = Path(args.json) if args.json else None
    results: dict[str, Any] = earlier
    tasks = [get_task(t) for t in args.tasks.split(",")]
    data = {t.name: load_task(t, args.data_dir) for t in tasks}
    texts = [s for d in data.values() for s in d.train.text_a + [x for x in d.train.text_b or [] if x]]
    tok = _tokenizer(args, shape.vocab_size, texts)
    for task in tasks:
        key = f"{task.name}/{args.preset}/{args.scheme}/batch{args.batch_size}" + (
            "/share" if args.share_only else ""
        )
        if device.type != "cpu" and not args.share_only:
            key += f"/{device.type}" + (f"-{args.autocast}" if args.autocast else "")
        if key in results:
            print(f"{key}: already in {out}, skipped", file=sys.stderr)
            continue
        regression = task.regression_range is not None
        enc = encode_split(tok, data[task.name].train, length, regression).features
        lengths = [len(x) for x in enc["input_ids"]]
        batches = _order(len(lengths), args.batch_size, args.seed)
        full = [b for b in batches if len(b) == args.batch_size]
        result: dict[str, Any] = {
            "task": task.name,
            "examples": len(lengths),
            "mean_length": round(statistics.mean(lengths), 2),
            "max_seq_len": length,
            "padding_share": round(padding_share(lengths, batches), 4),
            "batch_size": args.batch_size,
        }
        if not args.share_only:
            from transformers import DataCollatorWithPadding

            def features(b: list[int], enc: dict = enc) -> list[dict]:
                keys = ("input_ids", "attention_mask", "labels")
                return [{k: enc[k][i] for k in keys} for i in b]

            n = args.warmup + args.steps
            chosen = (full * (1 + n // max(1, len(full))))[:n]
            collate = {"padded": DataCollatorWithPadding(tok), "padding-free": FlattenedBatches()}
            config = tupe.TupeConfig(
                position_scheme=args.scheme, vocab_size=len(tok), hidden_size=shape.hidden_size,
                num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
                intermediate_size=shape.intermediate_size, max_position_embeddings=length,
                num_labels=1 if regression else max(2, len(task.tsv_labels)),
                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
            )  # fmt: skip
            models, optimizers = {}, {}
            for mode in collate:
                torch.manual_seed(args.seed)
                models[mode] = tupe.TupeForSequenceClassification(config).to(device).train()
                optimizers[mode] = torch.optim.AdamW(models[mode].parameters(), lr=2e-5, weight_decay=0.01)
            times: dict[str, list[float]] = {mode: [] for mode in collate}
            tokens: dict[str, int] = {mode: 0 for mode in collate}
            for r, b in enumerate(chosen):
                for mode in ("padded", "padding-free") if r % 2 == 0 else ("padding-free", "padded"):
                    batch = {
                        k: v.to(device) if torch.is_tensor(v) else v
                        for k, v in collate[mode](features(b)).items()
                    }
                    model, opt = models[mode], optimizers[mode]
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                        loss = model(**batch).loss
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    seconds = time.perf_counter() - t0
                    if r >= args.warmup:
                        times[mode].append(seconds)
                        tokens[mode] += batch["input_ids"].numel()
                print(f"{task.name} round {r + 1}/{n}", file=sys.stderr)
            median = {k: statistics.median(v) for k, v in times.items()}
            speed = {k: args.batch_size / v for k, v in median.items()}
            ratio = speed["padding-free"] / speed["padded"]
            result |= {
                "preset": args.preset,
                "scheme": args.scheme,
                "shape": f"{shape.num_hidden_layers} x {shape.hidden_size}",
                "threads": args.threads,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "autocast": args.autocast,
                "steps": args.steps,
                "median_step_s": {k: round(v, 4) for k, v in median.items()},
                "spread_s": {k: [round(min(v), 4), round(max(v), 4)] for k, v in times.items()},
                "examples_per_s": {k: round(v, 2) for k, v in speed.items()},
                "batch_tokens_timed": tokens,
                "ratio_padding_free_to_padded": round(ratio, 3),
                "target": TARGET,
                "meets_target": ratio >= TARGET,
                "torch": torch.__version__,
            }
            print(
                f"{task.name} ({args.preset}): padded {speed['padded']:.1f} examples/s, padding-free "
                f"{speed['padding-free']:.1f} examples/s: {ratio:.2f}x (target {TARGET}x); padding share "
                f"{result['padding_share']:.1%}"
            )
        else:
            print(f"{task.name}: padding share {result['padding_share']:.1%} at batch {args.batch_size}")
        results[key] = result
        if out:
            from tupe.io.files import atomic_write_text

            atomic_write_text(out, json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    from tupe.scripts import run_script

    sys.exit(run_script(main, prog="glue_padding_free.py"))
