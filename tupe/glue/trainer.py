"""One GLUE fine-tuning run (one learning rate, one seed) on the shared machinery of tupe/training/finetuning.py,
and its dev predictions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.glue.metrics import compute_metrics, predictions_from_logits
from tupe.glue.protocol import GlueSettings, main_score
from tupe.glue.tasks import GlueTask, Split
from tupe.io.files import atomic_write_text
from tupe.training.finetuning import (  # noqa: F401  (training_arguments: re-exported for tests)
    finish_run,
    load_head,
    loss_curve,
    make_trainer,
    training_arguments,
)


def _write_predictions(path: Path, split: Split, predictions: np.ndarray, regression: bool) -> None:
    lines = ["index\tlabel\tprediction"]
    for idx, y, p in zip(split.index, split.labels, predictions):
        if regression:
            lines.append(f"{idx}\t{float(y)!r}\t{float(p)!r}")
        else:
            lines.append(f"{idx}\t{int(y)}\t{int(p)}")
    atomic_write_text(path, "\n".join(lines) + "\n")


def read_predictions(path: str | Path) -> tuple[list, list]:
    """(labels, predictions) from a saved predictions file, for recomputing metrics by hand."""
    rows = Path(path).read_text().strip().split("\n")[1:]
    labels, preds = [], []

    def num(x: str) -> int | float:
        try:
            return int(x)
        except ValueError:
            return float(x)

    for row in rows:
        _, y, p = row.split("\t")
        labels.append(num(y))
        preds.append(num(p))
    return labels, preds


def check_finite_start(model: Any, train_ds: Any, collator: Any, model_dir: str) -> None:
    """Refuse a model whose weights or first-batch loss are not finite (NaN weights, a broken config): training it
    would "succeed" with loss 0.0 and majority-class scores."""
    import torch

    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise TupeError(
                f"{model_dir}: weight {name} is not finite (NaN or inf); refusing to fine-tune this model"
            )
    n = min(8, len(train_ds))
    if n == 0:
        return
    batch = collator([train_ds[i] for i in range(n)])
    device = next(model.parameters()).device  # on a GPU the model is there already, the batch is not
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = model(
            **{k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}
        ).loss
    model.train(was_training)
    if loss is not None and not torch.isfinite(loss):
        raise TupeError(
            f"{model_dir}: the loss on the first training batch is {loss.item()} (not finite): the model's weights "
            "or config are broken; refusing to fine-tune it"
        )


def train_one(
    model_dir: str,
    task: GlueTask,
    settings: GlueSettings,
    lr: float,
    seed: int,
    train_ds: Any,
    dev: dict[str, tuple[Split, Any]],
    tokenizer: Any,
    run_dir: Path,
    callbacks: list[Any],
    save_model: bool = False,
    report_to: list[str] | None = None,
    logging_dir: Path | None = None,
    push_to_hub: bool = False,
    hub_model_id: str | None = None,
) -> dict[str, Any]:
    """One (lr, seed) run: fresh classification head on the checkpoint, train, predict every dev split."""
    from transformers import DataCollatorWithPadding

    from tupe.modeling import TupeForSequenceClassification

    kwargs: dict[str, Any] = {"num_labels": task.num_labels}
    if not task.is_regression:
        kwargs["id2label"] = dict(enumerate(task.label_names))
        kwargs["label2id"] = {n: i for i, n in enumerate(task.label_names)}
    model = load_head(TupeForSequenceClassification, model_dir, seed, settings.dropout, **kwargs)
    args = training_arguments(
        settings,
        lr,
        seed,
        run_dir / "trainer",
        len(train_ds),
        report_to,
        push_to_hub=push_to_hub,
        hub_model_id=hub_model_id,
    )
    trainer = make_trainer(
        model,
        args,
        train_ds,
        DataCollatorWithPadding(tokenizer),
        tokenizer,
        callbacks,
        # --eval-steps: the validation loss on the first dev split (the scores are still computed at the end)
        eval_ds=next(iter(dev.values()))[1] if getattr(settings, "eval_steps", None) else None,
        logging_dir=logging_dir,
        stopped_message=lambda: (
            f"run lr={lr:g} seed={seed} stopped; the finished runs (their result.json) are kept: free "
            "space and rerun the same command"
        ),
    )
    check_finite_start(model, train_ds, DataCollatorWithPadding(tokenizer), model_dir)
    t0 = time.time()
    train_out = trainer.train()
    train_seconds = time.time() - t0

    scores: dict[str, dict[str, float]] = {}
    pred_files: dict[str, str] = {}
    for split_name, (split, ds) in dev.items():
        out = trainer.predict(ds)
        preds = predictions_from_logits(out.predictions, task.is_regression)
        scores[split_name] = compute_metrics(task.metrics, split.labels, preds)
        fname = f"predictions-{split_name}.tsv"
        _write_predictions(run_dir / fname, split, preds, task.is_regression)
        pred_files[split_name] = fname
    redo = (
        f"run lr={lr:g} seed={seed} has no result.json and is redone next time; the finished runs are kept: "
        "free space and rerun the same command"
    )
    used = finish_run(trainer, run_dir, save_model, redo)
    return {
        "lr": lr,
        "seed": seed,
        "scores": scores,
        "main": main_score(task, scores),
        "predictions": pred_files,
        "train_loss": float(train_out.training_loss),
        "loss_curve": loss_curve(trainer),
        "steps": int(trainer.state.global_step),
        "trainer": used,
        "train_seconds": round(train_seconds, 2),
        "seconds": round(time.time() - t0, 2),  # training and evaluation
    }
