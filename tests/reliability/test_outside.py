"""Hostile inputs from outside, by family (issue 26): run folders with FIFOs and `/dev/zero` links, hostile JSON
shapes, foreign files in every command's output, symbolic links in output folders, custom code in a model
folder, a real full disk.

Every case asserts the exit code, one `error:` line naming the file or option, and that nothing but tupe's own
files changed (the tree is hashed before and after). Cases that would hang or exhaust memory if mishandled run in
one subprocess (`outside_driver.py`) with a time limit per case and an address-space limit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tupe.io.outputs import update_record

from .bad_inputs import Ctx, _write
from .conftest import ROOT, assert_user_error, pretrain_args, run_cli, subprocess_env

# tupe's own bookkeeping files, which a refused command may create (its lock, its record)
_OWN = (".lock", ".lock.info", "tupe_files.json")


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (links not followed, FIFOs not opened): kind and content hash or link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            elif p.is_file():
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[rel] = ("special",)
    return out


def assert_untouched(before: dict[str, tuple], after: dict[str, tuple]) -> None:
    """Nothing that existed changed or vanished; new entries are only tupe's own bookkeeping files."""
    changed = [k for k, v in before.items() if after.get(k) != v and not Path(k).name.endswith(_OWN)]
    assert not changed, f"changed or removed: {changed}"
    added = [k for k in after if k not in before and not Path(k).name.endswith(_OWN)]
    # a refused command may leave the (empty) output folder it locked: nothing of the user's is in it
    added = [k for k in added if not (after[k] == ("dir",) and _only_own(k, after))]
    assert not added, f"added: {added}"


def _only_own(folder: str, tree: dict[str, tuple]) -> bool:
    inside = [k for k in tree if k.startswith(folder + os.sep)]
    return all(Path(k).name.endswith(_OWN) for k in inside)


# ------------------------------------------------------------------------------------------- bounded reads
def _resume_with(ctx: Ctx, name: str, kind: str) -> tuple[list, tuple[str, ...]]:
    run = Path(shutil.copytree(ctx.finished_run, ctx.tmp / f"run-{name}-{kind}"))
    (run / name).unlink()
    if kind == "fifo":
        os.mkfifo(run / name)
    else:
        (run / name).symlink_to("/dev/zero")
    needle = "FIFO (named pipe)" if kind == "fifo" else "character device"
    return ctx.pretrain(out=run, resume=True, max_steps=6), (name, needle)


def _glue_result(ctx: Ctx, kind: str) -> tuple[list, tuple[str, ...]]:
    out = ctx.tmp / f"g-{kind}"
    run = out / "runs" / "lr0.0001_seed1"
    run.mkdir(parents=True)
    update_record(out, add={"runs": "tupe glue"})
    if kind == "fifo":
        os.mkfifo(run / "result.json")
    else:
        (run / "result.json").symlink_to("/dev/zero")
    argv = [*ctx.glue("--max-train-samples", "8", "--max-eval-samples", "4")]
    argv[argv.index("--out") + 1] = out
    return argv, ("result.json", "not a regular file")


def _report(ctx: Ctx, kind: str) -> tuple[list, tuple[str, ...]]:
    d = ctx.tmp / f"rep-{kind}"
    d.mkdir()
    if kind == "fifo":
        os.mkfifo(d / "results.json")
    else:
        (d / "results.json").symlink_to("/dev/zero")
    return ["report", d], ("results.json", "not a regular file")


def _plot_dev_zero(ctx: Ctx) -> tuple[list, tuple[str, ...]]:
    run = ctx.tmp / "plot-run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to("/dev/zero")
    return ["plot", run, "--out", ctx.tmp / "plot.png"], ("metrics.jsonl", "character device")


def _json_file(ctx: Ctx, name: str, text: str) -> Path:
    return _write(ctx.tmp / "json" / name, text)


def _glue_json(ctx: Ctx, tag: str, train: str, dev: str, suffix: str = ".json") -> list:
    return ctx.glue(
        "--train-file", _json_file(ctx, f"{tag}/train{suffix}", train),
        "--dev-file", _json_file(ctx, f"{tag}/dev{suffix}", dev),
    )  # fmt: skip


_GOOD_ROWS = "\n".join(json.dumps({"sentence": f"a fine film {i}", "label": i % 2}) for i in range(8)) + "\n"


def hostile_cases(ctx: Ctx) -> list[tuple[str, list, tuple[str, ...]]]:
    cases = []
    for name in ("metrics.jsonl", "tupe_run.json", "tupe_files.json"):
        for kind in ("fifo", "zero"):
            cases.append((f"resume-{name}-{kind}", *_resume_with(ctx, name, kind)))
    for kind in ("fifo", "zero"):
        cases.append((f"glue-result-{kind}", *_glue_result(ctx, kind)))
        cases.append((f"report-results-{kind}", *_report(ctx, kind)))
    cases.append(("plot-metrics-zero", *_plot_dev_zero(ctx)))
    # JSON of the wrong shape: refused before `datasets` reads it (its reader segfaults on `null`)
    for text, what in (
        ("null", "null"),
        ("42", "a number"),
        ('"text"', "a string"),
        ("[1, 2]", "a list of a number"),
    ):
        corpus = _json_file(ctx, f"corpus-{what.replace(' ', '_')}.json", text)
        cases.append((f"corpus-json-{what}", ctx.pretrain(corpus=corpus, tokenizer=ctx.tokenizer), (what,)))
    cases.append(
        ("corpus-jsonl-null-line", ctx.pretrain(corpus=_json_file(ctx, "c.jsonl", '{"text": "a b"}\nnull\n')),
         ("c.jsonl:2", "null"))
    )  # fmt: skip
    cases.append(("eval-text-null", ["evaluate", "--model", ctx.glue_model, "--text", _json_file(ctx, "t.json", "null")],
                  ("t.json", "null")))  # fmt: skip
    cases.append(
        ("glue-train-null", _glue_json(ctx, "a", "null", _GOOD_ROWS, ".json"), ("train.json", "got null"))
    )
    cases.append(
        ("glue-dev-42", _glue_json(ctx, "b", _GOOD_ROWS, "42", ".json"), ("dev.json", "got a number"))
    )
    nested = _GOOD_ROWS + json.dumps({"sentence": {"nested": 1}, "label": 0}) + "\n"
    cases.append(("glue-dict-sentence", _glue_json(ctx, "c", nested, _GOOD_ROWS, ".jsonl"),
                  ("train.jsonl:9", "a sentence must be a string, got an object")))  # fmt: skip
    return cases


@pytest.mark.slow
def test_hostile_files_never_hang_nor_exhaust_memory(ctx: Ctx, tmp_path: Path) -> None:
    """FIFOs and /dev/zero links where tupe reads records, metrics and results; JSON of the wrong shape where it
    reads data: each refused in one line naming the file, in seconds, under a 12 GiB address-space limit (torch, arrow and tokenizers reserve several GiB of
    address space without using it)."""
    cases = hostile_cases(ctx)
    before = snapshot(ctx.tmp)
    spec = tmp_path.parent / f"{tmp_path.name}-cases.json"
    spec.write_text(json.dumps([[str(a) for a in argv] for _, argv, _ in cases]))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("outside_driver.py")), str(spec), "12", "120"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    failures = []
    for (case_id, _, needles), r in zip(cases, results, strict=True):
        try:
            assert r["seconds"] < 120, r
            assert isinstance(r["code"], int), r
            assert_user_error(r["code"], r["err"], *needles)
        except AssertionError as err:
            failures.append(f"{case_id}: {err}")
    assert not failures, "\n".join(failures)
    after = snapshot(ctx.tmp)
    # a glue output folder gets its lock; the resumed runs' cut-back metrics are their own
    assert_untouched(before, after)


# ------------------------------------------------------------------------------- foreign files in outputs
def _foreign_cases(
    ctx: Ctx, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, list, tuple[str, ...], Path]]:
    """(id, argv, needles, folder whose tree must not change)."""
    proj = ctx.tmp / "proj"
    _write(proj / "README.md", "# my project\n")
    _write(proj / "results.json", '{"mine": true}\n')
    run = Path(shutil.copytree(ctx.finished_run, ctx.tmp / "run"))
    ana = ctx.tmp / "ana"
    _write(ana / "analysis.html", "<p>mine</p>")
    rep = ctx.tmp / "rep"
    _write(rep / "notes.md", "my notes\n")
    ev = _write(ctx.tmp / "ev" / "eval.json", "{}\n")
    png = _write(ctx.tmp / "fig" / "loss.png", "not a figure\n")
    bench = _write(ctx.tmp / "bench" / "b.json", "{}\n")
    cmp_dir = ctx.tmp / "cmp"
    _write(cmp_dir / "valid_loss.md", "my table\n")
    monkeypatch.chdir(proj)
    glue_here = ctx.glue()
    glue_here[glue_here.index("--out") + 1] = "."
    glue_run = ctx.glue()
    glue_run[glue_run.index("--out") + 1] = run
    return [
        ("glue-out-dot", glue_here, ("--out . holds 'results.json', which tupe did not write",), proj),
        ("glue-out-run", glue_run, ("holds 'README.md', which `tupe pretrain` wrote", "`tupe glue` would"), run),
        ("analyze-out", ["analyze", "--model", ctx.glue_model, "--out", ana], ("'analysis.html'",), ana),
        ("report-out-csv", ["report", ctx.tmp, "--out", rep / "notes.csv"], ("notes.md exists and tupe did not",), rep),
        ("evaluate-json", ["evaluate", "--model", ctx.glue_model, "--text", ctx.corpus, "--json", ev],
         ("eval.json exists and tupe did not write it",), ev.parent),
        ("plot-out", ["plot", ctx.finished_run, "--out", png], ("loss.png exists and tupe did not write it",),
         png.parent),
        ("bench-json", ["bench", "--preset", "mini", "--json", bench], ("b.json exists and tupe did not",),
         bench.parent),
        ("compare-out", ["compare", *pretrain_args(ctx.corpus, ctx.tokenizer, ctx.cache, cmp_dir)[1:],
                         "--schemes", "bert-a,tupe-a"], ("holds 'valid_loss.md', which tupe did not write",), cmp_dir),
    ]  # fmt: skip


def test_foreign_files_in_every_commands_output_are_never_written_over(
    ctx: Ctx, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _case, argv, needles, folder in _foreign_cases(ctx, monkeypatch):
        before = snapshot(folder)
        code, _, err = run_cli(argv, capsys)
        assert_user_error(code, err, *needles)
        assert_untouched(before, snapshot(folder))


def test_overwrite_keeps_a_users_file_named_like_a_temporary_file(
    ctx: Ctx, capsys: pytest.CaptureFixture
) -> None:
    run = Path(shutil.copytree(ctx.finished_run, ctx.tmp / "run"))
    for name in (".README.md.draft.tmp", ".notes.tmp", ".metrics.jsonl.a1b2c3d4.tmp"):
        _write(run / name, "mine\n")
    code, _, err = run_cli(ctx.pretrain(out=run, overwrite=True), capsys)
    assert code == 0, err
    for name in (".README.md.draft.tmp", ".notes.tmp", ".metrics.jsonl.a1b2c3d4.tmp"):
        assert (run / name).read_text() == "mine\n", name


# ------------------------------------------------------------------------------- symbolic links in outputs
def test_a_symlinked_output_subfolder_is_never_written_or_deleted_through(
    ctx: Ctx, capsys: pytest.CaptureFixture
) -> None:
    elsewhere = ctx.tmp / "elsewhere"
    _write(elsewhere / "lr0.0001_seed1" / "precious.txt", "keep me\n")
    out = ctx.tmp / "out"
    out.mkdir()
    (out / "runs").symlink_to(elsewhere)
    before = snapshot(ctx.tmp)
    argv = ctx.glue()
    argv[argv.index("--out") + 1] = out
    code, _, err = run_cli(argv, capsys)
    assert_user_error(code, err, "holds 'runs', which tupe did not write")
    assert_untouched(before, snapshot(ctx.tmp))
    # a comparison whose scheme folder is a link elsewhere
    cmp_dir = ctx.tmp / "cmp"
    cmp_dir.mkdir()
    (cmp_dir / "bert-a").symlink_to(elsewhere)
    before = snapshot(ctx.tmp)
    argv = [
        "compare",
        *pretrain_args(ctx.corpus, ctx.tokenizer, ctx.cache, cmp_dir)[1:],
        "--schemes",
        "bert-a,tupe-a",
    ]
    code, _, err = run_cli(argv, capsys)
    assert_user_error(code, err, "holds 'bert-a'")
    assert_untouched(before, snapshot(ctx.tmp))


# ------------------------------------------------------------------------------------------- custom code
def test_custom_code_in_a_model_folder_is_refused_without_a_prompt(
    ctx: Ctx, capsys: pytest.CaptureFixture
) -> None:
    from .bad_inputs import _custom_code_model

    model = _custom_code_model(ctx)
    for argv in (ctx.glue(model=model), ["evaluate", "--model", model, "--text", ctx.corpus],
                 ["analyze", "--model", model, "--out", ctx.tmp / "a", "--text", ctx.corpus]):  # fmt: skip
        code, _, err = run_cli(argv, capsys)
        assert_user_error(code, err, "auto_map asks to run custom code", "evil_tok")
    assert not (ctx.tmp / "RAN").exists()


# -------------------------------------------------------------------------------------------- disk full
@pytest.fixture()
def small_fs(tmp_path: Path):  # noqa: ANN201
    """A real 1 MB tmpfs (mounting needs root; skipped with the reason otherwise)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_a_real_full_disk_while_checkpointing_is_one_line_and_leaves_no_staging_folder(
    ctx: Ctx, small_fs: Path, capsys: pytest.CaptureFixture
) -> None:
    out = small_fs / "run"
    code, _, err = run_cli(ctx.pretrain(out=out, max_steps=8), capsys)
    line = assert_user_error(
        code, err, f"cannot write {out}/checkpoint-", "No space left on device", "was not saved"
    )
    assert "modeling_tupe.py" not in line or str(out) in line.split("modeling_tupe.py")[0]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp-")], sorted(
        p.name for p in out.iterdir()
    )
    from tupe.training.checkpointing import verify_checkpoint

    for ckpt in out.glob("checkpoint-*"):  # what was kept is complete
        assert verify_checkpoint(ckpt) is None, ckpt


@pytest.mark.slow
def test_a_real_full_disk_under_analyze_leaves_no_file_and_says_so(
    ctx: Ctx, small_fs: Path, capsys: pytest.CaptureFixture
) -> None:
    """Issue 38: `tupe analyze --out` on a full disk left figures and tupe_files.json while saying "nothing was
    written". The figures fill the 1 MB file system: none of the files stays, and the message says so."""
    _write(small_fs / "filler", os.urandom(900_000))
    out = small_fs / "a"
    code, _, err = run_cli(["analyze", "--model", ctx.glue_model, "--out", out, "--no-progress"], capsys)
    assert_user_error(
        code, err, f"cannot write {out}/", "No space left on device", "none of its 5 files was written"
    )
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == [], sorted(out.iterdir())


# ------------------------------------------------------------------------------------------------ caches
@pytest.mark.slow
def test_damaged_caches_are_rebuilt_not_trusted(
    ctx: Ctx, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Random bytes in a cached `stream.bin` (same size) and a swapped cached `tokenizer.json` are detected by
    their recorded SHA-256 and rebuilt with a warning; the run then succeeds."""
    cache = tmp_path / "cache"
    argv = pretrain_args(ctx.corpus, ctx.tokenizer, cache, tmp_path / "r1", max_steps=2)
    argv[argv.index("--tokenizer") : argv.index("--tokenizer") + 2] = ["--vocab-size", "300"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    (stream,) = cache.glob("packed/*/stream.bin")
    stream.write_bytes(os.urandom(stream.stat().st_size))
    (tok,) = cache.glob("tokenizers/*/tokenizer.json")
    data = json.loads(tok.read_text())
    data["model"]["vocab"]["zzz-swapped"] = data["model"]["vocab"].pop(next(iter(data["model"]["vocab"])))
    tok.write_text(json.dumps(data))
    argv[argv.index("--out") + 1] = str(tmp_path / "r2")
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "cached tokenizer" in err and "does not match its recorded SHA-256" in err, err
    assert "cached token stream" in err, err


def test_a_tokenizer_pretrain_accepts_is_one_glue_accepts(ctx: Ctx, capsys: pytest.CaptureFixture) -> None:
    data = json.loads((ctx.tokenizer / "tokenizer.json").read_text())
    data["post_processor"] = None  # no [CLS] A [SEP] B [SEP]: GLUE would refuse the model hours later
    bare = _write(ctx.tmp / "bare" / "tokenizer.json", json.dumps(data))
    code, _, err = run_cli(ctx.pretrain(tokenizer=bare), capsys)
    assert_user_error(code, err, "does not wrap a sentence pair as [CLS] A [SEP] B [SEP]")
