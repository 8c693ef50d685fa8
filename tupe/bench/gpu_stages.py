"""The GPU suite's stages (tupe/bench/gpu_suite.py runs them in the order `--stages` gives, each within its share
of the budget): `cuda-tests`, `steps`, `profile` and `long` (each in a child process of the suite:
tupe/bench/gpu_profile.py, tupe/bench/gpu_long.py), `end-to-end`, and by name the `packing-speed` and `studies`
stages of tupe/bench/gpu_studies.py. Each takes the parsed flags, the results folder and its time limit, and
returns its results (written under `--out` as it goes)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tupe.scripts import reset_scratch_folder

from .children import child_env, python_command, run_logged
from .gpu_environment import write_json
from .gpu_studies import stage_packing_speed, stage_studies

DEFAULT_STAGES = ("cuda-tests", "steps", "profile", "long", "end-to-end")
STAGES = (*DEFAULT_STAGES, "packing-speed", "studies")
# seconds of the default 540 s budget (the shares of the stages asked for are scaled to --budget): on an H200
# (2026-11-27) tests/cuda without fp16 took 56 s, each `tupe bench` of `steps` about 60 s, end-to-end 66 s, a flex
# scheme's lengths in `long` ~25 s of compiling; `studies` takes whatever the others leave
SHARES = {"cuda-tests": 100, "steps": 150, "profile": 60, "long": 140, "end-to-end": 90, "packing-speed": 90,
          "studies": 400}  # fmt: skip
MIN_STAGE_S = 25  # a stage with less time than this left is skipped
WORK_MARKER = ".tupe-gpu-suite-work"  # written into the --work the suite makes: only such a folder is emptied


def stage_cuda_tests(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    tests = Path("tests/cuda")
    if not tests.is_dir():
        return {"skipped": "tests/cuda not found: run the suite from the repository root"}
    junit = out / "cuda_tests.xml"
    cmd = [
        *python_command(),
        "-m",
        "pytest",
        str(tests),
        "-v",
        "-p",
        "no:cacheprovider",
        "-ra",
        "--maxfail=10",
    ]
    cmd += ["--durations=10", f"--junitxml={junit}"]
    env = child_env()
    if args.smoke:  # the CPU dry run: the same file on the CPU, its two cheapest tests
        env["TUPE_TEST_DEVICE"] = args.device
        cmd += ["-k", "refused or masked_lm_loss"]
    elif args.cuda_tests_k:
        cmd += ["-k", args.cuda_tests_k]
    run = run_logged(cmd, out / "cuda_tests.log", timeout, env)
    result: dict = {
        "command": " ".join(cmd),
        **run,
        "selection": cmd[cmd.index("-k") + 1] if "-k" in cmd else None,
    }
    result.update(_junit_counts(junit))
    return result


def _junit_counts(path: Path) -> dict:
    if not path.exists():
        return {"counts": None}
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["time_s"] = sum(float(s.get("time", 0)) for s in suites)
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for s in suites
        for case in s.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {"counts": counts, "failed": failed}


def stage_steps(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    from tupe.modeling import POSITION_SCHEMES

    deadline = time.monotonic() + timeout
    shapes = [(32, 2)] if args.smoke else [(128, 64), (512, 16)]
    result: dict = {"shapes": []}
    for seq_len, batch in shapes:
        while True:
            path = out / f"steps_{seq_len}x{batch}.json"
            cmd = [*python_command(), "-m", "tupe", "bench", "--preset", "base", "--seq-len", str(seq_len)]
            cmd += ["--batch-size", str(batch), "--schemes", ",".join(POSITION_SCHEMES), "--attention-kernel"]
            cmd += ["default", "--flash-baseline", "--autocast", "bfloat16", "--device", args.device]
            cmd += ["--json", str(path), "--no-progress"]
            if args.smoke:
                cmd += ["--shape", "2x64", "--rounds", "1", "--warmup", "0", "--peak-flops", "1e11"]
            else:
                cmd += ["--rounds", "10", "--warmup", "3"]
            left = deadline - time.monotonic()
            if left < MIN_STAGE_S / 2:
                result["shapes"].append({"seq_len": seq_len, "skipped": "out of time"})
                break
            run = run_logged(cmd, out / "steps.log", left, child_env())
            entry = {"seq_len": seq_len, "batch_size": batch, "json": path.name, **run}
            if run["returncode"] == 0 and path.exists():
                entry["bench"] = json.loads(path.read_text())
                result["shapes"].append(entry)
                break
            tail = (out / "steps.log").read_text(errors="replace")[-4000:].lower()
            if "out of memory" in tail and batch > 1 and not run["timed_out"]:
                batch //= 2  # the largest batch that fits: halve and try again
                continue
            result["shapes"].append(entry)
            break
        write_json(out / "steps.json", result)
    return result


def _run_child(args: argparse.Namespace, out: Path, timeout: float, stage: str, extra: list[str]) -> dict:
    """A stage that runs in its own `--STAGE-child` process: its run record merged with the JSON it wrote (rows
    written one by one, so a child cut off by its time share still leaves what it measured)."""
    cmd = [
        *python_command(),
        "-m",
        "tupe.bench.gpu_suite",
        f"--{stage}-child",
        "--out",
        str(out),
        "--device",
        args.device,
    ]
    cmd += ["--smoke"] if args.smoke else []
    run = run_logged([*cmd, *extra], out / f"{stage}.log", timeout, child_env())
    path = out / f"{stage}.json"
    return {**run, **(json.loads(path.read_text()) if path.exists() else {"rows": []})}


def stage_profile(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    return _run_child(args, out, timeout, "profile", [])


def stage_long(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    return _run_child(
        args, out, timeout, "long", ["--long-schemes", args.long_schemes] if args.long_schemes else []
    )


def stage_end_to_end(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    from .endtoend import summarize_run

    deadline = time.monotonic() + timeout
    # scratch (the model, checkpoints, the cache: GBs at base) outside --out, which holds results only
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tupe-gpu-e2e-"))
    reset_scratch_folder(work, WORK_MARKER)  # main() refused a --work of the user's before any stage
    env = child_env()
    env["TUPE_CACHE"] = str(work / "cache")
    if args.smoke:
        corpus = work / "corpus.txt"
        import gzip

        from tupe.data.corpus import DEFAULT_CORPUS_DIR

        with gzip.open(sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))[0], "rt", encoding="utf-8") as f:
            text = f.read(200_000)
        corpus.write_text(text)
        common = ["--preset", "mini", "--corpus", str(corpus), "--vocab-size", "300", "--max-seq-len", "32"]
        common += [
            "--num-layers",
            "1",
            "--hidden-size",
            "32",
            "--num-heads",
            "2",
            "--intermediate-size",
            "64",
        ]
        common += ["--batch-size", "4", "--eval-steps", "3", "--save-steps", "4", "--precision", "fp32"]
        steps = 6
    else:
        common = ["--preset", "base", "--precision", "bf16", "--eval-steps", "100", "--save-steps", "150"]
        common += ["--logging-steps", "50"]
        steps = args.e2e_steps
    common += ["--scheme", "tupe-a", "--no-progress"]
    prep = run_logged(
        [*python_command(), "-m", "tupe", "pretrain", "--out", str(work / "prep"), "--prepare-only", *common],
        out / "end_to_end.log",
        deadline - time.monotonic(),
        env,
    )
    result: dict = {"prepare": prep, "steps": steps}
    if prep["returncode"] != 0:
        result["error"] = "preparing the data failed (see end_to_end.log)"
        return result
    stamps = work / "stamps.json"
    pre = ["--out", str(work / "run"), "--max-steps", str(steps + 1), *common]
    cmd = [*python_command(), "-m", "tupe.bench.endtoend", str(stamps), *pre]
    t_launch = time.time()
    run = run_logged(cmd, out / "end_to_end.log", deadline - time.monotonic(), env)
    result.update(run=run, command="tupe pretrain " + " ".join(pre))
    starts = json.loads(stamps.read_text())["step_starts"] if stamps.exists() else []
    if run["returncode"] != 0 or len(starts) < 2:
        result["error"] = f"tupe pretrain ended with {run['returncode']} after {len(starts)} steps"
        if len(starts) < 2:
            return result
    done = min(steps, len(starts) - 1)
    from tupe.training.presets import get_preset

    values = get_preset("mini" if args.smoke else "base")
    seq = 32 if args.smoke else int(values["max_length"])
    batch = 4 if args.smoke else int(values["batch_size"])
    summary = summarize_run(
        {"launch": t_launch, "step_starts": starts, "wall_s": run["wall_s"], "peak_rss_bytes": None},
        done,
        seq * batch,
    )
    result["figures"] = summary
    metrics = work / "run" / "metrics.jsonl"
    if metrics.exists():
        result["metrics_tail"] = metrics.read_text().splitlines()[-3:]
    return result


RUNNERS = {
    "cuda-tests": stage_cuda_tests,
    "steps": stage_steps,
    "profile": stage_profile,
    "long": stage_long,
    "end-to-end": stage_end_to_end,
    "packing-speed": stage_packing_speed,
    "studies": stage_studies,
}
