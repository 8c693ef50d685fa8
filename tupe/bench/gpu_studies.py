"""What the open issues still need from a GPU: the `packing-speed` and `studies` stages of the GPU suite.

    benchmarks/gpu/run.sh --out /tmp/gpu --archive $OUT/gpu.tar.gz --stages packing-speed,studies \
        [--studies length-1,length-2,...] [--glue-data .carry/glue] [--ood-text .carry/conll-news.txt]

`packing-speed` (issue 36, item 5 on a GPU): `benchmarks/packing_step.py` (a `--packing documents` training
step against a `stream` one) and, with `--glue-data`, `benchmarks/glue_padding_free.py` (a padding-free
`tupe glue` step against a padded one, CoLA and SST-2) at the `base` shape and length 512, bf16 autocast.

`studies`: the pre-training studies, as jobs in priority order (`--studies`, default all of `job_names()`); each
job is one or two `python -m tupe.comparison.study` folders under `--studies-work`, every call with `--resume`:

1. `length-1`, `length-2`, ... (issue 37, items 4 and 5; issue 47 re-runs their passkey stage with the
   order-aware probe): the study of every scheme over seeds 0-4, in chunks of `LENGTH_CHUNK` schemes
   (`length_chunks`: the length comparators and the new schemes first), each chunk a study folder of its own,
   trained, then evaluated (out-of-domain texts: built-in and every `--ood-text`; lengths 1x-8x with every
   extension method; the passkey probe; the summary) before the next chunk starts, so that a chunk that comes
   back is complete. Runs of one seed share the initialisation seed, the data order and the masks in every chunk
   (the same tokenizer and blocks), so chunks compare as one study would, paired by seed.
2. `regime` (issue 47, item 3; RESULTS G): `REGIME_SCHEMES` (bert-a, tupe-a, tupe-r, bert-r, rope, deberta) x
   seeds 0-2 at the paper's-regime recipe `REGIME_RECIPE` (the `small` preset, 6,000 steps), trained at once; then
   the out-of-domain texts, lengths 1x-8x and the order-aware passkey probe, the summary; then, with
   `--glue-data`, each of `REGIME_TASKS` (CoLA, MRPC, SST-2) found there on its whole training set, the
   small-model grid with five fine-tuning seeds (the paper's protocol) for every run.
   About 30 minutes of an H200 (18 `small` runs of 6,000 steps, scaled from the demo study's 39 `mini` runs of
   1,400 steps in 246 s): more than one lease, and the CPU runs it meanwhile (RESULTS G.4), so it comes second.
3. `paragraphs` (issue 36, item 6's short-document arm): the `packing` job's steps for `PARAGRAPH_SCHEMES` on the
   built-in books with every paragraph a document (`paragraph_corpus`, written on the device: on the built-in
   corpus, where a book is a document, the two packings differ only at the 23 book ends).
4. `packing` (issue 36, item 6; measured on the CPU in RESULTS D, so last here): bert-a, tupe-a, tupe-r, rope,
   alibi and deberta x seeds 0-2 at the demo recipe, `--packing stream` and `--packing documents` (the two
   folders trained at once); then on each the validation loss and plateau exit (`tupe compare`'s summary), the
   built-in out-of-domain text (*Great Astronomers*: loss and word order), the summary; then, with
   `--glue-data`, SST-2 of the seed-0 runs with the small-model grid.

Resuming: the study folders live in `--studies-work` (default `/tmp/tupe-gpu-studies`, kept between calls): a
call cut off by its limit is continued by the next call on the same machine (the device keeps a machine for a
short while after a call) from the last checkpoint of each run; a finished step is skipped by the study's own
`--resume`. Across machines what continues is what came back (below): a later session runs the jobs not yet
done (`--studies length-2,length-3`).

What comes back: after every step the results of each study folder are copied into `OUT/studies/<folder>/`:
summaries, `compare_summary.json`, `valid_loss.*`, every run's `metrics.jsonl`, `pretrain_summary.json`,
`config.json`, model card and logs, the evaluation JSONs and plots, GLUE's `results.json`; no weights, checkpoints,
tokenizers or TensorBoard logs (a `mini` model is 5.95 MB; 36 of them would not fit what the device returns). The
one exception: seed-0 runs of the packing study whose SST-2 did not finish on the device come back whole (weights
and tokenizer, not the checkpoints), in the issue's scheme order, while they fit `MODEL_RETURN_BYTES`, so that a
CPU session can fine-tune them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
import tarfile
import threading
import time
from pathlib import Path

from tupe.data.config import PACKINGS

# issue 47, item 3: the paper's regime (RESULTS G), the paper's four schemes first; GLUE on whole training sets
REGIME_SCHEMES = ("bert-a", "tupe-a", "tupe-r", "bert-r", "rope", "deberta")
REGIME_SEEDS = "0,1,2"
REGIME_RECIPE = ("--preset", "small", "--max-steps", "6000")
REGIME_TASKS = ("CoLA", "MRPC", "SST-2")  # the GLUE tasks with data in this project, smallest first
PACKING_SCHEMES = ("bert-a", "tupe-a", "tupe-r", "rope", "alibi", "deberta")  # issue 36, item 6
PACKING_SEEDS = "0,1,2"
# the short-document arm: the built-in books with every paragraph a document (`paragraph_corpus`), where
# `documents` gives each paragraph its own [CLS]; TUPE's [CLS] reset with and without its tie-cls ablation
PARAGRAPH_SCHEMES = ("bert-a", "tupe-a", "tupe-a-tie-cls", "tupe-r", "tupe-r-tie-cls")
LENGTH_SEEDS = "0,1,2,3,4"  # issue 37, item 5: Part C's three seeds and two more
# issue 37's comparators for length and its three new schemes first, then the rest of the registry
LENGTH_FIRST = ("bert-a", "rope", "alibi", "fire", "kerple-log", "kerple-power", "tupe-a", "deberta")
LENGTH_CHUNK = 4  # schemes per length job: 20 runs of 5 seeds, trained at once
STUDY_KERNEL = "sdpa"  # Part C's kernel on the GPU (RESULTS C.1): the same maths as the others, no compiling
RESERVE_S = 15  # kept back from each step for copying the results and writing the archive
MODEL_RETURN_BYTES = 40 * 2**20  # weights that may come back (the device returns 64 MiB at most)
ARCHIVE_PART_BYTES = 15 * 2**20  # the device returns files of 16 MiB at most
SKIPPED_DIRS = ("tensorboard",)  # and checkpoint-*
SKIPPED_SUFFIXES = (".safetensors", ".bin", ".pt", ".py", ".tmp")
LARGEST_RESULT_FILE = 4 * 2**20  # a larger file (predictions, say) stays on the device


def length_chunks(schemes: tuple[str, ...] | None = None, size: int = LENGTH_CHUNK) -> list[list[str]]:
    """The schemes of the length study in job order: `LENGTH_FIRST`, then the registry's others, `size` a job."""
    if schemes is None:
        from tupe.modeling import POSITION_SCHEMES

        schemes = tuple(POSITION_SCHEMES)
    order = [s for s in LENGTH_FIRST if s in schemes] + [s for s in schemes if s not in LENGTH_FIRST]
    return [order[i : i + size] for i in range(0, len(order), size)]


def job_names() -> list[str]:
    """Every job in priority order: the length chunks (issue 47 re-runs their passkey stage with the
    order-aware probe; a chunk fits a lease), the paper's regime (about 30 minutes of an H200 by the demo study's
    speed, more than a lease, and running on the CPU: RESULTS G.4), the short-document arm, then the packing study
    (measured on the CPU in RESULTS D)."""
    lengths = [f"length-{i}" for i in range(1, len(length_chunks()) + 1)]
    return [*lengths, "regime", "paragraphs", "packing"]


def _regime_job(
    args: argparse.Namespace, work: Path, train: list[str], evaluate: list[str], ood: list[str]
) -> dict:
    """`regime`: `REGIME_SCHEMES` x `REGIME_SEEDS` at `REGIME_RECIPE` trained at once; then the out-of-domain
    texts, lengths and the passkey probe; then, with `--glue-data`, each of `REGIME_TASKS` found there on its
    whole training set with the small-model grid for every run (the paper's protocol: five fine-tuning seeds,
    the best learning rate's median)."""
    smoke, f = args.smoke, work / "regime"
    schemes = ["bert-a"] if smoke else list(REGIME_SCHEMES)
    seeds = "0,1" if smoke else REGIME_SEEDS
    steps = [
        ("train", [_study(f, schemes, seeds, "train", [*REGIME_RECIPE, *train, "--parallel", str(args.studies_parallel)])]),
        ("evaluate", [_study(f, schemes, seeds, "ood,lengths,passkey,summary", [*ood, *evaluate])]),
    ]  # fmt: skip
    job = {"name": "regime", "schemes": schemes, "folders": [f], "steps": steps}
    tasks = [t for t in REGIME_TASKS if args.glue_data and (Path(args.glue_data) / t).is_dir()]
    if tasks:
        glue = ["--glue-data", str(args.glue_data), "--glue-tasks", ",".join(tasks), "--glue-pretrain-seeds", seeds,
                "--parallel", str(args.studies_parallel)]  # fmt: skip
        glue += ["--glue-lrs", "1e-4", "--glue-train-samples", "8", "--glue-seeds", "1"] if smoke else [
            "--glue-train-samples", "all", "--glue-seeds", "1,2,3,4,5"]  # fmt: skip
        steps.append(("glue", [_study(f, schemes, seeds, "glue,summary", glue)]))
    missing = [t for t in REGIME_TASKS if t not in tasks]
    if missing and args.glue_data:
        job["note"] = f"regime: no {', '.join(missing)} under --glue-data; GLUE without them"
    return job


def paragraph_corpus(out: Path, books: int | None = None) -> int:
    """The built-in corpus with every paragraph a document, one `.txt` per book in `out` (a blank line after
    each of its one-paragraph lines; the text otherwise unchanged), all its books or the first `books` (file name
    order): returns the number of paragraphs."""
    from tupe.data import DEFAULT_CORPUS_DIR

    out.mkdir(parents=True, exist_ok=True)
    paragraphs = 0
    for book in sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))[:books]:
        lines = [
            line for line in gzip.decompress(book.read_bytes()).decode("utf-8").split("\n") if line.strip()
        ]
        (out / book.name.removesuffix(".gz")).write_text("\n\n".join(lines) + "\n", encoding="utf-8")
        paragraphs += len(lines)
    return paragraphs


# ---- the plan -------------------------------------------------------------------------------------------------


def _study(folder: Path, schemes: list[str], seeds: str, stages: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "tupe.comparison.study", "--out", str(folder), "--schemes", ",".join(schemes),
            "--seeds", seeds, "--stages", stages, "--resume", "--no-progress", *extra]  # fmt: skip


def plan(args: argparse.Namespace, work: Path) -> list[dict]:
    """The jobs of `--studies`, each a list of steps, each step the study commands run at once."""
    smoke = args.smoke
    train = ["--attention-kernel", STUDY_KERNEL] + (["--max-steps", "3"] if smoke else [])
    evaluate = ["--max-blocks", "2", "--length-factors", "1,2", "--probe-distances", "4,40", "--probe-blocks", "2",
                "--extend-methods", "none,interpolate,yarn"] if smoke else []  # fmt: skip
    glue = ["--glue-data", str(args.glue_data), "--glue-pretrain-seeds", "0"] if args.glue_data else []
    if glue and smoke:
        glue += ["--glue-lrs", "1e-4", "--glue-train-samples", "8"]
    ood = [x for path in args.ood_text or [] if Path(path).is_file() for x in ("--ood-text", str(path))]
    # smoke: one scheme per job keeps the dry run short
    packing_schemes = ["tupe-a"] if smoke else list(PACKING_SCHEMES)
    seeds_p, seeds_l = ("0,1", "0,1") if smoke else (PACKING_SEEDS, LENGTH_SEEDS)
    chunks = [["rope"]] if smoke else length_chunks()
    parallel = args.studies_parallel
    jobs = []
    for name in args.studies:
        if name == "regime":
            jobs.append(_regime_job(args, work, train, evaluate, ood))
        elif name in ("packing", "paragraphs"):
            per = max(1, parallel // len(PACKINGS))
            if name == "packing":
                schemes, prefix, corpus = packing_schemes, "packing", []
            else:
                schemes, prefix = (["tupe-a"] if smoke else list(PARAGRAPH_SCHEMES)), "paragraphs"
                corpus = ["--corpus", str(work / "texts" / "paragraphs")]
            folders = {p: work / f"{prefix}-{p}" for p in PACKINGS}
            steps = [
                ("train", [_study(f, schemes, seeds_p, "train", [*train, *corpus, "--packing", p, "--parallel",
                                                                   str(per)]) for p, f in folders.items()]),
                ("evaluate", [_study(f, schemes, seeds_p, "ood,summary", ["--packing", p, *evaluate])
                              for p, f in folders.items()]),
            ]  # fmt: skip
            if glue and not (
                smoke and name == "paragraphs"
            ):  # smoke: the packing job's SST-2 step is the same
                steps.append(("sst-2", [_study(f, schemes, seeds_p, "glue,summary",
                                               ["--packing", p, *glue, "--parallel", str(per)])
                                        for p, f in folders.items()]))  # fmt: skip
            job = {"name": name, "folders": list(folders.values()), "steps": steps}
            if corpus:
                job["corpus"] = corpus[1]
                job["corpus_books"] = 2 if smoke else None  # smoke: two books (a short tokenizer training)
            jobs.append(job)
        else:
            index = int(name.split("-", 1)[1]) - 1
            if not 0 <= index < len(chunks):
                continue  # a smoke run has one chunk
            f = work / name
            schemes = chunks[index]
            steps = [
                ("train", [_study(f, schemes, seeds_l, "train", [*train, "--parallel", str(parallel)])]),
                ("evaluate", [_study(f, schemes, seeds_l, "ood,lengths,passkey,summary", [*ood, *evaluate])]),
            ]
            jobs.append({"name": name, "schemes": schemes, "folders": [f], "steps": steps})
    return jobs


# ---- what comes back ------------------------------------------------------------------------------------------


def _kept(rel: Path, size: int, whole_runs: set[Path]) -> bool:
    parts = rel.parts
    if any(p.startswith("checkpoint-") or p in SKIPPED_DIRS for p in parts) or rel.name.startswith(".lock"):
        return False
    if any(rel.is_relative_to(run) for run in whole_runs):
        return True
    return (
        rel.suffix not in SKIPPED_SUFFIXES
        and not rel.name.startswith("tokenizer")
        and size <= LARGEST_RESULT_FILE
    )


def collect(folder: Path, dest: Path, whole_runs: set[Path] = frozenset()) -> int:
    """Copy the results of a study folder to `dest` (what `_kept` keeps; `whole_runs`, relative to the folder:
    run folders that come back with their weights); files in `dest` that the rule no longer keeps (the weights of
    a run whose SST-2 has finished since) are removed. Returns the bytes copied."""
    copied = 0
    if not folder.is_dir():
        return 0
    for path in sorted(dest.rglob("*")) if dest.is_dir() else []:
        if path.is_file() and not _kept(path.relative_to(dest), path.stat().st_size, whole_runs):
            path.unlink()
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(folder)
        size = path.stat().st_size
        if not _kept(rel, size, whole_runs):
            continue
        target = dest / rel
        if (
            target.exists()
            and target.stat().st_size == size
            and target.stat().st_mtime >= path.stat().st_mtime
        ):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied += size
    return copied


def _sst2_done(folder: Path, scheme: str) -> bool:
    path = folder / "glue" / f"SST-2-{scheme}-seed-0" / "results.json"
    try:
        return bool(json.loads(path.read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def models_to_return(work: Path, budget: int = MODEL_RETURN_BYTES) -> list[Path]:
    """Seed-0 runs of the packing study with weights and no finished SST-2, in the issue's scheme order (stream,
    then documents, per scheme), while their weights fit `budget`: paths relative to `work`."""
    chosen, used = [], 0
    for scheme in PACKING_SCHEMES:
        for packing in PACKINGS:
            folder = work / f"packing-{packing}"
            weights = folder / "runs" / scheme / "seed-0" / "model.safetensors"
            if not weights.is_file() or _sst2_done(folder, scheme):
                continue
            size = weights.stat().st_size + 2**20  # and its tokenizer
            if used + size > budget:
                return chosen
            chosen.append(weights.parent.relative_to(work))
            used += size
    return chosen


def write_archive(src: Path, dest: Path, part_bytes: int = ARCHIVE_PART_BYTES) -> list[Path]:
    """`src` as one gzipped tar at `dest`, or `dest.part00`, `dest.part01`, ... of at most `part_bytes` each
    (`cat dest.part* > dest` joins them); earlier archives at `dest` are replaced, and an archive inside `src` is
    not packed into itself. Returns the files written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    own = re.compile(
        re.escape(dest.name) + r"(\.tmp|\.part\d+)?"
    )  # an archive inside `src` leaves itself out

    def leave_out_own(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        path = src.parent / member.name
        return None if path.parent.resolve() == dest.parent.resolve() and own.fullmatch(path.name) else member

    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            tar.add(src, arcname=src.name, filter=leave_out_own)
    for old in [dest, *dest.parent.glob(dest.name + ".part*")]:
        if old.name != tmp.name:
            old.unlink(missing_ok=True)
    if tmp.stat().st_size <= part_bytes:
        tmp.replace(dest)
        return [dest]
    parts = []
    with open(tmp, "rb") as fh:
        while chunk := fh.read(part_bytes):
            part = dest.with_name(f"{dest.name}.part{len(parts):02d}")
            part.write_bytes(chunk)
            parts.append(part)
    tmp.unlink()
    return parts


# ---- the stages -----------------------------------------------------------------------------------------------


def _run_at_once(cmds: list[list[str]], logs: list[Path], timeout: float, env: dict) -> list[dict]:
    """`cmds` in parallel, each with `run_logged` (its output to its log), all within `timeout`."""
    from .children import run_logged

    runs: list[dict] = [{} for _ in cmds]

    def one(i: int) -> None:
        runs[i] = run_logged(cmds[i], logs[i], timeout, env)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cmds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


def stage_studies(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    """The jobs of `plan` in order, each step within what is left of `timeout`; the results copied to
    `OUT/studies/` and `args.progress_hook()` (summary, archive) called after every step."""
    from .children import child_env

    deadline = time.monotonic() + timeout
    work = Path(args.studies_work)
    work.mkdir(parents=True, exist_ok=True)
    dest = out / "studies"
    env = child_env()
    result: dict = {"work": str(work), "jobs": [], "returned_models": []}
    missing = [p for p in args.ood_text or [] if not Path(p).is_file()]
    if missing:
        result["notes"] = [f"--ood-text {p}: not found, the length jobs run without it" for p in missing]
    if not args.glue_data:
        result.setdefault("notes", []).append("no --glue-data: no GLUE on the device")
    stop = False
    for job in plan(args, work):
        record: dict = {"name": job["name"], "steps": [], "status": "not started"}
        if "note" in job:
            result.setdefault("notes", []).append(job["note"])
        if "schemes" in job:
            record["schemes"] = job["schemes"]
        result["jobs"].append(record)
        if stop:
            record["status"] = "not started: out of time"
            continue
        if "corpus" in job:
            paragraph_corpus(Path(job["corpus"]), job["corpus_books"])
        for step, cmds in job["steps"]:
            left = deadline - time.monotonic() - RESERVE_S
            if left < 20:
                record["status"] = f"cut off before {step}: out of time"
                stop = True
                break
            logs = [dest / f"{Path(c[c.index('--out') + 1]).name}-{step}.log" for c in cmds]
            dest.mkdir(parents=True, exist_ok=True)
            print(
                f"studies: {job['name']} {step} ({len(cmds)} study call(s), up to {left:.0f} s)", flush=True
            )
            runs = _run_at_once(cmds, logs, left, env)
            entry = {"step": step, "wall_s": max(r["wall_s"] for r in runs),
                     "returncodes": [r["returncode"] for r in runs], "timed_out": any(r["timed_out"] for r in runs),
                     "commands": [" ".join(c[1:]) for c in cmds]}  # fmt: skip
            record["steps"].append(entry)
            whole = set(models_to_return(work)) if job["name"] == "packing" and step != "train" else set()
            for folder in job["folders"]:
                name = folder.name
                collect(folder, dest / name, {r.relative_to(name) for r in whole if r.parts[0] == name})
            if job["name"] == "packing" and step != "train":  # what comes back whole, as of this step
                result["returned_models"] = sorted(str(r) for r in whole)
            if entry["timed_out"]:
                record["status"] = f"cut off in {step} (rerun on the same machine to continue)"
                stop = True
            elif any(entry["returncodes"]):
                record["status"] = f"{step} failed (see studies/*-{step}.log)"
            else:
                record["status"] = "done"
            if hook := getattr(args, "progress_hook", None):
                hook({**result})
            if record["status"] != "done":
                break
    return result


def _packing_step_command(args: argparse.Namespace, out: Path, work: Path) -> list[str]:
    """benchmarks/packing_step.py's command line: base/512 in bf16, or tiny on a slice of the built-in corpus."""
    from .children import python_command

    step = [*python_command(), "benchmarks/packing_step.py", "--device", args.device, "--json",
            str(out / "packing_step.json")]  # fmt: skip
    if args.smoke:
        corpus = work / "corpus.txt"
        if not corpus.exists():
            from tupe.data.corpus import DEFAULT_CORPUS_DIR

            with gzip.open(sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))[0], "rt", encoding="utf-8") as f:
                corpus.write_text(f.read(200_000))
        step += ["--corpus", str(corpus), "--cache-dir", str(work / "cache"), "--rounds", "1", "--warmup", "0",
                 "--batch-size", "2", "--max-seq-len", "32", "--vocab-size", "300", "--hidden-size", "32",
                 "--valid-every", "20"]  # fmt: skip
    else:
        step += ["--preset", "base", "--autocast", "bfloat16", "--rounds", "10", "--warmup", "3", "--threads",
                 "4"]  # fmt: skip
    return step


def _glue_padding_free_command(args: argparse.Namespace, out: Path, tasks: list[str]) -> list[str]:
    """benchmarks/glue_padding_free.py's command line on `tasks`: base in bf16, or the mini preset's tiny steps."""
    from .children import python_command

    glue = [*python_command(), "benchmarks/glue_padding_free.py", "--data-dir", str(args.glue_data), "--tasks",
            ",".join(tasks), "--device", args.device, "--json", str(out / "glue_padding_free.json")]  # fmt: skip
    if args.smoke:
        glue += ["--preset", "mini", "--steps", "1", "--warmup", "0", "--max-seq-len", "32", "--batch-size",
                 "4"]  # fmt: skip
    else:
        glue += ["--preset", "base", "--autocast", "bfloat16", "--steps", "20", "--warmup", "3", "--threads",
                 "4"]  # fmt: skip
    return glue


def stage_packing_speed(args: argparse.Namespace, out: Path, timeout: float) -> dict:
    """Issue 36, item 5 on a GPU: a documents step against a stream step, and padding-free `tupe glue` against
    padded, at base/512 in bf16 (tiny shapes on the CPU with `--smoke`)."""
    from .children import child_env, run_logged

    deadline = time.monotonic() + timeout
    work = Path(args.studies_work) / "packing-speed"
    work.mkdir(parents=True, exist_ok=True)
    env = child_env()
    result: dict = {}

    def script(cmd: list[str], written: Path, timeout: float) -> dict:
        """Run a benchmark script (its output to packing_speed.log): its exit record, and the JSON it wrote."""
        record = {**run_logged(cmd, out / "packing_speed.log", timeout, env), "cmd": " ".join(cmd[1:])}
        if written.exists():
            record["result"] = json.loads(written.read_text())
        return record

    step = _packing_step_command(args, out, work)
    result["packing_step"] = script(step, out / "packing_step.json", deadline - time.monotonic())
    tasks = [t for t in ("CoLA", "SST-2") if args.glue_data and (Path(args.glue_data) / t).is_dir()]
    if not tasks:
        result["glue"] = {"skipped": "no --glue-data with CoLA/ and SST-2/"}
        return result
    glue = _glue_padding_free_command(args, out, tasks)
    left = deadline - time.monotonic()
    if left < 20:
        result["glue"] = {"skipped": "out of time"}
        return result
    result["glue"] = script(glue, out / "glue_padding_free.json", left)
    return result


# ---- the summary ----------------------------------------------------------------------------------------------


def packing_speed_lines(st: dict) -> list[str]:
    lines = []
    r = st.get("packing_step", {}).get("result")
    if r:
        lines.append(
            f"- `packing_step.py` ({r['scheme']}, {r['shape']}, {r.get('device')}, autocast {r.get('autocast')}): "
            f"stream {r['median_step_s']['stream'] * 1e3:.1f} ms, documents {r['median_step_s']['documents'] * 1e3:.1f}"
            f" ms per step (median of {r['rounds']}): **{r['ratio_documents_to_stream']:.3f} x** (target "
            f"{r['target']}); tokens/s {r.get('tokens_per_s')}; documents padding share "
            f"{r['documents_padding_share']:.1%}, packing efficiency {r['packing_efficiency']}"
        )
    else:
        lines.append(f"- `packing_step.py`: no result (exit {st.get('packing_step', {}).get('returncode')})")
    glue = st.get("glue", {})
    if "skipped" in glue:
        lines.append(f"- `glue_padding_free.py`: skipped ({glue['skipped']})")
    for key, g in (glue.get("result") or {}).items():
        if "examples_per_s" in g:
            lines.append(
                f"- `glue_padding_free.py` {key}: padded {g['examples_per_s']['padded']:.1f}, padding-free "
                f"{g['examples_per_s']['padding-free']:.1f} examples/s: **{g['ratio_padding_free_to_padded']:.2f} x**"
                f" (target {g['target']}); padding share {g['padding_share']:.1%}"
            )
    return lines


def studies_lines(st: dict, out: Path) -> list[str]:
    lines = [f"Study folders on the device: `{st.get('work')}`; results in `studies/`.", ""]
    lines += [f"- note: {n}" for n in st.get("notes", [])]
    for job in st.get("jobs", []):
        schemes = f" ({', '.join(job['schemes'])})" if job.get("schemes") else ""
        steps = ", ".join(f"{s['step']} {s['wall_s']:.0f} s" for s in job["steps"])
        lines.append(f"- **{job['name']}**{schemes}: {job['status']}" + (f" ({steps})" if steps else ""))
    if st.get("returned_models"):
        lines.append(f"- weights returned for: {', '.join(st['returned_models'])}")
    for table in sorted((out / "studies").glob("*/study.md")):
        lines += ["", f"### {table.parent.name}", "", table.read_text().rstrip()]
    return lines
