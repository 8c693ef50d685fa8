"""Fixtures for the reliability tests: a tiny corpus and tokenizer, tiny pre-training arguments, a tiny GLUE task
and checkpoint, and helpers that run the real CLI (in-process with `tupe.cli.main`, or as a subprocess)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORDS = (
    "the a of and to in is was he she it that for on with as his her at by be this had not are but from or have an "
    "they which one you were all we when there can more if out so said what up its about into than them only other "
    "time some could these two may first then do any like my now over such our man me even most made after also did"
).split()


def write_corpus(folder: Path, files: int = 3, paragraphs: int = 40, seed: int = 0) -> Path:
    """Deterministic English-like text (one paragraph per line, a blank line ends each file's document)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lines = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))).capitalize() + "."
            for _ in range(paragraphs)
        ]
        (folder / f"doc{f}.txt").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def rel_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("rel_corpus"))


@pytest.fixture(scope="session")
def rel_tokenizer(rel_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tupe.data import resolve_corpus, train_tokenizer

    out = tmp_path_factory.mktemp("rel_tok")
    train_tokenizer(resolve_corpus([str(rel_corpus)]), vocab_size=300, show_progress=False).save_pretrained(
        out
    )
    return out


@pytest.fixture(scope="session")
def rel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rel_cache")


def pretrain_args(corpus: Path, tokenizer: Path, cache: Path, out: Path, **over: object) -> list[str]:
    """`tupe pretrain` arguments for a tiny run (2 x 32 model, blocks of 32, batch 4); `over` replaces options."""
    opts: dict[str, object] = {
        "--corpus": corpus,
        "--tokenizer": tokenizer,
        "--cache-dir": cache,
        "--out": out,
        "--hidden-size": 32,
        "--num-layers": 2,
        "--num-heads": 2,
        "--intermediate-size": 64,
        "--max-length": 32,
        "--batch-size": 4,
        "--max-steps": 8,
        "--warmup-steps": 2,
        "--lr": 2e-3,
        "--dropout": 0.1,  # dropout on: resuming must restore the RNG state, not only weights and data order
        "--save-steps": 2,
        "--eval-steps": 4,
        "--logging-steps": 1,
        "--valid-every": 20,
    }
    for k, v in over.items():
        opts["--" + k.replace("_", "-")] = v
    args = ["pretrain"]
    for k, v in opts.items():
        if v is None:
            continue
        args += [k] if v is True else [k, str(v)]
    return args + ["--no-progress", "--quiet"]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """Run `tupe.cli.main(argv)` in-process: (exit code, stdout, stderr)."""
    from tupe.cli import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code: int, err: str, *needles: str) -> str:
    """Exit code 2, exactly one `error:` line holding every needle, no traceback; returns that line."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("tupe"), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert code == 2, (code, err)
    return line


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def start_cli(argv: list[str], fault: str | None = None, **kw: object) -> subprocess.Popen:
    """Start `python -m tupe ARGV` (or the fault-injecting runner) as a real subprocess."""
    if fault is None:
        cmd = [sys.executable, "-m", "tupe", *map(str, argv)]
    else:
        cmd = [sys.executable, str(Path(__file__).with_name("fault_runner.py")), fault, *map(str, argv)]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


@pytest.fixture(scope="session")
def finished_run(rel_corpus, rel_tokenizer, rel_cache, tmp_path_factory):  # noqa: ANN001, ANN201
    from tupe.cli import main

    out = tmp_path_factory.mktemp("finished") / "run"
    assert main([str(a) for a in pretrain_args(rel_corpus, rel_tokenizer, rel_cache, out, max_steps=4)]) == 0
    return out


@pytest.fixture(scope="session")
def glue_assets(tmp_path_factory):  # noqa: ANN001, ANN201
    from tests.glue.fixtures import make_checkpoint, write_task

    root = tmp_path_factory.mktemp("rel_glue")
    model = make_checkpoint(root / "model")
    for task in ("SST-2", "STS-B", "MRPC"):
        write_task(root / "data", task, n_train=16, n_dev=8)
    return model, root / "data"


@pytest.fixture()
def ctx(tmp_path, rel_corpus, rel_tokenizer, rel_cache, finished_run, glue_assets):  # noqa: ANN001
    from .bad_inputs import Ctx

    return Ctx(tmp_path, rel_corpus, rel_tokenizer, rel_cache, finished_run, *glue_assets)
