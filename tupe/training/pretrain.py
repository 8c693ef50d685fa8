"""Pre-train one positional scheme with masked LM on a corpus (the recipe of Ke et al., ICLR 2021, Table 2).

Corpus -> byte-level BPE (trained once and cached, or given) -> RoBERTa full-sentences blocks (cached) -> masked LM
(15%, 80/10/10, sparse prediction) on the `transformers` Trainer: AdamW (0.9, 0.999, eps 1e-6), warm-up then
linear decay, weight decay, clipping, accumulation, bf16/fp16 on GPUs, checkpoints (atomic), `--resume`,
`metrics.jsonl` and TensorBoard logs. Multi-process with `torchrun --nproc_per_node N -m tupe pretrain ...`.

The output directory ends up holding the model and tokenizer (load with `AutoModelForMaskedLM.from_pretrained`
after `import tupe`), `metrics.jsonl`, `tensorboard/`, `checkpoint-N/` folders, `tupe_run.json` and
`tupe_files.json` (what tupe wrote there: all that --overwrite removes).

This module is the orchestration only; the parts: `arguments` (options, presets), `tupe.data.prepare_data`
(data), `run_folder` (the output folder), `model` (`build_model`), `trainer` (the Trainer customisation).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import TrainerCallback

from tupe.errors import TupeError, one_line
from tupe.io.checkpoints import list_checkpoints
from tupe.io.files import atomic_write_text, folder_lock
from tupe.io.reading import read_json
from tupe.training.arguments import (  # noqa: F401  (re-exported: `tupe compare` and other commands use them)
    PretrainConfig,
    add_arguments,
    add_model_data_arguments,
    config_from_args,
    training_arguments,
)
from tupe.training.checkpointing import (
    MANIFEST_NAME,
    StopOnSignal,
    check_checkpoint_config,
    find_latest_checkpoint,
)
from tupe.training.model import build_model, check_scheme, model_config
from tupe.training.reporting import align_special_tokens, point_tensorboard
from tupe.training.run_folder import (  # noqa: F401  (re-exported)
    METRICS_FILE,
    RUN_FILE,
    RUN_FORMAT,
    SUMMARY_FILE,
    _truncate_metrics,
    _wipe,
    check_out_dir,
    record_written,
)
from tupe.training.trainer import (
    LogLastStepCallback,
    MetricsCallback,
    PretrainTrainer,
    SaveAtStepsCallback,
    save_final_model,
)


class _Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)


def pretrain(config: PretrainConfig) -> dict[str, Any]:
    """Run (or resume) one pre-training run; returns the summary also written to `OUT/pretrain_summary.json`.

    Path flags are checked before any work, and the main process holds `OUT`'s lock (one writer per run folder)
    from before the data is prepared to the end.
    """
    from tupe.validators import check_out_folder, check_path_kind

    out = check_out_folder("--out", config.out, must_exist=config.resume and not config.prepare_only)
    if (
        config.resume
        and not config.prepare_only
        and not (out / RUN_FILE).is_file()
        and not list_checkpoints(out)
    ):
        raise TupeError(
            f"--resume: {out} holds no tupe run (no {RUN_FILE}, no checkpoint-N); drop --resume to start one"
        )
    if config.tokenizer is not None:
        check_path_kind("--tokenizer", config.tokenizer, "any")
    if config.cache_dir is not None and Path(config.cache_dir).expanduser().exists():
        if not Path(config.cache_dir).expanduser().is_dir():
            raise TupeError(f"--cache-dir {config.cache_dir} is a file, not a folder")
    if config.prepare_only or int(os.environ.get("RANK", "0")) != 0:
        return _pretrain(config)
    with folder_lock(out, "tupe pretrain"):
        return _pretrain(config)


def _pretrain(config: PretrainConfig) -> dict[str, Any]:
    from transformers import set_seed

    from tupe.data.mlm import TRAIN_SPLIT, VALID_SPLIT, BlockDataset, EpochShuffleSampler, MaskedLMCollator
    from tupe.data.prepare import prepare_data
    from tupe.data.tokenizer import tokenizer_fingerprint

    t_start = time.perf_counter()
    check_scheme(config.scheme, config.attention_kernel)
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

    # Trainer arguments first: this sets up torch.distributed under torchrun, needed for main_process_first.
    args = training_arguments(config, v, out, per_device)
    state = PartialState()
    main = state.is_main_process
    log = _Log(config.quiet or not main)

    def warn(msg: str) -> None:
        """Warnings a user must see even with --quiet (a checkpoint skipped as corrupt), on stderr."""
        if main:
            print(msg, file=sys.stderr, flush=True)

    with args.main_process_first(desc="tokenizer and data", local=False):
        data = prepare_data(
            config.corpus,
            int(v["max_length"]),
            int(v["valid_every"]),
            tokenizer=config.tokenizer,
            vocab_size=int(v["vocab_size"]),
            tokenizer_max_mb=config.tokenizer_max_mb,
            cache_dir=config.cache_dir,
            text_column=config.text_column,
            skip_bad_text=config.skip_bad_text,
            log=log,
            progress=config.progress and not config.quiet and main,
        )
    corpus, tokenizer, packed, train_idx, valid_idx = (
        data.corpus,
        data.tokenizer,
        data.packed,
        data.train_idx,
        data.valid_idx,
    )
    log(
        f"data: {len(packed):,} blocks of {v['max_length']} tokens: {len(train_idx):,} train, "
        f"{len(valid_idx):,} valid"
    )
    if config.prepare_only:
        return {"prepared": True, **data.describe(), "wall_seconds": round(time.perf_counter() - t_start, 1)}

    model_kwargs = model_config(config, v, tokenizer)
    # saved with the model: truncation=True (pipelines, tokenizer calls) cuts at the model's length
    tokenizer.model_max_length = int(model_kwargs["max_position_embeddings"])
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
    # recorded only when set, so runs made before these options existed keep their identity
    if config.positional_lr_scale != 1.0:
        identity["optim"]["positional_lr_scale"] = config.positional_lr_scale
    if config.positional_weight_decay is not None:
        identity["optim"]["positional_weight_decay"] = config.positional_weight_decay
    action = check_out_dir(out, identity, config.resume, config.overwrite)
    state.wait_for_everyone()  # every process decided before the main one changes the folder
    resume_from = None
    with args.main_process_first(desc="output folder", local=False):
        if main:
            if action == "wipe":
                kept = _wipe(out)
                log(f"--overwrite: removed the previous run's files from {out}")
                if kept:
                    warn(
                        f"--overwrite: kept {len(kept)} file(s) tupe did not write in {out}: {', '.join(kept[:5])}"
                    )
            out.mkdir(parents=True, exist_ok=True)
            record_written(out, RUN_FILE, METRICS_FILE)  # before writing them: see run_folder
            for stale in out.glob(".tmp-checkpoint-*"):  # a save cut by a kill
                shutil.rmtree(stale, ignore_errors=True)
            atomic_write_text(
                out / RUN_FILE,
                json.dumps({**identity, "preset": config.preset, "corpus_desc": corpus.describe()}, indent=1),
            )
    nonfinite_skipped = 0
    if action == "resume":
        # the newest checkpoint that verifies (manifest sizes + SHA-256), not just the highest checkpoint-N name
        latest = find_latest_checkpoint(out, log=warn)
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
            check_checkpoint_config(
                latest, {k: model_kwargs[k] for k in (*shape, "model_type") if k in model_kwargs}
            )
        if latest is not None and (latest / MANIFEST_NAME).is_file():
            nonfinite_skipped = int(
                read_json(latest / MANIFEST_NAME, "checkpoint manifest").get("nonfinite_skipped", 0)
            )
        if resume_from is None:
            log(f"--resume: no checkpoint in {out} yet; starting from step 0")
        else:
            log(f"--resume: continuing from {resume_from}")
    if main:
        last_step = int(resume_from.rsplit("-", 1)[1]) if resume_from else 0
        _truncate_metrics(out / METRICS_FILE, last_step)

    set_seed(config.seed)
    model = build_model(config, model_kwargs)
    align_special_tokens(model, tokenizer)  # else the Trainer does it, with a warning
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

    stop = StopOnSignal()  # pre-emption (SIGTERM) or Ctrl-C: checkpoint at the end of the step, then stop
    callbacks: list[TrainerCallback] = [
        MetricsCallback(out / METRICS_FILE),
        LogLastStepCallback(),
        stop,
    ]
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
        positional_lr_scale=config.positional_lr_scale,
        positional_weight_decay=config.positional_weight_decay,
        passes_per_step=int(v["batch_size"]) / len(train_idx),
    )
    trainer.nonfinite_skipped = nonfinite_skipped

    # --report-to tensorboard: the Trainer's callback, our folder
    def kept() -> str:  # what a failed TensorBoard write leaves (it stops the run)
        last = list_checkpoints(out)
        where = f"the latest checkpoint {last[0]}" if last else "no checkpoint yet"
        return (
            f"the run stopped at step {trainer.state.global_step}; {where} and {METRICS_FILE} are kept: free "
            "space and rerun with --resume"
        )

    if point_tensorboard(trainer, out / "tensorboard", kept) and main:
        record_written(out, "tensorboard")
    if config.quiet or not main:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    try:
        train_out = trainer.train(resume_from_checkpoint=resume_from)
    except pickle.UnpicklingError as err:  # weights_only refused a pickled object in optimizer.pt & co.
        raise TupeError(
            f"{resume_from}: a state file (optimizer.pt, scheduler.pt or rng_state*.pth) holds objects that are not "
            f"plain tensors, refused by torch.load(weights_only=True) ({one_line(err)[:120]}); delete that checkpoint "
            "to resume from an earlier one"
        ) from None
    finally:
        stop.restore()
    if stop.received is not None:
        import signal

        warn(
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
    save_final_model(trainer, out)
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
    if main:
        record_written(out, "README.md", SUMMARY_FILE)
        _write_card(out, config, v, corpus, len(train_idx), summary)
        atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))  # last: marks the run finished
        log(f"done: {summary['steps']} steps, validation loss {final_eval:.4f}; model saved to {out}")
    return summary


def _write_card(
    out: Path, config: PretrainConfig, v: dict, corpus: Any, train_blocks: int, summary: dict
) -> None:
    """README.md next to the model: scheme, recipe, data, final metrics, the command, how to load it."""
    from tupe.io.model_card import write_model_card

    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_length")
    keys += ("vocab_size", "batch_size", "max_steps", "learning_rate", "warmup_steps", "weight_decay")
    keys += ("adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "mlm_probability")
    recipe = {"preset": config.preset, **{k: v[k] for k in keys}, "seed": config.seed}
    recipe["objective"] = "masked LM (15% of tokens: 80% [MASK], 10% random, 10% kept)"
    data = (
        f"{corpus.describe()}; byte-level BPE tokenizer ({v['vocab_size']} entries), packed into "
        f"{train_blocks:,} training blocks of {v['max_length']} tokens (1 block in {v['valid_every']} held out "
        "for validation)."
    )
    metrics = {
        "steps": summary["steps"],
        "validation masked-LM loss": summary["final_eval_loss"],
        "validation perplexity": math.exp(min(50.0, summary["final_eval_loss"])),
        "training loss (mean over the run)": summary["train_loss"],
        "passes over the training blocks": round(summary["steps"] * int(v["batch_size"]) / train_blocks, 2),
    }
    write_model_card(out, kind="fill-mask", scheme=config.scheme, recipe=recipe, data=data, metrics=metrics)


def run(args: argparse.Namespace) -> int:
    from tupe.runtime import hushed_libraries

    with hushed_libraries(args.progress, args.quiet):  # no "Writing model shards" bars with --quiet
        summary = pretrain(config_from_args(args))
    if summary.get("prepared"):
        print(json.dumps(summary, indent=1))
    return 0
