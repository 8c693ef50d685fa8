"""End-to-end mode of `tupe bench`: time `tupe pretrain` itself against the bare training step.

The run is a separate process, `python -m tupe.bench.endtoend STAMPS.json ...`, which is `tupe pretrain ...`
(its parser, allocator setting and `run`) with one addition: the start time of every `Trainer.training_step` is recorded (wall clock) and written to
STAMPS.json at exit. From the stamps and the launch time:

- time to first step: launch of the process to the start of the first training step (imports, tokenizer and
  data from the cache, model, Trainer set-up);
- end-to-end tokens/s: `steps x batch x seq_len` over the time from the start of step 1 to the start of step
  `steps + 1`. It covers everything a real run does in between: data loading, collation and masking, the
  Trainer's bookkeeping, the learning-rate schedule, logging, evaluation and checkpoints at the preset's
  intervals;
- steady tokens/s: the same over the median step interval (what a step costs away from evaluations);
- peak resident memory of the process (`wait4` rusage).

The bare step (tupe/bench/runner.py: forward, backward, clipping, AdamW on a fixed batch) of the same scheme,
shape and batch is timed in the bench process just before and just after the run, and the end-to-end tokens/s is
reported as a ratio to it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_pretrain_timed(
    pretrain_args: list[str], steps_file: Path, log_file: Path | None = None, env: dict | None = None
) -> dict:
    """Run `tupe pretrain ARGS` in a child process; returns launch time, step stamps, wall time and peak RSS."""
    cmd = [sys.executable, "-m", "tupe.bench.endtoend", str(steps_file), *pretrain_args]
    out = open(log_file, "w") if log_file else subprocess.DEVNULL  # noqa: SIM115
    try:
        t_launch = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        t_end = time.time()
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if log_file:
            out.close()
    if proc.returncode != 0:
        from tupe.errors import TupeError

        tail = Path(log_file).read_text(errors="replace")[-2000:] if log_file else ""
        inner = next((ln for ln in reversed(tail.splitlines()) if ": error: " in ln), None)
        raise TupeError(
            f"the end-to-end `tupe pretrain` failed (exit {proc.returncode})"
            + (f": {inner.split(': error: ', 1)[1]}" if inner else (f"; see {log_file}" if log_file else ""))
        )
    stamps = json.loads(Path(steps_file).read_text())["step_starts"]
    return {
        "launch": t_launch,
        "end": t_end,
        "step_starts": stamps,
        "wall_s": t_end - t_launch,
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # kilobytes on Linux
    }


def summarize_run(run: dict, steps: int, tokens_per_step: int) -> dict:
    """Figures of one timed run (see the module docstring); `steps` full steps are timed (run has steps + 1)."""
    starts = run["step_starts"]
    if len(starts) < steps + 1:
        raise RuntimeError(f"the run recorded {len(starts)} training steps, expected {steps + 1}")
    intervals = [b - a for a, b in zip(starts[:steps], starts[1 : steps + 1])]
    loop = starts[steps] - starts[0]
    return {
        "timed_steps": steps,
        "tokens_per_step": tokens_per_step,
        "time_to_first_step_s": starts[0] - run["launch"],
        "loop_s": loop,
        "tokens_per_s": steps * tokens_per_step / loop,
        "step_interval_s_median": statistics.median(intervals),
        "steady_tokens_per_s": tokens_per_step / statistics.median(intervals),
        "process_wall_s": run["wall_s"],
        "peak_rss_bytes": run["peak_rss_bytes"],
    }


def _bare_reference(scheme: str, shape, seq_len: int, batch_size: int):  # noqa: ANN001, ANN202
    import torch

    from .runner import build_tupe, make_batch

    device = torch.device("cpu")
    batch = make_batch(batch_size, seq_len, shape.vocab_size, device)
    return build_tupe(scheme, "default", shape, seq_len, batch, device, torch.float32)


def _time_bare(cand, rounds: int, warmup: int) -> float:  # noqa: ANN001
    import torch

    from .runner import time_interleaved

    cand.times.clear()
    cand.cpu_times.clear()
    time_interleaved([cand], torch.device("cpu"), rounds, warmup)
    return statistics.median(cand.times)


# `tupe pretrain` options (given as --e2e-arg=--flag=value) that change the model shape -> Shape field
_SHAPE_FLAGS = {
    "--hidden-size": "hidden_size",
    "--num-layers": "num_hidden_layers",
    "--num-heads": "num_attention_heads",
    "--intermediate-size": "intermediate_size",
    "--vocab-size": "vocab_size",
    "--dropout": "dropout",
}


def compare_end_to_end(groups: list[dict], args, schemes: list[str], threads: int, log) -> dict:  # noqa: ANN001
    """For each scheme: bare step, `tupe pretrain` end to end, bare step again; the ratio of tokens/s."""
    from tupe.training.presets import get_preset

    from .flops import Shape, preset_shape

    preset = get_preset(args.preset)
    seq_len, batch_size = int(preset["max_length"]), int(preset["batch_size"])
    extra = list(args.e2e_arg)
    shape = preset_shape(args.preset, args.layers).__dict__
    for a in extra:  # the bare step must see the same shape and batch as the run
        flag, _, value = a.partition("=")
        if flag == "--batch-size":
            batch_size = int(value)
        elif flag in ("--max-seq-len", "--max-length"):
            seq_len = int(value)
        elif flag in _SHAPE_FLAGS:
            shape[_SHAPE_FLAGS[flag]] = type(shape[_SHAPE_FLAGS[flag]])(value)
    shape = Shape(**shape)
    tokens = seq_len * batch_size
    steps = int(args.e2e_steps)
    out: dict = {"preset": args.preset, "threads": threads, "steps": steps, "extra_args": extra, "runs": []}
    with tempfile.TemporaryDirectory(prefix="tupe-bench-e2e-") as tmp:
        tmp = Path(tmp)
        common = ["--preset", args.preset, "--threads", str(threads), "--no-progress", *extra]
        log("end-to-end: preparing the tokenizer and packed data (cached after the first time)")
        run_pretrain_timed(
            ["--out", str(tmp / "prepare"), "--prepare-only", *common], tmp / "prep.json", tmp / "prep.log"
        )
        for scheme in schemes:
            cand = _bare_reference(scheme, shape, seq_len, batch_size)
            bare_before = _time_bare(cand, args.rounds, args.warmup)
            log(f"end-to-end: bare {scheme} step {bare_before:.3f} s; running tupe pretrain ({steps} steps)")
            load_before = os.getloadavg()
            run = run_pretrain_timed(
                [
                    "--scheme",
                    scheme,
                    "--out",
                    str(tmp / scheme),
                    "--max-steps",
                    str(steps + 1),
                    *common,
                ],
                tmp / f"{scheme}.json",
                tmp / f"{scheme}.log",
            )
            load_after = os.getloadavg()
            bare_after = _time_bare(cand, args.rounds, 0)
            bare = (bare_before + bare_after) / 2
            row = summarize_run(run, steps, tokens)
            row.update(
                scheme=scheme,
                bare_step_s_before=bare_before,
                bare_step_s_after=bare_after,
                bare_tokens_per_s=tokens / bare,
                ratio_end_to_end_to_bare=row["tokens_per_s"] / (tokens / bare),
                ratio_steady_to_bare=row["steady_tokens_per_s"] / (tokens / bare),
                loadavg=[round(x, 2) for x in (*load_before, *load_after)],
                command="tupe pretrain "
                + " ".join(["--scheme", scheme, "--max-steps", str(steps + 1), *common]),
            )
            out["runs"].append(row)
            print(
                f"end to end, {scheme} ({args.preset}, {batch_size} x {seq_len}, {threads} threads): "
                f"{row['tokens_per_s']:.0f} tokens/s over {steps} steps (steady {row['steady_tokens_per_s']:.0f}) "
                f"vs bare step {row['bare_tokens_per_s']:.0f}: ratio {row['ratio_end_to_end_to_bare']:.3f} "
                f"(steady {row['ratio_steady_to_bare']:.3f}); first step after {row['time_to_first_step_s']:.1f} s; "
                f"peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB"
            )
    return out


def _child(steps_file: str, argv: list[str]) -> int:
    """`tupe pretrain ARGV` with the start of every training step recorded into `steps_file`."""
    import argparse

    from tupe.runtime import tune_cpu_allocator
    from tupe.training.arguments import add_pretrain_arguments

    parser = argparse.ArgumentParser(prog="tupe pretrain")
    add_pretrain_arguments(parser)
    args = parser.parse_args(argv)
    tune_cpu_allocator()  # as the `tupe` command does before any command runs
    starts: list[float] = []
    try:
        from transformers import Trainer

        from tupe.training.pretrain import run

        original = Trainer.training_step

        def training_step(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            starts.append(time.time())
            return original(self, *a, **k)

        Trainer.training_step = training_step
        return run(args)
    finally:
        Path(steps_file).write_text(json.dumps({"step_starts": starts}))


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2:]))
