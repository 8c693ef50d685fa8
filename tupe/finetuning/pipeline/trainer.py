"""One run's `transformers` Trainer: its arguments (`finetune_training_arguments`: the recipe, --report-to, the
Hub), the checkpoint with a fresh head (`load_head`), the Trainer itself (`make_trainer`, whose predictions of a
padding-free batch are one row per example again), its first batch checked (`check_finite_start`), the grid's
progress bar, and what the run keeps at its end (`finish_run`, `trainer_used`, `eval_logs`, `loss_curve`)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tupe.errors import TupeError
from tupe.finetuning.pipeline.batches import unflattened


def progress_callback(bar: Any, label: str) -> Any:
    """A Trainer callback advancing one bar over every optimisation step of the whole grid (so its ETA covers the
    grid), with the run and its last loss beside it."""
    from transformers import TrainerCallback

    class GridProgress(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            bar.update(1)

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "loss" in logs:
                bar.set_postfix_str(f"{label} loss={logs['loss']:.4f}", refresh=False)

    return GridProgress()


def finetune_training_arguments(
    settings: Any,
    lr: float,
    seed: int,
    work: Path,
    n_train: int,
    report_to: list[str] | None = None,
    push_to_hub: bool = False,
    hub_model_id: str | None = None,
    early_stopping: int | None = None,
) -> Any:  # noqa: ANN401 - transformers.TrainingArguments
    """The Trainer's arguments of one run: the settings' recipe (GLUE's: the paper's), --report-to, and
    --push-to-hub / --hub-model-id. `early_stopping` (a patience in epochs) evaluates the validation loss after
    every epoch and ends with the weights of the best epoch."""
    import torch
    from transformers import TrainingArguments

    from tupe.training.flags import checkpointing_argument
    from tupe.training.reporting import trainer_reporting

    stopping: dict[str, Any] = {"save_strategy": "no", "eval_strategy": "no"}
    eval_steps = getattr(settings, "eval_steps", None)
    if eval_steps and early_stopping:
        raise TupeError("--eval-steps and --early-stopping: early stopping evaluates once an epoch; give one")
    if eval_steps:
        stopping = {"save_strategy": "no", "eval_strategy": "steps", "eval_steps": eval_steps}
    if early_stopping:
        stopping = {
            "save_strategy": "epoch",
            "eval_strategy": "epoch",
            "load_best_model_at_end": True,
            "metric_for_best_model": "eval_loss",
            "greater_is_better": False,
            "save_total_limit": 1,
            "save_only_model": True,
        }
    accum = int(getattr(settings, "grad_accum", 1) or 1)
    max_steps = getattr(settings, "max_steps", None)
    logging_steps = getattr(settings, "logging_steps", None)
    return TrainingArguments(
        output_dir=str(work),
        per_device_train_batch_size=settings.batch_size // accum,
        gradient_accumulation_steps=accum,
        max_steps=max_steps if max_steps is not None else -1,
        per_device_eval_batch_size=settings.eval_batch_size,
        learning_rate=lr,
        num_train_epochs=settings.epochs,
        # --warmup-steps, or --warmup-ratio: a float < 1 is a ratio of the total steps
        warmup_steps=settings.warmup_steps if settings.warmup_steps is not None else settings.warmup_ratio,
        lr_scheduler_type=settings.lr_scheduler,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_epsilon=settings.adam_epsilon,
        max_grad_norm=settings.max_grad_norm,
        optim="adamw_torch_fused",  # one fused kernel: 6x the per-tensor loop's speed on a CPU (4.5 vs 27 ms)
        seed=seed,
        data_seed=seed,
        logging_strategy="steps",
        logging_steps=logging_steps or max(1, min(50, n_train // settings.batch_size)),
        # the Trainer's integrations (--report-to) and the Hub (--push-to-hub, --hub-model-id)
        **trainer_reporting(report_to or [], push_to_hub, hub_model_id),
        **stopping,
        disable_tqdm=True,
        fp16=settings.fp16,
        bf16=settings.bf16,
        **checkpointing_argument(settings.gradient_checkpointing),
        torch_compile=settings.torch_compile,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def load_head(model_class: Any, model_dir: str, seed: int, dropout: float | None, **kwargs: Any) -> Any:
    """The checkpoint with a fresh task head (initialised from `seed`), the fine-tuning dropout applied."""
    import transformers

    transformers.set_seed(seed)  # the new head's initialisation depends on the seed too
    if dropout is not None:  # the pre-training dropout may differ (the mini preset uses 0)
        kwargs["hidden_dropout_prob"] = dropout
        kwargs["attention_probs_dropout_prob"] = dropout
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "newly initialized head" is expected here
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.disable_progress_bar()  # one bar for the whole grid
    try:
        return model_class.from_pretrained(model_dir, ignore_mismatched_sizes=True, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:  # --no-progress / --quiet turned them off for the whole command
            transformers.logging.enable_progress_bar()


def make_trainer(
    model: Any,
    args: Any,
    train_ds: Any,
    collator: Any,
    tokenizer: Any,
    callbacks: list[Any],
    eval_ds: Any = None,
    early_stopping: int | None = None,
    logging_dir: Path | None = None,
    stopped_message: Callable[[], str] | None = None,
) -> Any:
    """The Trainer of one run, printing nothing of its own (the grid has one bar)."""
    from transformers import EarlyStoppingCallback, PrinterCallback

    from tupe.training.reporting import align_special_tokens, point_tensorboard

    align_special_tokens(model, tokenizer)
    if early_stopping:
        callbacks = [*callbacks, EarlyStoppingCallback(early_stopping_patience=early_stopping)]
    trainer = _trainer_class()(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds
        if early_stopping or str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"
        else None,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)
    if logging_dir is not None:
        # one TensorBoard run per (lr, seed): the loss curves; a failed write stops the grid in one line
        point_tensorboard(trainer, logging_dir, stopped_message or (lambda: "the run stopped"))
    return trainer


def trainer_used(trainer: Any) -> dict[str, Any]:
    """What the Trainer actually used (not just what was asked), so results can be audited."""
    a = trainer.args
    config = trainer.model.config
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
        "train_batch_size": a.per_device_train_batch_size * max(1, a.n_gpu) * a.gradient_accumulation_steps,
        "gradient_accumulation_steps": a.gradient_accumulation_steps,
        "dropout": [config.hidden_dropout_prob, config.attention_probs_dropout_prob],
        "device": str(a.device),
    }
    if a.load_best_model_at_end:
        used["best_checkpoint"] = Path(trainer.state.best_model_checkpoint or "").name or None
    return used


def eval_logs(scores: dict[str, Any]) -> dict[str, float]:
    """A run's final scores as the Trainer logs evaluation metrics (run_ner's `eval_f1`, `eval_precision`, ...:
    TensorBoard shows them as eval/f1), on the scale results.json records them; GLUE's {split: {metric}} as
    `eval_<split>_<metric>`. An undefined score (None) is left out."""

    def number(v: Any) -> bool:  # noqa: ANN401
        return isinstance(v, int | float) and not isinstance(v, bool)

    out: dict[str, float] = {}
    for key, value in scores.items():
        if isinstance(value, dict):
            out.update({f"eval_{key}_{m}": float(v) for m, v in value.items() if number(v)})
        elif number(value):
            out[f"eval_{key}"] = float(value)
    return out


def loss_curve(trainer: Any) -> list[tuple[int, float]]:
    return [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]


def finish_run(trainer: Any, run_dir: Path, save_model: bool, redo: str) -> dict[str, Any]:
    """The end of one run, after its scores: the fine-tuned model saved in `run_dir/model` if asked (a full disk
    stops the grid in one line ending with `redo`, what happens to this run and how to go on), what the Trainer
    used, and its work folder `run_dir/trainer` removed. Returns what the Trainer used (`trainer_used`)."""
    from tupe.io.files import failed_writes_reported

    if save_model:
        # disk full: torch/safetensors report it in their own exception types
        with failed_writes_reported(run_dir / "model", redo):
            trainer.save_model(str(run_dir / "model"))
    used = trainer_used(trainer)
    shutil.rmtree(run_dir / "trainer", ignore_errors=True)
    return used


def _trainer_class() -> Any:
    """transformers' Trainer, whose predictions of a padding-free batch are one row per example again (as those
    of a padded batch are), so the families score them as they score padded ones."""
    from transformers import Trainer

    class FinetuningTrainer(Trainer):
        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):  # type: ignore[override]
            loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            positions = inputs.get("position_ids")
            if positions is not None and positions.shape[0] == 1:
                starts = positions[0] == 0
                logits, labels = unflattened(logits, starts), unflattened(labels, starts)
            return loss, logits, labels

    return FinetuningTrainer


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
    keep = ("input_ids", "attention_mask", "labels", "label")
    batch = collator([{k: v for k, v in train_ds[i].items() if k in keep} for i in range(n)])
    inputs = ("input_ids", "attention_mask", "position_ids", "labels")
    device = next(model.parameters()).device  # on a GPU the model is there already, the batch is not
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = model(**{k: v.to(device) for k, v in batch.items() if k in inputs}).loss
    model.train(was_training)
    if loss is not None and not torch.isfinite(loss):
        raise TupeError(
            f"{model_dir}: the loss on the first training batch is {loss.item()} (not finite): the model's weights "
            "or config are broken; refusing to fine-tune it"
        )
