"""Pre-training runs end to end: every scheme, resume, checkpoints, guards, NaN stop, metrics, CLI errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tupe.errors import TupeError
from tupe.modeling import POSITION_SCHEMES
from tupe.training.pretrain import pretrain


def _metrics(run: Path) -> list[dict]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("tokens_per_s", None)  # wall-clock dependent
    return recs


@pytest.mark.slow
@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_every_scheme_writes_a_loadable_model(scheme: str, tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    out = tmp_path / scheme
    summary = pretrain(tiny_run(out, scheme=scheme, max_steps=2))
    assert summary["steps"] == 2 and torch.isfinite(torch.tensor(summary["final_eval_loss"]))
    model = AutoModelForMaskedLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.position_scheme == scheme
    enc = tok(["the man said", "and so"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (*enc["input_ids"].shape, len(tok))


@pytest.mark.slow
def test_fill_mask_metrics_and_tensorboard(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    import transformers

    out = tmp_path / "run"
    pretrain(tiny_run(out, save_at=[3]))
    fill = transformers.pipeline("fill-mask", model=str(out))
    preds = fill("the man [MASK] the door")
    assert len(preds) == 5 and all("[MASK]" not in p["sequence"] for p in preds)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r]
    valid = [r for r in recs if "eval_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert [r["step"] for r in valid] == [2, 4]
    assert all(r["lr"] >= 0 and r["tokens_per_s"] > 0 for r in train) and train[1]["lr"] > 0
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-3",
        "checkpoint-4",
    ]
    summary = json.loads((out / "pretrain_summary.json").read_text())
    assert summary["final_eval_loss"] == valid[-1]["eval_loss"]


@pytest.mark.slow
def test_state_files_load_with_weights_only(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    pretrain(tiny_run(out, max_steps=2))
    files = [p for p in (out / "checkpoint-2").iterdir() if p.suffix in (".pt", ".pth")]
    assert {"optimizer.pt", "scheduler.pt"} <= {p.name for p in files}
    from transformers.trainer_pt_utils import (
        safe_globals,  # allow-lists numpy's RNG-state types, nothing else
    )

    with safe_globals():
        for p in files:
            torch.load(p, weights_only=True)  # what the Trainer does on --resume


@pytest.mark.slow
def test_resume_after_interruption_is_bit_exact(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    full = tmp_path / "full"
    pretrain(tiny_run(full, max_steps=6, save_steps=3, eval_steps=3))
    # the "killed" run: stopped after checkpoint-3 was written, with a half-written later checkpoint
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoint-6")
    (cut / "model.safetensors").unlink()
    (cut / "pretrain_summary.json").unlink()
    (cut / ".tmp-checkpoint-6").mkdir()
    (cut / ".tmp-checkpoint-6" / "checkpoint-6").mkdir()
    (cut / ".tmp-checkpoint-6" / "checkpoint-6" / "trainer_state.json").write_text("{")
    with (cut / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 5, "loss": 1')  # a line cut by the kill
    with pytest.raises(TupeError, match="already holds this run"):
        pretrain(tiny_run(cut, max_steps=6, save_steps=3, eval_steps=3))
    pretrain(tiny_run(cut, max_steps=6, save_steps=3, eval_steps=3, resume=True))
    assert _metrics(cut) == _metrics(full)
    assert not (cut / ".tmp-checkpoint-6").exists()
    from safetensors.torch import load_file

    a, b = load_file(full / "model.safetensors"), load_file(cut / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_out_dir_guards(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    pretrain(tiny_run(out, max_steps=2))
    with pytest.raises(TupeError, match=r"holds a different run \(scheme: 'tupe-a' -> 'bert-a'"):
        pretrain(tiny_run(out, max_steps=2, scheme="bert-a", resume=True))
    with pytest.raises(TupeError, match="different run.*learning_rate"):
        pretrain(tiny_run(out, max_steps=2, learning_rate=1e-3))
    pretrain(tiny_run(out, max_steps=2, scheme="bert-a", overwrite=True))
    assert json.loads((out / "tupe_run.json").read_text())["scheme"] == "bert-a"
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(TupeError, match="not a tupe run folder"):
        pretrain(tiny_run(foreign, max_steps=2, overwrite=True))
    assert (foreign / "notes.txt").exists()


def test_non_finite_loss_stops_and_names_the_step(tiny_run, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from tupe.modeling import TupeForMaskedLM

    real = TupeForMaskedLM.forward
    calls = {"n": 0}

    def poisoned(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = real(self, *a, **k)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 3:
                out.loss = out.loss * float("nan")  # what the trainer trains on
        return out

    monkeypatch.setattr(TupeForMaskedLM, "forward", poisoned)
    with pytest.raises(TupeError, match=r"not finite\) at step 3"):
        pretrain(tiny_run(tmp_path / "run", max_steps=4))


@pytest.mark.slow
def test_sparse_and_dense_prediction_give_the_same_loss(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    pretrain(tiny_run(tmp_path / "s", max_steps=1, eval_steps=1, dropout=0.0))
    pretrain(tiny_run(tmp_path / "d", max_steps=1, eval_steps=1, dropout=0.0, dense_prediction=True))
    s, d = _metrics(tmp_path / "s"), _metrics(tmp_path / "d")
    assert s[0]["loss"] == pytest.approx(d[0]["loss"], rel=1e-5)
    assert s[-1]["eval_loss"] == pytest.approx(d[-1]["eval_loss"], rel=1e-5)


def test_cli_corpus_errors_are_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from tupe.cli import main

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xc3\x28 broken\n")
    for corpus, expected in [(str(tmp_path / "missing.txt"), "not found"), (str(bad), "byte offset 5")]:
        code = main(["pretrain", "--corpus", corpus, "--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"),
                     "--no-progress", "--quiet"])  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert code == 2 and expected in err and "\n" not in err and "Traceback" not in err


@pytest.mark.slow
def test_gradient_accumulation_matches_one_big_batch(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    pretrain(tiny_run(tmp_path / "one", max_steps=3, eval_steps=3, dropout=0.0))
    pretrain(tiny_run(tmp_path / "acc", max_steps=3, eval_steps=3, dropout=0.0, grad_accum=4))
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "acc")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        key = "loss" if "loss" in ra else "eval_loss"
        assert rb[key] == pytest.approx(ra[key], rel=1e-4)


@pytest.mark.slow
def test_hf_bert_control_trains_on_the_same_blocks_and_resumes(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    """`--scheme hf-bert` trains transformers' own BertForMaskedLM with the same data, masks and Trainer."""
    from transformers import BertForMaskedLM

    full = tmp_path / "full"
    summary = pretrain(tiny_run(full, scheme="hf-bert", max_steps=4, save_steps=2, eval_steps=2))
    config = json.loads((full / "config.json").read_text())
    assert config["model_type"] == "bert" and config["position_scheme"] == "hf-bert"
    model = BertForMaskedLM.from_pretrained(full)
    assert model.config.hidden_size == 32 and model.config.max_position_embeddings == 32
    assert torch.isfinite(torch.tensor(summary["final_eval_loss"]))
    # same cached blocks and split as a tupe run
    tupe_run = pretrain(
        tiny_run(tmp_path / "bert-a", scheme="bert-a", max_steps=2, save_steps=2, eval_steps=2)
    )
    evals = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines() if "eval_loss" in x]
    assert (
        tupe_run["valid_blocks"] == summary["valid_blocks"]
        and tupe_run["data_cache"] == summary["data_cache"]
    )
    assert [e["step"] for e in evals] == [2, 4]
    # resume from checkpoint-2 reproduces the uninterrupted run
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoint-4")
    (cut / "pretrain_summary.json").unlink()
    pretrain(tiny_run(cut, scheme="hf-bert", max_steps=4, save_steps=2, eval_steps=2, resume=True))
    assert _metrics(cut) == _metrics(full)


def test_cli_parquet_and_jsonl_corpus_pack_like_the_same_text(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:  # noqa: ANN001
    """Rows of a parquet or JSON-lines file are documents: the same documents as text files (one per file) give
    the same packed blocks; a missing --text-column stops before any work with the columns listed."""
    import datasets

    from tupe.cli import main

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    docs = [p.read_text() for p in sorted(tiny_corpus.glob("*.txt"))]
    datasets.Dataset.from_dict({"body": docs}).to_parquet(str(tmp_path / "docs.parquet"))
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    common = ["--tokenizer", str(tiny_tokenizer_dir), "--max-length", "32", "--cache-dir", str(tmp_path / "c"),
              "--prepare-only", "--no-progress", "--quiet"]  # fmt: skip
    tokens = {}
    for name, corpus in (("text", [str(tiny_corpus)]), ("parquet", [str(tmp_path / "docs.parquet")]),
                         ("jsonl", [str(tmp_path / "docs.jsonl")])):  # fmt: skip
        extra = [] if name == "text" else ["--text-column", "body"]
        assert main(["pretrain", "--out", str(tmp_path / name), "--corpus", *corpus, *extra, *common]) == 0
        tokens[name] = json.loads(capsys.readouterr().out)["tokens"]
    assert tokens["parquet"] == tokens["jsonl"] == tokens["text"] > 0
    code = main(
        ["pretrain", "--out", str(tmp_path / "x"), "--corpus", str(tmp_path / "docs.parquet"), *common]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith(
        "docs.parquet has no column 'text' (columns: body); pick one with --text-column"
    )


@pytest.mark.slow
def test_saved_models_predict_every_position(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    """Training runs the LM head on the masked positions only; the final model and the checkpoints users load are
    saved with `sparse_prediction` off, so labels do not change the logits' shape, and resuming still works."""
    from tupe.modeling import TupeForMaskedLM

    out = tmp_path / "run"
    pretrain(tiny_run(out, max_steps=2, save_steps=1))
    for folder in (out, out / "checkpoint-1", out / "checkpoint-2"):
        assert json.loads((folder / "config.json").read_text())["sparse_prediction"] is False, folder
    model = TupeForMaskedLM.from_pretrained(out).eval()
    ids = torch.randint(5, 100, (2, 9))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    with torch.no_grad():
        assert model(input_ids=ids, labels=labels).logits.shape == (2, 9, model.config.vocab_size)
    # the run itself still trains sparsely, and a checkpoint saved dense resumes
    assert json.loads((out / "tupe_run.json").read_text())["model"]["sparse_prediction"] is True
    shutil.rmtree(out / "checkpoint-2")
    (out / "pretrain_summary.json").unlink()
    assert pretrain(tiny_run(out, max_steps=2, save_steps=1, resume=True))["steps"] == 2
