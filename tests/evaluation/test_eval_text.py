"""The shipped out-of-domain text and the evaluation of finished runs on another text (`--eval-text`)."""

from __future__ import annotations

import gzip

import pytest

from tupe.data.corpus import DEFAULT_CORPUS_DIR, DEFAULT_EVAL_TEXT_DIR
from tupe.evaluation.runs import BUILTIN_NAME, difference, evaluate_runs, resolve_text, verdict_lines

from .conftest import save_tupe


def test_builtin_eval_text_is_shipped_with_provenance_and_not_in_the_training_corpus():
    corpus = resolve_text(["built-in"])
    assert corpus.name == BUILTIN_NAME and [p.parent for p in corpus.files] == [DEFAULT_EVAL_TEXT_DIR]
    assert corpus.total_bytes > 100_000
    provenance = (DEFAULT_EVAL_TEXT_DIR / "PROVENANCE.md").read_text()
    (book,) = corpus.files
    assert book.name in provenance and "Great Astronomers" in provenance and "c58dca3a6abedd80" in provenance
    trained = {p.name for p in DEFAULT_CORPUS_DIR.glob("*.txt.gz")}
    assert (
        book.name not in trained
        and "Great Astronomers" not in (DEFAULT_CORPUS_DIR / "PROVENANCE.md").read_text()
    )
    with gzip.open(book, "rt", encoding="utf-8") as fh:
        text = fh.read()
    assert "PROJECT GUTENBERG" not in text.upper().replace("PROJECT GUTENBERG-TM", "")  # header/licence cut
    assert "Kepler" in text and "\n\n" not in text  # one document, one paragraph per line


def test_builtin_text_mixes_with_paths_and_a_real_file_named_built_in_wins(tmp_path, text_file, monkeypatch):
    mixed = resolve_text(["built-in", str(text_file)])
    assert len(mixed.files) == 2 and mixed.name == ""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "built-in").write_text("a file of that name\n")
    assert [p.name for p in resolve_text(["built-in"]).files] == ["built-in"]


def test_runs_on_another_text_paired_against_the_first(tmp_path, tokenizer, text_file):
    runs = {
        name: save_tupe(tmp_path / name, tokenizer, name, seed=i)
        for i, name in enumerate(["bert-a", "tupe-a"])
    }
    result = evaluate_runs(runs, [str(text_file)], progress=False, log=lambda m: None)
    assert [m["name"] for m in result["models"]] == ["bert-a", "tupe-a"]
    (d,) = result["tokenizer_groups"][0]["differences"]
    flipped = difference(result, "bert-a", "tupe-a")  # tupe-a - bert-a, as the demo words it
    assert flipped["value"] == pytest.approx(-d["loss"]["value"])
    assert (flipped["low"], flipped["high"]) == pytest.approx((-d["loss"]["high"], -d["loss"]["low"]))
    lines = verdict_lines(result, "bert-a")
    assert lines[0].startswith("On ") and any("word order" in line for line in lines)
    assert "paired on the same blocks and masks" in lines[-1] and "tupe-a's loss is" in lines[-1]


def test_demo_verdict_says_it_is_in_domain():
    from tupe.comparison.demo import verdict

    stats = {
        "reference": "bert-a",
        "unigram_loss": 7.0,
        "plateau_margin": 1.0,
        "schemes": {
            "bert-a": {"final_mean": 6.0, "plateau_exit_steps": [None], "steps_to_reach_reference": [100]},
            "tupe-a": {"final_mean": 5.5, "plateau_exit_steps": [50], "steps_to_reach_reference": [60]},
        },
    }
    paired = {"tupe-a - bert-a": {"value": -0.5, "low": -0.6, "high": -0.4}}
    for eval_text, tail in (
        (True, "the evaluation on --eval-text below does."),
        (False, "(--eval-text FILE"),
    ):
        last = verdict(stats, paired, 100, eval_text=eval_text)[-1]
        assert "held-out validation blocks of the training corpus (the same books)" in last and tail in last


def test_demo_and_evaluate_word_a_difference_alike():
    """`tupe demo` and `tupe evaluate` read a paired interval with one wording, worded from its sign."""
    from tupe.comparison.demo import verdict
    from tupe.evaluation.bootstrap import compared

    assert compared({"value": -0.5, "low": -0.6, "high": -0.4}) == "lower (better) than"
    assert compared({"value": 0.5, "low": 0.4, "high": 0.6}) == "higher (worse) than"
    assert compared({"value": 0.0, "low": -0.1, "high": 0.1}) == "not distinguishable from"
    stats = {
        "reference": "bert-a",
        "unigram_loss": 7.0,
        "plateau_margin": 1.0,
        "schemes": {
            "bert-a": {"final_mean": 6.0, "plateau_exit_steps": [None], "steps_to_reach_reference": [100]},
            "tupe-a": {"final_mean": 6.0, "plateau_exit_steps": [50], "steps_to_reach_reference": [None]},
        },
    }
    paired = {"tupe-a - bert-a": {"value": 0.0, "low": -0.1, "high": 0.1}}
    lines = verdict(stats, paired, 100)
    assert any(
        line.startswith("tupe-a's final loss is not distinguishable from bert-a's: +0.000 nats")
        for line in lines
    )
