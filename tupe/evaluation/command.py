"""Masked-LM loss, perplexity and pseudo-perplexity of one or more checkpoints on text files, with a unigram
baseline, a word-order check and bootstrap confidence intervals (paired between models sharing a tokenizer).

Reads `tupe pretrain` checkpoints and `transformers` BERT folders (BertForMaskedLM, run with transformers' own
code). Text is tokenised, packed and masked exactly as in pre-training. Definitions: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.evaluation import EXTEND_METHODS
from tupe.training.flags import add_training_flags

FLAG_NAMES = {"max_length": "--max-seq-len"}  # options whose attribute is not their name

MAX_BOOTSTRAP = (
    100_000  # each resample keeps 8 bytes per statistic; 10^5 is far past any interval's precision
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        nargs="+",
        required=True,
        type=V.nonempty_path,
        metavar="PATH",
        help="checkpoint folder(s): written by `tupe pretrain`, or a transformers BERT folder (BertForMaskedLM)",
    )
    p.add_argument(
        "--text",
        nargs="+",
        default=["built-in"],
        type=V.nonempty_path,
        metavar="PATH",
        help="text file(s), folders of them (recursive), globs, .gz, parquet/JSON/JSONL files, a saved `datasets` "
        "folder or a cached `datasets` name NAME[:CONFIG], as `tupe pretrain --corpus`; all together are one text; "
        "built-in (the default): the shipped out-of-domain book (Great Astronomers, 1895 popular science, never "
        "trained on)",
    )
    p.add_argument(
        "--text-column", default="text", help="column of parquet/JSON/`datasets` text (default: text)"
    )
    p.add_argument(
        "--tokenizer", type=V.nonempty_path, metavar="DIR", help="tokenizer for model folders that hold none"
    )
    p.add_argument(
        "--max-blocks",
        type=V.positive_int,
        metavar="N",
        help="evaluate at most N blocks, evenly spaced over the text (default: every full block)",
    )
    p.add_argument(
        "--masked-tokens",
        type=V.positive_int,
        metavar="N",
        help="evaluate the fewest evenly spaced blocks whose masked targets reach N (all blocks if they hold "
        "fewer), at each length of --lengths: every length rests on about N targets, where --max-blocks takes "
        "the same number of blocks at every length; excludes --max-blocks",
    )
    add_training_flags(
        p,
        ["max_seq_len"],
        dests={"max_seq_len": "max_length"},
        helps={"max_seq_len": "a block; default: the smallest max length of the models sharing a tokenizer"},
    )
    p.add_argument(
        "--lengths",
        type=V.int_list(2),
        metavar="L,L,...",
        help="evaluate at each of these block lengths (e.g. 128,256,512,1024): one row per model and length, "
        "paired differences from the first model, and a plot of loss against length (--plot)",
    )
    p.add_argument(
        "--extend-positions",
        choices=EXTEND_METHODS,
        default="none",
        help="with --lengths or --probe, how positions reach lengths beyond the trained ones: none (default: a learned table "
        "is reported as having no positions there, other schemes run as trained); for learned tables "
        "interpolate (trained rows resampled linearly) or repeat (trained rows copied end to end, as Longformer); "
        "for rotary schemes (rope), at scale s = length / training length, pi (positions / s), ntk (base * "
        "s^(d/(d-2))) or yarn (per-frequency ramp, attention factor 0.1 ln s + 1), as transformers' rope scaling; "
        "a method is refused by name for the schemes it does not apply to",
    )
    p.add_argument(
        "--probe",
        choices=("passkey",),
        help="after the loss, run a probe: passkey (a key of --probe-key-digits random digits in --probe-template, "
        "--probe-distances filler tokens later the same sentence with the digits masked; accuracy of recovering "
        "them against the same blocks with another first key; docs/evaluation.md)",
    )
    p.add_argument(
        "--probe-text",
        nargs="+",
        type=V.nonempty_path,
        metavar="PATH",
        help="with --probe, the filler text (read as --text; default: --text)",
    )
    p.add_argument(
        "--probe-template",
        default="The pass key is {key}.",
        metavar="TEXT",
        help="with --probe passkey, the sentence holding the key, {key} where it goes (default: %(default)s)",
    )
    p.add_argument(
        "--probe-key-digits",
        type=V.int_range(5, 10),
        default=5,
        metavar="K",
        help="with --probe passkey, distinct digits in the key, written with spaces between them: 5 to 10, at most "
        "the digits the tokenizer writes as one token each (default 5)",
    )
    p.add_argument(
        "--probe-distances",
        type=V.int_list(0),
        default=[16, 64, 128, 256, 512, 1024],
        metavar="D,D,...",
        help="with --probe passkey, filler tokens between the key and the masked key (default 16,64,128,256,512,1024)",
    )
    p.add_argument(
        "--probe-blocks",
        type=V.positive_int,
        default=100,
        metavar="N",
        help="with --probe passkey, probe blocks per distance, each with its own key and filler (default 100)",
    )
    p.add_argument(
        "--plot",
        type=V.nonempty_path,
        metavar="PNG",
        help="with --lengths, write the plot of loss against length here (default: beside --json, as "
        "NAME.png; none without --json)",
    )
    p.add_argument(
        "--batch-size", type=V.positive_int, default=16, help="blocks per forward pass (default 16)"
    )
    p.add_argument(
        "--seed", type=V.seed_int, default=0, help="seed of masks, shuffles, samples, resamples (default 0)"
    )
    p.add_argument(
        "--mlm-probability",
        type=V.open_prob,
        default=0.15,
        help="share of tokens masked (default 0.15, as pre-training)",
    )
    p.add_argument(
        "--pppl-tokens",
        type=V.nonneg_int,
        metavar="N",
        help="pseudo-perplexity on a random sample of N tokens (one forward pass each; default 2000, 0 = off; "
        "with --lengths default 0)",
    )
    p.add_argument(
        "--bootstrap",
        type=V.int_range(0, MAX_BOOTSTRAP),
        default=1000,
        metavar="R",
        help="bootstrap resamples of blocks for the 95%% intervals (default 1000, 0 = no intervals)",
    )
    p.add_argument(
        "--cache-dir",
        type=V.nonempty_path,
        help="where tokenised text is cached (default $TUPE_CACHE or ~/.cache/tupe)",
    )
    p.add_argument(
        "--skip-bad-text", action="store_true", help="drop lines that are not UTF-8 instead of stopping"
    )
    p.add_argument(
        "--json",
        type=V.nonempty_path,
        metavar="PATH",
        help="write every number, the command and versions to this file (one `tupe evaluate` writes it at a "
        "time: a second one is refused)",
    )
    V.add_threads_progress(p)
    p.add_argument(
        "--quiet", action="store_true", help="print the table only (no log lines, no progress bars)"
    )
    V.annotate_ranges(p)


def command_line(args: argparse.Namespace) -> str:
    """The command as the parsed options say it (so it is exact however the command was started)."""
    parts = ["tupe", "evaluate", "--model", *args.model, "--text", *args.text]
    for opt in (
        "tokenizer",
        "max_blocks",
        "masked_tokens",
        "max_length",
        "lengths",
        "extend_positions",
        "plot",
        "batch_size",
        "seed",
        "mlm_probability",
        "pppl_tokens",
        "bootstrap",
        "threads",
        "cache_dir",
        "json",
    ):
        value = getattr(args, opt, None)
        if opt == "lengths" and value is not None:
            value = ",".join(map(str, value))
        if opt == "extend_positions" and (
            value == "none" or not (getattr(args, "lengths", None) or getattr(args, "probe", None))
        ):
            continue
        if value is not None:
            parts += [FLAG_NAMES.get(opt, f"--{opt.replace('_', '-')}"), str(value)]
    if getattr(args, "probe", None):
        parts += ["--probe", args.probe]
        if args.probe_text:
            parts += ["--probe-text", *args.probe_text]
        parts += ["--probe-template", args.probe_template, "--probe-key-digits", str(args.probe_key_digits)]
        parts += [
            "--probe-distances",
            ",".join(map(str, args.probe_distances)),
            "--probe-blocks",
            str(args.probe_blocks),
        ]
    if getattr(args, "text_column", "text") != "text":
        parts += ["--text-column", args.text_column]
    for flag in ("skip_bad_text", "quiet"):
        if getattr(args, flag, False):
            parts.append(f"--{flag.replace('_', '-')}")
    if not getattr(args, "progress", True):
        parts.append("--no-progress")
    return " ".join(shlex.quote(p) for p in parts)


def versions() -> dict[str, str]:
    import numpy
    import tokenizers
    import torch
    import transformers

    from tupe.runtime import tupe_version

    return {
        "tupe": tupe_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": numpy.__version__,
    }


def run(args: argparse.Namespace) -> int:
    """Check every path flag, then hold the `--json` file's lock (one writer per output file) while evaluating."""
    import contextlib

    from tupe.io.files import file_lock

    check_paths(args)
    lock = file_lock(Path(args.json).expanduser(), "tupe evaluate") if args.json else contextlib.nullcontext()
    with lock:
        return _run(args)


def check_paths(args: argparse.Namespace) -> None:
    """Path flags checked for their kind before any work: models are folders, each given once; the tokenizer
    exists; the cache is a folder; the JSON output is a file that can be written."""
    seen: set[Path] = set()
    for m in args.model:
        V.check_path_kind("--model", m, "folder")
        resolved = Path(m).expanduser().resolve()
        if resolved in seen:
            raise TupeError(f"--model {m} is given twice")
        seen.add(resolved)
    if args.tokenizer is not None:
        V.check_path_kind("--tokenizer", args.tokenizer, "folder")
    if args.cache_dir is not None:
        V.check_out_folder("--cache-dir", args.cache_dir)
    if args.json is not None:
        V.check_out_file("--json", args.json)
        from tupe.io.outputs import check_file

        check_file(args.json, "tupe evaluate", "--json")  # a file tupe did not write is never replaced
    if getattr(args, "masked_tokens", None) is not None and args.max_blocks is not None:
        raise TupeError("--masked-tokens and --max-blocks exclude each other: give one budget")
    if getattr(args, "lengths", None):
        if args.max_length is not None:
            raise TupeError("--max-seq-len and --lengths exclude each other: give the lengths in --lengths")
        if plot_path(args) is not None:
            V.check_out_file("--plot", plot_path(args))
            from tupe.io.outputs import check_file

            check_file(plot_path(args), "tupe evaluate", "--plot")
    elif getattr(args, "plot", None):
        raise TupeError("--plot goes with --lengths")
    elif getattr(args, "extend_positions", "none") != "none" and not getattr(args, "probe", None):
        raise TupeError("--extend-positions goes with --lengths or --probe")
    if not getattr(args, "probe", None):
        given = [
            f
            for f, default in _PROBE_FLAGS.items()
            if getattr(args, f.removeprefix("--").replace("-", "_"), default) != default
        ]
        if given:
            raise TupeError(f"{given[0]} goes with --probe passkey")


_PROBE_FLAGS = {  # the probe's options and their defaults (a changed one without --probe is refused)
    "--probe-text": None,
    "--probe-template": "The pass key is {key}.",
    "--probe-key-digits": 5,
    "--probe-distances": [16, 64, 128, 256, 512, 1024],
    "--probe-blocks": 100,
}


def plot_path(args: argparse.Namespace) -> Path | None:
    """--plot, else NAME.png beside --json NAME.json (with --lengths), else none."""
    if getattr(args, "plot", None):
        return Path(args.plot).expanduser()
    if args.json:
        return Path(args.json).expanduser().with_suffix(".png")
    return None


def _run(args: argparse.Namespace) -> int:
    from tupe.runtime import hushed_libraries

    from .evaluate import evaluate, format_report, load_eval_model
    from .runs import resolve_text

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    V.apply_threads(args.threads)
    corpus = resolve_text(list(args.text), args.text_column, skip_bad_text=args.skip_bad_text)
    models = []
    with hushed_libraries(args.progress and not args.quiet, args.quiet):
        for path in args.model:
            models.append(load_eval_model(path, args.tokenizer))
            log(
                f"model: {path}: {models[-1].description}, {models[-1].num_parameters / 1e6:.2f} M parameters"
            )
    probe = _prepare_probe(
        args, models, corpus, log
    )  # its inputs are checked before the loss evaluation runs
    settings = _settings(args)
    if getattr(args, "lengths", None):
        result = _run_lengths(args, models, corpus, settings, log)
    else:
        result = evaluate(models, corpus, settings, log=log)
        result = {"command": command_line(args), "versions": versions(), **result}
        print(format_report(result))
    if probe is not None:
        from .passkey import passkey_probe
        from .report import format_passkey_report

        probe_settings, probe_corpus, prepared = probe
        result["passkey"] = passkey_probe(models, probe_corpus, probe_settings, log=log, prepared=prepared)
        print("\n" + format_passkey_report(result["passkey"]))
    if args.json:
        from tupe.io.outputs import claim_file

        write_json(claim_file(args.json, "tupe evaluate", "--json"), result)
        log(f"wrote {args.json}")
    return 0


def _settings(args: argparse.Namespace) -> Any:
    """The evaluation's `Settings` from the flags (no pseudo-perplexity by default with --lengths)."""
    from .evaluate import Settings

    pppl = (
        args.pppl_tokens if args.pppl_tokens is not None else (0 if getattr(args, "lengths", None) else 2000)
    )
    return Settings(
        seed=args.seed,
        mlm_probability=args.mlm_probability,
        max_blocks=args.max_blocks,
        masked_tokens=getattr(args, "masked_tokens", None),
        max_length=args.max_length,
        batch_size=args.batch_size,
        pppl_tokens=pppl,
        bootstrap=args.bootstrap,
        cache_dir=args.cache_dir,
        progress=args.progress and not args.quiet,
    )


def _prepare_probe(args: argparse.Namespace, models: list, corpus: Any, log: Any) -> tuple | None:
    """`--probe passkey`: its settings, text and prepared inputs (checked now); None without it."""
    if getattr(args, "probe", None) != "passkey":
        return None
    from .passkey import PasskeySettings, prepare_passkey
    from .runs import resolve_text

    probe_corpus = (
        resolve_text(list(args.probe_text), args.text_column, skip_bad_text=args.skip_bad_text)
        if args.probe_text
        else corpus
    )
    probe_settings = PasskeySettings(
        template=args.probe_template,
        key_digits=args.probe_key_digits,
        distances=args.probe_distances,
        blocks=args.probe_blocks,
        seed=args.seed,
        bootstrap=args.bootstrap,
        batch_size=args.batch_size,
        extend=args.extend_positions,
        cache_dir=args.cache_dir,
        progress=args.progress and not args.quiet,
    )
    return probe_settings, probe_corpus, prepare_passkey(models, probe_corpus, probe_settings, log)


def _run_lengths(
    args: argparse.Namespace, models: list, corpus: Any, settings: Any, log: Any
) -> dict[str, Any]:
    """`--lengths`: the evaluation at each length, its plot, and the report printed."""
    from .lengths import evaluate_lengths, plot_lengths
    from .report import format_lengths_report

    result = evaluate_lengths(models, corpus, args.lengths, settings, args.extend_positions, log=log)
    png = plot_path(args)
    if png is not None:
        from tupe.io.outputs import claim_file

        claim_file(png, "tupe evaluate", "--plot")
        result["plot"] = str(plot_lengths(result, png))
    result = {"command": command_line(args), "versions": versions(), **result}
    print(format_lengths_report(result))
    if png is not None:
        log(f"wrote {png}")
    else:
        log("no plot written: give --plot FILE.png (or --json) for loss against length")
    return result


def write_json(path: Path, result: dict[str, Any]) -> None:
    """The result as strict JSON, its paths (models, texts, cache, plot, command) relative to the file's folder."""
    from tupe.io.files import atomic_write_text
    from tupe.io.results import relative_paths

    result = relative_paths(result, Path(path).absolute().parent)
    atomic_write_text(path, json.dumps(_finite(result), indent=1, allow_nan=False) + "\n")


def _finite(value: Any) -> Any:  # noqa: ANN401
    """The result with NaN/inf numbers as null, so the file is strict JSON."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
