"""`tupe diagnose`: the tasks are laid out as documented; the scoring gives an exact solver (written here from the
task definitions, reading only its input) 1 - chance and models that cannot see order (a bag of symbols, a model
without positions) 0 on every task; a rope model learns what nope cannot; the command's folder rules and resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tupe.cli import main
from tupe.diagnostics.run import Settings, fresh_model, score_tasks
from tupe.diagnostics.tasks import BUCKETS, OFFSET, QUERIES, TASKS, Vocabulary, make_batch, task_rng
from tupe.evaluation.evaluate import EvalModel

L = 32
SETTINGS = Settings(train_length=L, multiples=(1, 2), test_examples=64)


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return fresh_model("nope", SETTINGS)[1]


def test_the_tasks_are_laid_out_as_documented(vocab):
    for n in (L, 2 * L):
        copy = make_batch("copy", task_rng(0, 1, 0, n), vocab, 50, n, L)
        assert copy.inputs.shape == (50, n) and (copy.inputs[:, :2] == [vocab.cls, vocab.task["copy"]]).all()
        for row, labels in zip(copy.inputs, copy.labels):
            at = np.flatnonzero(labels != -100)
            assert len(at) == QUERIES and (row[at] == vocab.mask).all()
            assert (
                at.max() - at.min() + OFFSET < L
            )  # the question and what it copies: one window of at most L
            original = row.copy()
            original[at] = labels[at]  # not needed to answer, but the symbols are distinct in the original
            assert (labels[at] == row[at - OFFSET]).all()  # the symbol 3 to the left, itself never masked
            visible = row[2:][row[2:] != vocab.mask]
            assert len(set(visible.tolist())) == len(visible) == n - 2 - QUERIES
        assert copy.chance == 1 / (n - 2 - QUERIES)
        for task, k in (("order", 2), ("distance", BUCKETS)):
            batch = make_batch(task, task_rng(0, 1, 1, n), vocab, 400, n, L)
            assert batch.chance == 1 / k and batch.candidates.tolist() == list(vocab.answers[:k])
            answers = []
            for row, labels in zip(batch.inputs, batch.labels):
                i, j = np.flatnonzero(row == vocab.marker)
                assert 1 <= j - i <= L // 2 and np.flatnonzero(labels != -100).tolist() == [i, j]
                if task == "order":
                    assert (labels[i], labels[j]) == vocab.answers[:2]
                else:
                    assert labels[i] == labels[j] == vocab.answers[(j - i - 1) * BUCKETS // (L // 2)]
                answers.append(int(labels[j]))
            if task == "distance":  # balanced classes (order has one of each in every sequence)
                shares = np.bincount(np.asarray(answers) - vocab.answers[0], minlength=k) / len(answers)
                assert (abs(shares - 1 / k) < 0.1).all(), shares


@dataclasses.dataclass
class Solver(EvalModel):
    """Answers every question by the tasks' definitions, from the input alone."""

    vocab: Vocabulary | None = None

    def logits_at(self, inputs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        v, out = self.vocab, []
        for row, sel in zip(inputs.tolist(), selected.tolist()):
            task = {t: name for name, t in v.task.items()}[row[1]]
            marks = [p for p, t in enumerate(row) if t == v.marker]
            for q in [p for p, s in enumerate(sel) if s]:
                if task == "copy":
                    answer = row[q - 3]
                elif task == "order":
                    answer = v.answers[0] if q == min(marks) else v.answers[1]
                else:
                    d = max(marks) - min(marks)
                    answer = v.answers[min(3, (d - 1) * 4 // 16)]
                out.append(
                    torch.zeros(self.model.config.vocab_size).index_fill_(0, torch.tensor(answer), 1.0)
                )
        return torch.stack(out)


@dataclasses.dataclass
class BagOfSymbols(EvalModel):
    """Sees which tokens the sequence holds, not where: the same answer at every question of a sequence (the most
    frequent visible symbol for copy, a fixed answer for the others)."""

    vocab: Vocabulary | None = None

    def logits_at(self, inputs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        out = []
        for row, sel in zip(inputs.tolist(), selected.tolist()):
            symbols = [t for t in row if t in set(self.vocab.symbols.tolist())]
            answer = max(set(symbols), key=lambda t: (symbols.count(t), t))
            logits = torch.zeros(self.model.config.vocab_size)
            logits[answer] = 1.0
            logits[self.vocab.answers[0]] = 0.5
            out += [logits] * sum(sel)
        return torch.stack(out)


def _stub(cls, vocab):
    model = fresh_model("nope", SETTINGS)[0]
    return cls(Path("."), cls.__name__, "tupe", "", model, None, L, 0, L, vocab=vocab)


def test_an_exact_solver_scores_one_and_a_bag_of_symbols_scores_chance(vocab):
    solved = score_tasks(_stub(Solver, vocab), vocab, SETTINGS)
    assert {(e["task"], e["length"]) for e in solved} == {(t, n) for t in TASKS for n in (L, 2 * L)}
    for e in solved:
        assert e["accuracy"]["value"] == 1.0, e
    bag = score_tasks(_stub(BagOfSymbols, vocab), vocab, SETTINGS)
    for e in bag:
        acc = e["accuracy"]
        if e["task"] == "order":  # the same answer at both markers: one of the two right
            assert acc["value"] == acc["low"] == acc["high"] == 0.5
        else:  # the interval holds chance
            assert acc["low"] <= e["chance"] <= acc["high"], e


@pytest.mark.slow
def test_rope_learns_order_and_copy_and_nope_trained_the_same_way_stays_at_chance(tmp_path, capsys):
    out = tmp_path / "diag"
    argv = ["diagnose", "--out", str(out), "--schemes", "rope,nope", "--seeds", "0,1", "--steps", "400"]
    argv += ["--multiples", "1,2", "--test-examples", "64", "--parallel", "1", "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "diagnostics.json").read_text())
    summary = record["summary"]
    for task in TASKS:  # nope: at chance on every task (order exactly: both markers get the same answer)
        for n in (L, 2 * L):
            cell = summary["nope"]["cells"][f"{task}@{n}/none"]
            assert cell["low"] <= 0.0 + 1e-9 and (task != "order" or cell["above_chance"] == [0.0, 0.0]), cell
            if task != "copy":
                assert cell["high"] >= -1e-9, cell
    assert all(v > 0.3 for v in summary["rope"]["cells"][f"order@{L}/none"]["above_chance"])
    assert abs(summary["nope"]["position_r2"]["mean"]) < 0.1  # no position in its hidden states
    assert "yarn" in {k.split("/")[1] for k in summary["rope"]["cells"]}
    assert "| rope |" in (out / "diagnostics.md").read_text() and record["command"].startswith(
        "tupe diagnose"
    )
    # resume: finished jobs are kept; a damaged result runs again
    stamp = (out / "runs" / "rope-seed-0" / "result.json").stat().st_mtime_ns
    (out / "runs" / "nope-seed-1" / "result.json").write_text("{")
    assert main([*argv, "--resume"]) == 0
    assert (out / "runs" / "rope-seed-0" / "result.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "runs" / "nope-seed-1" / "result.json").read_text())["name"] == "nope/seed-1"
    capsys.readouterr()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--multiples", "2,4"], "--multiples must start at 1"),
        (["--schemes", "rope,bogus"], "unknown scheme 'bogus' in --schemes"),
        (["--model", "NOWHERE"], "--model NOWHERE is not a folder"),
        (["--model", ".", "--schemes", "rope"], "--schemes goes with fresh models"),
    ],
)
def test_bad_options_are_one_line_errors_before_any_work(tmp_path, capsys, extra, message):
    assert main(["diagnose", "--out", str(tmp_path / "d"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_folder_of_other_files_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["diagnose", "--out", str(tmp_path), "--schemes", "nope", "--steps", "1"]) == 2
    assert "did not write" in capsys.readouterr().err and (tmp_path / "notes.txt").read_text() == "mine"


def test_a_checkpoint_is_fine_tuned_on_the_tasks_with_its_own_weights_and_scheme(tmp_path, capsys):
    """`--model`: a tupe checkpoint (its vocabulary's ordinary ids play the tasks' tokens) trained a few steps and
    scored like a fresh model; two folders of one name are refused."""
    from tests.evaluation.conftest import make_documents, save_tupe
    from tests.helpers import train_test_tokenizer

    tok = train_test_tokenizer(make_documents(40, seed=1), vocab_size=400)
    model = save_tupe(tmp_path / "rope-ckpt", tok, "rope", max_len=64)
    out = tmp_path / "diag"
    argv = ["diagnose", "--out", str(out), "--model", str(model), "--seeds", "0", "--steps", "3"]
    torch.set_num_threads(2)  # a job runs on one thread in this process, then gives the caller's count back
    try:
        assert (
            main([*argv, "--multiples", "1,2", "--test-examples", "8", "--parallel", "1", "--no-progress"])
            == 0
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    record = json.loads((out / "diagnostics.json").read_text())
    (run,) = record["runs"]
    assert (
        run["scheme"] == "rope" and run["checkpoint"] == "../rope-ckpt" and run["name"] == "rope-ckpt/seed-0"
    )
    assert {e["method"] for e in run["tasks"]} == {"none", "pi", "ntk", "yarn"}
    other = tmp_path / "other" / "rope-ckpt"
    other.mkdir(parents=True)
    assert main(["diagnose", "--out", str(tmp_path / "d2"), "--model", str(model), str(other)]) == 2
    assert "two folders called 'rope-ckpt'" in capsys.readouterr().err


def test_folders_made_outside_tupe_are_taken_and_a_short_one_is_refused_first(tmp_path, capsys):
    """`--model` on models trained by other code: a TupeForMaskedLM saved without a tokenizer (its config's special
    ids are left out of the tasks' tokens), a `transformers` BertForMaskedLM folder (converted exactly to bert-a, so
    `interpolate`/`repeat` apply), and a folder trained at fewer positions than --train-length, refused before
    --out is made."""
    from transformers import BertConfig, BertForMaskedLM

    from tupe.diagnostics.run import checkpoint_model
    from tupe.modeling import TupeConfig, TupeForMaskedLM

    size = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    TupeForMaskedLM(
        TupeConfig(position_scheme="nope", vocab_size=400, max_position_embeddings=64, **size)
    ).save_pretrained(tmp_path / "nope-bare")
    BertForMaskedLM(BertConfig(vocab_size=400, max_position_embeddings=64, **size)).save_pretrained(
        tmp_path / "bert"
    )
    model, vocab = checkpoint_model(str(tmp_path / "bert"), SETTINGS)
    assert model.config.position_scheme == "bert-a" and model.training
    config = model.config
    specials = {config.pad_token_id, config.cls_token_id, config.sep_token_id, config.mask_token_id}
    used = {*vocab.symbols.tolist(), *vocab.task.values(), vocab.marker, *vocab.answers}
    assert not used & specials and vocab.cls == config.cls_token_id
    out = tmp_path / "diag"
    argv = ["diagnose", "--out", str(out), "--model", str(tmp_path / "nope-bare"), str(tmp_path / "bert")]
    argv += ["--seeds", "0", "--steps", "3", "--multiples", "1,2", "--test-examples", "8", "--parallel", "1"]
    assert main([*argv, "--no-progress"]) == 0
    runs = {r["name"]: r for r in json.loads((out / "diagnostics.json").read_text())["runs"]}
    assert runs["nope-bare/seed-0"]["scheme"] == "nope" and runs["bert/seed-0"]["scheme"] == "bert-a"
    assert {e["method"] for e in runs["bert/seed-0"]["tasks"]} == {"none", "interpolate", "repeat"}
    capsys.readouterr()
    short = [
        "diagnose",
        "--out",
        str(tmp_path / "d2"),
        "--model",
        str(tmp_path / "bert"),
        "--train-length",
        "128",
    ]
    assert main(short) == 2
    assert "trained at 64 positions, fewer than --train-length 128" in capsys.readouterr().err
    assert not (tmp_path / "d2").exists()
    TupeForMaskedLM(
        TupeConfig(position_scheme="rope", vocab_size=100, max_position_embeddings=64, **size)
    ).save_pretrained(tmp_path / "small-vocab")
    assert main(["diagnose", "--out", str(tmp_path / "d3"), "--model", str(tmp_path / "small-vocab")]) == 2
    err = capsys.readouterr().err
    assert "small-vocab: the tasks need 262 ordinary token ids; the vocabulary has 96" in err
    assert not (tmp_path / "d3").exists()


def test_run_folders_of_one_scheme_form_one_group_over_their_pre_training_seeds(tmp_path, capsys):
    """`--model runs/nope/seed-0 runs/nope/seed-1`: the layout `tupe compare` and the study write. Both runs are
    named by their scheme, so the report has one row for nope over the two pre-training seeds; the same run
    folder name under two roots is refused."""
    from tupe.diagnostics.command import model_name
    from tupe.modeling import TupeConfig, TupeForMaskedLM

    size = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    for k in (0, 1):
        torch.manual_seed(k)
        TupeForMaskedLM(
            TupeConfig(position_scheme="nope", vocab_size=400, max_position_embeddings=64, **size)
        ).save_pretrained(tmp_path / "runs" / "nope" / f"seed-{k}")
    assert model_name(tmp_path / "runs" / "nope" / "seed-1") == ("nope", 1)
    assert model_name(tmp_path / "runs" / "nope") == ("nope", None)
    out = tmp_path / "diag"
    models = [str(tmp_path / "runs" / "nope" / f"seed-{k}") for k in (0, 1)]
    argv = ["diagnose", "--out", str(out), "--model", *models, "--seeds", "0", "--steps", "3"]
    argv += ["--multiples", "1", "--test-examples", "8", "--parallel", "1", "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "diagnostics.json").read_text())
    assert [r["name"] for r in record["runs"]] == ["nope/seed-0-0", "nope/seed-1-0"]
    assert list(record["summary"]) == ["nope"]
    assert record["summary"]["nope"]["pretrain_seeds"] == [0, 1] and record["summary"]["nope"]["seeds"] == [
        0,
        0,
    ]
    assert record["summary"]["nope"]["position_r2"]["seeds"] == 2
    (tmp_path / "other" / "nope").mkdir(parents=True)
    (tmp_path / "runs" / "nope" / "seed-0").rename(tmp_path / "other" / "nope" / "seed-0")
    (tmp_path / "runs" / "nope" / "seed-1").rename(tmp_path / "runs" / "nope" / "seed-0")
    twice = [str(tmp_path / "runs" / "nope" / "seed-0"), str(tmp_path / "other" / "nope" / "seed-0")]
    capsys.readouterr()
    assert main(["diagnose", "--out", str(tmp_path / "d2"), "--model", *twice]) == 2
    assert "two folders called 'nope/seed-0'" in capsys.readouterr().err


def test_the_committed_table_regenerates_from_the_committed_record():
    """docs/results/diagnostics: every job's accuracies (diagnostics.json, `runs`) give the summary over seeds and
    the Markdown table of RESULTS Part F, to the byte."""
    from tupe.diagnostics.report import aggregate, markdown

    folder = Path(__file__).resolve().parents[2] / "docs" / "results" / "diagnostics"
    record = json.loads((folder / "diagnostics.json").read_text())
    summary = aggregate(record["runs"])
    assert json.loads(json.dumps(summary)) == record["summary"]
    lengths = [k * record["settings"]["train_length"] for k in record["settings"]["multiples"]]
    assert markdown(summary, lengths, record["settings"]) == (folder / "diagnostics.md").read_text()
