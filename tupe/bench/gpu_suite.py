"""The GPU benchmark suite: one command that spends a lent GPU's minutes measuring, not preparing.

    benchmarks/gpu/run.sh --out DIR [--budget 540]        # = python -m tupe.bench.gpu_suite --out DIR ...
    python -m tupe.bench.gpu_suite --out DIR --device cpu --smoke    # the CPU dry run the tests make

Stages, in the order `--stages` gives them, each with its own share of the budget (the shares of the stages asked
for, scaled to `--budget`; time a stage leaves unused goes to the next ones; a stage with too little time left is
skipped with a note). By default:

1. `cuda-tests`: `pytest tests/cuda` (correctness first: a speed figure of a wrong kernel is worthless);
2. `steps`: `tupe bench` at the `base` shape, bf16 autocast, 128 x 64 and 512 x 16: every scheme with its
   default kernel, `bert-a` with SDPA held to its flash backend (`--flash-baseline`), transformers' BERT (SDPA)
   and DeBERTa-v2; tokens/s, MFU against the GPU's dense bf16 peak, peak memory, ratios to `bert-a [sdpa-flash]`;
   a batch that does not fit is halved until it does (the table says which batch ran);
3. `profile`: one base/512 step of bert-a (flash), tupe-a, alibi and transformers' BERT under PyTorch's profiler:
   wall time against the GPU's busy time (its idle share: launch-bound or compute-bound), kernels per step, the top
   kernels;
4. `long`: batch 1 at 1,024 to 8,192 tokens (base shape, bf16, no dropout so that `flex` may run): step time and
   peak memory of every scheme with its default kernel, one model at a time, until it runs out of memory;
5. `end-to-end`: `tupe pretrain --preset base --precision bf16` on the built-in corpus for a few hundred steps with
   evaluation and checkpoints inside the timed loop: tokens/s including data loading.

and, asked for by name (`--stages packing-speed,studies`; tupe/bench/gpu_studies.py), what the open issues still
need from a GPU:

6. `packing-speed`: issue 36's documents-vs-stream pre-training step and padding-free-vs-padded `tupe glue` step at
   base/512 in bf16 (`benchmarks/packing_step.py`, `benchmarks/glue_padding_free.py`);
7. `studies`: the length study of issue 37 (whose passkey stage issue 47 re-runs), the paper's-regime study of
   issue 47, the short-document arm and the packing study of issue 36, jobs in priority order, each resumable
   (`--studies`, `--studies-work`).

`--archive PATH` packs `--out` into one gzipped tar (in parts of 15 MiB where larger) after every stage and every
step of `studies`: what the device returns is at most 8 files, so point it into the device's return folder.

This module is the command (its flags, the checks before any stage, the stages in turn within the budget); the
stages are in tupe/bench/gpu_stages.py (`profile` and `long` run in children of this command: gpu_profile.py,
gpu_long.py), the machine's record in gpu_environment.py, the report in gpu_summary.py.

Every stage is a child process with a time limit (interrupted, then killed, at its end), writes its JSON under
`--out` as it goes, and `summary.md` / `summary.json` are rewritten after every stage: a run cut off by the
device's limit leaves every finished stage's results. The GPU, driver and library versions are printed first
(`environment.json`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tupe.errors import TupeError
from tupe.scripts import ScriptParser, claim_scratch_folder, run_script
from tupe.validators import check_out_file, float_range, int_range

from .children import end_on_sigterm
from .gpu_environment import environment, write_json
from .gpu_long import long_child
from .gpu_profile import profile_child
from .gpu_stages import DEFAULT_STAGES, MIN_STAGE_S, RUNNERS, SHARES, STAGES, WORK_MARKER
from .gpu_studies import write_archive
from .gpu_summary import write_summary

ROOT = Path(__file__).resolve().parents[2]  # the checkout the suite runs from

OUT_MARKER = ".tupe-gpu-suite"  # written into --out: a rerun may write over the suite's own results there


def _parser() -> ScriptParser:
    parser = ScriptParser(
        prog="benchmarks/gpu/run.sh",
        description="The GPU benchmark suite (docs/benchmarks.md, 'GPU'): cuda tests, training steps at base, "
        "long sequences, tupe pretrain end to end (and, when named, issue 36's packing timings and the open issues' "
        "studies), inside a time budget; results under --out as they come.",
    )
    parser.add_argument("--out", required=True, help="results folder (created; JSON, logs, summary.md)")
    parser.add_argument(
        "--budget",
        type=float_range(0, lo_open=True),
        default=540.0,
        help="seconds for all stages (default 540)",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cuda (default) or cpu (with --smoke: the dry run)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes: checks the script, measures nothing"
    )
    parser.add_argument(
        "--stages",
        default=",".join(DEFAULT_STAGES),
        help=f"comma-separated, of {', '.join(STAGES)} (default: %(default)s)",
    )
    parser.add_argument(
        "--archive",
        default=None,
        help="also pack --out into this .tar.gz (parts PATH.partNN of 15 MiB where larger) after every stage",
    )
    parser.add_argument(
        "--studies",
        default=None,
        help="studies: the jobs to run, in this order (default: all, length-1,...,regime,...; gpu_studies.py)",
    )
    parser.add_argument(
        "--studies-work",
        default="/tmp/tupe-gpu-studies",
        help="studies and packing-speed: the study folders, kept between calls to resume (default %(default)s)",
    )
    parser.add_argument(
        "--studies-parallel",
        type=int_range(1, 1024),
        default=36,
        help="studies: runs trained at once (default 36)",
    )
    parser.add_argument(
        "--glue-data",
        default=None,
        help="GLUE root with SST-2/ (and CoLA/): SST-2 of the packing study, packing-speed's glue step",
    )
    parser.add_argument(
        "--ood-text",
        action="append",
        default=None,
        help="studies: another out-of-domain text of the length jobs (repeatable; one missing is noted, skipped)",
    )
    parser.add_argument(
        "--cuda-tests-k",
        default="not fp16",
        help="pytest -k of the cuda-tests stage (default %(default)r: fp16 saves a third of the compiles; '' = all)",
    )
    parser.add_argument(
        "--e2e-steps", type=int_range(1), default=300, help="timed steps of end-to-end (default 300)"
    )
    parser.add_argument(
        "--work",
        default=None,
        help="scratch folder of end-to-end, emptied first: new, empty, or one the suite made (default: a new "
        "temporary folder)",
    )
    parser.add_argument(
        "--long-schemes",
        default=None,
        help="comma-separated schemes of the long stage (default: all, in LONG_ORDER)",
    )
    parser.add_argument("--long-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The suite's flags, checked: --stages and --studies known and each once, --device cpu only with --smoke."""
    parser = _parser()
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        parser.error(f"--stages: unknown {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    _refuse_repeats(parser, "--stages", stages)
    args.stages = stages
    from .gpu_studies import job_names

    names = job_names()
    args.studies = [j.strip() for j in (args.studies or ",".join(names)).split(",") if j.strip()]
    unknown = [j for j in args.studies if j not in names]
    if unknown:
        parser.error(f"--studies: unknown {', '.join(unknown)}; choose from {', '.join(names)}")
    _refuse_repeats(parser, "--studies", args.studies)
    if args.device == "cpu" and not args.smoke and not (args.long_child or args.profile_child):
        parser.error("--device cpu runs the base shapes for hours; add --smoke for the CPU dry run")
    return args


def _refuse_repeats(parser: argparse.ArgumentParser, flag: str, names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        parser.error(f"{flag}: {', '.join(repeated)} given more than once")


def check_paths(args: argparse.Namespace) -> None:
    """--out, --work and --archive, before any stage: nothing of the user's is written over or emptied."""
    out = claim_results_folder(args.out)
    if args.work:
        work = claim_scratch_folder("--work", args.work, WORK_MARKER)
        if work.resolve() == out.resolve() or out.resolve() in work.resolve().parents:
            raise TupeError(
                f"--work {work} is inside --out {out}, which holds results only; give another folder"
            )
    if args.archive:
        check_out_file("--archive", args.archive)


def claim_results_folder(path: str) -> Path:
    """--out: new, empty, or the results of an earlier run of the suite (its marker, or its summary.json), whose
    files the suite writes again; a folder of other files is refused before any stage."""
    from tupe.validators import check_out_folder

    out = check_out_folder("--out", path)
    if out.is_dir() and not (out / OUT_MARKER).is_file() and not (out / "summary.json").is_file():
        entries = sorted(e.name for e in out.iterdir())
        if entries:
            raise TupeError(
                f"--out {out} is not empty and holds no results of the suite (it holds {entries[0]!r}); "
                "give a new or empty folder"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    """The suite; a bad flag or path is one line `run.sh: error: ...` and exit code 2 before any stage."""
    return run_script(_main, argv, prog="gpu_suite")


def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.long_child or args.profile_child:  # the suite's own children, in the --out it checked
        out.mkdir(parents=True, exist_ok=True)
        return long_child(args) if args.long_child else profile_child(args)
    check_paths(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise TupeError(
                "--device cuda but torch.cuda.is_available() is False (use --device cpu --smoke for the dry run)"
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).touch()
    t_start = time.monotonic()
    end_on_sigterm()
    env = environment(args.device)
    print("environment:", json.dumps(env, indent=1), flush=True)
    write_json(out / "environment.json", env)
    stages: dict = {}

    # the summary names these folders, not this machine's paths (the interpreter as `python`)
    names = {str(out): "$OUT", str(Path(args.out)): "$OUT", str(ROOT): ".", sys.executable: "python"}
    for flag, name in (("work", "$WORK"), ("studies_work", "$STUDIES_WORK")):
        if getattr(args, flag, None):
            names[str(Path(getattr(args, flag)).resolve())] = names[str(getattr(args, flag))] = name

    def checkpoint() -> None:
        write_summary(out, env, stages, names)
        if args.archive:
            files = write_archive(out, Path(args.archive))
            print(
                f"archive: {', '.join(f'{f} ({f.stat().st_size / 2**20:.1f} MiB)' for f in files)}",
                flush=True,
            )

    def progress(name: str, partial: dict) -> None:  # a stage's results so far (studies: after every step)
        stages[name] = partial
        checkpoint()

    total = sum(SHARES[s] for s in args.stages)
    shares = {s: SHARES[s] * args.budget / total for s in args.stages}
    for i, name in enumerate(args.stages):
        left = args.budget - (time.monotonic() - t_start)
        later = sum(shares[s] for s in args.stages[i + 1 :])
        timeout = min(left, max(shares[name], left - later))
        if timeout < MIN_STAGE_S and not args.smoke:
            stages[name] = {"skipped": f"{left:.0f} s of the budget left"}
            print(f"== {name}: skipped ({left:.0f} s left)", flush=True)
        else:
            print(f"== {name}: up to {timeout:.0f} s ({left:.0f} s of the budget left)", flush=True)
            t0 = time.monotonic()
            args.progress_hook = lambda partial, name=name: progress(name, partial)
            try:
                stages[name] = RUNNERS[name](args, out, timeout)
            except Exception as e:  # noqa: BLE001 - the next stage still runs; the summary says what failed
                stages[name] = {"error": f"{type(e).__name__}: {e}"}
            stages[name]["stage_wall_s"] = time.monotonic() - t0
            print(f"== {name}: done in {stages[name]['stage_wall_s']:.0f} s", flush=True)
        checkpoint()
    print((out / "summary.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
