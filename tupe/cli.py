"""The `tupe` command line: one sub-command per job, each defined next to the code it runs.

Every sub-command module exposes `add_arguments(parser)` and `run(args) -> int`. A `TupeError` (or a
`ValueError`/`FileNotFoundError` raised while validating user input) is printed as one line with exit code 2;
`--debug` shows the traceback.

Start-up: building a parser imports neither torch nor transformers (tests/test_cli_startup.py checks it). The
command's own module, which may, is imported only to run it. Its options come from `PARSERS` where the command
module is heavy, else from the module itself (then kept light), and its description is read from its docstring
without importing it.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import sys
import threading
from typing import NoReturn

# name -> (module, one-line help). Adding a command touches this table and its own module only.
COMMANDS: dict[str, tuple[str, str]] = {
    "glue": (
        "tupe.finetuning.glue.finetune",
        "fine-tune a checkpoint on a GLUE task (the paper's lr x seed grid)",
    ),
    "finetune": (
        "tupe.finetuning.command",
        "fine-tune a checkpoint on your own files: ner (CoNLL), qa (SQuAD), multiple-choice (SWAG), classification",
    ),
    "report": (
        "tupe.finetuning.glue.report",
        "GLUE and finetune results as a table like the paper's Table 1 (Markdown, CSV)",
    ),
    "pretrain": ("tupe.training.pretrain", "pre-train one positional scheme with masked LM on a corpus"),
    "compare": (
        "tupe.comparison.compare",
        "pre-train several schemes on identical data and compare validation loss",
    ),
    "demo": (
        "tupe.comparison.demo",
        "pre-train bert-a and tupe-a (mini) side by side on the built-in corpus and say what came out",
    ),
    "plot": (
        "tupe.analysis.curves",
        "validation-loss curves of pre-training runs or whole `tupe compare` folders on one figure",
    ),
    "analyze": (
        "tupe.analysis.analyze",
        "draw the paper's position analyses (Fig. 2 and 6) for a checkpoint",
    ),
    "evaluate": (
        "tupe.evaluation.command",
        "masked-LM loss, perplexity and pseudo-perplexity of checkpoints on text, with bootstrap intervals",
    ),
    "diagnose": (
        "tupe.diagnostics.command",
        "train small models of each scheme on tasks only positions can answer; report with intervals over seeds",
    ),
    "convert": (
        "tupe.convert",
        "convert a checkpoint of the authors' released TUPE code (fairseq) into a tupe model folder",
    ),
    "bench": (
        "tupe.bench.command",
        "time training steps of each scheme and backend against transformers' BERT",
    ),
}

# command -> "module:function" building its options, for commands whose own module imports torch at the top
PARSERS: dict[str, str] = {
    "pretrain": "tupe.training.arguments:add_pretrain_arguments",
    "compare": "tupe.training.arguments:add_compare_arguments",
    "demo": "tupe.training.arguments:add_demo_arguments",
    "finetune": "tupe.finetuning.arguments:add_arguments",
}


def _command_in(argv: list[str]) -> str | None:
    """The sub-command named in argv (the first word that is one), so only its module needs importing."""
    return next((word for word in argv if word in COMMANDS), None)


class _UsageError(Exception):
    """A command-line mistake found by argparse; `main` prints it as one line and returns 2."""


# the spellings of transformers' example scripts (run_mlm.py, run_glue.py, run_ner.py, run_qa.py) and their
# TrainingArguments, after "_" -> "-", to tupe's flag of the same meaning (the first one the command has)
RUN_SCRIPT_SPELLINGS: dict[str, tuple[str, ...]] = {
    "--learning-rate": ("--lr", "--lrs"),
    "--num-train-epochs": ("--epochs",),
    "--per-device-train-batch-size": ("--batch-size",),
    "--per-device-eval-batch-size": ("--eval-batch-size", "--batch-size"),
    "--gradient-accumulation-steps": ("--grad-accum",),
    "--max-seq-length": ("--max-seq-len",),
    "--output-dir": ("--out",),
    "--model-name-or-path": ("--model", "--init-from"),
    "--tokenizer-name": ("--tokenizer",),
    "--train-file": ("--train", "--corpus"),
    "--validation-file": ("--validation",),
    "--seed": ("--seeds", "--seed"),
    "--warmup-ratio": ("--warmup-ratio",),
    "--save-steps": ("--save-steps",),
    "--mlm-probability": ("--mlm-probability",),
    "--label-all-tokens": ("--label-all-tokens",),
    "--dataset-name": ("--corpus", "--train"),
    "--task-name": ("--task",),
    "--overwrite-output-dir": ("--overwrite",),
    "--resume-from-checkpoint": ("--resume",),
}
# ... and those that tupe needs no flag for, with what to do instead (when the command has no flag of that meaning)
RUN_SCRIPT_NOTES: dict[str, str] = {
    "--do-train": "drop it, tupe trains whenever it runs",
    "--do-eval": "drop it, tupe always scores the validation data at the end (--eval-steps N: also during "
    "training, where the command has it)",
    "--do-predict": "drop it, the predictions are written with the scores",
    "--resume-from-checkpoint": "drop it, running the same command again keeps the finished runs and redoes the "
    "interrupted one",
}


def suggest_flag(word: str, options: set[str]) -> str | None:
    """The flag of `options` that an unrecognized `word` most likely means: its `-` spelling (`--learning_rate` ->
    `--learning-rate`), the tupe name of a run_*.py / TrainingArguments flag (`--learning_rate` -> `--lr`), or
    a close spelling."""
    import difflib

    if not word.startswith("--"):
        return None
    dashed = word.split("=", 1)[0].replace("_", "-").lower()
    if dashed in options:
        return dashed
    for candidate in RUN_SCRIPT_SPELLINGS.get(dashed, ()):
        if candidate in options:
            return candidate
    close = difflib.get_close_matches(
        dashed, sorted(o for o in options if o.startswith("--")), n=1, cutoff=0.8
    )
    return close[0] if close else None


def flag_hints(words: list[str], options: set[str]) -> str:
    """What to append to an error about `words` (flags the command does not have): "; did you mean --lr /
    --epochs?" for those with a tupe flag of the same meaning (`suggest_flag`), then "; --do_eval: drop it, ..."
    for those that need none (`RUN_SCRIPT_NOTES`); "" for none of either."""
    hints, notes = [], []
    for word in words:
        flag = suggest_flag(word, options)
        note = RUN_SCRIPT_NOTES.get(word.split("=", 1)[0].replace("_", "-").lower())
        if flag is not None and flag not in hints:
            hints.append(flag)
        elif flag is None and note is not None:
            notes.append(f"{word.split('=', 1)[0]}: {note}")
    return (f"; did you mean {' / '.join(hints)}?" if hints else "") + "".join(f"; {n}" for n in notes)


def _option_strings(p: argparse.ArgumentParser) -> set[str]:
    """Every flag of `p` and of its own sub-commands (`tupe convert fairseq`)."""
    found = set(p._option_string_actions)
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the option (no usage dump), so every user error looks alike."""

    help_prog: str | None = None  # whose --help the hint names: the sub-command's, once it is known
    command_options: set[str] | None = None  # the sub-command's flags, for "did you mean"

    def error(self, message: str) -> NoReturn:
        prog = self.help_prog or self.prog
        prefix = "unrecognized arguments: "
        if message.startswith(prefix) and self.command_options:
            message += flag_hints(message[len(prefix) :].split(), self.command_options)
        raise _UsageError(f"{prog}: error: {message} (see `{prog} --help`)")


def _one_line(err: BaseException) -> str:
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def _docstring(module_name: str) -> str:
    """A module's docstring, read from its source so the module (and what it imports) is not loaded."""
    spec = importlib.util.find_spec(module_name)
    try:
        with open(spec.origin, encoding="utf-8") as fh:  # type: ignore[union-attr, arg-type]
            return ast.get_docstring(ast.parse(fh.read())) or ""
    except (OSError, AttributeError, TypeError, SyntaxError):  # pragma: no cover - e.g. a zipped install
        return importlib.import_module(module_name).__doc__ or ""


def _add_arguments_function(name: str):  # noqa: ANN202
    module_name, _, function = PARSERS.get(name, f"{COMMANDS[name][0]}:add_arguments").partition(":")
    return getattr(importlib.import_module(module_name), function)


def version() -> str:
    """The installed package's version (package metadata)."""
    from tupe.runtime import tupe_version

    return tupe_version()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; options are added for `command` only, or for every command when it is None, which keeps
    `tupe --help` and each sub-command's start-up fast. No command module that imports torch is loaded."""
    parser = _Parser(
        prog="tupe",
        description="Pre-train, fine-tune, analyse and benchmark TUPE and baseline BERT encoders.",
    )
    parser.help_prog = f"tupe {command}" if command else None  # unknown flags are reported by this parser
    parser.add_argument("--version", action="version", version=f"tupe {version()}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=help_text)
            continue
        p = sub.add_parser(
            name, help=help_text, description=(_docstring(module_name) or help_text).strip().split("\n\n")[0]
        )
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks")
        _add_arguments_function(name)(p)
        p.set_defaults(_module_name=module_name)
        parser.command_options = _option_strings(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tupe.errors import TupeError

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_in(argv) or "")
    try:
        args = parser.parse_args(argv)
    except _UsageError as err:
        text = str(err)
        options = parser.command_options
        if "the following arguments are required" in text and options:
            # argparse names the missing flag before any it does not know: `glue --task_name sst2` gets "--task is
            # required", so the flags it does not know get their hints here
            unknown = [w for w in argv if w.startswith("--") and w.split("=", 1)[0] not in options]
            text = text.replace(" (see `", flag_hints(unknown, options) + " (see `", 1)
        print(text, file=sys.stderr)
        return 2
    from tupe.runtime import tune_cpu_allocator

    tune_cpu_allocator()  # before the command allocates anything: see tupe/runtime.py
    if not getattr(
        args, "debug", False
    ):  # a Rust panic's own report: its message, no stack (--debug keeps it)
        os.environ["RUST_BACKTRACE"] = "0"
    previous_hook = threading.excepthook
    if not getattr(args, "debug", False):
        threading.excepthook = _thread_failed(args.command)
    finished = False
    try:
        code = int(importlib.import_module(args._module_name).run(args) or 0)
        finished = code == 0
        return code
    except (TupeError, ValueError, OSError) as err:
        # OSError: a file the user named cannot be read or written (missing, permissions, disk full)
        if getattr(args, "debug", False):
            raise
        _say(f"tupe {args.command}: error: {_one_line(err)}")
        return 2
    except KeyboardInterrupt:
        print(f"tupe {args.command}: interrupted", file=sys.stderr)
        return 130
    except BaseException as err:
        # a Rust panic in the tokenizers library (pyo3's PanicException, a BaseException): one line, not a trace
        if type(err).__name__ != "PanicException" or getattr(args, "debug", False):
            raise
        _say(
            f"tupe {args.command}: error: the tokenizers library failed on this input (a panic in its Rust code: "
            f"{_one_line(err)[:300]}); check the tokenizer's tokenizer.json"
        )
        return 2
    finally:
        threading.excepthook = previous_hook
        _end_process_group(finished)


_STDERR_LOCK = threading.Lock()


def _say(line: str) -> None:
    """One line to stderr in a single write: `print` writes the text and its newline separately, and a library's
    thread failing meanwhile would glue its own output onto the error line."""
    with _STDERR_LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _thread_failed(command: str):  # noqa: ANN202 - a threading.excepthook
    """A library's background thread that fails (`datasets`, `tokenizers`, `transformers` helpers) is reported as
    one warning line, not Python's "Exception in thread ..." and traceback written piecemeal into the command's
    output; `--debug` keeps Python's report."""

    def hook(exc: threading.ExceptHookArgs) -> None:
        if exc.exc_type is SystemExit:
            return
        name = exc.thread.name if exc.thread is not None else "?"
        what = _one_line(exc.exc_value) if exc.exc_value is not None else exc.exc_type.__name__
        _say(f"tupe {command}: warning: a background thread ({name}) failed: {what}")

    return hook


def _end_process_group(finished: bool) -> None:
    """Close the process group a torchrun launch created (the Trainer opens it, nobody closes it). Left to
    interpreter teardown, gloo's worker threads can abort a process ("terminate called without an active
    exception", exit -6) after a run that finished correctly; destroying the group alone did not stop it in CI
    (2026-12-07). So after a finished command every rank first frees what it no longer holds (`gc.collect`: the
    Trainer and its DDP wrapper, whose reducer holds gloo work, can sit in reference cycles until the interpreter's
    last collection), waits for the others (no rank tears down while another is still in a collective), then
    destroys the group. After a failure nothing is torn down here: a barrier or a destroy could wait for ever on a
    rank still in a collective, and torchrun stops the others anyway."""
    torch = sys.modules.get("torch")
    if (
        not finished
        or torch is None
        or not torch.distributed.is_available()
        or not torch.distributed.is_initialized()
    ):
        return
    import gc
    from datetime import timedelta

    gc.collect()
    if torch.distributed.get_backend() == "gloo":
        # a rank that failed never arrives: after 10 minutes (a final save of a large model is well inside it) the
        # others report it and exit instead of waiting for ever
        try:
            torch.distributed.monitored_barrier(timeout=timedelta(minutes=10))
        except RuntimeError as err:
            _say(f"tupe: warning: another process did not finish ({_one_line(err)[:200]})")
            return
    else:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
