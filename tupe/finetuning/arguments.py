"""The options of `tupe finetune` and the settings they make. Importing this module imports neither torch nor
transformers: `tupe finetune --help` builds its parser from here (tupe/cli.py `PARSERS`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.finetuning.pipeline.settings import (
    GridSettings,
    add_grid_arguments,
    add_run_arguments,
    grid_settings,
)

FAMILIES = ("ner", "qa", "multiple-choice", "classification")
DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_EPOCHS = 3.0  # transformers' run_ner / run_qa / run_swag


@dataclass
class FinetuneSettings(GridSettings):
    """Everything that determines a `tupe finetune` run's score, apart from the learning rate and the seed: the
    shared recipe (tupe/finetuning/pipeline/settings.py `GridSettings`) and the task families' own settings."""

    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    epochs: float = DEFAULT_EPOCHS
    early_stopping: int | None = None  # patience in epochs, on the validation loss
    doc_stride: int | None = None  # qa: None = min(128, max_seq_len // 4)
    max_answer_length: int = 30
    n_best: int = 20
    version_2_with_negative: bool = False
    label_all_tokens: bool = False  # ner: every sub-token labelled (run_ner's label_all_tokens)

    def fingerprint_fields(self) -> dict[str, Any]:
        """As `GridSettings`; `label_all_tokens` only where set, so runs finished before it existed are reused."""
        d = super().fingerprint_fields()
        if not d.get("label_all_tokens"):
            d.pop("label_all_tokens", None)
        return d

    def resolved(self, max_positions: int, hidden_size: int | None) -> FinetuneSettings:
        """Defaults filled in for this model (GLUE's grid; 384 tokens for qa, like run_qa); a `--max-seq-len`
        beyond its positions is an error."""
        from tupe.finetuning.glue.protocol import PAPER_LRS, SMALL_MODEL_LRS, is_small_model

        lrs = SMALL_MODEL_LRS if is_small_model(hidden_size) else PAPER_LRS
        out = self.with_defaults(lrs, 384 if self.task == "qa" else 512, max_positions)
        if self.task == "qa":
            stride = self.doc_stride if self.doc_stride is not None else min(128, out.max_seq_len // 4)
            if (
                stride > out.max_seq_len
            ):  # transformers' QA pipeline's rule; a question leaving the context no
                # more than `stride` tokens of its window is refused by name where it is encoded (encode_windows)
                raise TupeError(f"--doc-stride {stride} is larger than --max-seq-len {out.max_seq_len}")
            out.doc_stride = stride
        if not out.lrs or not out.seeds:
            raise TupeError("the grid is empty: give at least one learning rate and one seed")
        return out


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
    add_grid_arguments(
        p,
        lrs_help="learning rates (default as `tupe glue`: 2e-5,3e-5,4e-5,5e-5; 5e-5,1e-4,3e-4 for a model "
        "narrower than 512)",
        seeds_default=DEFAULT_SEEDS,
        epochs_default=DEFAULT_EPOCHS,
        epochs_help="epochs (default 3)",
        max_seq_len_help="max tokens per example or window (default min(512, model's max); qa: min(384, model's "
        "max))",
    )
    p.add_argument(
        "--early-stopping",
        type=V.positive_int,
        metavar="PATIENCE",
        help="evaluate the validation loss every epoch, stop after PATIENCE epochs without improvement and keep "
        "the best epoch's weights (default: off, the last epoch is scored)",
    )
    ner = p.add_argument_group("named entities")
    ner.add_argument(
        "--label-all-tokens",
        action="store_true",
        help="label every sub-token of a word with the word's tag (B-X as I-X after the first), as run_ner's "
        "--label_all_tokens; default: the first sub-token only. The saved model's config.json and card name the "
        'pipeline aggregation_strategy that matches ("average" with this flag, else "first")',
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
    add_run_arguments(p)
    V.annotate_ranges(p)


def settings_from(args: argparse.Namespace) -> FinetuneSettings:
    return FinetuneSettings(
        task=args.task,
        early_stopping=args.early_stopping,
        doc_stride=args.doc_stride,
        max_answer_length=args.max_answer_length,
        n_best=args.n_best,
        version_2_with_negative=args.version_2_with_negative,
        label_all_tokens=args.label_all_tokens,
        **grid_settings(args),
    )
