"""`tupe evaluate` from the command line: the table, the JSON file, and one-line errors."""

from __future__ import annotations

import gzip
import json
import os

from tupe.cli import main

from .conftest import save_bert, save_tupe


def cli(capsys, *argv):
    capsys.readouterr()  # drop what making the fixtures printed
    rc = main(["evaluate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def cli_error(capsys, *argv) -> str:
    """Run with --quiet (no log lines, no bars); the command must fail with exit code 2 and one line."""
    rc, out, err = cli(capsys, *argv, "--quiet")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_table_and_json(tmp_path, tokenizer, text_file, capsys):
    a = save_tupe(tmp_path / "a", tokenizer, "tupe-a", seed=1)
    b = save_tupe(tmp_path / "b", tokenizer, "bert-a", seed=2)
    bert = save_bert(tmp_path / "bert")
    out_json = tmp_path / "out" / "eval.json"
    rc, out, err = cli(
        capsys,
        "--model", str(a), str(b), str(bert),
        "--text", str(text_file),
        "--bootstrap", "100", "--pppl-tokens", "30", "--max-blocks", "15", "--threads", "1",
        "--no-progress", "--json", str(out_json),
    )  # fmt: skip
    assert rc == 0, err
    result = json.loads(out_json.read_text())
    assert result["command"].startswith("tupe evaluate --model ")
    assert "--max-blocks 15" in result["command"]
    assert {"tupe", "torch", "transformers", "python"} <= set(result["versions"])
    # paths relative to the JSON's folder: a committed record names no folder of the machine that made it
    assert result["text"]["files"] == [os.path.relpath(text_file, out_json.parent)]
    assert (
        f"--model ../a ../b ../bert --text {os.path.relpath(text_file, out_json.parent)}" in result["command"]
    )
    assert [m["path"] for m in result["models"]] == ["../a", "../b", "../bert"]
    assert result["text"]["bytes"] == text_file.stat().st_size
    groups = result["tokenizer_groups"]
    assert [g["models"] for g in groups] == [[str(a), str(b)], [str(bert)]]  # names: as given
    for g in groups:
        assert g["blocks"] == 15 and g["masked_tokens"] > 0 and g["pppl_tokens"] == 30 and g["tokens"] > 0
    assert [d["a"] + "|" + d["b"] for d in groups[0]["differences"]] == [f"{a}|{b}"]
    assert groups[1]["differences"] == []  # different tokenizers: no paired difference
    models = {m["name"]: m for m in result["models"]}
    for name, m in models.items():
        loss = m["loss"]
        assert loss["low"] <= loss["value"] <= loss["high"]
        # the terminal row of each model shows the JSON's numbers
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert f"{loss['value']:.3f} [{loss['low']:.3f}, {loss['high']:.3f}]" in row
        assert f"{m['perplexity']['value']:,.2f}" in row
        delta = m["word_order_delta"]["value"]
        assert f"{0.0 if round(delta, 3) == 0 else delta:+.3f}" in row  # an untrained model: "+0.000"
    unigram_rows = [line for line in out.splitlines() if line.startswith("unigram")]
    assert len(unigram_rows) == 2
    assert f"{groups[0]['unigram']['loss']['value']:.3f}" in unigram_rows[0]
    diff = groups[0]["differences"][0]["loss"]
    assert f"{a} - {b}" in out and f"{diff['value']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]" in out
    assert "evaluating" in err  # log lines go to stderr, the table to stdout


def test_gz_text_and_quiet(tmp_path, tokenizer, text_file, capsys):
    model = save_tupe(tmp_path / "m", tokenizer)
    gz = tmp_path / "text.txt.gz"
    gz.write_bytes(gzip.compress(text_file.read_bytes()))
    runs = []
    for text in (text_file, gz):
        path = tmp_path / f"{text.name}.json"
        rc, out, err = cli(
            capsys,
            "--model",
            str(model),
            "--text",
            str(text),
            "--quiet",
            "--bootstrap",
            "50",
            "--json",
            str(path),
        )
        assert rc == 0 and err == "" and "loss" in out
        runs.append(json.loads(path.read_text()))
    plain, packed = (r["models"][0] for r in runs)
    assert plain["loss"] == packed["loss"] and plain["pseudo_loss"] == packed["pseudo_loss"]


def test_without_text_the_built_in_book_is_evaluated(tmp_path, tokenizer, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file named built-in here: the name means the shipped book
    model = save_tupe(tmp_path / "m", tokenizer)
    path = tmp_path / "eval.json"
    argv = ("--model", str(model), "--quiet", "--bootstrap", "20", "--max-blocks", "4", "--pppl-tokens", "10")
    rc, out, err = cli(capsys, *argv, "--json", str(path))
    assert rc == 0 and err == "", err
    omitted = json.loads(path.read_text())
    rc, out_named, err = cli(capsys, *argv, "--text", "built-in", "--json", str(path))
    assert rc == 0, err
    named = json.loads(path.read_text())
    assert " --text built-in" in omitted["command"]
    assert (
        omitted["text"]["files"] == named["text"]["files"]
        and "Great Astronomers" in omitted["text"]["description"]
    )
    assert omitted["models"][0]["loss"] == named["models"][0]["loss"] and out == out_named


def test_not_a_checkpoint_folder(tmp_path, tokenizer, text_file, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    err = cli_error(capsys, "--model", str(empty), "--text", str(text_file))
    assert err == (
        f"tupe evaluate: error: {empty}: not a masked-LM checkpoint: no config.json "
        "(expected a folder written by `tupe pretrain` or save_pretrained)"
    )


def test_classifier_checkpoint_has_no_masked_lm_head(tmp_path, tokenizer, text_file, capsys):
    from tupe import TupeForSequenceClassification

    from .conftest import tiny_config

    path = tmp_path / "classifier"
    TupeForSequenceClassification(tiny_config(len(tokenizer), num_labels=2)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    err = cli_error(capsys, "--model", str(path), "--text", str(text_file))
    assert f"{path}: not a masked-LM checkpoint: no masked-LM head" in err and "lm_head." in err


def test_folder_without_weights_or_tokenizer(tmp_path, tokenizer, text_file, capsys):
    path = save_tupe(tmp_path / "m", tokenizer)
    (path / "model.safetensors").unlink()
    err = cli_error(capsys, "--model", str(path), "--text", str(text_file))
    assert f"{path}: no model weights (model.safetensors)" in err

    path = save_tupe(tmp_path / "n", tokenizer)
    for f in path.glob("tokenizer*"):
        f.unlink()
    err = cli_error(capsys, "--model", str(path), "--text", str(text_file))
    assert f"{path}: no tokenizer files" in err


def test_empty_text_file(tmp_path, tokenizer, capsys):
    model = save_tupe(tmp_path / "m", tokenizer)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    err = cli_error(capsys, "--model", str(model), "--text", str(empty))
    assert err == f"tupe evaluate: error: corpus file {empty} is empty (no text)"


def test_text_too_short_for_one_block(tmp_path, tokenizer, capsys):
    model = save_tupe(tmp_path / "m", tokenizer)  # max length 32
    short = tmp_path / "short.txt"
    short.write_text("cat dog cat\n")
    err = cli_error(capsys, "--model", str(model), "--text", str(short))
    assert "4 tokens (with document separators)" in err  # 3 words + the document's [SEP]
    assert "make no block of 32 tokens, which needs 31 tokens after [CLS]" in err


def test_bad_options(tmp_path, tokenizer, text_file, capsys):
    model = save_tupe(tmp_path / "m", tokenizer)
    err = cli_error(capsys, "--model", str(model), "--text", str(text_file), "--mlm-probability", "1.5")
    assert "argument --mlm-probability: must be a finite number > 0 and < 1, got 1.5" in err
    for flag, value, allowed in (
        ("--threads", "0", "from 1 to 1024"),
        ("--batch-size", "-3", ">= 1"),
        ("--bootstrap", "x", "from 0 to 100000"),
    ):
        err = cli_error(capsys, "--model", str(model), "--text", str(text_file), flag, value)
        assert f"argument {flag}: must be an integer {allowed}, got" in err, err
    err = cli_error(capsys, "--model", str(model), "--text", str(text_file), "--max-seq-len", "64")
    assert "--max-seq-len 64 must be between 2 and the models' max length 32" in err
    err = cli_error(capsys, "--model", str(model), str(model), "--text", str(text_file))
    assert "is given twice" in err


def test_numeric_flags_are_checked_when_parsed_with_the_range_in_help(tmp_path, tokenizer, text_file, capsys):
    from tupe.cli import build_parser

    model = save_tupe(tmp_path / "m", tokenizer)
    base = ("--model", str(model), "--text", str(text_file))
    for flag, value, needle in (
        ("--max-blocks", "0", "must be an integer >= 1, got 0"),
        ("--max-seq-len", "1", "must be an integer from 2 to 1048576, got 1"),
        ("--max-length", "1", "must be an integer from 2 to 1048576, got 1"),  # the older spelling
        ("--batch-size", "-3", "must be an integer >= 1, got -3"),
        ("--seed", "-1", "must be an integer from 0 to 4294967295, got -1"),
        ("--pppl-tokens", "many", "must be an integer >= 0, got 'many'"),
        ("--bootstrap", "-1", "must be an integer from 0 to 100000, got -1"),
        ("--bootstrap", "1000000000", "must be an integer from 0 to 100000, got 1000000000"),
        ("--threads", "0", "must be an integer from 1 to 1024, got 0"),
        ("--mlm-probability", "nan", "must be a finite number > 0 and < 1, got nan"),
        ("--json", "", "must be a path, got an empty string"),
    ):
        err = cli_error(capsys, *base, flag, value)
        assert f"argument {flag}: {needle}" in err, err
    help_text = build_parser("evaluate")._subparsers._group_actions[0].choices["evaluate"].format_help()
    assert "[an integer >= 1]" in help_text and "[a finite number > 0 and < 1]" in " ".join(help_text.split())


def test_path_flags_are_checked_before_any_work(tmp_path, tokenizer, text_file, capsys):
    model = save_tupe(tmp_path / "m", tokenizer)
    base = ("--model", str(model), "--text", str(text_file))
    err = cli_error(capsys, *base, "--json", str(tmp_path))
    assert err == f"tupe evaluate: error: --json {tmp_path} is a folder, expected a file"
    a_file = tmp_path / "f"
    a_file.write_text("x")
    err = cli_error(capsys, *base, "--json", str(a_file / "out.json"))
    assert f"--json {a_file / 'out.json'}: {a_file} is a file, not a folder" in err
    err = cli_error(capsys, "--model", str(a_file), "--text", str(text_file))
    assert err == f"tupe evaluate: error: --model {a_file} is a file, expected a folder"
    err = cli_error(capsys, *base, "--tokenizer", str(tmp_path / "nope"))
    assert err == f"tupe evaluate: error: --tokenizer {tmp_path / 'nope'}: no such folder"
    err = cli_error(capsys, *base, "--cache-dir", str(a_file))
    assert err == f"tupe evaluate: error: --cache-dir {a_file} is a file, not a folder"


def test_a_second_writer_of_the_json_file_is_refused_and_a_dead_ones_lock_taken_over(
    tmp_path, tokenizer, text_file, capsys
):
    import signal

    from ..helpers import hold_lock

    model = save_tupe(tmp_path / "m", tokenizer)
    out_json = tmp_path / "res" / "eval.json"
    args = ("--model", str(model), "--text", str(text_file), "--bootstrap", "0", "--pppl-tokens", "0")
    holder = hold_lock("file_lock", out_json, "tupe evaluate")
    try:
        err = cli_error(capsys, *args, "--json", str(out_json))
        assert f"{out_json}: another `tupe evaluate` is writing it (pid {holder.pid} " in err
        assert not out_json.exists()
        other = tmp_path / "res" / "other.json"  # another file of the same folder is not locked
        rc, _, err = cli(capsys, *args, "--json", str(other), "--quiet")
        assert rc == 0 and other.is_file(), err
        holder.send_signal(signal.SIGKILL)  # the holder dies: its lock is taken over
        holder.wait()
        rc, _, err = cli(capsys, *args, "--json", str(out_json), "--quiet")
        assert rc == 0 and json.loads(out_json.read_text())["models"], err
    finally:
        holder.kill()
        holder.wait()
