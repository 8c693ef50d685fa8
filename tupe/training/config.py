"""The configuration of `tupe pretrain` as components: what the user gives (`PretrainConfig`, one flat record of the
command line's settings) and what the run is built from (`ResolvedConfig`: four parts, each built by its own code).

    PretrainConfig --resolve()--> ResolvedConfig
                                    .data   DataConfig   (tupe.data.config)  -> .build(): tokenizer, packed blocks
                                    .model  ModelConfig                      -> .values(tokenizer), .build(values)
                                    .optim  OptimConfig                      -> steps, batch, optimizer, schedule
                                    .run    RunConfig                        -> output folder, evaluation, saving,
                                                                                logging, resume, threads

`resolve` fills the preset's values in wherever the user said None, then hands each part the settings named as its
fields. Each part checks its own values once, when it is made (`__post_init__`); `ResolvedConfig` checks only what
ties two parts together (hf-bert with `--packing documents`, the position table against the block length, the
batch against processes x accumulation). `tupe_run.json` records the same identity as before
(`tupe.training.run_folder.run_identity`), so run folders of earlier versions resume.

Importing this module imports neither torch nor transformers (the parsers and `tupe compare` read it).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tupe.data.config import DEFAULT_PACKING, DataConfig
from tupe.errors import TupeError
from tupe.training.flags import LR_SCHEDULERS, checkpointing_argument, precision_flags
from tupe.training.optimizers import OPTIMIZERS
from tupe.training.presets import get_preset
from tupe.training.reporting import parse_report_to, trainer_reporting

_FLAG_NAMES = {"max_length": "--max-seq-len"}  # settings whose flag is not their name


def flag_of(name: str) -> str:
    """The flag that sets the setting `name`, as `--help` shows it."""
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def _check_positive(part: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(part, name)
        if value is not None and int(value) <= 0:
            raise TupeError(f"{flag_of(name)} must be positive, got {value}")


@dataclass(frozen=True)
class PretrainConfig:
    """Everything `tupe pretrain` accepts; `None` means "the preset's value" (`resolve` fills them in)."""

    out: str
    scheme: str = "tupe-a"
    corpus: list[str] | None = None
    preset: str = "mini"
    text_column: str = "text"
    tokenizer: str | None = None
    vocab_size: int | None = None
    tokenizer_max_mb: float | None = None
    packing: str = DEFAULT_PACKING  # tupe.data.config.PACKINGS: "stream" (FULL-SENTENCES) or "documents"
    max_length: int | None = None
    max_position_embeddings: int | None = None  # None: max_length
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    dropout: float | None = None
    dense_prediction: bool = False
    init_from: str | None = None  # continued pre-training: tupe/training/init_from.py
    attention_kernel: str | None = None  # None: the model's default ("auto"; hf-bert: transformers' "sdpa")
    batch_size: int | None = None
    grad_accum: int = 1
    max_steps: int | None = None
    epochs: float | None = None  # instead of max_steps: known once the data is
    lr_scheduler: str | None = None
    learning_rate: float | None = None
    warmup_steps: int | None = None
    warmup_ratio: float | None = None  # instead of warmup_steps
    weight_decay: float | None = None
    optimizer: str | None = None  # a name of tupe.training.optimizers.OPTIMIZERS
    positional_lr_scale: float = 1.0
    positional_weight_decay: float | None = None
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
    gradient_checkpointing: bool = False
    torch_compile: bool = False
    cache_dir: str | None = None
    resume: bool = False
    overwrite: bool = False
    skip_nonfinite: bool = False
    skip_bad_text: bool = False
    progress: bool = True
    quiet: bool = False
    threads: int | None = None
    prepare_only: bool = False
    report_to: str | None = None  # None: tensorboard where installed, else none
    push_to_hub: bool = False
    hub_model_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # read by no part of the run (kept for callers)

    def resolve(self, world_size: int | None = None) -> ResolvedConfig:
        """The run's settings, made once: the preset's values wherever this config says None, handed to the four
        parts, each checked where it is made, frozen.

        `world_size`: processes of the run (default: torchrun's WORLD_SIZE, else 1), to split the global batch."""
        values = get_preset(self.preset)
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in settings.items():
            if name in values and value is None:
                settings[name] = values[name]
        settings["save_at"] = tuple(int(s) for s in settings["save_at"] or ())
        for given, other in (("epochs", "max_steps"), ("warmup_ratio", "warmup_steps")):
            if settings[given] is not None:
                if getattr(self, other) is not None:
                    raise TupeError(f"{flag_of(given)} and {flag_of(other)} say the same thing: give one")
                settings[other] = None  # from `given`, in `for_data`
        if settings["max_position_embeddings"] is None:
            settings["max_position_embeddings"] = settings["max_length"]
        settings["world_size"] = (
            int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else int(world_size)
        )
        return ResolvedConfig(
            model=_part(ModelConfig, settings),
            data=_part(DataConfig, settings),
            optim=_part(OptimConfig, settings),
            run=_part(RunConfig, settings),
        )


def _part(cls: type, settings: dict[str, Any]) -> Any:
    """The part `cls` made of the settings named as its fields."""
    return cls(**{f.name: settings[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ModelConfig:
    """The model: scheme, shape, dropout, prediction head, attention kernel, and the weights it starts from.
    Checked when made: a known scheme, an `--attention-kernel` that can run it."""

    scheme: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    dropout: float
    dense_prediction: bool = False
    attention_kernel: str | None = None
    init_from: str | None = None

    def __post_init__(self) -> None:
        from tupe.training.model import check_scheme

        check_scheme(self.scheme, self.attention_kernel)

    def values(self, tokenizer: Any) -> dict[str, Any]:
        """The model's config values (`tupe.training.model.model_config`)."""
        from tupe.training.model import model_config

        return model_config(self, tokenizer)

    def build(self, values: dict[str, Any]) -> Any:
        """A freshly initialised masked-LM model of `values` (`tupe.training.model.build_model`)."""
        from tupe.training.model import build_model

        return build_model(self, values)


@dataclass(frozen=True)
class OptimConfig:
    """The optimisation: global batch, accumulation, length (steps or epochs), optimizer and its settings, the
    learning-rate schedule, clipping, the seed, and how the steps run (precision, activation checkpointing,
    compilation, skipping non-finite losses). Checked when made."""

    batch_size: int
    max_steps: int | None
    learning_rate: float
    weight_decay: float
    optimizer: str
    lr_scheduler: str
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    max_grad_norm: float
    grad_accum: int = 1
    epochs: float | None = None
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    positional_lr_scale: float = 1.0
    positional_weight_decay: float | None = None
    seed: int = 0
    precision: str = "auto"
    gradient_checkpointing: bool = False
    torch_compile: bool = False
    skip_nonfinite: bool = False

    def __post_init__(self) -> None:
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise TupeError(
                f"unknown --lr-scheduler {self.lr_scheduler!r}; choose one of: {', '.join(LR_SCHEDULERS)}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise TupeError(f"unknown optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
        _check_positive(self, ("max_steps", "batch_size"))

    def for_data(self, train_blocks: int) -> OptimConfig:
        """`--epochs` and `--warmup-ratio` as steps, once the number of training blocks is known."""
        steps = self.max_steps
        if steps is None:
            steps = max(1, math.ceil(self.epochs * train_blocks / self.batch_size))
        warmup = self.warmup_steps if self.warmup_steps is not None else round(self.warmup_ratio * steps)
        return dataclasses.replace(self, max_steps=steps, warmup_steps=warmup)


@dataclass(frozen=True)
class RunConfig:
    """The run: its output folder and preset's name, resume or start again, evaluation, checkpoints, logging and
    reporting, progress, threads, processes. Checked when made (`--report-to` too: wandb without wandb is one line
    before the data, the model, tupe_run.json)."""

    out: str
    preset: str = "mini"
    resume: bool = False
    overwrite: bool = False
    prepare_only: bool = False
    eval_steps: int | None = None
    eval_batch_size: int | None = None
    save_steps: int | None = None
    save_at: tuple[int, ...] = ()
    save_total_limit: int | None = None
    logging_steps: int | None = None
    progress: bool = True
    quiet: bool = False
    threads: int | None = None
    report_to: str | None = None
    push_to_hub: bool = False
    hub_model_id: str | None = None
    world_size: int = 1

    def __post_init__(self) -> None:
        parse_report_to(self.report_to)
        _check_positive(self, ("eval_steps", "logging_steps", "save_steps"))

    @property
    def out_dir(self) -> Path:
        return Path(self.out).expanduser()


@dataclass(frozen=True)
class ResolvedConfig:
    """A run's configuration as its parts (`PretrainConfig.resolve`), each checked where it was made; checked here
    is only what ties two parts together."""

    data: DataConfig
    model: ModelConfig
    optim: OptimConfig
    run: RunConfig

    def __post_init__(self) -> None:
        from tupe.training.model import check_packing_for_scheme

        check_packing_for_scheme(self.model.scheme, self.data.packing)
        if self.model.max_position_embeddings < self.data.max_length:
            raise TupeError(
                f"--max-position-embeddings {self.model.max_position_embeddings} is smaller than --max-seq-len "
                f"{self.data.max_length}: blocks would have no row"
            )
        per_step = self.run.world_size * self.optim.grad_accum
        if self.optim.batch_size % per_step:
            raise TupeError(
                f"--batch-size {self.optim.batch_size} (global) is not divisible by processes x --grad-accum = "
                f"{per_step}"
            )

    def for_data(self, train_blocks: int) -> ResolvedConfig:
        """`--epochs` and `--warmup-ratio` as steps, once the number of training blocks is known."""
        return dataclasses.replace(self, optim=self.optim.for_data(train_blocks))

    @property
    def per_device_batch_size(self) -> int:
        """Sequences per process and forward pass: the global batch over processes x accumulation steps."""
        return self.optim.batch_size // (self.run.world_size * self.optim.grad_accum)

    def training_arguments(self) -> Any:
        """The Trainer's arguments for the run. Creating them also sets up torch.distributed under torchrun."""
        import torch
        from transformers import TrainingArguments

        optim, run = self.optim, self.run
        return TrainingArguments(
            output_dir=str(run.out_dir),
            max_steps=optim.max_steps
            if optim.max_steps is not None
            else -1,  # --epochs: set once data is known
            per_device_train_batch_size=self.per_device_batch_size,
            per_device_eval_batch_size=run.eval_batch_size or self.per_device_batch_size,
            gradient_accumulation_steps=optim.grad_accum,
            learning_rate=optim.learning_rate,
            weight_decay=optim.weight_decay,
            adam_beta1=optim.adam_beta1,
            adam_beta2=optim.adam_beta2,
            adam_epsilon=optim.adam_epsilon,
            max_grad_norm=optim.max_grad_norm,
            lr_scheduler_type=optim.lr_scheduler,
            warmup_steps=optim.warmup_steps or 0,
            logging_steps=run.logging_steps,
            eval_strategy="steps",
            eval_steps=run.eval_steps,
            save_strategy="steps",
            save_steps=run.save_steps,
            save_total_limit=run.save_total_limit,
            seed=optim.seed,
            **trainer_reporting(parse_report_to(run.report_to), run.push_to_hub, run.hub_model_id),
            disable_tqdm=not run.progress or run.quiet,
            dataloader_num_workers=0,
            dataloader_pin_memory=torch.cuda.is_available(),
            remove_unused_columns=False,
            prediction_loss_only=True,
            logging_nan_inf_filter=False,
            include_num_input_tokens_seen="non_padding",
            average_tokens_across_devices=True,
            use_cpu=not torch.cuda.is_available(),  # also what makes accelerate run data-parallel on CPU (gloo)
            # every parameter of every scheme gets a gradient from the masked-LM loss (tests/training/
            # test_multiprocess.py checks it): DDP need not search the graph for unused ones at every step
            ddp_find_unused_parameters=False,
            **precision_flags(optim.precision),
            **checkpointing_argument(optim.gradient_checkpointing),
            torch_compile=optim.torch_compile,
        )
