"""Padding-free fine-tuning (tupe/finetuning/pipeline/batches.py `FlattenedBatches`): a batch's examples in one row with
`position_ids` restarting at 0. The oracle is the padded path: the same predictions, labels and losses from
padded batches (to float rounding), through `Trainer.predict` and through whole `tupe finetune` / `tupe glue` runs
of every task family; the batches are transformers' `DataCollatorWithFlattening`'s; and transformers' Trainer with
`DataCollatorWithFlattening` trains a tupe model to the weights the padded batches give."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tupe.cli import main
from tupe.finetuning.pipeline.batches import (
    FlattenedBatches,
    data_collator,
    padding_free_refusal,
    unflattened,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "finetune"
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=60,
            max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip


def _examples(n: int, labels: str, seed: int = 0) -> list[dict]:
    """`n` examples of 3..20 tokens ([CLS]=1 ... [SEP]=2): a class per example, a score, or a label per token
    (-100 at [CLS] and [SEP], as the families encode them)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = rng.randint(3, 20)
        ids = [1] + [rng.randint(5, 59) for _ in range(m - 2)] + [2]
        if labels == "class":
            y = rng.randint(0, 2)
        elif labels == "score":
            y = rng.uniform(0, 5)
        else:
            y = [-100] + [rng.randint(0, 2) for _ in range(m - 2)] + [-100]
        out.append({"input_ids": ids, "attention_mask": [1] * m, "labels": y})
    return out


class _Tok:
    """What transformers' padding collators read of a tokenizer: pad id 0, right side."""

    pad_token_id, pad_token, padding_side, model_input_names = (
        0,
        "[PAD]",
        "right",
        ["input_ids", "attention_mask"],
    )

    def pad(self, features, **kwargs):
        n = max(len(f["input_ids"]) for f in features)
        out = {
            "input_ids": [f["input_ids"] + [0] * (n - len(f["input_ids"])) for f in features],
            "attention_mask": [f["attention_mask"] + [0] * (n - len(f["attention_mask"])) for f in features],
        }
        rest = {k: [f[k] for f in features] for k in features[0] if k not in out}
        return {
            **{k: torch.tensor(v) for k, v in out.items()},
            **{k: torch.tensor(v) for k, v in rest.items()},
        }


def test_the_batches_are_transformers_flattening_with_the_labels_a_classifier_needs() -> None:
    from transformers import DataCollatorWithFlattening

    for kind in ("class", "score", "token"):
        features = _examples(5, kind)
        ours = FlattenedBatches()(features)
        theirs = DataCollatorWithFlattening(return_position_ids=True)(
            [{"input_ids": f["input_ids"]} for f in features]
        )
        assert torch.equal(ours["input_ids"], theirs["input_ids"])
        assert torch.equal(ours["position_ids"], theirs["position_ids"])
        assert "attention_mask" not in ours  # no padding, no mask
        if kind == "token":  # joined as they are (transformers' would put -100 at each first label)
            assert ours["labels"].tolist() == [[y for f in features for y in f["labels"]]]
        else:  # one per example, in order: int64 class ids, float32 scores
            assert ours["labels"].tolist() == pytest.approx([f["labels"] for f in features])
            assert ours["labels"].dtype == (torch.long if kind == "class" else torch.float32)
    with pytest.raises(ValueError, match="example 1 of the batch has no tokens"):
        FlattenedBatches()([{"input_ids": [1, 2]}, {"input_ids": []}])


def test_unflattened_gives_one_padded_row_per_example() -> None:
    starts = torch.tensor([True, False, False, True, False, True])
    flat = torch.arange(6.0)[None, :, None].expand(1, 6, 2)
    rows = unflattened(flat, starts)
    assert rows[:, :, 0].tolist() == [[0, 1, 2], [3, 4, -100], [5, -100, -100]]
    per_example = torch.ones(3, 2)
    assert unflattened(per_example, starts) is per_example  # one row per example already: as it is
    a, b = unflattened((flat[..., 0], flat[..., 1]), starts)
    assert a.shape == b.shape == (3, 3)


def _predict(model, features, collator, batch_size: int = 4):
    import datasets
    from transformers import TrainingArguments

    from tupe.finetuning.pipeline.trainer import _trainer_class

    args = TrainingArguments(
        output_dir="unused", per_device_eval_batch_size=batch_size, report_to=[], use_cpu=True,
        disable_tqdm=True, save_strategy="no",
    )  # fmt: skip
    trainer = _trainer_class()(model=model, args=args, data_collator=collator)
    return trainer.predict(datasets.Dataset.from_list(features))


@pytest.mark.parametrize("scheme", ["tupe-a", "tupe-r", "rope", "alibi", "deberta", "t5"])
@pytest.mark.parametrize(
    ("head", "labels", "num_labels"),
    [("TupeForSequenceClassification", "class", 3), ("TupeForSequenceClassification", "score", 1),
     ("TupeForTokenClassification", "token", 3)],
)  # fmt: skip
def test_predictions_and_loss_equal_the_padded_batches(scheme: str, head: str, labels: str, num_labels: int):
    """`Trainer.predict` on padding-free batches (the last one shorter) = on padded batches: logits at every real
    token, labels, the evaluation loss."""
    from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

    import tupe

    torch.manual_seed(0)
    config = tupe.TupeConfig(position_scheme=scheme, num_labels=num_labels, **TINY)
    model = getattr(tupe, head)(config).eval()
    features = _examples(11, labels, seed=1)
    padded_collator = (DataCollatorForTokenClassification if labels == "token" else DataCollatorWithPadding)(
        _Tok()
    )
    padded = _predict(model, features, padded_collator)
    flat = _predict(model, features, FlattenedBatches())
    assert flat.predictions.shape == padded.predictions.shape
    assert np.array_equal(flat.label_ids, padded.label_ids)
    if labels == "token":
        real = padded.label_ids != -100  # the Trainer's padding and the model's outputs on [PAD] differ
        np.testing.assert_allclose(flat.predictions[real], padded.predictions[real], atol=1e-5, rtol=1e-5)
        lengths = [len(f["input_ids"]) for f in features]
        assert all((flat.predictions[i, m:] == -100).all() for i, m in enumerate(lengths))
    else:
        np.testing.assert_allclose(flat.predictions, padded.predictions, atol=1e-5, rtol=1e-5)
    assert flat.metrics["test_loss"] == pytest.approx(padded.metrics["test_loss"], rel=1e-5)


def _finetune(model: Path, task: str, train: str, validation: str, out: Path, *extra: str) -> dict:
    rc = main(["finetune", "--task", task, "--model", str(model), "--train", str(DATA / train),
               "--validation", str(DATA / validation), "--out", str(out), "--lrs", "1e-3", "--seeds", "1",
               "--epochs", "1", "--batch-size", "8", "--threads", "1", "--no-progress", "--dropout", "0",
               "--report-to", "none", *extra])  # fmt: skip
    assert rc == 0
    return json.loads(next((out / "runs").glob("*/result.json")).read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "train", "validation", "extra", "batches"),
    [
        ("classification", "sentiment_train.csv", "sentiment_val.csv", (), "padding-free"),
        ("ner", "ner_train.conll", "ner_valid.txt", (), "padding-free"),
        ("qa", "squad_train.json", "squad_dev.json", ("--max-seq-len", "48", "--doc-stride", "12"), "padded"),
        ("multiple-choice", "swag_train.csv", "swag_val.csv", (), "padded"),
    ],
)
def test_every_family_scores_as_with_padding(
    tmp_path, capsys, task, train, validation, extra, batches
) -> None:
    """A whole `tupe finetune` run (dropout 0) by default and with --padding: the same training losses, scores and
    predictions; qa and multiple-choice pad and say why once; the run records its batches."""
    from ..glue.fixtures import make_checkpoint

    model = make_checkpoint(tmp_path / "model")
    capsys.readouterr()
    default = _finetune(model, task, train, validation, tmp_path / "default", *extra)
    said = capsys.readouterr().out
    padded = _finetune(model, task, train, validation, tmp_path / "padded", *extra, "--padding")
    assert "padded batches (not padding-free)" not in capsys.readouterr().out
    assert said.count("padded batches (not padding-free)") == (batches == "padded")
    assert default["trainer"]["batches"] == batches and padded["trainer"]["batches"] == "padded"
    assert default["train_loss"] == pytest.approx(padded["train_loss"], rel=1e-5)
    assert [x for _, x in default["loss_curve"]] == pytest.approx(
        [x for _, x in padded["loss_curve"]], rel=1e-5
    )
    assert default["scores"] == pytest.approx(padded["scores"], rel=1e-6)
    lines = [(tmp_path / d / "predictions.jsonl").read_text() for d in ("default", "padded")]
    assert lines[0] == lines[1]


@pytest.mark.parametrize("task", ["CoLA", "STS-B"])
def test_glue_scores_as_with_padding(tmp_path, task) -> None:
    from ..glue.fixtures import make_checkpoint, write_task

    model = make_checkpoint(tmp_path / "model")
    write_task(tmp_path / "glue", task)
    results = {}
    for name, extra in (("default", []), ("padded", ["--padding"])):
        rc = main(["glue", "--model", str(model), "--task", task, "--data-dir", str(tmp_path / "glue"),
                   "--out", str(tmp_path / name), "--lrs", "1e-3", "--seeds", "1", "--epochs", "1",
                   "--batch-size", "8", "--threads", "1", "--dropout", "0", "--quiet", "--report-to", "none",
                   *extra])  # fmt: skip
        assert rc == 0
        results[name] = json.loads(next((tmp_path / name / "runs").glob("*/result.json")).read_text())
    default, padded = results["default"], results["padded"]
    assert (default["trainer"]["batches"], padded["trainer"]["batches"]) == ("padding-free", "padded")
    assert default["train_loss"] == pytest.approx(padded["train_loss"], rel=1e-5)
    assert default["scores"].keys() == padded["scores"].keys() == {"dev"}
    # This STS-B regressor predicts nearly one value (0.0558, standard deviation 6.4e-5): Pearson's r divides the
    # float32 rounding of the two paths' sums (~1e-8 of a prediction) by that spread; 1.2e-5 apart seen on AVX-512.
    assert default["scores"]["dev"] == pytest.approx(padded["scores"]["dev"], rel=1e-3, abs=1e-4)
    files = [(tmp_path / d / "runs" / "lr0.001_seed1" / "predictions-dev.tsv") for d in ("default", "padded")]
    rows = [[line.split("\t") for line in f.read_text().splitlines()[1:]] for f in files]
    assert [r[:2] for r in rows[0]] == [r[:2] for r in rows[1]]
    np.testing.assert_allclose([float(r[2]) for r in rows[0]], [float(r[2]) for r in rows[1]], atol=1e-5)


def test_a_kernel_that_refuses_documents_pads(tmp_path) -> None:
    """fold keeps no documents apart: the family's runs pad, and the reason is the kernel's own."""
    import tupe
    from tupe.finetuning.classification import ClassificationFamily

    config = tupe.TupeConfig(position_scheme="tupe-a", num_labels=2, attention_kernel="fold", **TINY)
    model = tupe.TupeForSequenceClassification(config)
    why = padding_free_refusal(
        ClassificationFamily.__new__(ClassificationFamily), model, _examples(3, "class")
    )
    assert why is not None and "fold" in why
    model.set_attn_implementation("eager")
    assert (
        padding_free_refusal(ClassificationFamily.__new__(ClassificationFamily), model, _examples(3, "class"))
        is None
    )
    assert isinstance(
        data_collator(ClassificationFamily.__new__(ClassificationFamily), None, True), FlattenedBatches
    )


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["tupe-a", "tupe-r", "rope", "alibi", "deberta"])
@pytest.mark.parametrize("head", ["TupeForSequenceClassification", "TupeForTokenClassification"])
def test_transformers_trainer_with_data_collator_with_flattening(tmp_path, scheme: str, head: str) -> None:
    """transformers' Trainer with `DataCollatorWithFlattening` trains a tupe model (dropout 0) to the weights
    padded batches give: for token classification its labels as they are (-100 at [CLS] already), for sequence
    classification its batches with one label per example beside them."""
    import datasets
    from transformers import (
        DataCollatorForTokenClassification,
        DataCollatorWithFlattening,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    import tupe

    token = head == "TupeForTokenClassification"
    features = _examples(12, "token" if token else "class", seed=2)
    flattening = DataCollatorWithFlattening(return_position_ids=True)

    def flattened(batch: list[dict]) -> dict:
        if token:
            return flattening([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in batch])
        out = flattening([{"input_ids": f["input_ids"]} for f in batch])
        out["labels"] = torch.tensor([f["labels"] for f in batch])  # its own labels are a causal LM's
        return out

    padding = (DataCollatorForTokenClassification if token else DataCollatorWithPadding)(_Tok())
    weights, start = [], None
    for collator in (padding, flattened):
        torch.manual_seed(0)
        model = getattr(tupe, head)(tupe.TupeConfig(position_scheme=scheme, num_labels=3, **TINY))
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        args = TrainingArguments(
            output_dir=str(tmp_path / "t"), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-2,
            report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0, logging_steps=1,
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(features),
                          data_collator=collator)  # fmt: skip
        out = trainer.train()
        assert np.isfinite(out.training_loss)
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    assert any(not torch.equal(start[k], weights[1][k]) for k in start)  # it trained
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], atol=2e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["tupe-a", "rope"])
def test_public_flattened_batches_in_a_trainer_classify_as_padded_batches(tmp_path, scheme: str) -> None:
    """Issue 49: `DataCollatorWithFlattening` cannot carry one label per example; `tupe.FlattenedBatches`, the
    public collator, does: given to transformers' Trainer as it is, it trains a sequence classifier (dropout 0) to
    the weights of padded batches, and its batches are `DataCollatorWithFlattening`'s plus `labels` (examples,)."""
    import datasets
    from transformers import DataCollatorWithFlattening, DataCollatorWithPadding, Trainer, TrainingArguments

    import tupe

    features = _examples(12, "class", seed=3)
    flat = tupe.FlattenedBatches()(features[:4])
    theirs = DataCollatorWithFlattening(return_position_ids=True)(
        [{"input_ids": f["input_ids"]} for f in features[:4]]
    )
    assert torch.equal(flat["input_ids"], theirs["input_ids"]) and torch.equal(
        flat["position_ids"], theirs["position_ids"]
    )
    assert flat["labels"].tolist() == [f["labels"] for f in features[:4]]
    weights = []
    for collator in (DataCollatorWithPadding(_Tok()), tupe.FlattenedBatches()):
        torch.manual_seed(0)
        model = tupe.TupeForSequenceClassification(
            tupe.TupeConfig(position_scheme=scheme, num_labels=3, **TINY)
        )
        args = TrainingArguments(
            output_dir=str(tmp_path / "t"), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-2,
            report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0,
        )  # fmt: skip
        Trainer(
            model=model, args=args, train_dataset=datasets.Dataset.from_list(features), data_collator=collator
        ).train()
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], atol=2e-5, rtol=1e-4)
