"""Fuzz harness: property-based (`hypothesis`) corpus files, flag values, path flags and GLUE rows, run through the
real CLI entry point (`tupe.cli.main`, in-process). Every case must end with exit 0, or exit 2 and exactly one
`tupe CMD: error: ...` line, with no traceback, nothing outside the case's own folder touched and earlier results
intact. Hangs (FIFOs, /dev/zero) and memory (huge lines) run in a subprocess with a time and memory limit.

Counts: `TUPE_FUZZ_EXAMPLES` (default 60) is the number of examples of the corpus and flag properties; the GLUE
property runs half of it and the path property a third, so the default is 60 + 60 + 60 + 30 + 20 = 230 generated
cases; `TUPE_FUZZ_EXAMPLES=1000 pytest tests/reliability/test_fuzz.py` runs ~3,800.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import WORDS, subprocess_env

N = int(os.environ.get("TUPE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=N,
    deadline=None,
    derandomize=os.environ.get("TUPE_FUZZ_RANDOM") is None,  # reproducible in CI; TUPE_FUZZ_RANDOM=1 explores
    suppress_health_check=list(HealthCheck),
    database=None,
)


OUTCOMES: dict[
    str, Counter
] = {}  # property -> exit code -> count (printed with -s; checked after each property)


def _count(name: str, code: int) -> None:
    OUTCOMES.setdefault(name, Counter())[code] += 1


def _report(name: str, at_least: int) -> None:
    got = OUTCOMES.get(name, Counter())
    print(f"fuzz {name}: {sum(got.values())} cases, exit codes {dict(sorted(got.items()))}")
    assert sum(got.values()) >= at_least, got


def _snapshot(folder: Path) -> dict[str, str]:
    """path -> SHA-256 of every file under `folder` (what must stay untouched)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _run(argv: list[str]) -> tuple[int, str]:
    """`tupe.cli.main(argv)` in-process with stderr captured: (exit code, stderr)."""
    import contextlib
    import io

    from tupe.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def _assert_clean_outcome(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    assert code in (0, 2), (code, err)
    errors = [ln for ln in err.splitlines() if ": error: " in ln]
    if code == 2:
        assert len(errors) == 1 and errors[0].startswith("tupe"), err
        assert len(errors[0]) < 2000, errors[0]  # never a file dumped into the message
    else:
        assert not errors, err


class _Sandbox:
    """A fresh folder per example, with a sentinel file next to the case's folder that must never change."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tupe-fuzz-"))
        self.case = self.root / "case"
        self.case.mkdir()
        (self.root / "SENTINEL.md").write_text("a user's file next to the run\n")

    def check_and_remove(self) -> None:
        assert (self.root / "SENTINEL.md").read_text() == "a user's file next to the run\n"
        shutil.rmtree(self.root, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ corpus files
_line_text = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=0, max_size=25).map(" ".join),
    st.text(max_size=60),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
)
_ends = st.sampled_from(["\n", "\r\n", "\r"])
_encodings = st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-8-sig", "latin-1", "utf-16"])


@st.composite
def corpus_file(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["text", "text", "text", "binary", "empty", "long-line", "mixed"]))
    if kind == "empty":
        return b""
    if kind == "binary":
        return draw(st.binary(min_size=1, max_size=400))
    if kind == "long-line":  # a line far over the line/word bounds, with or without spaces
        n = draw(st.integers(20_000, 200_000))
        unit = draw(st.sampled_from(["x", "ab", "word ", "\u00e9t\u00e9 "]))
        return (unit * (n // len(unit))).encode() + b"\n" + b"the end of it\n"
    lines = draw(st.lists(_line_text, min_size=1, max_size=30))
    end = draw(_ends)
    text = end.join(lines) + draw(st.sampled_from(["", end]))
    enc = draw(_encodings)
    data = text.encode(enc, errors="replace")
    if kind == "mixed":  # text with a few stray bytes inserted
        pos = draw(st.integers(0, len(data)))
        data = data[:pos] + draw(st.binary(min_size=1, max_size=8)) + data[pos:]
    return data


@st.composite
def corpus_folder(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    files = draw(st.lists(corpus_file(), min_size=1, max_size=3))
    names = draw(
        st.lists(
            st.sampled_from(["a.txt", "b.txt", "c", "sub/d.txt", ".hidden.txt", "notes.md", "e.txt.gz"]),
            min_size=len(files),
            max_size=len(files),
            unique=True,
        )
    )
    return list(zip(names, files, strict=True))


@pytest.mark.parametrize("skip_bad_text", [False, True], ids=["strict", "skip-bad-text"])
def test_fuzz_corpus_files(rel_tokenizer: Path, rel_corpus: Path, skip_bad_text: bool) -> None:
    import gzip

    @FUZZ
    @given(files=corpus_folder(), with_good=st.booleans())
    def case(files: list[tuple[str, bytes]], with_good: bool) -> None:
        box = _Sandbox()
        corpus = box.case / "corpus"
        if with_good:
            shutil.copytree(rel_corpus, corpus)
        for name, data in files:
            path = corpus / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
        before = _snapshot(corpus)
        argv = ["pretrain", "--prepare-only", "--corpus", corpus, "--tokenizer", rel_tokenizer]
        argv += [
            "--cache-dir",
            box.case / "cache",
            "--out",
            box.case / "out",
            "--max-length",
            "16",
            "--quiet",
        ]
        argv += ["--valid-every", "2"] + (["--skip-bad-text"] if skip_bad_text else [])
        code, err = _run(argv)
        _assert_clean_outcome(code, err)
        _count(f"corpus-{skip_bad_text}", code)
        assert _snapshot(corpus) == before  # the input is never changed
        box.check_and_remove()

    case()
    _report(f"corpus-{skip_bad_text}", N)


def test_line_ends_are_universal(tmp_path: Path) -> None:
    """LF, CRLF and CR-only files give the same lines; a CRLF split across read chunks is one line end."""
    from tupe.data import corpus as C

    lines = ["first line", "", "second \u00e9 line", "third"]
    got = {}
    for name, end in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r")):
        p = tmp_path / f"{name}.txt"
        p.write_bytes(end.join(lines).encode())
        got[name] = [ln for batch in C.iter_file_lines(p) for ln in batch]
    assert got["lf"] == got["crlf"] == got["cr"] == lines


def test_long_lines_are_split_without_losing_text() -> None:
    from tupe.data.corpus import MAX_LINE_CHARS, MAX_WORD_CHARS, split_long_line

    @FUZZ
    @given(st.lists(st.text(alphabet="ab", min_size=1, max_size=3000), min_size=1, max_size=40).map(" ".join))
    def case(line: str) -> None:
        pieces = split_long_line(line)
        assert all(len(p) <= MAX_LINE_CHARS for p in pieces)
        assert all(len(w) <= MAX_WORD_CHARS for p in pieces for w in p.split()) or len(line) <= MAX_WORD_CHARS
        assert "".join("".join(pieces).split()) == "".join(line.split())

    case()


# ------------------------------------------------------------------------------------------------ flag values
_PRETRAIN_FLAGS = [
    "--vocab-size", "--tokenizer-max-mb", "--max-length", "--valid-every", "--mlm-probability", "--hidden-size",
    "--num-layers", "--num-heads", "--intermediate-size", "--dropout", "--batch-size", "--grad-accum",
    "--max-steps", "--lr", "--warmup-steps", "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-epsilon",
    "--max-grad-norm", "--seed", "--eval-steps", "--eval-batch-size", "--save-steps", "--save-at",
    "--save-total-limit", "--logging-steps", "--threads",
]  # fmt: skip
_values = st.one_of(
    st.integers(-3, 3).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "-0", "1e400", "0x10", "", " ", "1,2", "3,,x", "ten", "1_000"]),
    st.text(max_size=8),
)


def test_fuzz_pretrain_flag_values(rel_tokenizer: Path, rel_corpus: Path, rel_cache: Path) -> None:
    @FUZZ
    @given(flags=st.lists(st.tuples(st.sampled_from(_PRETRAIN_FLAGS), _values), min_size=1, max_size=3))
    def case(flags: list[tuple[str, str]]) -> None:
        box = _Sandbox()
        argv = ["pretrain", "--prepare-only", "--corpus", rel_corpus, "--tokenizer", rel_tokenizer]
        argv += ["--cache-dir", rel_cache, "--out", box.case / "out", "--max-length", "16", "--quiet"]
        for flag, value in flags:
            if flag == "--threads":
                continue  # would change this test process's torch threads
            argv += [f"{flag}={value}"]
        code, err = _run(argv)
        _assert_clean_outcome(code, err)
        _count("pretrain-flags", code)
        box.check_and_remove()

    case()
    _report("pretrain-flags", N)


_GLUE_FLAGS = [
    "--lrs", "--seeds", "--epochs", "--batch-size", "--eval-batch-size", "--max-seq-len", "--max-train-samples",
    "--max-eval-samples", "--warmup-ratio", "--weight-decay", "--adam-eps", "--clip", "--dropout",
]  # fmt: skip


def test_fuzz_glue_flag_values_parse_or_refuse_in_one_line() -> None:
    """GLUE flags through the real parser: every value is accepted or refused with one line naming the flag."""
    from tupe.cli import _UsageError, build_parser

    parser = build_parser("glue")

    @FUZZ
    @given(flag=st.sampled_from(_GLUE_FLAGS), value=_values)
    def case(flag: str, value: str) -> None:
        try:
            parser.parse_args(["glue", "--model", "m", "--task", "SST-2", "--out", "o", f"{flag}={value}"])
            _count("glue-flags", 0)
        except _UsageError as err:
            assert "\n" not in str(err) and flag in str(err), str(err)
            _count("glue-flags", 2)

    case()
    _report("glue-flags", N)


_OTHER_FLAGS = {
    "evaluate": (
        ["evaluate", "--model", "m", "--text", "t"],
        ["--max-blocks", "--max-length", "--batch-size", "--seed", "--mlm-probability", "--pppl-tokens",
         "--bootstrap", "--threads"],
    ),
    "analyze": (
        ["analyze", "--model", "m", "--out", "o"],
        ["--max-length", "--num-blocks", "--batch-size", "--zoom", "--max-offset"],
    ),
    "bench": (
        ["bench"],
        ["--seq-len", "--batch-size", "--layers", "--rounds", "--warmup", "--threads", "--peak-flops",
         "--breakdown-steps", "--e2e-steps"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(_OTHER_FLAGS))
def test_fuzz_evaluate_analyze_bench_flag_values_parse_or_refuse_in_one_line(command: str) -> None:
    """The numeric flags of the other commands through the real parser: a value is accepted (then a finite
    number) or refused with one line naming the flag."""
    import math

    from tupe.cli import _UsageError, build_parser

    parser = build_parser(command)
    base, flags = _OTHER_FLAGS[command]

    @settings(FUZZ, max_examples=max(10, N // 2))
    @given(flag=st.sampled_from(flags), value=_values)
    def case(flag: str, value: str) -> None:
        try:
            args = parser.parse_args([*base, f"{flag}={value}"])
        except _UsageError as err:
            assert "\n" not in str(err) and flag in str(err), str(err)
            _count(f"{command}-flags", 2)
            return
        parsed = getattr(args, flag[2:].replace("-", "_"))
        assert isinstance(parsed, int | float) and math.isfinite(parsed), (flag, value, parsed)
        _count(f"{command}-flags", 0)

    case()
    _report(f"{command}-flags", max(10, N // 2))


# ------------------------------------------------------------------------------------------------ path flags
@st.composite
def out_path(draw: st.DrawFn) -> str:
    return draw(
        st.sampled_from(
            ["new", "file", "under-file/x", "foreign", "empty-dir", "link-to-file", "broken-link", "dev-null"]
        )
    )


def test_fuzz_out_and_tokenizer_paths(rel_tokenizer: Path, rel_corpus: Path, rel_cache: Path) -> None:
    @settings(FUZZ, max_examples=max(10, N // 3))
    @given(
        kind=out_path(), resume=st.booleans(), overwrite=st.booleans(), tok=st.sampled_from(["dir", "file"])
    )
    def case(kind: str, resume: bool, overwrite: bool, tok: str) -> None:
        box = _Sandbox()
        c = box.case
        (c / "file").write_text("a user's file\n")
        (c / "foreign").mkdir()
        (c / "foreign" / "NOTES.md").write_text("mine\n")
        (c / "empty-dir").mkdir()
        (c / "link-to-file").symlink_to(c / "file")
        (c / "broken-link").symlink_to(c / "nowhere")
        out = "/dev/null" if kind == "dev-null" else c / kind
        tokenizer = rel_tokenizer if tok == "dir" else c / "file"
        before = _snapshot(c)
        argv = ["pretrain", "--corpus", rel_corpus, "--tokenizer", tokenizer, "--cache-dir", rel_cache]
        argv += ["--out", out, "--max-length", "16", "--quiet", "--prepare-only"]
        argv += (["--resume"] if resume else []) + (["--overwrite"] if overwrite else [])
        code, err = _run(argv)
        _assert_clean_outcome(code, err)
        after = _snapshot(c)
        assert {k: v for k, v in after.items() if k in before} == before  # nothing of the user's changed
        _count("paths", code)
        box.check_and_remove()

    case()
    _report("paths", 10)


# ------------------------------------------------------------------------------------------------ GLUE rows
class _Reached(Exception):
    """Raised instead of fine-tuning: the data were read and encoded without error."""


@pytest.fixture(scope="module")
def glue_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.glue.fixtures import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("fuzz_glue") / "model")


_cell = st.one_of(
    st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join),
    st.text(max_size=20),
    st.sampled_from(["0", "1", "2", "-1", "", "positive", "nan", "1.5"]),
)


@st.composite
def glue_tsv(draw: st.DrawFn) -> bytes:
    header = draw(st.sampled_from(["sentence\tlabel"] * 4 + ["label\tsentence", "sentence", ""]))
    junk = draw(st.sampled_from([0, 0, 1, 12]))  # half the files hold only well-formed rows
    rows = draw(st.lists(st.lists(_cell, min_size=1, max_size=3).map("\t".join), max_size=junk))
    good = draw(st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from("01")), min_size=2, max_size=6))
    rows += [f"{w}\t{lab}" for w, lab in good]
    end = draw(_ends)
    enc = draw(st.sampled_from(["utf-8"] * 4 + ["utf-8-sig", "latin-1", "utf-16"]))
    data = (end.join([header, *rows]) + end).encode(enc, errors="replace")
    if draw(st.integers(0, 3)) == 0:
        data += draw(st.binary(max_size=20))
    return data


def test_fuzz_glue_rows(glue_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tupe.finetuning.pipeline.run as finetune

    def reached(*a: object, **k: object) -> None:
        raise _Reached

    monkeypatch.setattr(finetune, "train_run", reached)

    @settings(FUZZ, max_examples=max(10, N // 2))
    @given(train=glue_tsv(), dev=glue_tsv())
    def case(train: bytes, dev: bytes) -> None:
        box = _Sandbox()
        d = box.case / "data" / "SST-2"
        d.mkdir(parents=True)
        (d / "train.tsv").write_bytes(train)
        (d / "dev.tsv").write_bytes(dev)
        argv = [
            "glue",
            "--model",
            glue_model,
            "--task",
            "SST-2",
            "--data-dir",
            d.parent,
            "--out",
            box.case / "g",
        ]
        argv += ["--lrs", "1e-4", "--seeds", "1", "--epochs", "1"]
        try:
            code, err = _run(argv)
        except _Reached:
            code, err = 0, ""
        _assert_clean_outcome(code, err)
        _count("glue-rows", code)
        box.check_and_remove()

    case()
    _report("glue-rows", 10)


# ------------------------------------------------------------------------------------------------ hangs, memory
def _limited(max_bytes: int):  # noqa: ANN202
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))

    return apply


@pytest.mark.parametrize("odd", ["fifo", "dev-zero", "dev-urandom", "fifo-direct"])
def test_odd_files_never_hang(odd: str, tmp_path: Path, rel_corpus: Path, rel_tokenizer: Path) -> None:
    corpus = Path(shutil.copytree(rel_corpus, tmp_path / "corpus"))
    target = corpus / "odd.txt"
    if odd.startswith("fifo"):
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero" if odd == "dev-zero" else "/dev/urandom")
    src = target if odd == "fifo-direct" else corpus
    argv = [sys.executable, "-m", "tupe", "pretrain", "--prepare-only", "--corpus", str(src), "--tokenizer"]
    argv += [
        str(rel_tokenizer),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    proc = subprocess.run(argv, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    _assert_clean_outcome(proc.returncode, proc.stderr)
    assert proc.returncode == 2 and "odd.txt" in proc.stderr


def test_a_huge_single_line_stays_within_memory(tmp_path: Path, rel_tokenizer: Path) -> None:
    """A 20 MB line without a line end, encoded under a 6 GB address-space limit (virtual: torch alone maps several GB)."""
    big = tmp_path / "one-line.txt"
    with big.open("w") as fh:
        for i in range(400_000):
            fh.write(WORDS[i % len(WORDS)] * 2 + " " + "x" * 40 + " ")
    argv = [sys.executable, "-m", "tupe", "pretrain", "--prepare-only", "--corpus", str(big), "--tokenizer"]
    argv += [
        str(rel_tokenizer),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    proc = subprocess.run(
        argv, env=subprocess_env(), capture_output=True, text=True, timeout=300, preexec_fn=_limited(6 << 30)
    )
    _assert_clean_outcome(proc.returncode, proc.stderr)
    assert proc.returncode == 0, proc.stderr
