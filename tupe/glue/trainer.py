"""One fine-tuning run (one learning rate, one seed) on the `transformers` Trainer, and its dev predictions."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from tupe.glue.metrics import compute_metrics, predictions_from_logits
from tupe.glue.protocol import GlueSettings, main_score
from tupe.glue.tasks import GlueTask, Split
from tupe.io.files import atomic_write_text, failed_writes_reported


def _progress_callback(bar: Any, label: str) -> Any:
    from transformers import TrainerCallback

    class GridProgress(TrainerCallback):
        """Advances one bar over every optimisation step of the whole grid (so its ETA covers the grid)."""

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            bar.update(1)

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "loss" in logs:
                bar.set_postfix_str(f"{label} loss={logs['loss']:.4f}", refresh=False)

    return GridProgress()


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


def training_arguments(
    settings: GlueSettings,
    lr: float,
    seed: int,
    work: Path,
    n_train: int,
    report_to: list[str] | None = None,
    push_to_hub: bool = False,
    hub_model_id: str | None = None,
) -> Any:  # noqa: ANN401 - transformers.TrainingArguments
    """The Trainer's arguments of one run: the paper's recipe, --report-to, and --push-to-hub / --hub-model-id
    (the Trainer then pushes the run's model when it saves it, `--save-models`)."""
    import torch
    from transformers import TrainingArguments

    from tupe.training.reporting import trainer_reporting

    return TrainingArguments(
        output_dir=str(work),
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=settings.eval_batch_size,
        learning_rate=lr,
        num_train_epochs=settings.epochs,
        warmup_steps=settings.warmup_ratio,  # a float < 1 is a ratio of the total steps
        lr_scheduler_type=settings.lr_scheduler,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_epsilon=settings.adam_epsilon,
        max_grad_norm=settings.max_grad_norm,
        optim="adamw_torch",
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="steps",
        logging_steps=max(1, min(50, n_train // settings.batch_size)),
        # the Trainer's integrations (--report-to) and the Hub (--push-to-hub, --hub-model-id)
        **trainer_reporting(report_to or [], push_to_hub, hub_model_id),
        disable_tqdm=True,
        fp16=settings.fp16,
        bf16=settings.bf16,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
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
    import transformers
    from transformers import DataCollatorWithPadding, PrinterCallback, Trainer

    from tupe.modeling import TupeForSequenceClassification

    transformers.set_seed(seed)  # the new head's initialisation depends on the seed too
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "newly initialized head" is expected here
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.disable_progress_bar()  # one bar for the whole grid
    try:
        kwargs: dict[str, Any] = {"num_labels": task.num_labels}
        if settings.dropout is not None:  # the pre-training dropout may differ (the mini preset uses 0)
            kwargs["hidden_dropout_prob"] = settings.dropout
            kwargs["attention_probs_dropout_prob"] = settings.dropout
        if not task.is_regression:
            kwargs["id2label"] = dict(enumerate(task.label_names))
            kwargs["label2id"] = {n: i for i, n in enumerate(task.label_names)}
        model = TupeForSequenceClassification.from_pretrained(
            model_dir, ignore_mismatched_sizes=True, **kwargs
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:  # --no-progress / --quiet turned them off for the whole command
            transformers.logging.enable_progress_bar()

    from tupe.training.reporting import align_special_tokens, point_tensorboard

    align_special_tokens(model, tokenizer)
    work = run_dir / "trainer"
    args = training_arguments(
        settings, lr, seed, work, len(train_ds), report_to, push_to_hub=push_to_hub, hub_model_id=hub_model_id
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)
    if logging_dir is not None:
        # one TensorBoard run per (lr, seed): the loss curves; a failed write stops the grid in one line
        point_tensorboard(
            trainer,
            logging_dir,
            lambda: (
                f"run lr={lr:g} seed={seed} stopped; the finished runs (their result.json) are kept: free "
                "space and rerun the same command"
            ),
        )
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
    if save_model:
        with failed_writes_reported(  # disk full: torch/safetensors report it in their own exception types
            run_dir / "model",
            f"run lr={lr:g} seed={seed} has no result.json and is redone next time; the finished runs are "
            "kept: free space and rerun the same command",
        ):
            trainer.save_model(str(run_dir / "model"))
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    a = trainer.args
    # what the Trainer actually used (not just what was asked), so results.json can be audited
    used = {
        "learning_rate": a.learning_rate,
        "warmup_steps": a.get_warmup_steps(trainer.state.max_steps),
        "total_steps": trainer.state.max_steps,
        "lr_scheduler": str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)),
        "optimizer": str(getattr(a.optim, "value", a.optim)),
        "adam_betas": [a.adam_beta1, a.adam_beta2],
        "adam_epsilon": a.adam_epsilon,
        "weight_decay": a.weight_decay,
        "max_grad_norm": a.max_grad_norm,
        "train_batch_size": a.per_device_train_batch_size * max(1, a.n_gpu),
        "dropout": [model.config.hidden_dropout_prob, model.config.attention_probs_dropout_prob],
        "device": str(a.device),
    }
    shutil.rmtree(work, ignore_errors=True)
    return {
        "lr": lr,
        "seed": seed,
        "scores": scores,
        "main": main_score(task, scores),
        "predictions": pred_files,
        "train_loss": float(train_out.training_loss),
        "loss_curve": losses,
        "steps": int(trainer.state.global_step),
        "trainer": used,
        "train_seconds": round(train_seconds, 2),
        "seconds": round(time.time() - t0, 2),  # training and evaluation
    }
