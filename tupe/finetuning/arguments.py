"""The options of `tupe finetune` and the settings they make. Importing this module imports neither torch nor
transformers: `tupe finetune --help` builds its parser from here (tupe/cli.py `PARSERS`)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.training.flags import add_training_flags, precision_flags

FAMILIES = ("ner", "qa", "multiple-choice", "classification")
DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_EPOCHS = 3.0  # transformers' run_ner / run_qa / run_swag


@dataclass
class FinetuneSettings:
    """Everything that determines a run's score, apart from the learning rate and the seed."""

    task: str
    lrs: list[float] | None = None  # None: GLUE's defaults (the paper's grid; the small-model grid below 512)
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    epochs: float = DEFAULT_EPOCHS
    batch_size: int = 32
    eval_batch_size: int = 64
    max_seq_len: int | None = None  # None: min(512, the model's positions); 384 for qa, like run_qa
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    lr_scheduler: str = "linear"
    dropout: float | None = 0.1
    early_stopping: int | None = None  # patience in epochs, on the validation loss
    doc_stride: int | None = None  # qa: None = min(128, max_seq_len // 4)
    max_answer_length: int = 30
    n_best: int = 20
    version_2_with_negative: bool = False
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    fp16: bool = False
    bf16: bool = False

    def resolved(self, max_positions: int, hidden_size: int | None) -> FinetuneSettings:
        """Defaults filled in for this model; a `--max-seq-len` beyond its positions is an error."""
        from tupe.glue.protocol import PAPER_LRS, SMALL_MODEL_LRS, is_small_model

        out = FinetuneSettings(**asdict(self))
        lrs = (
            self.lrs
            if self.lrs is not None
            else (SMALL_MODEL_LRS if is_small_model(hidden_size) else PAPER_LRS)
        )
        out.lrs = list(dict.fromkeys(float(x) for x in lrs))
        out.seeds = list(dict.fromkeys(int(x) for x in self.seeds))
        if self.max_seq_len is None:
            out.max_seq_len = min(384 if self.task == "qa" else 512, max_positions)
        elif self.max_seq_len > max_positions:
            raise TupeError(
                f"--max-seq-len {self.max_seq_len} exceeds the model's max_position_embeddings {max_positions}"
            )
        if self.task == "qa":
            stride = self.doc_stride if self.doc_stride is not None else min(128, out.max_seq_len // 4)
            if not 0 < stride < out.max_seq_len // 2:
                raise TupeError(
                    f"--doc-stride {stride} must be below half of --max-seq-len {out.max_seq_len}"
                )
            out.doc_stride = stride
        if not out.lrs or not out.seeds:
            raise TupeError("the grid is empty: give at least one learning rate and one seed")
        return out

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings a finished run must share with the current command to be reused (not the grid itself)."""
        d = asdict(self)
        for key in ("lrs", "seeds", "eval_batch_size"):
            d.pop(key)
        return d


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, choices=FAMILIES, help="the task family of the files")
    p.add_argument(
        "--model",
        required=True,
        help="pre-trained tupe checkpoint directory (save_pretrained); a transformers BERT folder is converted",
    )
    p.add_argument(
        "--train",
        required=True,
        type=V.nonempty_path,
        help="training file: CoNLL / .jsonl / .csv (ner), SQuAD .json (qa), SWAG .csv (multiple-choice), "
        ".csv/.tsv/.jsonl/.parquet with text,label (classification), or a saved `datasets` split folder",
    )
    p.add_argument("--validation", required=True, type=V.nonempty_path, help="validation file, same format")
    p.add_argument(
        "--out",
        required=True,
        type=V.nonempty_path,
        help="output directory (results.json, predictions.jsonl)",
    )
    p.add_argument(
        "--lrs",
        type=V.float_list(0.0),
        help="learning rates (default as `tupe glue`: 2e-5,3e-5,4e-5,5e-5; 5e-5,1e-4,3e-4 for a model narrower "
        "than 512)",
    )
    p.add_argument(
        "--seeds",
        type=V.int_list(0),
        default=list(DEFAULT_SEEDS),
        help="seeds (default 1,2,3); mean over them",
    )
    add_training_flags(
        p,
        ["epochs", "batch_size"],
        defaults={"epochs": DEFAULT_EPOCHS, "batch_size": 32},
        helps={"epochs": "default 3", "batch_size": "default 32"},
    )
    p.add_argument(
        "--eval-batch-size", type=V.positive_int, default=64, help="evaluation batch size (default 64)"
    )
    add_training_flags(
        p,
        ["max_seq_len"],
        helps={
            "max_seq_len": "per example or window; default min(512, model's max), qa: min(384, model's max)"
        },
    )
    p.add_argument(
        "--early-stopping",
        type=V.positive_int,
        metavar="PATIENCE",
        help="evaluate the validation loss every epoch, stop after PATIENCE epochs without improvement and keep "
        "the best epoch's weights (default: off, the last epoch is scored)",
    )
    p.add_argument(
        "--max-train-samples", type=V.positive_int, help="a fixed random subset of the training set"
    )
    p.add_argument(
        "--max-eval-samples",
        type=V.positive_int,
        help="a fixed random subset of the validation set (smoke tests)",
    )
    qa = p.add_argument_group("question answering")
    qa.add_argument(
        "--doc-stride",
        type=V.positive_int,
        help="tokens shared by consecutive windows (default min(128, len/4))",
    )
    qa.add_argument(
        "--max-answer-length", type=V.positive_int, default=30, help="longest answer in tokens (default 30)"
    )
    qa.add_argument("--n-best", type=V.positive_int, default=20, help="start/end candidates per window (20)")
    qa.add_argument(
        "--version-2-with-negative",
        action="store_true",
        help="SQuAD v2.0: questions may have no answer (predicted when [CLS] outscores every span)",
    )
    add_training_flags(
        p,
        ["warmup_ratio", "lr_scheduler", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "precision"],
        defaults={"warmup_ratio": 0.06, "lr_scheduler": "linear", "adam_beta1": 0.9, "adam_beta2": 0.999,
                  "adam_epsilon": 1e-6, "max_grad_norm": 1.0, "precision": "fp32"},
        helps={"warmup_ratio": "default 0.06", "lr_scheduler": "default linear", "adam_beta1": "default 0.9",
               "adam_beta2": "default 0.999", "adam_epsilon": "default 1e-6", "max_grad_norm": "default 1.0",
               "precision": "default fp32"},
    )  # fmt: skip
    p.add_argument("--weight-decay", type=V.nonneg_float, default=0.01, help="default 0.01")
    p.add_argument(
        "--dropout",
        type=V.float_range(-1, 1, hi_open=True),
        default=0.1,
        help="hidden and attention dropout while fine-tuning (default 0.1; -1 keeps the checkpoint's)",
    )
    p.add_argument("--scheme", help="expected position scheme; an error if the checkpoint's differs")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the model directory)")
    p.add_argument(
        "--save-models", action="store_true", help="keep every run's fine-tuned model (runs/*/model)"
    )
    p.add_argument("--overwrite", action="store_true", help="discard runs in --out made with other settings")
    V.add_threads_progress(p, "progress bar")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    V.annotate_ranges(p)


def settings_from(args: argparse.Namespace) -> FinetuneSettings:
    precision = precision_flags(args.precision)
    return FinetuneSettings(
        task=args.task,
        lrs=args.lrs,
        seeds=args.seeds,
        epochs=args.epochs,
        batch_size=args.batch_size,
        eval_batch_size=args.eval_batch_size,
        max_seq_len=args.max_seq_len,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        adam_epsilon=args.adam_epsilon,
        max_grad_norm=args.max_grad_norm,
        lr_scheduler=args.lr_scheduler,
        dropout=None if args.dropout < 0 else args.dropout,
        early_stopping=args.early_stopping,
        doc_stride=args.doc_stride,
        max_answer_length=args.max_answer_length,
        n_best=args.n_best,
        version_2_with_negative=args.version_2_with_negative,
        max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples,
        fp16=precision["fp16"],
        bf16=precision["bf16"],
    )
