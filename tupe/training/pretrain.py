"""Pre-train one positional scheme with masked LM on a corpus (the paper's recipe, TUPE spec section 4).

Corpus -> byte-level BPE (trained once and cached, or given) -> RoBERTa full-sentences blocks (cached) -> masked LM
(15%, 80/10/10, sparse prediction) on the `transformers` Trainer: AdamW (0.9, 0.999, eps 1e-6), warm-up then
linear decay, weight decay, clipping, accumulation, bf16/fp16 on GPUs, checkpoints (atomic), `--resume`,
`metrics.jsonl` and TensorBoard logs. Multi-process with `torchrun --nproc_per_node N -m tupe pretrain ...`.

The output directory ends up holding the model and tokenizer (load with `AutoModelForMaskedLM.from_pretrained`
after `import tupe`), `metrics.jsonl`, `tensorboard/`, `checkpoint-N/` folders and `tupe_run.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback, TrainingArguments

from tupe.errors import TupeError
from tupe.training.checkpointing import (
    MANIFEST_NAME,
    StopOnSignal,
    atomic_write_text,
    check_checkpoint_config,
    find_latest_checkpoint,
    list_checkpoints,
)
from tupe.training.presets import get_preset

RUN_FILE = "tupe_run.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "pretrain_summary.json"
RUN_FORMAT = 1
# files a tupe run writes at the top of its folder (anything else makes --overwrite refuse to wipe the folder)
_RUN_ARTIFACTS_PREFIXES = (
    "checkpoint-",
    ".tmp-checkpoint-",
    "tensorboard",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer",
    "special_tokens_map.json",
    "training_args.bin",
    "modeling_tupe.py",
    "configuration_tupe.py",
    "positional.py",
    "kernels.py",
    "conversion.py",
    METRICS_FILE,
    SUMMARY_FILE,
    RUN_FILE,
)


@dataclass
class PretrainConfig:
    """Everything `tupe pretrain` accepts; `None` means "the preset's value"."""

    out: str
    scheme: str = "tupe-a"
    corpus: list[str] | None = None
    preset: str = "mini"
    text_column: str = "text"
    tokenizer: str | None = None
    vocab_size: int | None = None
    tokenizer_max_mb: float | None = None
    max_length: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    dropout: float | None = None
    dense_prediction: bool = False
    attn_implementation: str | None = None
    batch_size: int | None = None
    grad_accum: int = 1
    max_steps: int | None = None
    learning_rate: float | None = None
    warmup_steps: int | None = None
    weight_decay: float | None = None
    adam_beta1: float | None = None
    adam_beta2: float | None = None
    adam_epsilon: float | None = None
    max_grad_norm: float | None = None
    mlm_probability: float | None = None
    valid_every: int | None = None
    eval_steps: int | None = None
    save_steps: int | None = None
    save_at: list[int] | None = None
    save_total_limit: int | None = None
    logging_steps: int | None = None
    eval_batch_size: int | None = None
    seed: int = 0
    precision: str = "auto"
    cache_dir: str | None = None
    resume: bool = False
    overwrite: bool = False
    skip_nonfinite: bool = False
    skip_bad_text: bool = False
    progress: bool = True
    quiet: bool = False
    threads: int | None = None
    prepare_only: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def resolved(self) -> dict[str, Any]:
        """Preset values with this config's explicit values on top."""
        values = get_preset(self.preset)
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in values and v is not None:
                values[f.name] = v
        return values


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _warn(msg: str) -> None:
    """Warnings a user must see even with --quiet (a checkpoint skipped as corrupt), on stderr."""
    if _is_main():
        print(msg, file=sys.stderr, flush=True)


class _Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet or not _is_main()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)


# ----------------------------------------------------------------------------------------------------- out dir
def _identity_diff(old: dict, new: dict) -> list[str]:
    diffs = []
    for section in ("scheme", "model", "data", "optim"):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    diffs.append(f"{section}.{k}: {a.get(k)!r} -> {b.get(k)!r}")
        elif a != b:
            diffs.append(f"{section}: {a!r} -> {b!r}")
    return diffs


def check_out_dir(out: Path, identity: dict, resume: bool, overwrite: bool) -> str:
    """Decide what to do with `out`: 'fresh', 'resume' or 'wipe'. Raises a `TupeError` when it must refuse.

    A folder that holds another run is refused unless --overwrite; one that holds this run is refused unless
    --resume or --overwrite; a non-empty folder that is not a tupe run is never wiped.
    """
    if out.exists() and not out.is_dir():
        raise TupeError(f"--out {out} is a file, not a folder")
    entries = [p for p in out.iterdir()] if out.exists() else []
    if not entries:
        return "fresh"
    run_file = out / RUN_FILE
    if not run_file.exists():
        foreign = [p.name for p in entries if not p.name.startswith(_RUN_ARTIFACTS_PREFIXES)]
        if foreign:
            raise TupeError(
                f"--out {out} is not empty and is not a tupe run folder (it holds {foreign[0]!r}); choose a new --out"
            )
        return "wipe" if overwrite else _refuse(out, "holds files of an unfinished run (no tupe_run.json)")
    try:
        old = json.loads(run_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TupeError(f"{run_file}: unreadable ({err}); use --overwrite to start again") from None
    diffs = _identity_diff(old, identity)
    if overwrite:
        return "wipe"
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise TupeError(f"--out {out} holds a different run ({shown}); use another --out or pass --overwrite")
    if resume:
        return "resume"
    return _refuse(out, "already holds this run")


def _refuse(out: Path, why: str) -> str:
    raise TupeError(f"--out {out} {why}; pass --resume to continue it or --overwrite to start again")


def _wipe(out: Path) -> None:
    for p in out.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _truncate_metrics(path: Path, last_step: int) -> None:
    """On resume, drop records the interrupted run wrote after the checkpoint we continue from."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut by the kill
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------- trainer
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
                epoch=round(state.epoch or 0.0, 4),
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


class PretrainTrainer(Trainer):
    """The stock Trainer plus: our sampler, a masked-LM loss normalised over the whole global batch, a stop on
    non-finite losses, and atomic checkpoints."""

    def __init__(self, *args, train_sampler=None, skip_nonfinite=False, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._tupe_sampler = train_sampler
        # skip (and count) batches with a non-finite loss instead of stopping
        self.skip_nonfinite = skip_nonfinite
        self.nonfinite_skipped = 0
        self._staging_root: str | None = None
        # our compute_loss divides by the number of masked tokens of the global batch, so the Trainer must count
        # them (it does so when the model "accepts loss kwargs") and must not rescale for accumulation
        self.model_accepts_loss_kwargs = True

    def train(self, resume_from_checkpoint=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        """The Trainer's train(), except that a checkpoint taken at max_steps is only loaded: transformers 5.23,
        resumed from there, trains one step past max_steps (a run killed during its final evaluation or save)."""
        from transformers import TrainerState
        from transformers.trainer import TRAINER_STATE_NAME
        from transformers.trainer_utils import TrainOutput

        if resume_from_checkpoint is not None:
            state = TrainerState.load_from_json(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME))
            if 0 < self.args.max_steps <= state.global_step:
                self._load_from_checkpoint(resume_from_checkpoint)
                self.state = state
                losses = [h["loss"] for h in state.log_history if "loss" in h]
                return TrainOutput(state.global_step, sum(losses) / max(1, len(losses)), {})
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _get_num_items_in_batch(self, batch_samples, device):  # noqa: ANN001, ANN202
        # Masked tokens of the whole global batch (all accumulation steps, all processes). Counted here rather than
        # by the Trainer: its accelerate gather leaves a 0-dim tensor un-gathered on CPU/gloo.
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
        if sparse:
            outputs = model(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels
            )
            logits = outputs.logits  # (num_masked, vocab)
        else:
            outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            logits = outputs.logits[selected]
        return F.cross_entropy(logits.float(), labels[selected], reduction="sum"), selected.sum(), outputs

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
            if _is_main():
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

        from tupe.training.checkpointing import first_nonfinite_parameter, write_manifest

        run_dir = super()._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = os.path.join(run_dir, f".tmp-{name}")
        bad = first_nonfinite_parameter(model)
        if bad is not None:  # never let a diverged model replace the last good checkpoint
            raise TupeError(
                f"parameter {bad} is not finite after step {self.state.global_step}; the run stopped without "
                f"saving {name} (earlier checkpoints are kept): lower --lr or raise --warmup-steps"
            )
        if self.args.should_save and os.path.exists(staging):
            shutil.rmtree(staging)
        self.accelerator.wait_for_everyone()
        self._staging_root = staging
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            final = os.path.join(run_dir, name)
            # last file of the checkpoint: sizes + SHA-256 of all others, so a later truncation is detected
            write_manifest(
                os.path.join(staging, name),
                self.state.global_step,
                {"nonfinite_skipped": self.nonfinite_skipped},
            )
            _fsync_tree(os.path.join(staging, name))
            if os.path.exists(final):  # re-saving a step (e.g. after resume): swap atomically
                old = staging + "-old"
                os.replace(final, old)
                os.replace(os.path.join(staging, name), final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(os.path.join(staging, name), final)
            shutil.rmtree(staging, ignore_errors=True)
            _fsync_dir(run_dir)
            if self.args.save_total_limit:
                from transformers.trainer_utils import rotate_checkpoints

                rotate_checkpoints(
                    output_dir=run_dir, save_total_limit=self.args.save_total_limit, use_mtime=False
                )
        self.accelerator.wait_for_everyone()


def _fsync_tree(path: str) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                pass


def _save_final_model(trainer: Trainer, out: Path) -> None:
    """save_model into a staging folder, then rename each file into `out`: a kill never leaves a half-written
    model.safetensors (or tokenizer file) under its final name."""
    staging = out / ".tmp-final"
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))
    if trainer.args.should_save:
        _fsync_tree(str(staging))
        for p in sorted(staging.iterdir()):
            os.replace(p, out / p.name)
        _fsync_dir(str(out))
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------- main entry
def _precision_flags(precision: str) -> dict[str, bool]:
    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise TupeError(f"--precision must be auto, fp32, bf16 or fp16, got {precision!r}")
    cuda = torch.cuda.is_available()
    if precision == "auto":
        if not cuda:
            return {"bf16": False, "fp16": False}
        return {"bf16": torch.cuda.is_bf16_supported(), "fp16": not torch.cuda.is_bf16_supported()}
    if precision in ("bf16", "fp16") and not cuda:
        raise TupeError(f"--precision {precision} needs a GPU here; use fp32 (the default on CPU)")
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def pretrain(config: PretrainConfig) -> dict[str, Any]:
    """Run (or resume) one pre-training run; returns the summary also written to `OUT/pretrain_summary.json`."""
    import tupe  # noqa: F401 - registers the model with the Auto classes
    from tupe.data.corpus import resolve_corpus
    from tupe.data.mlm import TRAIN_SPLIT, VALID_SPLIT, BlockDataset, EpochShuffleSampler, MaskedLMCollator
    from tupe.data.packing import default_cache_dir, load_or_build_packed
    from tupe.data.tokenizer import get_or_train_tokenizer, load_tokenizer, tokenizer_fingerprint
    from tupe.modeling import POSITION_SCHEMES, TupeConfig, TupeForMaskedLM

    log = _Log(config.quiet)
    t_start = time.perf_counter()
    if config.scheme not in POSITION_SCHEMES:
        raise TupeError(f"unknown scheme {config.scheme!r}; choose one of: {', '.join(POSITION_SCHEMES)}")
    v = config.resolved()
    if config.threads:
        torch.set_num_threads(int(config.threads))
    out = Path(config.out).expanduser()
    for key in (
        "max_steps",
        "batch_size",
        "max_length",
        "vocab_size",
        "eval_steps",
        "logging_steps",
        "save_steps",
    ):
        if int(v[key]) <= 0:
            raise TupeError(f"--{key.replace('_', '-')} must be positive, got {v[key]}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = world * config.grad_accum
    if v["batch_size"] % per_step:
        raise TupeError(
            f"--batch-size {v['batch_size']} (global) is not divisible by processes x --grad-accum = {per_step}"
        )
    per_device = v["batch_size"] // per_step
    cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()

    # Trainer arguments first: this sets up torch.distributed under torchrun, needed for main_process_first.
    flags = _precision_flags(config.precision)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=int(v["max_steps"]),
        per_device_train_batch_size=per_device,
        per_device_eval_batch_size=config.eval_batch_size or per_device,
        gradient_accumulation_steps=config.grad_accum,
        learning_rate=v["learning_rate"],
        weight_decay=v["weight_decay"],
        adam_beta1=v["adam_beta1"],
        adam_beta2=v["adam_beta2"],
        adam_epsilon=v["adam_epsilon"],
        max_grad_norm=v["max_grad_norm"],
        lr_scheduler_type="linear",
        warmup_steps=int(v["warmup_steps"]),
        logging_steps=int(v["logging_steps"]),
        eval_strategy="steps",
        eval_steps=int(v["eval_steps"]),
        save_strategy="steps",
        save_steps=int(v["save_steps"]),
        save_total_limit=config.save_total_limit,
        seed=config.seed,
        report_to="none",
        disable_tqdm=not config.progress or config.quiet,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        remove_unused_columns=False,
        prediction_loss_only=True,
        logging_nan_inf_filter=False,
        include_num_input_tokens_seen="non_padding",
        average_tokens_across_devices=True,
        use_cpu=not torch.cuda.is_available(),  # also what makes accelerate run data-parallel on CPU (gloo)
        **flags,
    )

    corpus = resolve_corpus(config.corpus, config.text_column, skip_bad_text=config.skip_bad_text)
    with args.main_process_first(desc="tokenizer and data", local=False):
        if config.tokenizer:
            tokenizer = load_tokenizer(config.tokenizer)
        else:
            max_bytes = int(config.tokenizer_max_mb * 1e6) if config.tokenizer_max_mb else None
            tokenizer = get_or_train_tokenizer(
                corpus,
                cache_dir,
                int(v["vocab_size"]),
                max_bytes=max_bytes,
                log=log,
                progress=config.progress and not config.quiet and _is_main(),
            )
        packed = load_or_build_packed(
            corpus,
            tokenizer,
            int(v["max_length"]),
            cache_dir,
            progress=config.progress and _is_main(),
            log=log,
        )
    train_idx, valid_idx = packed.split(int(v["valid_every"]))
    log(
        f"data: {len(packed):,} blocks of {v['max_length']} tokens: {len(train_idx):,} train, "
        f"{len(valid_idx):,} valid"
    )
    if config.prepare_only:
        return {
            "prepared": True,
            "tokens": packed.num_tokens,
            "blocks": len(packed),
            "train_blocks": int(len(train_idx)),
            "valid_blocks": int(len(valid_idx)),
            "data_cache": str(packed.path),
            "tokenize_pack_seconds": packed.meta.get("seconds"),
            "tokenize_pack_tokens_per_second": packed.meta.get("tokens_per_second"),
            "wall_seconds": round(time.perf_counter() - t_start, 1),
        }

    model_kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=int(v["hidden_size"]),
        num_hidden_layers=int(v["num_hidden_layers"]),
        num_attention_heads=int(v["num_attention_heads"]),
        intermediate_size=int(v["intermediate_size"]),
        max_position_embeddings=int(v["max_length"]),
        position_scheme=config.scheme,
        hidden_dropout_prob=float(v["dropout"]),
        attention_probs_dropout_prob=float(v["dropout"]),
        sparse_prediction=not config.dense_prediction,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        mask_token_id=tokenizer.mask_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    identity = {
        "format": RUN_FORMAT,
        "scheme": config.scheme,
        "model": model_kwargs,
        "data": {
            "corpus": packed.meta["corpus_fingerprint"],
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "max_length": int(v["max_length"]),
            "valid_every": int(v["valid_every"]),
            "mlm_probability": float(v["mlm_probability"]),
        },
        "optim": {
            k: v[k]
            for k in (
                "batch_size",
                "learning_rate",
                "warmup_steps",
                "weight_decay",
                "adam_beta1",
                "adam_beta2",
                "adam_epsilon",
                "max_grad_norm",
            )
        }
        | {"seed": config.seed, "grad_accum": config.grad_accum},
    }
    action = check_out_dir(out, identity, config.resume, config.overwrite)
    _barrier()  # every process decided before the main one changes the folder
    resume_from = None
    with args.main_process_first(desc="output folder", local=False):
        if _is_main():
            if action == "wipe":
                log(f"--overwrite: emptying {out}")
                _wipe(out)
            out.mkdir(parents=True, exist_ok=True)
            for stale in out.glob(".tmp-checkpoint-*"):  # a save cut by a kill
                shutil.rmtree(stale, ignore_errors=True)
            atomic_write_text(
                out / RUN_FILE,
                json.dumps({**identity, "preset": config.preset, "corpus_desc": corpus.describe()}, indent=1),
            )
    nonfinite_skipped = 0
    if action == "resume":
        # the newest checkpoint that verifies (manifest sizes + SHA-256), not just the highest checkpoint-N name
        latest = find_latest_checkpoint(out, log=_warn)
        if latest is None and list_checkpoints(out):
            raise TupeError(
                f"--resume: no complete checkpoint in {out} (every checkpoint-N failed verification, see the "
                "warnings); use --overwrite to start again"
            )
        resume_from = str(latest) if latest is not None else None
        if latest is not None:
            shape = (
                "position_scheme",
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
            shape += ("intermediate_size", "max_position_embeddings")
            check_checkpoint_config(latest, {k: model_kwargs[k] for k in shape})
        if latest is not None and (latest / MANIFEST_NAME).is_file():
            nonfinite_skipped = int(
                json.loads((latest / MANIFEST_NAME).read_text()).get("nonfinite_skipped", 0)
            )
        if resume_from is None:
            log(f"--resume: no checkpoint in {out} yet; starting from step 0")
        else:
            log(f"--resume: continuing from {resume_from}")
    if _is_main():
        last_step = int(resume_from.rsplit("-", 1)[1]) if resume_from else 0
        _truncate_metrics(out / METRICS_FILE, last_step)

    from transformers import set_seed

    set_seed(config.seed)
    mcfg = TupeConfig(**model_kwargs)
    if config.attn_implementation:
        mcfg._attn_implementation = config.attn_implementation
    model = TupeForMaskedLM(mcfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"model: {config.scheme}, {n_params / 1e6:.2f} M parameters, {v['num_hidden_layers']} x {v['hidden_size']}, "
        f"{v['num_attention_heads']} heads; batch {v['batch_size']} x {v['max_length']} tokens "
        f"({world} process(es) x {per_device} x {config.grad_accum} accumulation), {v['max_steps']} steps"
    )

    epochs = max(1, math.ceil(int(v["max_steps"]) * int(v["batch_size"]) / len(train_idx)))
    train_ds = BlockDataset(packed, train_idx, TRAIN_SPLIT, epochs=epochs)
    valid_ds = BlockDataset(packed, valid_idx, VALID_SPLIT)
    collator = MaskedLMCollator(len(tokenizer), seed=config.seed, mlm_probability=float(v["mlm_probability"]))
    sampler = EpochShuffleSampler(len(train_idx), epochs, config.seed)

    from transformers.integrations import TensorBoardCallback

    tb = TensorBoardCallback()
    tb.logging_dir = str(out / "tensorboard")
    stop = StopOnSignal()  # pre-emption (SIGTERM) or Ctrl-C: checkpoint at the end of the step, then stop
    callbacks: list[TrainerCallback] = [MetricsCallback(out / METRICS_FILE), tb, stop]
    if v["save_at"]:
        callbacks.append(SaveAtStepsCallback([int(s) for s in v["save_at"]]))
    trainer = PretrainTrainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=valid_ds,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks,
        train_sampler=sampler,
        skip_nonfinite=config.skip_nonfinite,
    )
    trainer.nonfinite_skipped = nonfinite_skipped
    if config.quiet or not _is_main():
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    try:
        train_out = trainer.train(resume_from_checkpoint=resume_from)
    finally:
        stop.restore()
    if stop.received is not None:
        import signal

        _warn(
            f"tupe pretrain: stopped by {signal.Signals(stop.received).name} after step {trainer.state.global_step}; "
            f"saved {out / f'checkpoint-{trainer.state.global_step}'}: continue with the same command and --resume"
        )
        raise SystemExit(128 + int(stop.received))
    final_evals = [
        h["eval_loss"]
        for h in trainer.state.log_history
        if "eval_loss" in h and h.get("step") == trainer.state.global_step
    ]
    final_eval = final_evals[-1] if final_evals else trainer.evaluate()["eval_loss"]
    _save_final_model(trainer, out)
    summary = {
        "scheme": config.scheme,
        "preset": config.preset,
        "steps": trainer.state.global_step,
        "final_eval_loss": final_eval,
        "train_loss": train_out.training_loss,
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "num_parameters": n_params,
        "train_blocks": int(len(train_idx)),
        "valid_blocks": int(len(valid_idx)),
        "corpus": corpus.describe(),
        "data_cache": str(packed.path),
        "tokenize_pack_tokens_per_second": packed.meta.get("tokens_per_second"),
        "nonfinite_skipped": trainer.nonfinite_skipped,
    }
    if _is_main():
        atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))  # last: marks the run finished
        log(f"done: {summary['steps']} steps, validation loss {final_eval:.4f}; model saved to {out}")
    return summary


# -------------------------------------------------------------------------------------------------------- CLI
# The parser is built from a torch-free module, so `tupe pretrain --help` starts fast
from tupe.training.arguments import add_model_data_arguments  # noqa: E402, F401
from tupe.training.arguments import add_pretrain_arguments as add_arguments  # noqa: E402, F401


def config_from_args(args: argparse.Namespace, **over: Any) -> PretrainConfig:
    names = {f.name for f in dataclasses.fields(PretrainConfig)}
    kw = {k: v for k, v in vars(args).items() if k in names}
    kw.update(over)
    return PretrainConfig(**kw)


def run(args: argparse.Namespace) -> int:
    summary = pretrain(config_from_args(args))
    if summary.get("prepared"):
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    from tupe.cli import main

    sys.exit(main(["pretrain", *sys.argv[1:]]))
