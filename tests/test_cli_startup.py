"""Start-up: the command line builds its parsers without torch or transformers, and `tupe --version` works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    )


def test_building_every_parser_imports_no_torch():
    code = (
        "import sys, tupe.cli as c\n"
        "c.build_parser(None)\n"
        "for name in c.COMMANDS: c.build_parser(name)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'scipy', 'sklearn', 'datasets') if m in sys.modules))"
    )
    assert _python(code).stdout.strip() == "[]"


def test_import_tupe_is_light_and_still_gives_the_model_classes():
    code = (
        "import sys, tupe\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "from tupe import TupeConfig, TupeForMaskedLM\n"
        "from transformers import AutoConfig\n"
        "print(type(AutoConfig.for_model('tupe')).__name__, TupeForMaskedLM.__name__)"
    )
    assert _python(code).stdout.split() == ["TupeConfig", "TupeForMaskedLM"]


def test_importing_transformers_after_tupe_registers_the_auto_classes():
    code = (
        "import tupe\n"
        "from transformers import AutoConfig, AutoModelForMaskedLM\n"
        "config = AutoConfig.for_model('tupe', vocab_size=50, hidden_size=16, num_hidden_layers=1, "
        "num_attention_heads=2, intermediate_size=32)\n"
        "print(type(AutoModelForMaskedLM.from_config(config)).__module__)"
    )
    assert _python(code).stdout.strip().startswith("tupe.")


def test_the_import_hook_leaves_nothing_changed_and_tupe_pipelines_imports_first():
    """The hook (docs/architecture.md, "Registration with transformers") takes its wrapper off the loader of the
    module it waited for and leaves sys.meta_path once both registrations ran; `import tupe.pipelines` in a fresh
    process (it imports transformers' pipelines, which fires the hook) registers the pipelines (it failed with a
    circular import before)."""
    code = (
        "import sys, tupe\n"
        "import transformers.pipelines as p\n"
        "hooks = [f for f in sys.meta_path if type(f).__name__ == '_AfterImport']\n"
        "wrapped = [m for m in ('transformers', 'transformers.pipelines') "
        "if 'exec_module' in vars(sys.modules[m].__spec__.loader)]\n"
        "print(len(hooks), wrapped, p.PIPELINE_REGISTRY.supported_tasks['token-classification']['impl'].__module__)"
    )
    # the token-classification class lives beside the modeling code (model folders carry a copy of it)
    assert _python(code).stdout.split() == ["0", "[]", "tupe.modeling.token_classification"]
    code = (
        "import tupe.pipelines\n"
        "from transformers.pipelines import PIPELINE_REGISTRY as r\n"
        "print(r.supported_tasks['question-answering']['impl'].__module__, "
        "r.supported_tasks['token-classification']['impl'].__module__)"
    )
    assert _python(code).stdout.split() == ["tupe.pipelines", "tupe.modeling.token_classification"]


def test_version_flag_prints_the_package_version():
    from importlib.metadata import version

    out = subprocess.run(
        [sys.executable, "-m", "tupe", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"tupe {version('tupe')}"


def test_sub_command_help_keeps_its_description():
    out = subprocess.run(
        [sys.executable, "-m", "tupe", "pretrain", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0
    assert "Pre-train one positional scheme" in out.stdout and "--prepare-only" in out.stdout


def test_every_command_suggests_the_flag_an_underscore_or_run_script_spelling_means(capsys) -> None:  # noqa: ANN001
    """Issue 38: `--learning_rate` (run_mlm.py's habit) got "unrecognized arguments" with no suggestion."""
    from tupe.cli import COMMANDS, build_parser, main, suggest_flag

    checked = 0
    for name in COMMANDS:
        options = build_parser(name).command_options
        assert options, name
        dashed = sorted(o for o in options if o.startswith("--") and "-" in o[2:])
        checked += bool(dashed)
        for flag in dashed:
            assert suggest_flag(flag.replace("-", "_").replace("__", "--", 1), options) == flag, (name, flag)
    assert checked >= len(COMMANDS) - 2  # all but the commands whose flags are one word (`tupe report`)
    assert main(["pretrain", "--out", "x", "--learning_rate", "1e-4", "--num_train_epochs", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "tupe pretrain: error: unrecognized arguments: --learning_rate 1e-4 --num_train_epochs 2; did you mean "
        "--lr / --epochs? (see `tupe pretrain --help`)"
    )
    assert main(["glue", "--model", "m", "--task", "SST-2", "--out", "g", "--learning_rate", "1e-4"]) == 2
    assert "did you mean --lrs?" in capsys.readouterr().err


def test_more_transformers_flags_get_a_hint_even_when_a_required_flag_is_missing(capsys) -> None:  # noqa: ANN001
    """Issue 49: `--dataset_name`, `--overwrite_output_dir`, `--resume_from_checkpoint`, `--do_eval` and `glue
    --task_name` got no hint; `glue --task_name sst2` got only "--task is required" (argparse names a missing flag
    before unknown ones). Each now names tupe's flag, or says what to do where tupe needs none."""
    from tupe.cli import main

    argv = ["pretrain", "--out", "x", "--dataset_name", "wikitext", "--overwrite_output_dir"]
    assert main([*argv, "--resume_from_checkpoint", "--do_eval"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "did you mean --corpus / --overwrite / --resume?" in err
    assert "--do_eval: drop it, tupe always scores the validation data" in err
    assert main(["glue", "--model", "m", "--out", "g", "--task_name", "sst2", "--do_train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "tupe glue: error: the following arguments are required: --task; did you mean --task?; --do_train: drop "
        "it, tupe trains whenever it runs (see `tupe glue --help`)"
    )
    argv = ["finetune", "--task", "ner", "--model", "m", "--out", "o", "--train", "t", "--validation", "v"]
    assert main([*argv, "--resume_from_checkpoint", "--overwrite_output_dir"]) == 2
    err = capsys.readouterr().err.strip()
    assert "did you mean --overwrite?" in err and "--resume_from_checkpoint: drop it, running the same" in err
