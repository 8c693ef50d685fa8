"""The Trainer customisation of pre-training: metrics and save-at callbacks, the global masked-LM loss, a stop on
non-finite losses, token-weighted validation, and atomic checkpoints.

Public methods and callbacks carry most of it: `compute_loss`, `evaluate`, `create_optimizer`, `get_batch_samples`
(the masked-token count of the global batch; the Trainer's own gather leaves it un-gathered on CPU/gloo),
`save_model` (saved with `sparse_prediction` off), `log` (a running throughput of its own), `train` (a run resumed
from a checkpoint at max_steps must not train one more step), and `PassesCallback` (the logged `epoch` as passes over
the training blocks). Three private methods are overridden because no public hook reaches them, and one is called:
`_get_train_sampler` (the epoch-shuffled block order), `_get_output_dir` / `_save_checkpoint` (checkpoints written to
a staging folder and renamed when complete), `_load_from_checkpoint` (called by `train` for a run at max_steps).
docs/architecture.md lists them with why; tests/training/test_trainer_hooks.py fails loudly if transformers changes
them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback

from tupe.errors import TupeError
from tupe.io.files import failed_writes_reported, fsync_dir, fsync_tree
from tupe.training.checkpointing import find_latest_checkpoint, first_nonfinite_parameter, write_manifest
from tupe.training.optimizers import DEFAULT_OPTIMIZER, OptimizerSettings, build_optimizer
from tupe.training.run_folder import record_written


class MetricsCallback(TrainerCallback):
    """Appends one JSON object per log event to metrics.jsonl: training (`loss`, `lr`, `tokens_per_s`) or
    validation (`eval_loss`) records, each with `step`. tokens/s counts non-padding tokens of all processes over
    the time spent in training steps (evaluation and saving excluded)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._step_time = 0.0
        self._t0: float | None = None
        self._tokens_last = 0
        self._lr: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self._tokens_last = state.num_input_tokens_seen or 0

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        if self._t0 is not None:
            self._step_time += time.perf_counter() - self._t0
            self._t0 = None

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
        if not state.is_world_process_zero or not logs:
            return
        rec: dict[str, Any] = {"step": state.global_step}
        if "loss" in logs:
            tokens = (state.num_input_tokens_seen or 0) - self._tokens_last
            self._tokens_last = state.num_input_tokens_seen or 0
            self._lr = logs.get("learning_rate", self._lr)
            rec.update(
                loss=logs["loss"],
                lr=self._lr,
                grad_norm=logs.get("grad_norm"),
                tokens_per_s=round(tokens / self._step_time, 1) if self._step_time > 0 else None,
                epoch=round(state.epoch or 0.0, 4),  # passes over the training blocks (PassesCallback)
            )
            self._step_time = 0.0
        elif "eval_loss" in logs:
            rec.update(eval_loss=logs["eval_loss"], lr=self._lr)
        else:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")


class SaveAtStepsCallback(TrainerCallback):
    """Checkpoint at the listed steps too (the paper fine-tunes the 100k/300k/600k/1M checkpoints)."""

    def __init__(self, steps: list[int]) -> None:
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        if state.global_step in self.steps:
            control.should_save = True
        return control


class PassesCallback(TrainerCallback):
    """The Trainer's `epoch` as passes over the training blocks (global batch / training blocks a step), set where
    the Trainer sets its own, at the end of each step, before it logs, evaluates or saves: the Trainer's is the
    fraction of its one dataset that holds every pass. Also notes the tokens seen when training (re)starts, for
    the running throughput `PretrainTrainer.log` adds."""

    def __init__(self, passes_per_step: float | None) -> None:
        self.passes_per_step = passes_per_step
        self.tokens_at_start = 0

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.tokens_at_start = state.num_input_tokens_seen or 0

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        if self.passes_per_step is not None:
            state.epoch = round(state.global_step * self.passes_per_step, 4)


class _TiedOnly(logging.Filter):
    """Drops the Trainer's "missing keys ['lm_head.decoder.weight']" warning when it loads a checkpoint: that
    weight is tied to the word embeddings, so it is not saved and comes back with them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "missing keys" not in (msg := record.getMessage()) or "['lm_head.decoder.weight']" not in msg


class LogLastStepCallback(TrainerCallback):
    """Log at the last step too: the Trainer's final train loss adds the steps since the last log from this process
    only, so without it a multi-process summary differed from the single-process one."""

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        if state.max_steps and state.global_step >= state.max_steps:
            control.should_log = True
        return control


class PretrainTrainer(Trainer):
    """The stock Trainer plus: our sampler, a masked-LM loss normalised over the whole global batch, a stop on
    non-finite losses, and atomic checkpoints."""

    def __init__(
        self,
        *args,  # noqa: ANN002
        train_sampler=None,  # noqa: ANN001
        skip_nonfinite=False,  # noqa: ANN001
        optimizer_name: str = DEFAULT_OPTIMIZER,
        positional_lr_scale: float = 1.0,
        positional_weight_decay: float | None = None,
        passes_per_step: float | None = None,
        **kwargs,  # noqa: ANN003
    ) -> None:
        self.passes = PassesCallback(passes_per_step)
        callbacks = [*(kwargs.pop("callbacks", None) or []), self.passes]
        super().__init__(*args, callbacks=callbacks, **kwargs)
        self.optimizer_name = optimizer_name
        self.positional_lr_scale = positional_lr_scale
        self.positional_weight_decay = positional_weight_decay
        self._tupe_sampler = train_sampler
        # skip (and count) batches with a non-finite loss instead of stopping
        self.skip_nonfinite = skip_nonfinite
        self.nonfinite_skipped = 0
        self._staging_root: str | None = None
        # our compute_loss divides by the number of masked tokens of the global batch, so the Trainer must count
        # them (it does so when the model "accepts loss kwargs") and must not rescale for accumulation
        self.model_accepts_loss_kwargs = True

    def save_model(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        """Checkpoints and the final model are saved with `sparse_prediction` off: a user who loads them and passes
        labels gets (batch, sequence, vocabulary) logits, as from any masked LM; training keeps it on for speed."""
        config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        sparse = getattr(config, "sparse_prediction", None)
        if sparse:
            config.sparse_prediction = False
        try:
            return super().save_model(*args, **kwargs)
        finally:
            if sparse:
                config.sparse_prediction = sparse

    def train(self, resume_from_checkpoint=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        """The Trainer's train(), except that a checkpoint taken at max_steps is only loaded: transformers 5.23,
        resumed from there, trains one step past max_steps (a run killed during its final evaluation or save)."""
        from transformers import TrainerState
        from transformers.trainer import TRAINER_STATE_NAME
        from transformers.trainer_utils import TrainOutput

        logger = logging.getLogger("transformers.trainer")
        tied_only = _TiedOnly()
        logger.addFilter(tied_only)
        try:
            if resume_from_checkpoint is not None:
                state = TrainerState.load_from_json(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME))
                if 0 < self.args.max_steps <= state.global_step:
                    self._load_from_checkpoint(resume_from_checkpoint)
                    self.state = state
                    losses = [h["loss"] for h in state.log_history if "loss" in h]
                    return TrainOutput(state.global_step, sum(losses) / max(1, len(losses)), {})
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        finally:
            logger.removeFilter(tied_only)

    def create_optimizer(self, model=None):  # noqa: ANN001, ANN201
        """`optimizer_name` of `tupe.training.optimizers.OPTIMIZERS` (AdamW by default) over the model's parameter
        groups: positional tables and matrices in groups of their own, decayed as every weight matrix
        (`--positional-weight-decay`, default `--weight-decay`, as in the released code), at `--lr` x
        `--positional-lr-scale`."""
        if self.optimizer is not None:
            return self.optimizer
        a = self.args
        settings = OptimizerSettings(
            a.learning_rate,
            a.weight_decay,
            (a.adam_beta1, a.adam_beta2),
            a.adam_epsilon,
            self.positional_lr_scale,
            self.positional_weight_decay,
        )
        self.optimizer = build_optimizer(
            self.optimizer_name, model if model is not None else self.model, settings
        )
        return self.optimizer

    def log(self, logs, start_time=None):  # noqa: ANN001, ANN201
        # One TensorBoard key per quantity: given the start time, the Trainer adds its own `train_runtime` and
        # `train_tokens_per_second` to every step's log (include_num_input_tokens_seen), so the end of training
        # wrote `train/train_runtime` a second time at the last step with another value. The running throughput
        # goes under a key of its own instead, and `train_runtime` is the Trainer's end-of-training total only.
        if start_time is not None and self.args.include_num_input_tokens_seen != "no":
            seen = self.state.num_input_tokens_seen - self.passes.tokens_at_start
            elapsed = time.time() - start_time
            if elapsed > 0:
                logs = {**logs, "tokens_per_second_since_start": round(seen / elapsed, 3)}
        return super().log(logs)

    def get_batch_samples(self, epoch_iterator, num_batches, device):  # noqa: ANN001, ANN201
        """The Trainer's (the next `num_batches` batches and the count its loss is divided by), with the count of
        masked tokens of the whole global batch (all accumulation steps, all processes) made here: the Trainer's
        accelerate gather leaves a 0-dim tensor un-gathered on CPU/gloo."""
        batch_samples = list(itertools.islice(epoch_iterator, num_batches))
        return batch_samples, self._masked_tokens(batch_samples, device)

    def _masked_tokens(self, batch_samples, device):  # noqa: ANN001, ANN202
        if not batch_samples or "labels" not in batch_samples[0]:
            return None
        count = sum((b["labels"] != -100).sum() for b in batch_samples).to(device=device, dtype=torch.float32)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            count = count.reshape(1).clone()
            torch.distributed.all_reduce(count)
            count = count[0]
        return count

    def _get_train_sampler(self, train_dataset=None):  # noqa: ANN001, ANN202
        return (
            self._tupe_sampler
            if self._tupe_sampler is not None
            else super()._get_train_sampler(train_dataset)
        )

    def _masked_lm_sum(self, model, inputs):  # noqa: ANN001, ANN202
        """(sum of cross-entropy over masked tokens, number of masked tokens, model outputs)."""
        labels = inputs["labels"]
        selected = labels != -100
        sparse = getattr(self.accelerator.unwrap_model(model).config, "sparse_prediction", True)
        count = selected.sum()
        # document blocks (--packing documents) carry position_ids; stream blocks none (the call is unchanged)
        extra = {"position_ids": inputs["position_ids"]} if "position_ids" in inputs else {}
        if sparse:
            outputs = model(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels, **extra
            )
            # the model's loss is the mean over these masked tokens (0 when there are none): reuse it rather
            # than a second cross-entropy over the (num_masked, vocab) logits
            return outputs.loss.float() * count, count, outputs
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], **extra)
        logits = outputs.logits[selected]
        return F.cross_entropy(logits.float(), labels[selected], reduction="sum"), count, outputs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001, ANN201
        loss_sum, count, outputs = self._masked_lm_sum(model, inputs)
        if model.training:
            loss_sum = self._stop_if_not_finite(loss_sum, model)
        if num_items_in_batch is not None:
            total = torch.as_tensor(num_items_in_batch, device=loss_sum.device, dtype=torch.float32).clamp(
                min=1
            )
            loss = loss_sum / total
            if self.accelerator.num_processes > 1:
                loss = loss * self.accelerator.num_processes  # DDP averages gradients over processes
        else:
            loss = loss_sum / count.clamp(min=1)
        return (loss, outputs) if return_outputs else loss

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):  # noqa: ANN001, ANN201
        """Validation loss = mean cross-entropy over *all* masked tokens of the validation blocks.

        Token-weighted and independent of the batch size and of the number of processes (each process takes
        blocks rank, rank + P, ...; sums are all-reduced), so 1-process and N-process runs report the same number.
        """
        ds = eval_dataset if eval_dataset is not None else self.eval_dataset
        model = self.model
        was_training = model.training
        model.eval()
        rank, world = self.args.process_index, self.args.world_size
        order = list(range(rank, len(ds), world))
        bs = self.args.per_device_eval_batch_size
        sums = torch.zeros(2, dtype=torch.float64, device=self.args.device)
        t0 = time.perf_counter()
        with torch.no_grad(), self.compute_loss_context_manager():
            for i in range(0, len(order), bs):
                batch = self._prepare_inputs(self.data_collator([ds[j] for j in order[i : i + bs]]))
                loss_sum, count, _ = self._masked_lm_sum(model, batch)
                sums[0] += loss_sum.double()
                sums[1] += count.double()
        if world > 1:
            torch.distributed.all_reduce(sums)
        if was_training:
            model.train()
        metrics = {
            f"{metric_key_prefix}_loss": float(sums[0] / sums[1].clamp(min=1)),
            f"{metric_key_prefix}_masked_tokens": int(sums[1]),
            f"{metric_key_prefix}_runtime": round(time.perf_counter() - t0, 3),
        }
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _stop_if_not_finite(self, loss_sum: torch.Tensor, model) -> torch.Tensor:  # noqa: ANN001
        bad = (~torch.isfinite(loss_sum.detach())).float().reshape(1)
        if self.accelerator.num_processes > 1:
            torch.distributed.all_reduce(bad)
        if bad.item() == 0:
            return loss_sum
        step = self.state.global_step + 1
        if self.skip_nonfinite:
            self.nonfinite_skipped += 1
            if self.is_world_process_zero():
                print(
                    f"warning: training loss is {loss_sum.item()} (not finite) at step {step}: batch skipped "
                    f"({self.nonfinite_skipped} so far)",
                    file=sys.stderr,
                    flush=True,
                )
            # zero loss still connected to every parameter: this batch adds no gradient, and every process
            # (DDP) still takes part in the gradient all-reduce
            params = [p for p in model.parameters() if p.requires_grad]
            # value 0 in the logged average (a nan would stay in the Trainer's running loss sum for good)
            return torch.stack([p.reshape(-1)[0].float() for p in params]).sum() * 0.0
        last = find_latest_checkpoint(self.args.output_dir, log=None, deep=False)
        raise TupeError(
            f"training loss is {loss_sum.item()} (not finite) at step {step}; the run stopped there "
            f"(last good checkpoint: {last or 'none'}): lower --lr, raise --warmup-steps, use --precision fp32, "
            "or pass --skip-nonfinite to skip such batches"
        )

    # -- atomic checkpoints: the Trainer writes into .tmp-checkpoint-N/, which is renamed to checkpoint-N when
    # complete; get_last_checkpoint() only matches checkpoint-N, so a half-written checkpoint is never resumed.
    def _get_output_dir(self, trial):  # noqa: ANN001, ANN202
        if self._staging_root is not None:
            return self._staging_root
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):  # noqa: ANN001, ANN202
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = super()._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = os.path.join(run_dir, f".tmp-{name}")
        bad = first_nonfinite_parameter(model)
        if bad is not None:  # never let a diverged model replace the last good checkpoint
            raise TupeError(
                f"parameter {bad} is not finite after step {self.state.global_step}; the run stopped without "
                f"saving {name} (earlier checkpoints are kept): lower --lr or raise --warmup-steps"
            )
        if self.args.should_save:
            record_written(Path(run_dir), f".tmp-{name}", name, f".tmp-{name}-old")  # before writing them
            if os.path.exists(staging):
                shutil.rmtree(staging)
        self.accelerator.wait_for_everyone()

        def kept() -> str:  # after a failed write: what is left to resume from
            from tupe.io.checkpoints import list_checkpoints

            earlier = list_checkpoints(run_dir)
            left = (
                f"the latest complete checkpoint {earlier[0]} is kept" if earlier else "no earlier checkpoint"
            )
            return f"{name} was not saved (partial files removed); {left}: free space and rerun with --resume"

        self._staging_root = staging
        try:
            # disk full, I/O error: drop the partial checkpoint, keep the earlier ones
            with failed_writes_reported(
                os.path.join(run_dir, name), kept, cleanup=lambda: shutil.rmtree(staging, ignore_errors=True)
            ):
                super()._save_checkpoint(model, trial)
                self.accelerator.wait_for_everyone()
                if self.args.should_save:
                    # last file of the checkpoint: sizes + SHA-256 of all others, so a later truncation is detected
                    write_manifest(
                        os.path.join(staging, name),
                        self.state.global_step,
                        {"nonfinite_skipped": self.nonfinite_skipped},
                    )
                    fsync_tree(os.path.join(staging, name))
        finally:
            self._staging_root = None
        if self.args.should_save:
            final = os.path.join(run_dir, name)
            # the manifest (last file of the checkpoint: sizes + SHA-256 of all others) was written above
            if os.path.exists(final):  # re-saving a step (e.g. after resume): swap atomically
                old = staging + "-old"
                os.replace(final, old)
                os.replace(os.path.join(staging, name), final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(os.path.join(staging, name), final)
            shutil.rmtree(staging, ignore_errors=True)
            fsync_dir(run_dir)
            if self.args.save_total_limit:
                from transformers.trainer_utils import rotate_checkpoints

                rotate_checkpoints(
                    output_dir=run_dir, save_total_limit=self.args.save_total_limit, use_mtime=False
                )
        self.accelerator.wait_for_everyone()


def save_final_model(trainer: Trainer, out: Path) -> None:
    """save_model into a staging folder, then rename each file into `out`: a kill never leaves a half-written
    model.safetensors (or tokenizer file) under its final name."""
    staging = out / ".tmp-final"
    if trainer.args.should_save:
        record_written(out, staging.name)
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    with failed_writes_reported(  # disk full: the checkpoints (which hold the same weights) are untouched
        staging,
        f"the final model was not saved; the checkpoints in {out} are kept: free space and rerun with --resume",
        cleanup=lambda: shutil.rmtree(staging, ignore_errors=True),
    ):
        trainer.save_model(str(staging))
        if trainer.args.should_save:
            fsync_tree(str(staging))
    if trainer.args.should_save:
        record_written(out, *(p.name for p in staging.iterdir()))
        for p in sorted(staging.iterdir()):
            os.replace(p, out / p.name)
        fsync_dir(str(out))
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()


def build_trainer(run: Any, args: Any, data: Any, model: Any, nonfinite_skipped: int = 0):  # noqa: ANN201
    """The `PretrainTrainer` of a run (`run`: its `ResolvedConfig`; `args`: its `TrainingArguments`; `data`: the
    `PreparedData`) with the datasets, sampler, masking, callbacks and TensorBoard folder; returns it with the
    signal handler (`StopOnSignal`) among its callbacks."""
    import math

    from tupe.data.mlm import TRAIN_SPLIT, VALID_SPLIT, BlockDataset, EpochShuffleSampler, MaskedLMCollator
    from tupe.io.checkpoints import list_checkpoints
    from tupe.training.checkpointing import StopOnSignal
    from tupe.training.reporting import point_tensorboard
    from tupe.training.run_folder import METRICS_FILE

    optim, out, train_blocks = run.optim, run.run.out_dir, len(data.train_idx)
    epochs = max(1, math.ceil(optim.max_steps * optim.batch_size / train_blocks))
    stop = StopOnSignal()  # pre-emption (SIGTERM) or Ctrl-C: checkpoint at the end of the step, then stop
    callbacks: list[TrainerCallback] = [MetricsCallback(out / METRICS_FILE), LogLastStepCallback(), stop]
    if run.run.save_at:
        callbacks.append(SaveAtStepsCallback(list(run.run.save_at)))
    trainer = PretrainTrainer(
        model=model,
        args=args,
        train_dataset=BlockDataset(data.packed, data.train_idx, TRAIN_SPLIT, epochs=epochs),
        eval_dataset=BlockDataset(data.packed, data.valid_idx, VALID_SPLIT),
        data_collator=MaskedLMCollator(
            len(data.tokenizer), seed=optim.seed, mlm_probability=run.data.mlm_probability
        ),
        processing_class=data.tokenizer,
        callbacks=callbacks,
        train_sampler=EpochShuffleSampler(train_blocks, epochs, optim.seed),
        skip_nonfinite=optim.skip_nonfinite,
        optimizer_name=optim.optimizer,
        positional_lr_scale=optim.positional_lr_scale,
        positional_weight_decay=optim.positional_weight_decay,
        passes_per_step=optim.batch_size / train_blocks,
    )
    trainer.nonfinite_skipped = nonfinite_skipped

    def kept() -> str:  # what a failed TensorBoard write leaves (it stops the run)
        last = list_checkpoints(out)
        where = f"the latest checkpoint {last[0]}" if last else "no checkpoint yet"
        return (
            f"the run stopped at step {trainer.state.global_step}; {where} and {METRICS_FILE} are kept: free "
            "space and rerun with --resume"
        )

    # --report-to tensorboard: the Trainer's callback, our folder
    if point_tensorboard(trainer, out / "tensorboard", kept) and trainer.is_world_process_zero():
        record_written(out, "tensorboard")
    if run.run.quiet or not trainer.is_world_process_zero():
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    return trainer, stop


def train_or_stop(trainer: PretrainTrainer, stop: Any, resume_from: Path | None, warn: Any) -> Any:
    """`trainer.train()` from `resume_from`; a stop by signal ends the process (128 + the signal) after saying
    which checkpoint to continue from."""
    import pickle
    import signal

    from tupe.errors import one_line

    try:
        train_out = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except pickle.UnpicklingError as err:  # weights_only refused a pickled object in optimizer.pt & co.
        raise TupeError(
            f"{resume_from}: a state file (optimizer.pt, scheduler.pt or rng_state*.pth) holds objects that are not "
            f"plain tensors, refused by torch.load(weights_only=True) ({one_line(err)[:120]}); delete that checkpoint "
            "to resume from an earlier one"
        ) from None
    finally:
        stop.restore()
    if stop.received is not None:
        step = trainer.state.global_step
        warn(
            f"tupe pretrain: stopped by {signal.Signals(stop.received).name} after step {step}; saved "
            f"{trainer.args.output_dir}/checkpoint-{step}: continue with the same command and --resume"
        )
        raise SystemExit(128 + int(stop.received))
    return train_out
