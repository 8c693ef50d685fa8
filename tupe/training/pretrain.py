"""Pre-train one positional scheme with masked LM on a corpus (the recipe of Ke et al., ICLR 2021, Table 2).

Corpus -> byte-level BPE (trained once and cached, or given) -> RoBERTa full-sentences blocks (cached; or document
blocks with `--packing documents`, tupe/data/documents.py) -> masked LM
(15%, 80/10/10, sparse prediction) on the `transformers` Trainer: AdamW (0.9, 0.999, eps 1e-6), warm-up then
linear decay, weight decay, clipping, accumulation, bf16/fp16 on GPUs, checkpoints (atomic), `--resume`,
`metrics.jsonl` and TensorBoard logs. Multi-process with `torchrun --nproc_per_node N -m tupe pretrain ...`.

The output directory ends up holding the model and tokenizer (load with `AutoModelForMaskedLM.from_pretrained`
after `import tupe`), `metrics.jsonl`, `tensorboard/`, `checkpoint-N/` folders, `tupe_run.json` and
`tupe_files.json` (what tupe wrote there: all that --overwrite removes).

This module is the orchestration only, one build after another: `config` (`PretrainConfig.resolve`: the run's
settings as four parts, each checked once where it is made), `DataConfig.build` (data), `run_folder` (the output
folder), `checkpointing` (where to resume), `ModelConfig.build` (the model), `trainer` (`build_trainer`, the Trainer
customisation).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tupe.data.config import DataConfig
from tupe.errors import TupeError
from tupe.io.checkpoints import list_checkpoints
from tupe.io.files import atomic_write_text, folder_lock
from tupe.training.arguments import (  # noqa: F401  (re-exported: `tupe compare` and other commands use them)
    add_arguments,
    add_model_data_arguments,
    config_from_args,
    pretrain_training_arguments,
)
from tupe.training.checkpointing import ResumePoint, select_resume_checkpoint
from tupe.training.config import PretrainConfig, ResolvedConfig  # noqa: F401  (re-exported)
from tupe.training.init_from import load_source, with_source
from tupe.training.reporting import align_special_tokens
from tupe.training.run_folder import (  # noqa: F401  (re-exported)
    METRICS_FILE,
    RUN_FILE,
    RUN_FORMAT,
    SUMMARY_FILE,
    check_out_dir,
    prepare_run_folder,
    record_written,
    run_identity,
    truncate_metrics,
)
from tupe.training.trainer import build_trainer, save_final_model, train_or_stop


class _Log:
    """Progress lines (stdout; none with --quiet or off the main process) and warnings a user must see even with
    --quiet, such as a checkpoint skipped as corrupt (stderr, main process)."""

    def __init__(self, quiet: bool, main: bool) -> None:
        self.quiet, self.main = quiet, main

    def __call__(self, msg: str) -> None:
        if not self.quiet and self.main:
            print(msg, flush=True)

    def warn(self, msg: str) -> None:
        if self.main:
            print(msg, file=sys.stderr, flush=True)


def pretrain(config: PretrainConfig) -> dict[str, Any]:
    """Run (or resume) one pre-training run; returns the summary also written to `OUT/pretrain_summary.json`.

    Settings and path flags are checked before any work, and the main process holds `OUT`'s lock (one writer per
    run folder) from before the data is prepared to the end.
    """
    from tupe.validators import check_out_folder, check_path_kind

    cfg = with_source(config).resolve()  # --init-from: the source's tokenizer and shape
    _check_memory(cfg)
    run, data = cfg.run, cfg.data
    out = check_out_folder("--out", run.out, must_exist=run.resume and not run.prepare_only)
    if run.resume and not run.prepare_only and not (out / RUN_FILE).is_file() and not list_checkpoints(out):
        raise TupeError(
            f"--resume: {out} holds no tupe run (no {RUN_FILE}, no checkpoint-N); drop --resume to start one"
        )
    if data.tokenizer is not None:
        check_path_kind("--tokenizer", data.tokenizer, "any")
    if data.cache_dir is not None and Path(data.cache_dir).expanduser().exists():
        if not Path(data.cache_dir).expanduser().is_dir():
            raise TupeError(f"--cache-dir {data.cache_dir} is a file, not a folder")
    if run.prepare_only or int(os.environ.get("RANK", "0")) != 0:
        return _pretrain(cfg)
    with folder_lock(out, "tupe pretrain"):
        return _pretrain(cfg)


def _check_memory(cfg: ResolvedConfig) -> None:
    """Sizes whose product cannot fit in this machine's memory stop the run before the BPE and the data, in one
    line naming the options (not an allocation abort minutes later)."""
    from tupe.validators import activation_bytes, check_memory, model_bytes

    m = cfg.model
    hidden, layers, heads = m.hidden_size, m.num_hidden_layers, m.num_attention_heads
    length, vocab = cfg.data.max_length, cfg.data.vocab_size
    activations = activation_bytes(
        cfg.per_device_batch_size, length, hidden, layers, heads, m.intermediate_size, vocab, training=True
    )
    check_memory(
        f"--vocab-size {vocab}, --hidden-size {hidden}, --num-layers {layers}, --batch-size "
        f"{cfg.optim.batch_size} and --max-seq-len {length}",
        model_bytes(vocab, hidden, layers, m.intermediate_size) + activations,
    )


def _pretrain(cfg: ResolvedConfig) -> dict[str, Any]:
    """The run, step by step: process set-up, data, the run folder, where to resume, model, Trainer, training,
    the final model and its summary."""
    import torch
    from accelerate import PartialState
    from transformers import set_seed

    from tupe.data.tokenizer import tokenizer_fingerprint

    t_start = time.perf_counter()
    if cfg.run.threads:
        torch.set_num_threads(int(cfg.run.threads))
    # the Trainer's arguments first: they set up torch.distributed under torchrun (main_process_first needs it)
    args = cfg.training_arguments()
    state = PartialState()
    main, out = state.is_main_process, cfg.run.out_dir
    log = _Log(cfg.run.quiet, main)
    with args.main_process_first(desc="tokenizer and data", local=False):
        data = _prepare_data(cfg.data, log, progress=cfg.run.progress and not cfg.run.quiet and main)
    if cfg.run.prepare_only:
        return {"prepared": True, **data.describe(), "wall_seconds": round(time.perf_counter() - t_start, 1)}
    cfg = cfg.for_data(len(data.train_idx))  # --epochs and --warmup-ratio as steps
    args.max_steps, args.warmup_steps = cfg.optim.max_steps, cfg.optim.warmup_steps

    from tupe.runtime import keep_large_blocks

    keep_large_blocks()  # packed blocks: the same sizes every step (a no-op unless the allocator is tuned)
    model_kwargs = cfg.model.values(data.tokenizer)
    source = load_source(cfg, data.tokenizer) if cfg.model.init_from else None
    if source is not None:
        model_kwargs = source.model_kwargs(model_kwargs)
    # saved with the model: truncation=True (pipelines, tokenizer calls) cuts at the model's length
    data.tokenizer.model_max_length = int(model_kwargs["max_position_embeddings"])
    fingerprints = data.packed.meta["corpus_fingerprint"], tokenizer_fingerprint(data.tokenizer)
    identity = run_identity(cfg, model_kwargs, *fingerprints)
    if source is not None:
        identity["init_from"] = source.identity  # --resume refuses another source
    action = check_out_dir(out, identity, cfg.run.resume, cfg.run.overwrite)
    state.wait_for_everyone()  # every process decided before the main one changes the folder
    with args.main_process_first(desc="output folder", local=False):
        if main:
            record = {**identity, "preset": cfg.run.preset, "corpus_desc": data.corpus.describe()}
            prepare_run_folder(out, action, record, log, log.warn)
    resume = ResumePoint()
    if action == "resume":
        resume = select_resume_checkpoint(out, model_kwargs, log, log.warn)
    if main:
        truncate_metrics(out / METRICS_FILE, resume.step)  # records written after that checkpoint

    set_seed(cfg.optim.seed)
    model = cfg.model.build(model_kwargs)
    align_special_tokens(model, data.tokenizer)  # else the Trainer does it, with a warning
    init = source.copy_into(model) if source is not None else None
    log(_describe_model(cfg, model))
    if init is not None:
        log(init.line())
    trainer, stop = build_trainer(cfg, args, data, model, resume.nonfinite_skipped)
    train_out = train_or_stop(trainer, stop, resume.path, log.warn)
    return _finish(cfg, trainer, train_out, data, main, log, time.perf_counter() - t_start, init)


def _prepare_data(config: DataConfig, log: _Log, progress: bool) -> Any:
    """Tokenizer and packed blocks from the cache (or made and cached), split into train and valid."""
    data = config.build(log=log, progress=progress)
    log(
        f"data: {len(data.packed):,} blocks of {config.max_length} tokens: {len(data.train_idx):,} train, "
        f"{len(data.valid_idx):,} valid"
    )
    if data.packing == "documents":
        from tupe.data.documents import describe_packing, undivided_files_warning

        log(describe_packing(data.packed))
        warning = undivided_files_warning(data.packed, data.corpus)
        if warning:
            log.warn(warning)
    return data


def _describe_model(cfg: ResolvedConfig, model: Any) -> str:
    n_params = sum(p.numel() for p in model.parameters())
    m, optim = cfg.model, cfg.optim
    return (
        f"model: {m.scheme}, {n_params / 1e6:.2f} M parameters, {m.num_hidden_layers} x {m.hidden_size}, "
        f"{m.num_attention_heads} heads; batch {optim.batch_size} x {cfg.data.max_length} tokens "
        f"({cfg.run.world_size} process(es) x {cfg.per_device_batch_size} x {optim.grad_accum} accumulation), "
        f"{optim.max_steps} steps"
    )


def _finish(
    cfg: ResolvedConfig,
    trainer: Any,
    train_out: Any,
    data: Any,
    main: bool,
    log: _Log,
    seconds: float,
    init: Any = None,
) -> dict[str, Any]:
    """The final validation loss, the model saved, its card, and the summary (written last: the run is done)."""
    out, step = cfg.run.out_dir, trainer.state.global_step
    final_evals = [
        h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h and h.get("step") == step
    ]
    final_eval = final_evals[-1] if final_evals else trainer.evaluate()["eval_loss"]
    save_final_model(trainer, out)
    summary = {
        "scheme": cfg.model.scheme,
        "preset": cfg.run.preset,
        "steps": step,
        "final_eval_loss": final_eval,
        "train_loss": train_out.training_loss,
        "wall_seconds": round(seconds, 1),
        "num_parameters": sum(p.numel() for p in trainer.model.parameters()),
        "train_blocks": int(len(data.train_idx)),
        "valid_blocks": int(len(data.valid_idx)),
        "corpus": data.corpus.describe(),
        "data_cache": str(data.stream_path),
        "tokenize_pack_tokens_per_second": data.packed.meta.get("tokens_per_second"),
        "nonfinite_skipped": trainer.nonfinite_skipped,
    }
    if data.packing == "documents":  # recorded only then: a stream run's summary is what it always was
        stats = data.packed.stats
        summary.update(
            packing="documents",
            documents_cache=str(data.packed.path),
            packing_efficiency=stats["all"]["efficiency"],
            packing_stats=stats,
        )
    if init is not None:
        summary["init_from"] = init.summary()
    if main:
        record_written(out, "README.md", SUMMARY_FILE)
        _write_card(cfg, data.corpus, len(data.train_idx), summary, init.card() if init else "")
        atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))  # last: marks the run finished
        packing = (
            f" (--packing documents, packing efficiency {summary['packing_efficiency']:.1%})"
            if data.packing == "documents"
            else ""
        )
        log(
            f"done: {summary['steps']} steps, validation loss {final_eval:.4f}{packing}; model saved to {out}"
        )
    return summary


_CARD_MODEL = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_CARD_OPTIM = ("batch_size", "max_steps", "learning_rate", "warmup_steps", "weight_decay")
_CARD_OPTIM += ("adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm")


def _card_recipe(cfg: ResolvedConfig) -> dict[str, Any]:
    """The model card's recipe table, in the order it always had."""
    recipe = {"preset": cfg.run.preset, "optimizer": cfg.optim.optimizer}
    recipe.update({k: getattr(cfg.model, k) for k in _CARD_MODEL})
    recipe.update(max_length=cfg.data.max_length, vocab_size=cfg.data.vocab_size)
    recipe.update({k: getattr(cfg.optim, k) for k in _CARD_OPTIM})
    recipe.update(mlm_probability=cfg.data.mlm_probability, seed=cfg.optim.seed)
    recipe["objective"] = "masked LM (15% of tokens: 80% [MASK], 10% random, 10% kept)"
    return recipe


def _write_card(cfg: ResolvedConfig, corpus: Any, train_blocks: int, summary: dict, notes: str = "") -> None:
    """README.md next to the model: scheme, recipe, data, final metrics, the command, how to load it."""
    from tupe.io.model_card import write_model_card

    d = cfg.data
    recipe = _card_recipe(cfg)
    data = (
        f"{corpus.describe()}; byte-level BPE tokenizer ({d.vocab_size} entries). Packing: stream "
        "(`--packing stream`, RoBERTa's FULL-SENTENCES): the documents one after another with a [SEP] between "
        f"them, cut into blocks of {d.max_length} tokens that each start with [CLS] and may cross a document "
        f"boundary; {train_blocks:,} training blocks of {d.max_length} tokens (1 block in {d.valid_every} held out "
        "for validation)."
    )
    recipe["packing"] = "stream (FULL-SENTENCES: blocks cross documents)"
    if d.packing == "documents":
        recipe["packing"] = "documents"
        stats = summary["packing_stats"]
        data = (
            f"{corpus.describe()}; byte-level BPE tokenizer ({d.vocab_size} entries). Packing: documents "
            f"(`--packing documents`): every document starts with its own [CLS] at position 0 and ends with [SEP], "
            f"attention stays inside it (position_ids restart at 0), a document of more than {d.max_length - 1} "
            f"tokens ([SEP] included) is cut into pieces that each start with [CLS] at position 0, and pieces are "
            f"packed by best fit in corpus order. {stats['documents']:,} documents, {stats['all']['pieces']:,} pieces, "
            f"{train_blocks:,} training blocks of {d.max_length} tokens; packing efficiency "
            f"{stats['all']['efficiency']:.1%} (tokens that are not padding / block tokens; "
            f"{stats['all']['content_share']:.1%} document tokens). Validation: the text of the stream packing's "
            f"validation blocks (1 in {d.valid_every}), packed the same way."
        )
    metrics = {
        "steps": summary["steps"],
        "packing efficiency": summary.get("packing_efficiency"),  # --packing documents only (None: no row)
        "validation masked-LM loss": summary["final_eval_loss"],
        "validation perplexity": math.exp(min(50.0, summary["final_eval_loss"])),
        "training loss (mean over the run)": summary["train_loss"],
        "passes over the training blocks": round(summary["steps"] * cfg.optim.batch_size / train_blocks, 2),
    }
    write_model_card(
        cfg.run.out_dir,
        kind="fill-mask",
        scheme=cfg.model.scheme,
        recipe=recipe,
        data=data,
        metrics=metrics,
        notes=notes,
    )


def run(args: argparse.Namespace) -> int:
    from tupe.runtime import hushed_libraries

    with hushed_libraries(args.progress, args.quiet):  # no "Writing model shards" bars with --quiet
        summary = pretrain(config_from_args(args))
    if summary.get("prepared"):
        print(json.dumps(summary, indent=1))
    return 0
