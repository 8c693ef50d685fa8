"""Positional diagnostics: train a small model of each scheme (or fine-tune a checkpoint) on synthetic tasks that
only positions can answer (copy the token 3 to the left; which of two marked tokens comes first; their distance),
test it at 1x-8x its training length with every extension method that applies, probe its hidden states for the
absolute position, and report each scheme with Student-t intervals over seeds. Definitions: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError

MARKER = ".tupe-diagnose"  # written in --out when the command makes or first uses it


def _schemes(text: str) -> list[str]:
    from tupe.modeling import POSITION_SCHEMES

    names = list(POSITION_SCHEMES) if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    return V.name_list(",".join(names), POSITION_SCHEMES, "--schemes", "scheme")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", required=True, type=V.nonempty_path, help="output folder (diagnostics.md, .json, runs/)"
    )
    p.add_argument(
        "--schemes",
        help="comma-separated positional schemes, or all (default: all 16; not with --model)",
    )
    p.add_argument(
        "--model",
        nargs="+",
        type=V.nonempty_path,
        metavar="PATH",
        help="instead of fresh models, fine-tune these checkpoints on the tasks (their own weights and scheme): tupe "
        "folders (a tokenizer is not needed) or transformers BERT folders (converted exactly to bert-a)",
    )
    p.add_argument("--seeds", type=V.seed_list, default=[0, 1, 2], help="seeds (default 0,1,2)")
    p.add_argument(
        "--train-length", type=V.int_range(16, 512), default=32, help="training length L (default 32)"
    )
    p.add_argument(
        "--multiples",
        type=V.int_list(1),
        default=[1, 2, 4, 8],
        metavar="K,K,...",
        help="test lengths as multiples of L, the first 1 (default 1,2,4,8)",
    )
    p.add_argument("--steps", type=V.int_range(1, 10**6), default=1000, help="training steps (default 1000)")
    p.add_argument(
        "--batch-size", type=V.int_range(3, 4096), default=32, help="sequences per step (default 32)"
    )
    p.add_argument(
        "--lr", type=V.float_range(0.0, 1.0), default=3e-3, help="peak learning rate (default 3e-3)"
    )
    p.add_argument(
        "--test-examples",
        type=V.int_range(8, 10**6),
        default=256,
        help="test sequences per task and length (default 256)",
    )
    p.add_argument(
        "--parallel", type=V.int_range(1, 64), default=2, help="jobs at once, one thread each (default 2)"
    )
    p.add_argument("--resume", action="store_true", help="keep the finished jobs in --out and run the others")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _settings(args: argparse.Namespace) -> Any:  # noqa: ANN401 - run.Settings, imported lazily
    from .run import Settings

    if args.multiples[0] != 1 or sorted(set(args.multiples)) != args.multiples:
        raise TupeError(f"--multiples must start at 1 and increase, got {','.join(map(str, args.multiples))}")
    return Settings(
        train_length=args.train_length,
        multiples=tuple(args.multiples),
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        test_examples=args.test_examples,
    )


def _jobs(args: argparse.Namespace, out: Path) -> list[Any]:
    from .run import Job

    jobs = []
    if args.model and args.schemes:
        raise TupeError(
            "--schemes goes with fresh models; --model fine-tunes the checkpoints under their own schemes"
        )
    if args.model:
        seen: dict[str, str] = {}
        for path in args.model:
            if not Path(path).is_dir():
                raise TupeError(f"--model {path} is not a folder")
            name, pretrain_seed = model_name(Path(path))
            key = name if pretrain_seed is None else f"{name}/seed-{pretrain_seed}"
            if key in seen:
                raise TupeError(f"--model names two folders called {key!r}; their results would share a name")
            seen[key] = path
            # a run folder <scheme>/seed-<k>: its jobs join the scheme's group, one per pre-training and task seed
            tag = "" if pretrain_seed is None else f"{pretrain_seed}-"
            jobs += [
                Job(
                    f"{name}/seed-{tag}{s}",
                    None,
                    str(path),
                    s,
                    str(out / "runs" / f"{name}-seed-{tag}{s}"),
                    pretrain_seed,
                )
                for s in args.seeds
            ]
    else:
        for scheme in _schemes(args.schemes or "all"):
            jobs += [
                Job(f"{scheme}/seed-{s}", scheme, None, s, str(out / "runs" / f"{scheme}-seed-{s}"))
                for s in args.seeds
            ]
    return jobs


def model_name(folder: Path) -> tuple[str, int | None]:
    """The name a --model folder's results go by, and its pre-training seed: a `tupe compare`/study run folder
    `<scheme>/seed-<k>` is (`<scheme>`, k), so the runs of one scheme over several seeds form one group of the
    report; any other folder is (its name, None)."""
    import re

    resolved = folder.resolve()
    found = re.fullmatch(r"seed-(\d+)", resolved.name)
    if found and resolved.parent.name:
        return resolved.parent.name, int(found[1])
    return resolved.name, None


def _prepare_out(out: Path, resume: bool) -> None:
    """An empty or new folder, or with --resume one this command made; never another's files."""
    V.check_out_folder("--out", out, must_exist=resume)
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise TupeError(
            f"--out {out} holds files that tupe diagnose did not write; give an empty or new folder"
        )
    if (out / MARKER).exists() and not resume:
        raise TupeError(
            f"--out {out} holds an earlier tupe diagnose; add --resume to continue it, or give a new folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).touch()


def _commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _run_all(jobs: list[Any], settings: Any, parallel: int, progress: bool) -> list[dict[str, Any]]:  # noqa: ANN401
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm.auto import tqdm

    from .run import finished, run_job

    results = {j.name: r for j in jobs if (r := finished(j)) is not None}
    todo = [j for j in jobs if j.name not in results]
    bar = tqdm(total=len(jobs), initial=len(results), desc="diagnose", unit="job", disable=not progress)
    if parallel == 1 or len(todo) <= 1:
        for job in todo:
            results[job.name] = run_job(job, settings)
            bar.update()
    else:
        with ProcessPoolExecutor(parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_job, job, settings): job for job in todo}
            for future in as_completed(futures):
                results[futures[future].name] = future.result()
                bar.update()
    bar.close()
    return [results[j.name] for j in jobs]


def run(args: argparse.Namespace) -> int:
    from tupe.io.files import atomic_write_text

    from .report import aggregate, markdown

    settings = _settings(args)
    out = Path(args.out)
    jobs = _jobs(args, out)
    if args.model:
        from .run import checkpoint_model

        # each read once first: a folder it cannot take is refused before --out is touched
        for path in args.model:
            checkpoint_model(path, settings)
    _prepare_out(out, args.resume)
    start = time.perf_counter()
    results = _run_all(jobs, settings, args.parallel, args.progress)
    summary = aggregate(results)
    lengths = [k * settings.train_length for k in settings.multiples]
    from tupe.evaluation.command import versions
    from tupe.io.results import recorded_command, recorded_path

    words = sys.argv[2:] if sys.argv[1:2] == ["diagnose"] else sys.argv[1:]
    record = {
        # paths relative to --out, where the record is written
        "command": recorded_command(["tupe", "diagnose", *words], out),
        "commit": _commit(),
        "machine": {"platform": platform.platform(terse=True), **versions()},
        "settings": dataclasses.asdict(settings),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "job_seconds": round(sum(r["seconds"] for r in results), 1),
        "summary": summary,
        "runs": [
            r | {"checkpoint": r["checkpoint"] and recorded_path(r["checkpoint"], out)} for r in results
        ],
    }
    text = markdown(summary, lengths, record["settings"])
    atomic_write_text(out / "diagnostics.md", text)
    atomic_write_text(out / "diagnostics.json", json.dumps(record, indent=1) + "\n")
    print(text)
    print(
        f"wrote {out / 'diagnostics.md'} and diagnostics.json ({len(results)} jobs, {record['wall_seconds']:.0f} s)"
    )
    return 0
