"""The study of every positional scheme (issue 23, item 3; extended for length by issue 37): one command that a
session launches and can resume.

    python -m tupe.comparison.study --out runs/study --resume --parallel 2 \
        [--ood-text mnli_premises.txt] [--ood-text conll-news.txt] [--glue-data /path/to/glue]

(`mnli_premises.txt`: the MultiNLI premises as a text file, one premise per document, i.e. separated by blank
lines; a JSON object of records is not a table the corpus reader takes. `conll-news.txt`: Reuters news made by
`benchmarks/texts/conll_news.py` from CoNLL-2003.)

Stages, each written under `--out` (outside the repository) and skipped on `--resume` when its output exists:

1. `train`: `tupe compare` of every scheme in `tupe.POSITION_SCHEMES` x `--seeds` (default 0,1,2) at the demo's
   recipe (`--preset`, default mini; `--corpus`, default the built-in one; `--max-steps`, default the demo's
   1,400; `--packing`, default stream) into `OUT/runs/`; interrupted runs continue from their latest checkpoint,
   finished ones are kept. The paper's regime of RESULTS G is `--preset small --max-steps 6000`.
2. `ood`: every run on each out-of-domain text (`built-in`, plus each `--ood-text`, repeatable): `tupe evaluate`'s
   loss, tokens per word, paired intervals and word-order check -> `OUT/ood-<name>.json`.
3. `lengths`: every run at 1x, 2x, 4x, 8x its training length on `--length-text` (default `built-in`), once per
   method of `--extend-methods` (default none, interpolate, pi, ntk, yarn), each with the runs it applies to
   (none: every run; interpolate: learned tables; pi/ntk/yarn: rope) -> `OUT/lengths-<method>.json` and `.png`;
   `--masked-tokens` gives every length the same budget of masked targets.
4. `passkey`: the passkey probe (`tupe evaluate --probe passkey`) of the same runs at `--probe-distances`
   (default 16-1,024 filler tokens), filler from `--probe-text` (default `built-in`), once per method as in
   `lengths` -> `OUT/passkey-<method>.json`.
5. `glue` (with `--glue-data`): each task of `--glue-tasks` (default SST-2) on `--glue-train-samples` training
   examples (default the 8,000-sentence subset of RESULTS A.7; `all`: the whole training set) with the
   small-model grid (`--glue-lrs`) and fine-tuning seeds `--glue-seeds` (default 1,2,3) for every run
   (`--glue-pretrain-seeds`: of those pre-training seeds only), `--parallel` `tupe glue` processes at a time ->
   `OUT/glue/<task>-<scheme>-seed-<s>/`, then `tupe report`.
6. `summary`: `OUT/study.md` and `OUT/study.json`: per scheme the final validation loss (mean +- std over seeds),
   the step each seed left the plateau, the out-of-domain loss, tokens per word and word-order delta, the loss
   at each length and method, the passkey's token use (accuracy minus the guess without the key) and copying
   (accuracy minus the accuracy with the key's digits deranged) at each distance and method (mean +- std), and
   per GLUE task its main dev metric (the best learning rate's median over the fine-tuning seeds; mean +- std over
   the pre-training seeds fine-tuned) with the majority-class row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tupe.errors import TupeError

STAGES = ("train", "ood", "lengths", "passkey", "glue", "summary")
EXTEND = ("none", "interpolate", "pi", "ntk", "yarn")  # the default --extend-methods
PRESETS = ("mini", "small")  # the train stage's recipes (tupe pretrain's presets of this size)


def glue_tasks(value: str) -> list[str]:
    """`--glue-tasks`: GLUE tasks in any spelling `tupe glue --task` takes (`sst2`, `cola`), each once, in the given
    order, as their canonical names (`SST-2`, `CoLA`: the names of the study's GLUE folders)."""
    from tupe.finetuning.glue.tasks import TASKS, get_task

    names = [t.strip() for t in value.split(",") if t.strip()]
    tasks, unknown = [], []
    for name in names:
        try:
            tasks.append(get_task(name).name)
        except TupeError:
            unknown.append(name)
    if not tasks or unknown or len(set(tasks)) != len(tasks):
        raise argparse.ArgumentTypeError(
            f"{value!r}: give GLUE tasks, each once, from {', '.join(TASKS)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    return tasks


def _train_samples(value: str) -> int | None:
    """`--glue-train-samples`: a positive count, or `all` (None: the whole training set)."""
    if value.strip().lower() == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of examples >= 1, or all")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from tupe import validators as V
    from tupe.evaluation import EXTEND_METHODS
    from tupe.evaluation.passkey import DEFAULT_DISTANCES
    from tupe.scripts import ScriptParser
    from tupe.training.arguments import DEMO_STEPS, add_packing_argument, attention_kernel_name

    p = ScriptParser(prog="python -m tupe.comparison.study", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=V.nonempty_path, help="study folder (outside the repository)")
    p.add_argument(
        "--schemes", help="comma-separated schemes (default: every scheme in tupe.POSITION_SCHEMES)"
    )
    p.add_argument("--seeds", default="0,1,2", help="pre-training seeds (default 0,1,2)")
    p.add_argument(
        "--preset",
        choices=PRESETS,
        default="mini",
        help="train stage: the model and recipe preset of every run (default mini, the demo's; small: width 256, "
        "RESULTS G)",
    )
    p.add_argument("--max-steps", type=V.positive_int, default=DEMO_STEPS, help=f"default {DEMO_STEPS}")
    p.add_argument("--parallel", type=V.positive_int, default=2, help="runs trained at once (default 2)")
    add_packing_argument(p)
    p.add_argument(
        "--corpus",
        nargs="+",
        metavar="PATH",
        help="train stage: the pre-training corpus, as `tupe pretrain --corpus` takes it (default: the built-in "
        "corpus; its validation blocks are every run's validation text)",
    )
    p.add_argument(
        "--resume", action="store_true", help="keep every finished stage and run, continue the rest"
    )
    p.add_argument("--stages", default=",".join(STAGES), help=f"stages to run (default: {','.join(STAGES)})")
    p.add_argument(
        "--ood-text",
        nargs="+",
        action="append",
        metavar="PATH",
        help="another out-of-domain text (its files; repeat the option for more texts; built-in is always one)",
    )
    p.add_argument(
        "--ood-text-column", default="text", help="column of a JSON/parquet --ood-text (MNLI: text_a)"
    )
    p.add_argument("--length-text", nargs="+", default=["built-in"], metavar="PATH", help="default: built-in")
    p.add_argument("--length-factors", type=V.int_list(1), default=[1, 2, 4, 8], help="default 1,2,4,8")
    p.add_argument("--max-blocks", type=V.positive_int, help="blocks per evaluation (default: all)")
    p.add_argument(
        "--masked-tokens",
        type=V.positive_int,
        help="lengths: a budget of masked targets at every length, instead of --max-blocks",
    )
    p.add_argument(
        "--extend-methods",
        default=",".join(EXTEND),
        help=f"lengths and passkey: --extend-positions methods, each with the runs it applies to (default "
        f"{','.join(EXTEND)})",
    )
    p.add_argument(
        "--probe-distances",
        type=V.int_list(0),
        default=list(DEFAULT_DISTANCES),
        help=f"passkey: filler tokens between the key and its masked copy (default "
        f"{','.join(map(str, DEFAULT_DISTANCES))})",
    )
    p.add_argument(
        "--probe-blocks", type=V.positive_int, default=100, help="passkey: blocks per distance (default 100)"
    )
    p.add_argument("--probe-text", nargs="+", default=["built-in"], metavar="PATH", help="default: built-in")
    p.add_argument(
        "--glue-data",
        type=V.nonempty_path,
        help="GLUE root with a folder per task (no GLUE stage without it)",
    )
    p.add_argument(
        "--glue-tasks",
        type=glue_tasks,
        default=["SST-2"],
        help="comma-separated GLUE tasks fine-tuned in the glue stage (default SST-2), e.g. CoLA,SST-2,MRPC",
    )
    p.add_argument(
        "--glue-train-samples",
        type=_train_samples,
        default=8000,
        help="training examples of each task: a fixed random subset of N (default 8000, RESULTS A.7's SST-2 "
        "subset; a task with fewer uses them all), or `all`",
    )
    p.add_argument(
        "--glue-lrs", help="learning rates of the GLUE grid (default: tupe glue's small-model grid)"
    )
    p.add_argument(
        "--glue-seeds",
        type=V.int_list(0),
        default=[1, 2, 3],
        help="fine-tuning seeds of every learning rate (default 1,2,3)",
    )
    p.add_argument(
        "--glue-pretrain-seeds",
        help="fine-tune the runs of these pre-training seeds only (default: every seed)",
    )
    p.add_argument(
        "--attention-kernel",
        type=attention_kernel_name,
        help="attention kernel of every run (default: auto); the maths is the same, only the speed differs",
    )
    p.add_argument("--cache-dir", type=V.nonempty_path, help="tokenizer/data cache")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    unknown = set(args.stages.split(",")) - set(STAGES)
    if unknown:
        p.error(f"--stages: unknown {', '.join(sorted(unknown))}; choose from {', '.join(STAGES)}")
    stages = args.stages.split(",")
    if len(set(stages)) != len(stages):
        p.error(
            f"--stages: {', '.join(sorted({x for x in stages if stages.count(x) > 1}))} given more than once"
        )
    unknown = set(args.extend_methods.split(",")) - set(EXTEND_METHODS)
    if unknown:
        p.error(
            f"--extend-methods: unknown {', '.join(sorted(unknown))}; choose from {', '.join(EXTEND_METHODS)}"
        )
    if args.masked_tokens and args.max_blocks:
        p.error("--masked-tokens and --max-blocks exclude each other: give one budget")
    names = [Path(paths[0]).stem for paths in args.ood_text or []]
    if len(set(names)) != len(names) or "built-in" in names:
        p.error(f"--ood-text: each text is named by its first file's stem, and these repeat: {names}")
    return args


# what each stage's result file must hold for the summary to read it: top-level keys, and the keys of the
# entries of its list
STAGE_KEYS = {
    "ood": (("models",), "models", ("name", "loss", "word_order_delta")),
    "lengths": (("settings", "by_length"), "by_length", ("model", "length", "evaluated")),
    "passkey": (("settings", "by_distance"), "by_distance", ("model", "distance", "evaluated")),
}


def read_stage(path: Path) -> dict[str, Any]:
    """A stage's result file (`ood-*.json`, `lengths-*.json`, `passkey-*.json`), checked: a file cut short, empty
    or without the keys the summary reads is a one-line `TupeError` naming it (not a `JSONDecodeError` or
    `KeyError: 'by_length'` further on)."""
    from tupe.io.reading import RESULTS_LIMIT, read_json

    stage = path.name.split("-", 1)[0]
    top, entries, keys = STAGE_KEYS[stage]
    result = read_json(path, f"the study's {stage} result", RESULTS_LIMIT)
    missing = [k for k in top if k not in result]
    if not missing and not isinstance(result[entries], list):
        missing = [entries]
    bad = next((e for e in result.get(entries) or [] if not isinstance(e, dict) or set(keys) - set(e)), None)
    if missing or bad is not None:
        what = f"no {', '.join(map(repr, missing))}" if missing else f"an entry of {entries!r} lacks {keys}"
        raise TupeError(f"{path}: {what}; not a complete {stage} result of the study")
    return result


def _done(path: Path, resume: bool, log) -> bool:  # noqa: ANN001
    """Whether `--resume` keeps the stage's file: one that exists and reads whole; a damaged one (cut short by a
    kill, emptied, edited) is done again, with a line saying so."""
    if resume and path.exists():
        try:
            read_stage(path)
        except TupeError as err:
            log(f"--resume: {err}; the stage is done again")
            return False
        log(f"--resume: {path} exists, stage kept")
        return True
    return False


def _runs(out: Path, schemes: list[str], seeds: list[int]) -> dict[str, Path]:
    from tupe.comparison.compare import run_dirs

    return {f"{s}/seed-{k}": d for (s, k), d in run_dirs(out / "runs", schemes, seeds).items()}


def _write(path: Path, result: dict[str, Any]) -> None:
    from tupe.evaluation.command import versions, write_json

    write_json(path, {"command": " ".join(sys.argv), "versions": versions(), **result})


def _command(module: Any, argv: list[str]) -> int:
    """A `tupe` sub-command run in this process from its own module (its options, then its `run`)."""
    parser = argparse.ArgumentParser(prog=f"tupe {module.__name__.rsplit('.', 1)[-1]}")
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(argv)) or 0)


def _glue(runs: dict[str, Path], out: Path, args: argparse.Namespace, log) -> None:  # noqa: ANN001
    """Every `--glue-tasks` task for every run, `--parallel` `tupe glue` processes at a time (each resumes what it
    finds) -> `OUT/glue/<task>-<scheme>-seed-<s>/`."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    (out / "logs").mkdir(parents=True, exist_ok=True)
    subset = [] if args.glue_train_samples is None else ["--max-train-samples", str(args.glue_train_samples)]

    def one(item: tuple[str, str, Path]) -> tuple[str, int]:
        task, name, d = item
        tag = f"{task}-{name.replace('/', '-')}"
        argv = [sys.executable, "-m", "tupe", "glue", "--model", str(d), "--task", task, "--data-dir",
                str(args.glue_data), "--out", str(out / tag), "--seeds", ",".join(map(str, args.glue_seeds)),
                *subset, "--threads", "1", "--no-progress",
                *(["--lrs", args.glue_lrs] if args.glue_lrs else [])]  # fmt: skip
        log(f"glue: {task} {name} -> {out / tag} (log {out / 'logs' / tag}.log)")
        with open(out / "logs" / f"{tag}.log", "ab") as fh:
            return tag, subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode

    items = [(task, name, d) for task in args.glue_tasks for name, d in runs.items()]
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        failed = [tag for tag, rc in pool.map(one, items) if rc != 0]
    if failed:
        raise TupeError(
            f"tupe glue failed for {', '.join(failed)} (logs in {out / 'logs'}); rerun with --resume"
        )


def check_inputs(args: argparse.Namespace, stages: list[str], seeds: list[int]) -> None:
    """The texts, the GLUE data and the seeds to fine-tune, checked before the train stage (hours), each error
    naming the study's own flag."""
    from tupe.comparison.compare import parse_seeds
    from tupe.evaluation.runs import resolve_text
    from tupe.validators import check_path_kind

    texts = [("--ood-text", paths, args.ood_text_column) for paths in args.ood_text or [] if "ood" in stages]
    texts += [("--length-text", args.length_text, "text")] if "lengths" in stages else []
    texts += [("--probe-text", args.probe_text, "text")] if "passkey" in stages else []
    for flag, paths, column in texts:
        try:
            resolve_text(paths, column)
        except TupeError as err:
            raise TupeError(f"{flag}: {err}") from None
    if "glue" in stages and args.glue_data:
        from tupe.finetuning.glue.tasks import find_task_dir, get_task

        check_path_kind("--glue-data", Path(args.glue_data), "folder")
        # as tupe glue finds it: ROOT/<task> under any common spelling (cola/, CoLA/)
        for task in args.glue_tasks:
            if find_task_dir(get_task(task), Path(args.glue_data)) is None:
                raise TupeError(f"--glue-data {args.glue_data}: no folder for {task} in it (e.g. {task}/)")
    if args.glue_pretrain_seeds:
        outside = sorted(set(parse_seeds(args.glue_pretrain_seeds)) - set(seeds))
        if outside:
            raise TupeError(
                f"--glue-pretrain-seeds {args.glue_pretrain_seeds}: seed(s) {', '.join(map(str, outside))} are not "
                f"among the study's --seeds {','.join(map(str, seeds))}"
            )


def run(args: argparse.Namespace) -> int:
    from tupe.comparison.compare import parse_schemes, parse_seeds
    from tupe.modeling import POSITION_SCHEMES
    from tupe.runtime import hushed_libraries

    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    schemes = parse_schemes(args.schemes) if args.schemes else list(POSITION_SCHEMES)
    seeds = parse_seeds(args.seeds)
    if len(seeds) < 2:
        raise TupeError("--seeds: the study needs at least two seeds (a spread)")
    stages = args.stages.split(",")
    check_inputs(args, stages, seeds)
    runs = _runs(out, schemes, seeds)

    def log(msg: str) -> None:
        print(f"[study] {msg}", flush=True)

    with hushed_libraries(args.progress):
        if "train" in stages:
            _train(args, out, schemes, seeds, log)
        # each stage needs the runs it reads (the glue stage those of --glue-pretrain-seeds; the summary none), so
        # SST-2 of the seed-0 runs can start while the other seeds still train
        glue_seeds = parse_seeds(args.glue_pretrain_seeds) if args.glue_pretrain_seeds else seeds
        _check_finished(args, stages, runs, glue_seeds)
        texts = {"built-in": (["built-in"], "text")}
        for paths in args.ood_text or []:
            texts[Path(paths[0]).stem] = (list(paths), args.ood_text_column)
        if "ood" in stages:
            _ood(args, out, runs, texts, log)
        methods = args.extend_methods.split(",")
        stage_models = _StageModels(runs, methods, out, args.resume, log)
        if "lengths" in stages:
            _lengths(args, stage_models, log)
        if "passkey" in stages:
            _passkey(args, stage_models, log)
        if "glue" in stages and args.glue_data:
            from tupe.finetuning.glue import report

            chosen = {n: d for n, d in runs.items() if int(n.rsplit("-", 1)[1]) in glue_seeds}
            _glue(chosen, out / "glue", args, log)
            _command(report, [str(out / "glue"), "--out", str(out / "glue" / "table.md")])
        if "summary" in stages:
            summary = summarize(out, schemes, seeds, list(texts), methods, args.glue_tasks)
            log(f"wrote {out / 'study.md'}")
            print(summary["markdown"])
    return 0


def _train(args: argparse.Namespace, out: Path, schemes: list[str], seeds: list[int], log: Any) -> None:
    """The train stage: every scheme x seed at `--preset`'s recipe, `tupe compare` with --resume."""
    from tupe.comparison.compare import compare
    from tupe.training.pretrain import PretrainConfig

    base = PretrainConfig(
        out=str(out / "runs"),
        scheme=schemes[0],
        preset=args.preset,
        max_steps=args.max_steps,
        cache_dir=args.cache_dir,
        resume=True,
        progress=args.progress,
        threads=1,
        attention_kernel=args.attention_kernel,
        packing=args.packing,
        corpus=args.corpus,
    )
    compare(base, schemes, seeds=seeds, parallel=args.parallel, log=log)


def _check_finished(
    args: argparse.Namespace, stages: list[str], runs: dict[str, Path], glue_seeds: list[int]
) -> None:
    """The runs the requested stages read have a final model, else one line naming the unfinished ones."""
    needed = set(runs) if {"ood", "lengths", "passkey"} & set(stages) else set()
    if "glue" in stages and args.glue_data:
        needed |= {n for n in runs if int(n.rsplit("-", 1)[1]) in glue_seeds}
    missing = [name for name, d in runs.items() if name in needed and not (d / "config.json").is_file()]
    if missing:
        raise TupeError(f"runs not finished: {', '.join(missing)} (run the train stage, with --resume)")


def _ood(
    args: argparse.Namespace, out: Path, runs: dict[str, Path], texts: dict[str, tuple], log: Any
) -> None:
    """The out-of-domain stage: every run on every text (`ood-NAME.json`), skipping the texts done."""
    from tupe.evaluation.runs import evaluate_runs

    for name, (paths, column) in texts.items():
        path = out / f"ood-{name}.json"
        if not _done(path, args.resume, log):
            log(f"out-of-domain evaluation on {' '.join(paths)}")
            result = evaluate_runs(
                runs,
                paths,
                text_column=column,
                cache_dir=args.cache_dir,
                progress=args.progress,
                log=log,
                max_blocks=args.max_blocks,
            )
            _write(path, result)


class _StageModels:
    """The runs' models, loaded once when a stage first needs them, and each --extend-positions method of a stage
    still to do with the runs it applies to."""

    def __init__(self, runs: dict[str, Path], methods: list[str], out: Path, resume: bool, log: Any) -> None:
        self.runs, self.methods, self.out, self.resume, self.log = runs, methods, out, resume, log
        self.loaded: list[Any] = []

    def models_for(self, method: str) -> list[Any]:
        from tupe.evaluation.evaluate import load_eval_model
        from tupe.evaluation.lengths import applies

        if not self.loaded:
            for name, d in self.runs.items():
                m = load_eval_model(d)
                m.name = name
                self.loaded.append(m)
        return [m for m in self.loaded if applies(m, method)]

    def per_method(self, stage: str) -> Iterator[tuple[str, Path, list[Any]]]:
        """Each --extend-positions method of `stage` still to do, with its result file and the runs it applies
        to."""
        for ext in self.methods:
            path = self.out / f"{stage}-{ext}.json"
            if _done(path, self.resume, self.log):
                continue
            models = self.models_for(ext)
            if not models:
                self.log(f"{stage}, {ext}: no run it applies to")
                continue
            yield ext, path, models


def _lengths(args: argparse.Namespace, stage_models: _StageModels, log: Any) -> None:
    """The lengths stage: loss at each --length-factors multiple of the trained length, per method
    (`_lengths_method`)."""
    for ext, path, models in stage_models.per_method("lengths"):
        _lengths_method(args, ext, path, models, log)


def _lengths_method(args: argparse.Namespace, ext: str, path: Path, models: list[Any], log: Any) -> None:
    """The lengths with one --extend-positions method. Each finished length goes to `lengths-<method>.partial.json`
    at once, and `--resume` evaluates only the lengths it lacks (same runs, settings and text, else it starts
    over), so a stage cut short by a session's end loses one length's work, not the method's."""
    from tupe.evaluation.evaluate import Settings
    from tupe.evaluation.lengths import evaluate_lengths, plot_lengths
    from tupe.evaluation.runs import resolve_text
    from tupe.io.files import atomic_write_text

    base_len = min(m.train_length or m.max_length for m in models)
    lengths = [base_len * f for f in args.length_factors]
    settings = Settings(
        pppl_tokens=0,
        max_blocks=args.max_blocks,
        masked_tokens=args.masked_tokens,
        cache_dir=args.cache_dir,
        progress=args.progress,
    )
    corpus = resolve_text(args.length_text)
    partial = path.with_name(f"{path.stem}.partial.json")
    key = {
        "runs": [m.name for m in models],
        "lengths": lengths,
        "max_blocks": args.max_blocks,
        "masked_tokens": args.masked_tokens,
        "extend": ext,
        "text": corpus.describe(),
    }
    found = _read_partial(partial, key, "lengths", log) if args.resume else {}
    # a length's share as evaluate_lengths hands it over; a damaged one is evaluated again
    whole = {"run", "entries", "text", "settings"}
    kept = {
        int(n): sh for n, sh in found.items() if n.isdigit() and isinstance(sh, dict) and whole <= sh.keys()
    }
    log(
        f"lengths {lengths}, --extend-positions {ext}: {len(models)} run(s)"
        + (f" ({len(kept)} length(s) kept from {partial.name})" if kept else "")
    )

    def keep(length: int, share: dict[str, Any]) -> None:
        kept[length] = share
        atomic_write_text(partial, json.dumps({"key": key, "lengths": kept}) + "\n")

    result = evaluate_lengths(models, corpus, lengths, settings, ext, log=log, kept=kept, on_length=keep)
    result["plot"] = str(plot_lengths(result, path.with_suffix(".png")))
    _write(path, result)
    partial.unlink(missing_ok=True)


def _passkey(args: argparse.Namespace, stage_models: _StageModels, log: Any) -> None:
    """The passkey stage: the probe at --probe-distances, per method (`_passkey_method`)."""
    for ext, path, models in stage_models.per_method("passkey"):
        _passkey_method(args, ext, path, models, log)


def _passkey_method(args: argparse.Namespace, ext: str, path: Path, models: list[Any], log: Any) -> None:
    """The probe with one --extend-positions method. Each finished model's entries go to
    `passkey-<method>.partial.json` at once, and `--resume` probes only the models it lacks (same settings and
    filler text, else it starts over), so a stage cut short by a session's end loses one model's work, not the
    method's."""
    from tupe.evaluation.passkey import PasskeySettings, passkey_probe
    from tupe.evaluation.runs import resolve_text
    from tupe.io.files import atomic_write_text

    settings = PasskeySettings(
        distances=args.probe_distances,
        blocks=args.probe_blocks,
        extend=ext,
        cache_dir=args.cache_dir,
        progress=args.progress,
    )
    corpus = resolve_text(args.probe_text)
    partial = path.with_name(f"{path.stem}.partial.json")
    key = {
        "distances": sorted({int(d) for d in settings.distances}),
        "blocks": settings.blocks,
        "seed": settings.seed,
        "template": settings.template,
        "key_digits": settings.key_digits,
        "extend": ext,
        "text": corpus.describe(),
    }
    kept = _read_partial(partial, key, "models", log) if args.resume else {}
    todo = [m for m in models if m.name not in kept]
    log(
        f"passkey at distances {args.probe_distances}, --extend-positions {ext}: {len(todo)} run(s)"
        + (f" ({len(kept)} kept from {partial.name})" if kept else "")
    )

    def keep(name: str, entries: list[dict[str, Any]]) -> None:
        kept[name] = entries
        atomic_write_text(partial, json.dumps({"key": key, "models": kept}) + "\n")

    result = passkey_probe(todo, corpus, settings, log=log, on_model=keep)
    result["by_distance"] = [e for m in models for e in kept.get(m.name, [])]
    _write(path, result)
    partial.unlink(missing_ok=True)


def _read_partial(partial: Path, key: dict[str, Any], field: str, log: Any) -> dict[str, Any]:
    """What an interrupted stage's method finished (the mapping `field` of its partial file: the passkey stage's
    models by name, the lengths stage's lengths); none if the file is absent, unreadable or made with other
    settings (said in a line)."""
    if not partial.exists():
        return {}
    try:
        found = json.loads(partial.read_text(encoding="utf-8"))
        pieces = found[field]
        if not isinstance(pieces, dict):
            raise TypeError(f"{field} is not a mapping")
    except (OSError, ValueError, KeyError, TypeError):
        log(f"--resume: {partial} is unreadable; the method starts again from its first {field[:-1]}")
        return {}
    if found.get("key") != key:
        log(f"--resume: {partial} was made with other runs, settings or text; the method starts again")
        return {}
    return pieces


def _mean_std(values: list[float | None], unit: str = "seed") -> str:
    xs = [v for v in values if v is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.3f} (1 {unit})"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def _tokens_per_word(values: list[float | None]) -> str:
    """One tokenizer per run: the runs of a scheme share the study's tokenizer, so one value, or the range."""
    xs = sorted({round(v, 3) for v in values if v is not None})
    return "-" if not xs else f"{xs[0]:.3f}" if len(xs) == 1 else f"{xs[0]:.3f}-{xs[-1]:.3f}"


def _stage_columns(
    out: Path,
    stage: str,
    methods: Sequence[str],
    schemes: list[str],
    seeds: list[int],
    points: str,
    entries: str,
    point: str,
    rows: dict[str, dict[str, Any]],
    columns: Sequence[tuple[str, Any]],  # (label, entry -> float), each a column per method and point
) -> list[str]:
    """One column per (label, value) of `columns`, method and point (length or distance) of a stage's
    `OUT/<stage>-<method>.json` (each file read once), filled in `rows` with each scheme's per-seed values (None
    where a run was not evaluated there); the columns of the first label first."""
    cols: list[list[str]] = [[] for _ in columns]
    for ext in methods:
        path = out / f"{stage}-{ext}.json"
        if not path.exists():
            continue
        result = read_stage(path)
        found = {(e["model"], e[point]): e for e in result[entries]}
        if not isinstance(result["settings"], dict) or points not in result["settings"]:
            raise TupeError(f"{path}: no settings.{points}; not a complete {stage} result of the study")
        for k, (label, value) in enumerate(columns):
            for x in result["settings"][points]:
                col = label.format(x, ext)
                cols[k].append(col)
                for s in schemes:
                    es = [found.get((f"{s}/seed-{seed}", x)) for seed in seeds]
                    rows[s][col] = [value(e) if e and e["evaluated"] else None for e in es]
    return [col for group in cols for col in group]


def complete_grid(path: Path) -> dict[str, Any] | None:
    """The `tupe glue` results.json at `path` when its grid is complete with a best learning rate (the study's and
    the claims' GLUE readings); None where there is no such file or the grid is not finished; a file that is not a
    results record is an error naming it."""
    if not path.exists():
        return None
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TupeError(f"{path}: not a readable results.json ({err})") from None
    if not isinstance(result, dict):
        raise TupeError(f"{path}: not a `tupe glue` results.json (a JSON object)")
    best = result.get("best")
    if not (result.get("complete") and isinstance(best, dict) and best.get("main_median") is not None):
        return None
    return result


def _glue_columns(
    out: Path, schemes: list[str], seeds: list[int], tasks: Sequence[str], rows: dict[str, dict[str, Any]]
) -> tuple[list[str], dict[str, float | None]]:
    """One column per GLUE task with a complete result: per pre-training seed the best learning rate's median
    over the fine-tuning seeds of the task's main metric (x 100; None for a seed whose grid is not complete, so
    the list pairs with `seeds` as every other column does), filled in `rows`; and what always predicting
    the most frequent dev label scores on it (accuracy; 0 for the Matthews correlation; None otherwise)."""
    from tupe.finetuning.glue.report import majority_score

    cols: list[str] = []
    majority: dict[str, float | None] = {}
    for task in tasks:
        col = None
        for s in schemes:
            found: list[float | None] = []  # one per pre-training seed, None where its grid is not complete
            for k in seeds:
                result = complete_grid(out / "glue" / f"{task}-{s}-seed-{k}" / "results.json")
                if result is None:
                    found.append(None)
                    continue
                metric = result["main_metric"]
                col = f"{task} dev {'acc.' if metric == 'accuracy' else metric}"
                found.append(100 * result["best"]["main_median"])
                shares = result["data"].get("dev_majority_accuracy") or {}
                majority[col] = majority_score(shares, "dev", metric)
            if any(v is not None for v in found):
                rows[s][col] = found
        if col is not None:
            cols.append(col)
    return cols, majority


def _pretraining_rows(
    out: Path, schemes: list[str], seeds: list[int], rows: dict[str, dict[str, Any]]
) -> None:
    """Each scheme's final validation loss and plateau exit per seed: from `tupe compare`'s record of the runs when
    it covers the study's seeds, else read from the runs themselves (a study folder whose runs/ holds the runs of
    several comparisons), for a scheme whose runs have all finished."""
    from tupe.analysis.baseline import study_unigram
    from tupe.analysis.curves import read_metrics
    from tupe.analysis.seeds import plateau_exit_step
    from tupe.training.run_folder import SUMMARY_FILE

    compare_file = out / "runs" / "compare_summary.json"
    try:
        record = json.loads(compare_file.read_text()) if compare_file.exists() else {}
    except ValueError as err:
        raise TupeError(
            f"{compare_file}: not a tupe compare record ({err}); run the train stage with --resume"
        ) from None
    if isinstance(record, dict) and record.get("seeds") == seeds:
        stats = record["stats"]["schemes"]
        for s in schemes:
            if s in stats:
                rows[s]["final_losses"] = stats[s]["final_losses"]
                rows[s]["plateau_exit_steps"] = stats[s].get("plateau_exit_steps")
        return
    unigram = None
    for s in schemes:
        dirs = [out / "runs" / s / f"seed-{k}" for k in seeds]
        if not all((d / SUMMARY_FILE).is_file() for d in dirs):
            continue
        valid = [read_metrics(d)[1] for d in dirs]
        if not all(valid):
            continue
        if unigram is None:
            unigram = study_unigram(out / "runs", dirs)
        rows[s]["final_losses"] = [v[-1]["eval_loss"] for v in valid]
        if unigram is not None:
            rows[s]["plateau_exit_steps"] = [plateau_exit_step(v, unigram) for v in valid]


def summarize(
    out: Path,
    schemes: list[str],
    seeds: list[int],
    texts: list[str],
    methods: Sequence[str] = EXTEND,
    glue_tasks: Sequence[str] = ("SST-2",),
) -> dict[str, Any]:
    """`study.md` / `study.json` from the stages' files (each section only where its stage has run)."""
    rows: dict[str, dict[str, Any]] = {s: {} for s in schemes}
    _pretraining_rows(out, schemes, seeds, rows)
    for text in texts:
        path = out / f"ood-{text}.json"
        if path.exists():
            by_name = {m["name"]: m for m in read_stage(path)["models"]}
            for s in schemes:
                ms = [by_name.get(f"{s}/seed-{k}") for k in seeds]
                rows[s][f"ood:{text}"] = [m["loss"]["value"] if m else None for m in ms]
                rows[s][f"word_order:{text}"] = [m["word_order_delta"]["value"] if m else None for m in ms]
                rows[s][f"tokens_per_word:{text}"] = [m.get("tokens_per_word") if m else None for m in ms]
    length_cols = _stage_columns(
        out, "lengths", methods, schemes, seeds, "lengths", "by_length", "length", rows,
        [("L={} ({})", lambda e: e["loss"]["value"])],
    )  # fmt: skip
    # token use: the accuracy of recovering the key minus the same blocks' guess without it; copying: the accuracy
    # minus the same blocks' accuracy with the key's digits deranged (probes recorded before the order-aware probe
    # have no such entry: no value)
    passkey_cols = _stage_columns(
        out, "passkey", methods, schemes, seeds, "distances", "by_distance", "distance", rows,
        [("passkey d={} ({})", lambda e: e["accuracy_minus_guess"]["value"]),
         ("copying d={} ({})", lambda e: e["copying"]["value"] if "copying" in e else None)],
    )  # fmt: skip
    glue_cols, majority = _glue_columns(out, schemes, seeds, glue_tasks, rows)
    header = ["scheme", "final valid loss", "left plateau at (per seed)"]
    header += [f"{t}: loss" for t in texts] + [f"{t}: tokens/word" for t in texts]
    header += [f"{t}: word order" for t in texts] + length_cols + passkey_cols + glue_cols
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for s in schemes:
        r = rows[s]
        cells = [
            s,
            _mean_std(r.get("final_losses", [])),
            ", ".join("not left" if x is None else str(x) for x in r.get("plateau_exit_steps") or []),
        ]
        cells += [_mean_std(r.get(f"ood:{t}", [])) for t in texts]
        cells += [_tokens_per_word(r.get(f"tokens_per_word:{t}", [])) for t in texts]
        cells += [_mean_std(r.get(f"word_order:{t}", [])) for t in texts]
        cells += [_mean_std(r.get(c, [])) for c in length_cols + passkey_cols]
        cells += [_mean_std(r.get(c, []), "pre-training seed") for c in glue_cols]
        lines.append("| " + " | ".join(cells) + " |")
    if glue_cols:
        blank = [""] * (len(header) - 1 - len(glue_cols))
        cells = blank + ["-" if majority.get(c) is None else f"{majority[c]:.2f}" for c in glue_cols]
        lines.append("| majority class | " + " | ".join(cells) + " |")
    markdown = "\n".join(lines) + "\n"
    from tupe.io.files import atomic_write_text

    atomic_write_text(out / "study.md", markdown)
    atomic_write_text(out / "study.json", json.dumps({"seeds": seeds, "schemes": rows}, indent=1) + "\n")
    return {"rows": rows, "markdown": markdown}


def main(argv: list[str] | None = None) -> int:
    """The study; a bad flag, path or stage file is one line `study: error: ...` and exit code 2."""
    from tupe.scripts import run_script

    return run_script(lambda a: run(parse_args(a)), argv, prog="study")


if __name__ == "__main__":
    sys.exit(main())
