"""Pre-train several positional schemes (and seeds) on identical data, then compare their validation loss.

`tupe compare --schemes bert-a,tupe-a --out DIR [--seeds 0,1,2] [--parallel 2] [pretrain options]` trains one
run per (scheme, seed) on the same tokenizer and cached blocks; runs of one seed share the initial seed, the data
order and the masks, so scheme differences within a seed are paired. Layout: `DIR/<scheme>/` for one seed,
`DIR/<scheme>/seed-<s>/` for several. `--parallel N` trains N runs at once in separate processes (one thread each
by default: on a small CPU this is the fastest way to use several cores), each logging to `DIR/logs/`.

Outputs in DIR:

- `valid_loss.png`: every run's validation curve (seeds of a scheme share a colour) and the unigram baseline;
- `valid_loss.md`, `valid_loss.csv`: the validation loss of every run at every evaluation;
- `compare_summary.json`: per scheme the final loss (mean ± std over seeds), the step each run left the plateau
  (validation loss 1 nat below the unigram baseline), the steps it needed to reach the first scheme's final loss
  of the same seed (the paper's "TUPE needs 30% of the steps", Fig. 5a), and the paired difference from the first
  scheme with a Student-t interval over seeds; with one seed, `paired`: each final loss and paired difference
  with a 95% bootstrap interval over the shared validation blocks and masks (printed too).

A one-line warning (stderr, and `warning` in the summary) says when the validation set is too small for what is
reported: fewer than 100 validation blocks (`tupe.comparison.paired.MIN_VALID_BLOCKS`), or, with one seed, a
paired difference whose 95% interval includes 0.

With `--resume`, finished runs are kept and interrupted ones continue from their latest checkpoint; a
comparison of other schemes, seeds, steps or `--packing` is refused.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tupe.errors import TupeError
from tupe.io.files import atomic_write_text
from tupe.io.outputs import OutputFolder
from tupe.io.reading import Refused, open_regular, read_json
from tupe.training.arguments import add_compare_arguments as add_arguments  # noqa: F401 - the CLI's hook
from tupe.training.model import check_scheme
from tupe.training.pretrain import SUMMARY_FILE, PretrainConfig, config_from_args, pretrain

LOG_DIR = "logs"  # a parallel run's output: DIR/logs/<scheme>[-seed-<s>].log


def parse_schemes(text: str) -> list[str]:
    """`--schemes`: schemes of `--scheme` (hf-bert included), the first the reference."""
    from tupe.training.model import pretrain_schemes
    from tupe.validators import name_list

    return name_list(text, pretrain_schemes(), "--schemes", "scheme")


MAX_SEEDS = 1000  # a range like 0-10000000000 would otherwise be expanded in memory


def parse_seeds(text: str) -> list[int]:
    """`0,1,2` or a range `0-4`."""
    try:
        if "-" in text.strip().lstrip("-") and "," not in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            seeds = list(range(lo, min(hi, lo + MAX_SEEDS) + 1))  # bounded: a longer range is refused below
        else:
            seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise TupeError(f"--seeds must be integers like 0,1,2 or a range 0-4, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise TupeError(f"--seeds needs distinct integers, got {text!r}")
    bad = next((s for s in seeds if not 0 <= s < 2**32), None)
    if bad is not None:
        raise TupeError(f"--seeds: each seed must be from 0 to {2**32 - 1}, got {bad} in {text!r}")
    if len(seeds) > MAX_SEEDS:
        raise TupeError(f"--seeds: more than {MAX_SEEDS:,} seeds in {text!r} (one run per seed and scheme)")
    return seeds


def run_dirs(out: Path, schemes: list[str], seeds: list[int]) -> dict[tuple[str, int], Path]:
    """Where each (scheme, seed) run lives: `out/scheme` for one seed, `out/scheme/seed-s` for several."""
    if len(seeds) == 1:
        return {(s, seeds[0]): out / s for s in schemes}
    return {(s, k): out / s / f"seed-{k}" for s in schemes for k in seeds}


def _finished(run_dir: Path, max_steps: int) -> bool:
    """The run finished with exactly `max_steps` (a longer run is not this comparison's)."""
    try:
        return read_json(run_dir / SUMMARY_FILE, "run summary")["steps"] == max_steps
    except Refused:
        raise
    except (TupeError, KeyError):
        return False


def _last_step(run_dir: Path) -> int:
    """Latest step a run has logged (0 if none): progress of a run in another process."""
    try:
        with open_regular(run_dir / "metrics.jsonl", "metrics log") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
            lines = fh.read().decode("utf-8", "replace").splitlines()
        for line in reversed(lines):
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
    except (OSError, TupeError):
        pass
    return 0


def _child(cfg: PretrainConfig, log_path: str) -> None:  # pragma: no cover - runs in a subprocess
    """Entry point of a parallel run: all output to its log file, errors as one line there."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    from tupe.runtime import hushed_libraries, tune_cpu_allocator

    tune_cpu_allocator()  # a spawned interpreter: the parent's setting is not inherited
    try:
        with hushed_libraries(cfg.progress, cfg.quiet):
            pretrain(cfg)
    except TupeError as e:
        print(f"error: {e}", flush=True)
        sys.exit(2)


class _Terminated(Exception):
    """SIGTERM received by the parent of parallel runs."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def _train_parallel(
    jobs: list[tuple[str, PretrainConfig]],
    parallel: int,
    log_dir: Path,
    progress: bool,
    log,  # noqa: ANN001
) -> None:
    """Run `pretrain` for every job, `parallel` processes at a time, with one progress bar over all steps."""
    import multiprocessing as mp

    from tqdm.auto import tqdm

    ctx = mp.get_context("spawn")
    pending = list(jobs)
    active: dict[str, tuple[Any, Path, int, Path]] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    total = sum(int(c.resolve().optim.max_steps) for _, c in jobs)
    bar = tqdm(total=total, desc="pre-training", unit="step", disable=not progress, dynamic_ncols=True)
    done_steps: dict[str, int] = {}
    # A SIGTERM (a scheduler, `kill`) must stop the runs too: without this the parent dies and its runs go on
    # as orphans, holding the cores, with nobody to collect them.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        while pending or active:
            while pending and len(active) < parallel:
                name, cfg = pending.pop(0)
                run_dir = Path(cfg.out)
                log_path = log_dir / f"{name.replace('/', '-')}.log"
                proc = ctx.Process(target=_child, args=(cfg, str(log_path)), name=name)
                proc.start()
                log(f"started {name} (pid {proc.pid}, log {log_path})")
                active[name] = (proc, run_dir, int(cfg.resolve().optim.max_steps), log_path)
            time.sleep(1.0)
            for name, (proc, run_dir, steps, log_path) in list(active.items()):
                done_steps[name] = min(steps, _last_step(run_dir))
                if not proc.is_alive():
                    proc.join()
                    del active[name]
                    if proc.exitcode == 0:
                        done_steps[name] = steps
                        log(f"finished {name}")
                    else:
                        failed.append(f"{name} (exit {proc.exitcode}, see {log_path})")
            bar.n = sum(done_steps.values())
            bar.set_postfix_str(", ".join(f"{n} {done_steps.get(n, 0)}" for n in active), refresh=False)
            bar.refresh()
    except (KeyboardInterrupt, _Terminated) as err:
        for proc, *_ in active.values():
            if isinstance(err, _Terminated):  # Ctrl-C reaches the whole group, a SIGTERM only this process
                proc.terminate()  # each run checkpoints at the end of its step and stops
        for proc, *_ in active.values():
            proc.join(timeout=300)
        what = "stopped by SIGTERM" if isinstance(err, _Terminated) else "interrupted"
        print(
            f"tupe compare: {what}; finished runs are kept, the ones in progress ({', '.join(active)}) saved a "
            f"checkpoint (see {log_dir}): run the same command with --resume to continue",
            file=sys.stderr,
            flush=True,
        )
        if isinstance(err, _Terminated):
            raise SystemExit(143) from None
        raise
    finally:
        bar.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if failed:
        raise TupeError("runs failed: " + "; ".join(failed) + " (rerun with --resume to continue them)")


def compare(
    base: PretrainConfig,
    schemes: list[str],
    seeds: list[int] | None = None,
    parallel: int = 1,
    log=print,  # noqa: ANN001
) -> dict[str, Any]:
    """Pre-train every (scheme, seed) with `base`'s settings under `base.out` and summarise; one comparison
    writes `base.out` at a time (its lock; each run's folder has its own)."""
    from tupe.io.files import folder_lock
    from tupe.validators import check_out_folder

    out = check_out_folder("--out", base.out)
    with folder_lock(out, "tupe compare"):
        return _compare(base, out, schemes, seeds, parallel, log)


COMPARE_RUN_FILE = "compare_run.json"  # the comparison's identity: schemes, seeds, steps
COMPARE_FILES = (
    "valid_loss.csv",
    "valid_loss.md",
    "valid_loss.png",
    "compare_summary.json",
    COMPARE_RUN_FILE,
    "eval_text.json",
    LOG_DIR,
)


def _is_legacy_compare_output(path: Path) -> bool:
    """In a folder written before tupe kept records: a run folder of tupe pretrain, or a comparison's file when
    the folder's compare_summary.json is a comparison's."""
    if path.is_dir() and not path.is_symlink() and (path / "tupe_run.json").is_file():
        return True
    if path.name not in COMPARE_FILES:
        return False
    try:
        return "schemes" in read_json(path.parent / "compare_summary.json", "comparison summary")
    except TupeError:
        return False


def _check_comparison(out: Path, identity: dict[str, Any], base: PretrainConfig) -> None:
    """`--resume` continues the same comparison only: other schemes, seeds, steps or `--packing` are refused like
    `tupe pretrain --resume` refuses another run (finished runs of another length would be compared silently)."""
    path = out / COMPARE_RUN_FILE
    if base.resume and not base.overwrite and os.path.lexists(path):
        old = read_json(path, "comparison record")
        # --packing is recorded only when it is not the default, so older records read as stream
        diffs = [
            f"{k}: {old.get(k, default)!r} -> {identity.get(k, default)!r}"
            for k, default in (("schemes", None), ("seeds", None), ("max_steps", None), ("packing", "stream"))
            if old.get(k, default) != identity.get(k, default)
        ]
        if diffs:
            raise TupeError(
                f"--out {out} holds another comparison ({'; '.join(diffs)}); --resume continues the same one: use "
                "another --out, or --overwrite to start again"
            )
    atomic_write_text(path, json.dumps({"format": 1, **identity}, indent=1) + "\n")


def _epochs_as_steps(base: PretrainConfig, log) -> PretrainConfig:  # noqa: ANN001
    """`--epochs` as the steps `tupe pretrain --epochs` would train: every run of a comparison trains on the same
    blocks, so one count, made from the prepared data before any run starts (the comparison's identity, `--resume`
    and the progress bar need it)."""
    prepared = pretrain(dataclasses.replace(base, prepare_only=True, resume=False))
    steps = base.resolve().for_data(prepared["train_blocks"]).optim.max_steps
    log(f"--epochs {base.epochs:g}: {steps} steps per run ({prepared['train_blocks']} training blocks)")
    return dataclasses.replace(base, epochs=None, max_steps=steps)


def _compare(
    base: PretrainConfig,
    out: Path,
    schemes: list[str],
    seeds: list[int] | None,
    parallel: int,
    log,  # noqa: ANN001
) -> dict[str, Any]:
    seeds = seeds or [base.seed]
    prepared = False
    if base.epochs is not None:
        base, prepared = _epochs_as_steps(base, log), True
    max_steps = int(base.resolve().optim.max_steps)
    dirs = run_dirs(out, schemes, seeds)
    # what this comparison writes at the top of --out; a user's file there stops it before any work
    outputs = OutputFolder(out, "tupe compare", legacy=_is_legacy_compare_output)
    outputs.claim(*dict.fromkeys(schemes), *COMPARE_FILES)
    identity: dict[str, Any] = {"schemes": schemes, "seeds": seeds, "max_steps": max_steps}
    if base.packing != "stream":
        identity["packing"] = base.packing
    _check_comparison(out, identity, base)
    jobs = []
    for (scheme, seed), run_dir in dirs.items():
        name = scheme if len(seeds) == 1 else f"{scheme}/seed-{seed}"
        if base.resume and _finished(run_dir, max_steps):
            log(f"{name}: already finished in {run_dir}, reusing it")
            continue
        # the runs of one comparison resume what they find (an interrupted run continues)
        resume = base.resume and (run_dir / "tupe_run.json").exists()
        cfg = dataclasses.replace(base, out=str(run_dir), scheme=scheme, seed=seed, resume=resume)
        jobs.append((name, cfg))
    jobs.sort(key=lambda job: seeds.index(job[1].seed))  # seed by seed: partial results stay paired
    t0 = time.perf_counter()
    if parallel > 1 and len(jobs) > 1:
        if not prepared:  # tokenizer and packed blocks once, before the runs start sharing the cache
            pretrain(dataclasses.replace(base, prepare_only=True, resume=False))
        threads = base.threads or max(1, (os.cpu_count() or 1) // parallel)
        jobs = [(n, dataclasses.replace(c, threads=threads, progress=False)) for n, c in jobs]
        _train_parallel(jobs, parallel, out / LOG_DIR, base.progress and not base.quiet, log)
    else:
        for i, (name, cfg) in enumerate(jobs, 1):
            log(f"[{i}/{len(jobs)}] pre-training {name} -> {cfg.out}")
            pretrain(cfg)
    summary = summarize(out, schemes, seeds)
    summary["train_seconds"] = round(time.perf_counter() - t0, 1)
    return summary


def summarize(out: Path, schemes: list[str], seeds: list[int] | None = None) -> dict[str, Any]:
    """Write the plot, the Markdown/CSV tables and compare_summary.json for the finished runs in `out`."""
    from tupe.analysis.baseline import run_unigram
    from tupe.analysis.curves import plot_curves, read_metrics
    from tupe.analysis.seeds import aggregate, render_table

    seeds = seeds or [0]
    dirs = run_dirs(out, schemes, seeds)
    valid = {key: read_metrics(d)[1] for key, d in dirs.items()}
    base = schemes[0]
    for key, records in valid.items():
        if not records:
            raise TupeError(f"{dirs[key]}: no validation record")
    unigram = run_unigram(dirs[(base, seeds[0])])
    stats = aggregate(
        {s: {k: valid[(s, k)] for k in seeds} for s in schemes},
        reference=base,
        unigram=None if unigram is None else unigram["unigram_loss"],
    )

    names = {(s, k): (s if len(seeds) == 1 else f"{s}/seed-{k}") for (s, k) in dirs}
    steps = sorted({r["step"] for v in valid.values() for r in v})
    by_step = {key: {r["step"]: r["eval_loss"] for r in v} for key, v in valid.items()}
    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    w.writerow(["step", *names.values()])
    for st in steps:
        w.writerow([st, *[f"{by_step[k][st]:.4f}" if st in by_step[k] else "" for k in dirs]])
    atomic_write_text(out / "valid_loss.csv", fh.getvalue())

    lines = ["| step | " + " | ".join(names.values()) + " |", "|---:|" + "---:|" * len(names)]
    for st in steps:
        vals = [by_step[k].get(st) for k in dirs]
        best = min(v for v in vals if v is not None)
        cells = [
            "" if v is None else (f"**{v:.4f}**" if v == best and len(vals) > 1 else f"{v:.4f}") for v in vals
        ]
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    table = render_table(stats)
    atomic_write_text(out / "valid_loss.md", "\n".join(lines) + "\n\n" + table)
    png = plot_curves(
        list(dirs.values()),
        out / "valid_loss.png",
        labels=[s for s, _ in dirs],
        title="Pre-training validation loss"
        + (f" ({len(seeds)} seeds per scheme)" if len(seeds) > 1 else ""),
        baseline=stats["unigram_loss"],
    )
    summary = {
        "schemes": schemes,
        "seeds": seeds,
        "baseline": base,
        "runs": {names[k]: str(d) for k, d in dirs.items()},
        "stats": stats,
        "plot": str(png),
        "table": table,
        **_paired_or_size(dirs, schemes, seeds),
    }
    atomic_write_text(out / "compare_summary.json", json.dumps(summary, indent=1))
    return summary


def _paired_or_size(
    dirs: dict[tuple[str, int], Path], schemes: list[str], seeds: list[int]
) -> dict[str, Any]:
    """One seed: each scheme's final loss and its paired difference from the first, with 95% bootstrap
    intervals over the shared validation blocks and masks (`paired`, and `paired_table` to print). Several
    seeds: the Student-t interval over seeds is in the table already. Either way `warning`: a line when the
    validation set is too small for the differences reported (tupe.comparison.paired.MIN_VALID_BLOCKS)."""
    from tupe.comparison.paired import paired_comparison, validation_warning

    if len(seeds) > 1:
        try:
            blocks = read_json(dirs[(schemes[0], seeds[0])] / SUMMARY_FILE, "run summary")["valid_blocks"]
        except (TupeError, KeyError, TypeError):
            return {"warning": None}
        return {"warning": validation_warning(int(blocks))}
    seed = seeds[0]
    paired = paired_comparison({s: dirs[(s, seed)] for s in schemes}, reference=schemes[0], seed=seed)
    size = paired["validation"]
    lines = [
        f"Final validation loss, 95% bootstrap CI over the {size['blocks']:,} shared validation blocks "
        f"({size['masked_tokens']:,} masked tokens, same masks):"
    ]
    width = max(len(f"{s} - {schemes[0]}") for s in schemes) + 2
    for name in [*schemes, *(f"{s} - {schemes[0]}" for s in schemes[1:])]:
        d = paired[name]
        sign = "+" if " - " in name else ""
        ci = "" if d["low"] is None else f"   [{d['low']:{sign}.3f}, {d['high']:{sign}.3f}]"
        lines.append(f"  {name:<{width}}{d['value']:{sign}8.3f}{ci}" + ("  paired" if " - " in name else ""))
    return {
        "paired": paired,
        "paired_table": "\n".join(lines),
        "warning": validation_warning(size["blocks"], size["masked_tokens"], paired),
    }


def run(args: argparse.Namespace) -> int:
    schemes = parse_schemes(args.schemes)
    for scheme in schemes:  # a kernel that cannot run one of them: refused before the first run starts
        check_scheme(scheme, args.attention_kernel, args.packing)
    seeds = parse_seeds(args.seeds) if args.seeds else None
    if args.parallel < 1:
        raise TupeError(f"--parallel must be at least 1, got {args.parallel}")
    check_eval_text(args)
    from tupe.runtime import console_log, hushed_libraries

    log = console_log(args.quiet)

    with hushed_libraries(args.progress, args.quiet):  # no "Writing model shards" bars with --quiet
        summary = compare(
            config_from_args(args, scheme=schemes[0]), schemes, seeds=seeds, parallel=args.parallel, log=log
        )
    print()
    print(summary["table"])
    if summary.get("paired_table"):
        print(summary["paired_table"])
        print()
    print(f"plot: {summary['plot']}")
    if summary.get("warning"):
        print(summary["warning"], file=sys.stderr)
    if args.eval_text:
        with hushed_libraries(args.progress, args.quiet):
            evaluate_on_text(Path(args.out).expanduser(), summary, args.eval_text, args, log)
    return 0


def check_eval_text(args: argparse.Namespace) -> None:
    """--eval-text resolved and read before any training, so that a wrong path, a file that is not text (a zip)
    or too little text for one block stops the command at once, not after every run has trained. Each byte
    makes at most one token of a byte-level BPE (and one separator a line), so fewer than the block needs can
    make no block under any tokenizer the runs may train."""
    if not getattr(args, "eval_text", None):
        return
    from tupe.data.corpus import iter_line_batches
    from tupe.evaluation.runs import resolve_text
    from tupe.training.presets import get_preset

    length = getattr(args, "max_length", None)
    if length is None:
        length = get_preset(getattr(args, "preset", None) or "mini").get("max_length", 2)
    need = int(length) - 1  # tokens after [CLS]
    try:
        corpus = resolve_text(args.eval_text, getattr(args, "text_column", "text"))
        have = 0
        for lines, _, _ in iter_line_batches(corpus):
            have += sum(len(line.encode()) + 1 for line in lines)
            if have >= need:
                break
        if have < need:
            raise TupeError(
                f"{' '.join(args.eval_text)}: {have} bytes of text (with line ends), fewer than the {need} tokens "
                f"after [CLS] that one block of --max-length {length} needs; give more text"
            )
    except TupeError as err:
        raise TupeError(f"--eval-text: {err}") from None


def evaluate_on_text(
    out: Path,
    summary: dict[str, Any],
    texts: list[str],
    args: argparse.Namespace,
    log,  # noqa: ANN001
) -> dict[str, Any]:
    """`--eval-text`: `tupe evaluate` of every finished run on another text; prints its table and the paired
    verdict against the first scheme, writes `out/eval_text.json`."""
    from tupe.evaluation.command import versions, write_json
    from tupe.evaluation.report import format_report
    from tupe.evaluation.runs import EVAL_TEXT_FILE, evaluate_runs, verdict_lines

    runs = {name: Path(d) for name, d in summary["runs"].items()}
    log(f"evaluating {len(runs)} run(s) on --eval-text {' '.join(texts)}")
    progress = getattr(args, "progress", True) and not getattr(args, "quiet", False)
    result = evaluate_runs(
        runs,
        texts,
        seed=getattr(args, "seed", 0) or 0,
        text_column=getattr(args, "text_column", "text"),
        cache_dir=getattr(args, "cache_dir", None),
        progress=progress,
        log=log if progress else (lambda m: None),
    )
    write_json(out / EVAL_TEXT_FILE, {"eval_text": texts, "versions": versions(), **result})
    print()
    print(format_report(result))
    print()
    for line in verdict_lines(result, next(iter(runs))):
        print(line)
    print(f"wrote {out / EVAL_TEXT_FILE}")
    return result
