"""The study runner (`python -m tupe.comparison.study`): its evaluation and summary stages on tiny runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.glue.fixtures import write_task
from tests.training.conftest import tiny_cli_args
from tupe.cli import main as cli
from tupe.comparison.study import main
from tupe.errors import TupeError


@pytest.mark.slow
def test_study_stages_on_tiny_runs(
    tiny_corpus: Path,
    tiny_tokenizer_dir: Path,
    cache_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    out = tmp_path / "study"
    args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir) + ["--max-steps", "2"]
    assert (
        cli(["compare", "--schemes", "bert-a,rope", "--seeds", "0,1", "--out", str(out / "runs"), *args]) == 0
    )
    text = sorted(tiny_corpus.iterdir())[0]
    news = tmp_path / "news.txt"
    news.write_text("Stocks rose on Monday.\nThe bank said rates would stay.\n\nOil fell.\n" * 20)
    common = ["--out", str(out), "--schemes", "bert-a,rope", "--seeds", "0,1", "--max-blocks", "4",
              "--length-text", str(text), "--length-factors", "1,2", "--cache-dir", str(cache_dir), "--no-progress",
              "--extend-methods", "none,interpolate,yarn", "--probe-text", str(text), "--probe-distances", "4,40",
              "--probe-blocks", "3", "--ood-text", str(news)]  # fmt: skip
    assert main([*common, "--stages", "ood,lengths,passkey,summary"]) == 0
    ood = json.loads((out / "ood-built-in.json").read_text())
    assert [m["name"] for m in ood["models"]] == [
        "bert-a/seed-0",
        "bert-a/seed-1",
        "rope/seed-0",
        "rope/seed-1",
    ]
    news_result = json.loads((out / "ood-news.json").read_text())
    assert news_result["text"]["files"] == ["../news.txt"]  # relative to the record's folder
    # each method with the runs it applies to: none every run, interpolate the learned table, yarn rope
    expected = {"none": ["bert-a", "rope"], "interpolate": ["bert-a"], "yarn": ["rope"]}
    for ext, schemes in expected.items():
        lengths = json.loads((out / f"lengths-{ext}.json").read_text())
        assert lengths["lengths"] == [32, 64] and lengths["extend_positions"] == ext
        assert sorted({e["model"].split("/")[0] for e in lengths["by_length"]}) == schemes
        assert len(lengths["by_length"]) == 2 * 2 * len(schemes)
        assert (out / f"lengths-{ext}.png").stat().st_size > 0
        passkey = json.loads((out / f"passkey-{ext}.json").read_text())
        assert passkey["settings"]["distances"] == [4, 40] and passkey["settings"]["extend_positions"] == ext
        assert sorted({e["model"].split("/")[0] for e in passkey["by_distance"]}) == schemes
    none = json.loads((out / "lengths-none.json").read_text())
    assert [e["evaluated"] for e in none["by_length"] if e["length"] == 64] == [False, False, True, True]
    yarn = json.loads((out / "lengths-yarn.json").read_text())
    assert [e["extended"] for e in yarn["by_length"]] == [None, None, "yarn", "yarn"]
    table = (out / "study.md").read_text()
    assert "| bert-a |" in table and "| rope |" in table and "L=64 (interpolate)" in table
    assert "news: loss" in table and "news: tokens/word" in table and "passkey d=40 (yarn)" in table
    assert "copying d=40 (yarn)" in table and "copying d=4 (none)" in table
    row = next(line for line in table.splitlines() if line.startswith("| bert-a |"))
    assert row.count("±") >= 4  # mean ± std over the two seeds in every filled column
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert cells[header.index("L=64 (yarn)")] == "-"  # yarn is not bert-a's method
    assert float(cells[header.index("news: tokens/word")]) > 1.0
    # --resume keeps the finished stages
    mtime = (out / "ood-built-in.json").stat().st_mtime_ns
    assert main([*common, "--stages", "ood,summary", "--resume"]) == 0
    assert (out / "ood-built-in.json").stat().st_mtime_ns == mtime

    # a passkey stage cut short after two of four models resumes after them: the partial file keeps each finished
    # model's entries, and the finished file equals the uninterrupted one
    from tupe.evaluation import passkey as passkey_module

    whole = json.loads((out / "passkey-none.json").read_text())["by_distance"]
    (out / "passkey-none.json").unlink()
    probe = passkey_module.passkey_probe

    def cut_after_two(models, corpus, settings, log, on_model):  # noqa: ANN001, ANN202
        def stop(name, entries):  # noqa: ANN001, ANN202
            on_model(name, entries)
            if len(json.loads((out / "passkey-none.partial.json").read_text())["models"]) == 2:
                raise KeyboardInterrupt

        return probe(models, corpus, settings, log=log, on_model=stop)

    monkeypatch.setattr(passkey_module, "passkey_probe", cut_after_two)
    with pytest.raises(KeyboardInterrupt):
        main([*common, "--stages", "passkey", "--resume", "--extend-methods", "none"])
    monkeypatch.undo()
    assert not (out / "passkey-none.json").exists()
    kept = json.loads((out / "passkey-none.partial.json").read_text())["models"]
    assert list(kept) == ["bert-a/seed-0", "bert-a/seed-1"]
    capsys.readouterr()
    assert main([*common, "--stages", "passkey", "--resume", "--extend-methods", "none"]) == 0
    assert "2 run(s) (2 kept from passkey-none.partial.json)" in capsys.readouterr().out
    assert json.loads((out / "passkey-none.json").read_text())["by_distance"] == whole
    assert not (out / "passkey-none.partial.json").exists()

    # a lengths stage cut short after the first of its two lengths resumes at the second, and ends equal to the
    # uninterrupted one (the kept length is not evaluated again)
    from tupe.evaluation import lengths as lengths_module

    whole = json.loads((out / "lengths-none.json").read_text())
    (out / "lengths-none.json").unlink()
    evaluate_lengths = lengths_module.evaluate_lengths

    def cut_after_one(*args, on_length, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        def stop(length, share):  # noqa: ANN001, ANN202
            on_length(length, share)
            raise KeyboardInterrupt

        return evaluate_lengths(*args, on_length=stop, **kwargs)

    monkeypatch.setattr(lengths_module, "evaluate_lengths", cut_after_one)
    with pytest.raises(KeyboardInterrupt):
        main([*common, "--stages", "lengths", "--resume", "--extend-methods", "none"])
    monkeypatch.undo()
    partial = json.loads((out / "lengths-none.partial.json").read_text())
    assert list(partial["lengths"]) == ["32"]
    partial["lengths"]["64"] = {"run": None}  # a damaged share: evaluated again, not read
    (out / "lengths-none.partial.json").write_text(json.dumps(partial))
    evaluated: list[int] = []

    def count(models, corpus, length, *rest):  # noqa: ANN001, ANN002, ANN202
        evaluated.append(length)
        return at_length(models, corpus, length, *rest)

    at_length = lengths_module._evaluate_at
    monkeypatch.setattr(lengths_module, "_evaluate_at", count)
    capsys.readouterr()
    assert main([*common, "--stages", "lengths", "--resume", "--extend-methods", "none"]) == 0
    monkeypatch.undo()
    assert evaluated == [64]
    assert "4 run(s) (1 length(s) kept from lengths-none.partial.json)" in capsys.readouterr().out
    again = json.loads((out / "lengths-none.json").read_text())
    assert again["by_length"] == whole["by_length"] and again["lengths"] == whole["lengths"] == [32, 64]
    assert [r["length"] for r in again["runs"]] == [32, 64] and again["text"] == whole["text"]
    assert not (out / "lengths-none.partial.json").exists()

    # CoLA and SST-2 for the seed-0 runs only, whole training sets, one learning rate and two fine-tuning seeds
    # (time), two `tupe glue` processes at a time; the summary gains a column per task. It starts while a seed-1
    # run is unfinished (no config.json yet), which the evaluation stages refuse by name
    (out / "runs" / "rope" / "seed-1" / "config.json").rename(tmp_path / "rope-seed-1-config.json")
    capsys.readouterr()
    assert main([*common, "--stages", "ood", "--resume"]) == 2
    assert "runs not finished: rope/seed-1" in capsys.readouterr().err
    for task in ("SST-2", "CoLA"):
        write_task(tmp_path / "glue", task, n_train=8, n_dev=8)
    glue = ["--glue-data", str(tmp_path / "glue"), "--glue-tasks", "SST-2,CoLA", "--glue-train-samples", "all",
            "--glue-seeds", "1,2", "--glue-pretrain-seeds", "0", "--glue-lrs", "1e-4", "--parallel", "2"]  # fmt: skip
    assert main([*common, *glue, "--stages", "glue,summary", "--resume"]) == 0
    assert sorted(p.name for p in (out / "glue").glob("*-seed-*")) == [
        "CoLA-bert-a-seed-0",
        "CoLA-rope-seed-0",
        "SST-2-bert-a-seed-0",
        "SST-2-rope-seed-0",
    ]
    result = json.loads((out / "glue" / "CoLA-rope-seed-0" / "results.json").read_text())
    assert result["settings"]["max_train_samples"] is None and result["data"]["train_examples"] == 8
    assert sorted(r["seed"] for r in result["runs"]) == [1, 2]
    table = (out / "study.md").read_text()
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[-2:] == ["SST-2 dev acc.", "CoLA dev mcc"]
    majority = next(line for line in table.splitlines() if line.startswith("| majority class |"))
    assert [c.strip() for c in majority.strip("|").split("|")][-2:] == [
        "50.00",
        "0.00",
    ]  # 4 of 8 dev rows each
    row = next(line for line in table.splitlines() if line.startswith("| rope |"))
    assert row.rstrip(" |").endswith("(1 pre-training seed)") and row.count("(1 pre-training seed)") == 2


def _model(seed: int) -> dict:
    return {"name": f"bert-a/seed-{seed}", "loss": {"value": 5.0 + seed}, "word_order_delta": {"value": 1.0}}


def _entry(seed: int, key: str, x: int) -> dict:
    return {"model": f"bert-a/seed-{seed}", key: x, "evaluated": True, "loss": {"value": 6.0 + seed},
            "accuracy_minus_guess": {"value": 0.1 * seed}}  # fmt: skip


def _stage_files(out: Path) -> dict[str, str]:
    """Stage files of a study of bert-a x seeds 0,1 (the keys the summary reads, values made up)."""
    model, entry = _model, _entry
    files = {
        "ood-built-in.json": {"models": [model(0), model(1)]},
        "lengths-none.json": {"settings": {"lengths": [32]}, "by_length": [entry(0, "length", 32), entry(1, "length", 32)]},
        "passkey-none.json": {"settings": {"distances": [4]}, "by_distance": [entry(0, "distance", 4), entry(1, "distance", 4)]},
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (out / name).write_text(json.dumps(value))
    return {name: (out / name).read_text() for name in files}


@pytest.mark.parametrize(
    "name, damage, needle",
    [
        ("lengths-none.json", lambda t: t[: len(t) // 2], "lengths-none.json:1: not valid JSON"),  # cut short
        ("ood-built-in.json", lambda t: "", "ood-built-in.json:1: not valid JSON"),  # emptied
        ("lengths-none.json", lambda t: t.replace('"by_length"', '"rows"'), "no 'by_length'"),  # was KeyError
        (
            "passkey-none.json",
            lambda t: t.replace('"evaluated"', '"done"'),
            "an entry of 'by_distance' lacks",
        ),
    ],
)
def test_a_damaged_stage_file_is_done_again_on_resume_and_named_by_the_summary(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    name: str,
    damage,
    needle: str,  # noqa: ANN001
) -> None:
    """Issue 49, item 15: --resume kept a stage file that merely existed (truncated, empty, missing keys) and the
    summary then died on it (`JSONDecodeError`, `KeyError: 'by_length'`)."""
    from tupe.comparison.study import _done

    out = tmp_path / "study"
    texts = _stage_files(out)
    common = [
        "--out",
        str(out),
        "--schemes",
        "bert-a",
        "--seeds",
        "0,1",
        "--extend-methods",
        "none",
        "--no-progress",
    ]
    assert main([*common, "--stages", "summary"]) == 0  # whole files: read
    (out / name).write_text(damage(texts[name]))
    capsys.readouterr()
    assert main([*common, "--stages", "summary"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("study: error:") and "\n" not in err and name in err and needle in err, err
    logged: list[str] = []
    assert _done(out / name, True, logged.append) is False  # --resume does the stage again
    assert needle in logged[0] and "the stage is done again" in logged[0]
    assert _done(
        out / "ood-built-in.json" if "ood" not in name else out / "lengths-none.json", True, logged.append
    )


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--ood-text", "NOPE"], "--ood-text: corpus path not found"),  # was: found after the train stage
        (["--stages", "train,passkey", "--probe-text", "NOPE"], "--probe-text: corpus path not found"),
        (
            ["--glue-pretrain-seeds", "0,7"],
            "--glue-pretrain-seeds 0,7: seed(s) 7 are not among the study's --seeds",
        ),
        (["--stages", "train,ood,train"], "--stages: train given more than once"),
        (["--glue-data", "NOPE"], "--glue-data"),
        (["--glue-tasks", "SST-2,CoLB"], "(unknown: CoLB)"),
        (["--glue-tasks", "SST-2,sst2"], "each once"),
        (["--glue-train-samples", "0"], "give a number of examples >= 1, or all"),
        (["--preset", "base"], "--preset: invalid choice: 'base'"),
    ],
)
def test_flags_are_checked_before_the_train_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], needle: str
) -> None:
    """Issue 49, item 16: a missing --ood-text was reported after the whole train stage, naming `tupe evaluate`'s
    flags; --glue-pretrain-seeds outside --seeds said "run tupe glue first"."""
    out = tmp_path / "study"
    extra = [str(tmp_path / "nope.txt") if a == "NOPE" else a for a in extra]
    argv = ["--out", str(out), "--schemes", "bert-a", "--seeds", "0,1", "--max-steps", "1", "--no-progress"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("study: error:") and "\n" not in err and needle in err, err
    assert not (out / "runs").exists()  # nothing trained


def test_glue_tasks_take_any_spelling_tupe_glue_takes() -> None:
    """--glue-tasks names the study's GLUE folders by each task's canonical name, whatever spelling was given."""
    from tupe.comparison.study import glue_tasks

    assert glue_tasks("sst2, cola,MRPC") == ["SST-2", "CoLA", "MRPC"]
    with pytest.raises(argparse.ArgumentTypeError, match="each once"):
        glue_tasks("CoLA,cola")


def test_the_summary_reads_final_losses_from_the_runs_without_a_covering_comparison(tmp_path: Path) -> None:
    """A study folder whose runs/ holds the runs of several comparisons (RESULTS G's rope and deberta beside the
    paper's four) has no `tupe compare` record of them all: each scheme's final losses come from its runs, for a
    scheme whose runs have all finished."""
    from tupe.comparison.study import summarize

    for scheme, seeds in (("bert-a", (0, 1)), ("rope", (0, 1))):
        for k in seeds:
            run = tmp_path / "runs" / scheme / f"seed-{k}"
            run.mkdir(parents=True)
            curve = [{"step": 10, "eval_loss": 7.0}, {"step": 20, "eval_loss": 6.0 - k}]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
            if not (scheme == "rope" and k == 1):  # rope seed 1 still training
                (run / "pretrain_summary.json").write_text(json.dumps({"steps": 20}))
    # a record of another comparison (other seeds) is not used
    (tmp_path / "runs" / "compare_summary.json").write_text(
        json.dumps({"seeds": [0], "stats": {"schemes": {}}})
    )
    rows = summarize(tmp_path, ["bert-a", "rope"], [0, 1], texts=[])["rows"]
    assert rows["bert-a"]["final_losses"] == [6.0, 5.0] and "final_losses" not in rows["rope"]
    (tmp_path / "runs" / "compare_summary.json").write_text('{"seeds": [0')  # cut short: named, no traceback
    with pytest.raises(TupeError, match="compare_summary.json: not a tupe compare record"):
        summarize(tmp_path, ["bert-a", "rope"], [0, 1], texts=[])


def test_glue_data_folders_are_found_as_tupe_glue_finds_them(tmp_path: Path) -> None:
    """--glue-data: a task's folder under any spelling `tupe glue` takes (`cola/`) is accepted before the train
    stage; a root without one of the tasks is refused naming it."""
    from tupe.comparison.study import check_inputs, parse_args

    (tmp_path / "glue" / "cola").mkdir(parents=True)
    (tmp_path / "glue" / "SST-2").mkdir()
    base = ["--out", str(tmp_path / "study"), "--glue-data", str(tmp_path / "glue"), "--stages", "glue"]
    check_inputs(parse_args([*base, "--glue-tasks", "CoLA,sst2"]), ["glue"], [0, 1])
    with pytest.raises(TupeError, match=r"no folder for MRPC in it \(e.g. MRPC/\)"):
        check_inputs(parse_args([*base, "--glue-tasks", "CoLA,MRPC"]), ["glue"], [0, 1])


def test_a_partial_file_is_kept_only_when_whole_and_made_with_the_same_settings(
    tmp_path: Path,
) -> None:
    from tupe.comparison.study import _read_partial

    said: list[str] = []
    key = {"distances": [16, 64], "blocks": 100, "extend": "none", "text": "built-in"}
    partial = tmp_path / "passkey-none.partial.json"
    assert _read_partial(partial, key, "models", said.append) == {} and said == []  # none yet: nothing to say
    models = {"rope/seed-0": [{"model": "rope/seed-0", "distance": 16}]}
    partial.write_text(json.dumps({"key": key, "models": models}))
    assert _read_partial(partial, key, "models", said.append) == models
    assert _read_partial(partial, {**key, "blocks": 50}, "models", said.append) == {}
    assert "made with other runs, settings or text; the method starts again" in said[-1]
    for damaged in ('{"key": {}, "models": [1]}', '{"key": ', ""):
        partial.write_text(damaged)
        assert _read_partial(partial, key, "models", said.append) == {}
        assert "is unreadable; the method starts again from its first model" in said[-1]
    lengths = tmp_path / "lengths-none.partial.json"  # the lengths stage's file: its lengths by number
    lengths.write_text(json.dumps({"key": key, "lengths": {"128": {"run": None, "entries": []}}}))
    # read as it is: the stage itself redoes a share that lacks a field
    assert list(_read_partial(lengths, key, "lengths", said.append)) == ["128"]
    lengths.write_text(json.dumps({"key": key, "lengths": []}))
    assert _read_partial(lengths, key, "lengths", said.append) == {}
    assert "is unreadable; the method starts again from its first length" in said[-1]
