"""End to end through the CLI: a tiny checkpoint fine-tuned for a few steps on fixture tasks; results.json is
complete, saved predictions reproduce the metrics, and an interrupted grid resumes without redoing runs."""

import json
import shutil

import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score

import tupe.finetuning.pipeline.run as ft
from tupe.cli import main
from tupe.finetuning.glue.finetune import read_predictions
from tupe.io.checkpoints import pretrain_steps_of

from .fixtures import make_checkpoint, write_task

pytestmark = pytest.mark.slow


def _glue(model, data, out, *extra):
    return main(
        ["glue", "--model", str(model), "--data-dir", str(data), "--out", str(out), "--epochs", "1",
         "--batch-size", "16", *extra]
    )  # fmt: skip


@pytest.fixture
def count_runs(monkeypatch):
    """Count (and optionally interrupt) the training runs the grid starts."""
    calls = []
    real = ft.train_run

    def wrapper(*args, **kwargs):
        calls.append((args[1], args[2]))  # (lr, seed)
        if wrapper.interrupt_at == len(calls):
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    wrapper.interrupt_at = None
    monkeypatch.setattr(ft, "train_run", wrapper)
    wrapper.calls = calls
    return wrapper


def test_mrpc_grid_results_predictions_and_resume(tiny_model, glue_dir, tmp_path, count_runs, capsys):
    out = tmp_path / "mrpc"
    args = ["--task", "mrpc", "--lrs", "1e-4,5e-5", "--seeds", "1,2"]
    count_runs.interrupt_at = 3  # Ctrl-C during the third run
    assert _glue(tiny_model, glue_dir, out, *args) == 130
    partial = json.loads((out / "results.json").read_text())
    assert not partial["complete"] and len(partial["runs"]) == 2

    assert count_runs.calls == [(1e-4, 1), (1e-4, 2), (5e-5, 1)]
    count_runs.interrupt_at = None
    count_runs.calls.clear()
    assert _glue(tiny_model, glue_dir, out, *args) == 0
    assert count_runs.calls == [(5e-5, 1), (5e-5, 2)]  # nothing finished was redone

    res = json.loads((out / "results.json").read_text())
    assert res["complete"] and res["task"] == "MRPC" and res["scheme"] == "tupe-a"
    assert len(res["runs"]) == 4 and set(res["per_lr"]) == {"0.0001", "5e-05"}
    assert res["best"]["lr"] in (1e-4, 5e-5)
    s = res["settings"]
    assert (s["epochs"], s["batch_size"], s["warmup_ratio"], s["weight_decay"]) == (1.0, 16, 0.06, 0.01)
    assert (s["adam_beta1"], s["adam_beta2"], s["adam_epsilon"], s["max_grad_norm"]) == (
        0.9,
        0.999,
        1e-6,
        1.0,
    )
    assert s["max_seq_len"] == 64  # capped at the model's max_position_embeddings
    assert res["data"]["train_examples"] == 48 and res["data"]["dev_examples"] == {"dev": 24}
    for run in res["runs"]:
        assert run["steps"] == 3  # ceil(48 / 16) x 1 epoch
        used = run["trainer"]  # read back from the Trainer itself
        assert used["learning_rate"] == run["lr"] and used["total_steps"] == 3
        assert used["warmup_steps"] == 1  # ceil(0.06 x 3)
        assert used["adam_betas"] == [0.9, 0.999] and used["adam_epsilon"] == 1e-6
        assert (used["weight_decay"], used["max_grad_norm"], used["train_batch_size"]) == (0.01, 1.0, 16)
        assert used["lr_scheduler"] == "linear" and used["dropout"] == [0.1, 0.1]
        labels, preds = read_predictions(out / run["predictions"]["dev"])
        assert len(labels) == 24
        assert run["scores"]["dev"]["accuracy"] == pytest.approx(accuracy_score(labels, preds))
        assert run["scores"]["dev"]["f1"] == pytest.approx(f1_score(labels, preds))
    by_lr = [r["scores"]["dev"]["accuracy"] for r in res["runs"] if r["lr"] == 5e-5]
    assert res["per_lr"]["5e-05"]["median"]["dev"]["accuracy"] == pytest.approx(sum(by_lr) / 2)

    # Same command again: nothing to do. More seeds: only the new runs.
    count_runs.calls.clear()
    assert _glue(tiny_model, glue_dir, out, *args) == 0
    assert count_runs.calls == []
    assert _glue(tiny_model, glue_dir, out, "--task", "MRPC", "--lrs", "1e-4,5e-5", "--seeds", "1,2,3") == 0
    assert count_runs.calls == [(1e-4, 3), (5e-5, 3)]
    assert json.loads((out / "results.json").read_text())["best"]["n_seeds"] == 3

    # A run without its result.json (killed while writing predictions) is redone.
    (out / "runs" / "lr5e-05_seed2" / "result.json").unlink()
    count_runs.calls.clear()
    assert _glue(tiny_model, glue_dir, out, *args) == 0
    assert count_runs.calls == [(5e-5, 2)]

    # Other settings in the same --out: refused, one line.
    capsys.readouterr()
    assert _glue(tiny_model, glue_dir, out, *args, "--warmup-ratio", "0.1") == 2
    err = capsys.readouterr().err
    assert "other settings" in err and err.count("\n") == 1


def test_stsb_regression(tiny_model, glue_dir, tmp_path):
    out = tmp_path / "stsb"
    assert (
        _glue(tiny_model, glue_dir, out, "--task", "STS-B", "--lrs", "1e-4", "--seeds", "1", "--save-models")
        == 0
    )
    res = json.loads((out / "results.json").read_text())
    # the fine-tuned model: a one-output regression head, trained with the paper's dropout 0.1
    saved = json.loads((out / "runs" / "lr0.0001_seed1" / "model" / "config.json").read_text())
    assert len(saved["id2label"]) == 1
    assert saved["hidden_dropout_prob"] == 0.1 == res["settings"]["dropout"]
    assert json.loads((tiny_model / "config.json").read_text())["hidden_dropout_prob"] == 0.0
    assert res["metrics"] == ["pearson", "spearman"] and res["main_metric"] == "pearson"
    run = res["runs"][0]
    labels, preds = read_predictions(out / run["predictions"]["dev"])
    assert all(isinstance(p, float) for p in preds) and len(set(preds)) > 1  # a score, not a class
    assert run["scores"]["dev"]["pearson"] == pytest.approx(pearsonr(labels, preds)[0])
    assert run["scores"]["dev"]["spearman"] == pytest.approx(spearmanr(labels, preds)[0])
    assert res["best"]["main_median"] == pytest.approx(run["scores"]["dev"]["pearson"])


def test_mnli_two_dev_sets_and_report(tiny_model, glue_dir, tmp_path, capsys):
    out = tmp_path / "runs" / "mnli"
    assert _glue(tiny_model, glue_dir, out, "--task", "MNLI", "--lrs", "1e-4", "--seeds", "1") == 0
    res = json.loads((out / "results.json").read_text())
    run = res["runs"][0]
    assert set(run["predictions"]) == {"dev_matched", "dev_mismatched"}
    for split in ("dev_matched", "dev_mismatched"):
        labels, preds = read_predictions(out / run["predictions"][split])
        assert run["scores"][split]["accuracy"] == pytest.approx(accuracy_score(labels, preds))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "runs")]) == 0
    table = capsys.readouterr().out
    m = 100 * res["best"]["median"]["dev_matched"]["accuracy"]
    mm = 100 * res["best"]["median"]["dev_mismatched"]["accuracy"]
    assert f"| TUPE-A | ? | {m:.2f}/{mm:.2f} | {(m + mm) / 2:.2f} |" in table


def test_bert_a_from_bert_and_pretrain_steps(glue_dir, tmp_path):
    """A `bert-a` model converted from a transformers BERT fine-tunes the same way; steps come from trainer_state."""
    from transformers import BertConfig, BertForMaskedLM

    from tupe import TupeForMaskedLM

    from .fixtures import make_tokenizer

    tok = make_tokenizer()
    bert = BertForMaskedLM(
        BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    )  # fmt: skip
    model_dir = tmp_path / "checkpoint-1500"
    TupeForMaskedLM.from_bert(bert).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "rte"
    assert _glue(model_dir, glue_dir, out, "--task", "RTE", "--lrs", "1e-4", "--seeds", "1") == 0
    res = json.loads((out / "results.json").read_text())
    assert res["scheme"] == "bert-a" and res["pretrain_steps"] == 1500
    (model_dir / "trainer_state.json").write_text(json.dumps({"global_step": 2000}))
    assert pretrain_steps_of(model_dir) == 2000
    (model_dir / "pretrain_summary.json").write_text(json.dumps({"steps": 2500, "scheme": "bert-a"}))
    assert pretrain_steps_of(model_dir) == 2500


def test_a_google_layout_bert_folder_through_glue_and_evaluate(glue_dir, tmp_path, capsys):
    """A BERT folder in Google's vocabulary layout ([CLS] 101, as bert-base-uncased), built with transformers
    alone: `tupe glue` converts it keeping its ids and fine-tunes it, and `tupe evaluate` finds the converted
    copy the same model as the folder (the same loss on the same masks)."""
    from ..helpers import google_bert_folder
    from .fixtures import BAD, GOOD, NOUNS, VERBS

    bert = google_bert_folder(tmp_path / "bert", ["the", *GOOD, *BAD, *NOUNS, *VERBS])
    out = tmp_path / "rte"
    assert _glue(bert, glue_dir, out, "--task", "RTE", "--lrs", "1e-4", "--seeds", "1") == 0
    res = json.loads((out / "results.json").read_text())
    assert res["scheme"] == "bert-a" and res["complete"]
    assert json.loads((out / "converted-bert-a" / "config.json").read_text())["cls_token_id"] == 101
    text = tmp_path / "text.txt"
    lines = [f"the {n} {v} {g} and the {n} {v} {b} ." for n, v, g, b in zip(NOUNS, VERBS * 2, GOOD, BAD)]
    text.write_text("\n".join(lines * 8) + "\n")
    result = tmp_path / "eval.json"
    argv = ["evaluate", "--model", str(bert), str(out / "converted-bert-a"), "--text", str(text), "--max-seq-len", "32",
            "--bootstrap", "0", "--pppl-tokens", "0", "--no-progress", "--json", str(result)]  # fmt: skip
    assert main(argv) == 0
    losses = [m["loss"]["value"] for m in json.loads(result.read_text())["models"]]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_a_refusal_leaves_the_out_folder_as_it_was_found(glue_dir, tmp_path, capsys):
    """A BERT folder refused after `tupe glue` has claimed its names (a tokenizer larger than the model's
    vocabulary): a folder it created is gone, a user's folder holds only what it held, no `tupe_files.json`,
    no `.tmp-converted-bert-a`."""
    from ..helpers import google_bert_folder

    bert = google_bert_folder(tmp_path / "bert")
    config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] - 8}))
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig.from_pretrained(bert)).save_pretrained(bert)
    new = tmp_path / "new"
    assert _glue(bert, glue_dir, new, "--task", "RTE", "--lrs", "1e-4", "--seeds", "1") == 2
    assert "tokenizer has" in capsys.readouterr().err and not new.exists()
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    assert _glue(bert, glue_dir, users, "--task", "RTE", "--lrs", "1e-4", "--seeds", "1") == 2
    assert sorted(p.name for p in users.iterdir()) == ["notes.txt"]


def test_user_errors_are_one_line(tiny_model, glue_dir, tmp_path, capsys):
    def err_of(*argv):
        capsys.readouterr()
        assert main(list(argv)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err

    base = ["glue", "--model", str(tiny_model), "--out", str(tmp_path / "o")]
    err = err_of(*base, "--task", "CoLA", "--data-dir", str(glue_dir), "--scheme", "tupe-r")
    assert "--scheme tupe-r does not match the checkpoint's position_scheme 'tupe-a'" in err
    assert "config.json" in err
    assert "unknown GLUE task 'MRCP'" in err_of(*base, "--task", "MRCP", "--data-dir", str(glue_dir))

    bad = tmp_path / "bad"
    d = write_task(bad, "QQP")
    lines = (d / "dev.tsv").read_text().split("\n")
    lines[9] = lines[9] + "\textra"
    (d / "dev.tsv").write_text("\n".join(lines))
    err = err_of(*base, "--task", "QQP", "--data-dir", str(bad))
    assert f"{d / 'dev.tsv'}:10: malformed row: 7 tab-separated fields, expected 6" in err

    unfinished = tmp_path / "pretrain-out"
    shutil.copytree(tiny_model, unfinished / "checkpoint-200")
    err = err_of("glue", "--model", str(unfinished), "--out", str(tmp_path / "o"), "--task", "CoLA",
                 "--data-dir", str(glue_dir))  # fmt: skip
    assert "no config.json" in err and "checkpoint-200" in err

    err = err_of(*base, "--task", "CoLA", "--data-dir", str(glue_dir), "--max-seq-len", "100")
    assert "exceeds the model's max_position_embeddings 64" in err

    no_tok = tmp_path / "no_tok"
    shutil.copytree(tiny_model, no_tok)
    for f in no_tok.glob("tokenizer*"):
        f.unlink()
    assert "no tokenizer files" in err_of(*base[:2], str(no_tok), *base[3:], "--task", "CoLA",
                                                "--data-dir", str(glue_dir))  # fmt: skip


def test_scheme_flag_accepts_the_matching_scheme(tmp_path, glue_dir):
    model = make_checkpoint(tmp_path / "tupe-r", scheme="tupe-r")
    out = tmp_path / "wnli"
    assert (
        _glue(model, glue_dir, out, "--task", "WNLI", "--lrs", "1e-4", "--seeds", "1", "--scheme", "tupe-r")
        == 0
    )
    assert json.loads((out / "results.json").read_text())["scheme"] == "tupe-r"


def _bert_folder(path, with_head=True):
    from transformers import BertConfig, BertForMaskedLM, BertModel

    from .fixtures import make_tokenizer

    tok = make_tokenizer()
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=0)  # fmt: skip
    (BertForMaskedLM if with_head else BertModel)(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_transformers_bert_folder_model_card_tensorboard_quiet(glue_dir, tmp_path, capsys):
    """A plain `transformers` BertForMaskedLM folder is converted on the fly with a one-line notice; the result
    folder gets a model card and TensorBoard curves; --quiet prints nothing."""
    model_dir = _bert_folder(tmp_path / "bert")
    bert_model = _bert_folder(tmp_path / "bert-model", with_head=False)
    capsys.readouterr()
    out = tmp_path / "rte"
    args = ("--task", "RTE", "--lrs", "1e-4", "--seeds", "1", "--threads", "1", "--report-to", "tensorboard")
    assert _glue(model_dir, glue_dir, out, *args, "--no-progress") == 0
    printed = capsys.readouterr()
    assert f"note: {model_dir} is a transformers BERT checkpoint; converted exactly to bert-a" in printed.out
    assert "lr=0.0001 seed=1: dev/accuracy=" in printed.out and "\r" not in printed.err
    res = json.loads((out / "results.json").read_text())
    assert res["scheme"] == "bert-a"
    assert list((out / "tensorboard" / "lr0.0001_seed1").glob("events.out.tfevents.*"))
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "# BERT-A (bert-a)" in card
    assert f"| dev accuracy (median) | {res['best']['median']['dev']['accuracy']:.6g} |" in card
    assert "GLUE RTE from" in card and "| learning rates | 0.0001 |" in card
    out2 = tmp_path / "rte-quiet"
    assert _glue(bert_model, glue_dir, out2, *args, "--quiet") == 0
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == ""


def test_sigterm_says_what_was_kept(tiny_model, glue_dir, tmp_path, monkeypatch, capsys):
    import os
    import signal

    real = ft.train_run
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(ft, "train_run", wrapper)
    out = tmp_path / "mrpc"
    with pytest.raises(SystemExit) as exc:
        _glue(tiny_model, glue_dir, out, "--task", "mrpc", "--lrs", "1e-4", "--seeds", "1,2", "--quiet")
    assert exc.value.code == 143
    err = capsys.readouterr().err
    assert f"tupe glue: stopped by SIGTERM; the finished runs are kept in {out / 'runs'}" in err
    assert "run the same command again to continue" in err
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 1
    assert signal.getsignal(signal.SIGTERM) is not None


def test_hub_flags_reach_each_runs_trainer_arguments(tiny_model, glue_dir, tmp_path, monkeypatch, capsys):
    """--push-to-hub / --hub-model-id are passed to the Trainer's own arguments, one Hub repository per run (the
    push itself needs the network and a login: only the plumbing is tested)."""
    from tupe.finetuning.glue.protocol import GlueSettings
    from tupe.finetuning.pipeline.trainer import finetune_training_arguments

    settings = GlueSettings(task="RTE", lrs=[2e-5], seeds=[1])
    targs = finetune_training_arguments(
        settings, 2e-5, 1, tmp_path / "w", 64, ["tensorboard"], True, "me/rte-lr2e-05_seed1"
    )
    assert targs.push_to_hub is True and targs.hub_model_id == "me/rte-lr2e-05_seed1"
    assert targs.report_to == ["tensorboard"]
    plain = finetune_training_arguments(settings, 2e-5, 1, tmp_path / "w", 64)
    assert plain.push_to_hub is False and plain.report_to in ([], "none")

    seen = []

    def fake_finetune_training_arguments(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - record, do not train
        seen.append((kwargs["push_to_hub"], kwargs["hub_model_id"]))
        raise SystemExit(0)

    monkeypatch.setattr(ft, "finetune_training_arguments", fake_finetune_training_arguments)
    out = tmp_path / "rte-hub"
    args = (
        "--task",
        "RTE",
        "--lrs",
        "3e-5",
        "--seeds",
        "2",
        "--no-progress",
        "--save-models",
        "--push-to-hub",
    )
    with pytest.raises(SystemExit):
        _glue(tiny_model, glue_dir, out, *args, "--hub-model-id", "me/tupe-a-rte")
    assert seen == [(True, "me/tupe-a-rte-lr3e-05_seed2")]
    with pytest.raises(SystemExit):
        _glue(tiny_model, glue_dir, tmp_path / "rte-hub-2", *args)
    assert seen[-1] == (True, "rte-hub-2-lr3e-05_seed2")  # default prefix: the --out folder's name
    capsys.readouterr()
    assert _glue(tiny_model, glue_dir, tmp_path / "x", "--task", "RTE", "--push-to-hub") == 2
    assert (
        "--push-to-hub pushes the fine-tuned models, which only --save-models keeps"
        in capsys.readouterr().err
    )
    assert _glue(tiny_model, glue_dir, tmp_path / "x", "--task", "RTE", "--threads", "0") == 2
    assert "argument --threads: must be an integer from 1 to 1024, got 0" in capsys.readouterr().err


def test_disk_full_while_saving_a_fine_tuned_model_is_one_line(
    tiny_model, glue_dir, tmp_path, monkeypatch, capsys
):
    import errno
    import os

    from transformers import Trainer

    original = Trainer.save_model

    def full(self, output_dir=None, _internal_call=False):
        if str(output_dir).endswith("model"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self, output_dir, _internal_call)

    monkeypatch.setattr(Trainer, "save_model", full)
    out = tmp_path / "g"
    assert (
        _glue(tiny_model, glue_dir, out, "--task", "SST-2", "--lrs", "1e-4", "--seeds", "1", "--save-models")
        == 2
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"cannot write {out / 'runs' / 'lr0.0001_seed1' / 'model'}: No space left on device" in lines[0]
    assert "has no result.json and is redone next time" in lines[0]
    assert not (out / "runs" / "lr0.0001_seed1" / "result.json").exists()


def test_step_flags_shared_with_finetune(tiny_model, glue_dir, tmp_path, capsys):
    """--grad-accum, --max-steps, --logging-steps, --eval-steps (one definition for glue and finetune, issue 38):
    the global batch stays --batch-size, the run stops at --max-steps, the validation loss is logged every
    --eval-steps; --grad-accum is not part of the fingerprint, --max-steps is."""
    out = tmp_path / "sst"
    argv = ("--task", "SST-2", "--lrs", "1e-4", "--seeds", "1", "--report-to", "none", "--max-steps", "2")
    assert (
        _glue(
            tiny_model, glue_dir, out, *argv, "--grad-accum", "4", "--logging-steps", "1", "--eval-steps", "1"
        )
        == 0
    )
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["trainer"]["total_steps"] == 2 and run["trainer"]["gradient_accumulation_steps"] == 4
    assert run["trainer"]["train_batch_size"] == 16
    capsys.readouterr()
    assert _glue(tiny_model, glue_dir, out, *argv) == 0  # another --grad-accum: the finished run is reused
    assert "1 already done" in capsys.readouterr().out
    assert _glue(tiny_model, glue_dir, out, *argv[:-1], "3") == 2  # another --max-steps: another recipe
    assert "--overwrite" in capsys.readouterr().err
    assert _glue(tiny_model, glue_dir, tmp_path / "x", *argv, "--grad-accum", "3") == 2
    assert "--batch-size 16 is not divisible by --grad-accum 3" in capsys.readouterr().err
