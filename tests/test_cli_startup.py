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
