"""The paper's GLUE protocol as data: the grid, the settings of one run, and how a grid's scores are summarised.

Grid: learning rates {2e-5, 3e-5, 4e-5, 5e-5} x 5 seeds; a learning rate's score is the median of its seeds' dev
scores (tupe/finetuning/pipeline/results.py `summarize_grid`, aggregate "median"), and the best learning rate is reported
(Ke et al., ICLR 2021, Sec. 4.1 and Table 2; see docs/glue.md). A model narrower than 512 gets `SMALL_MODEL_LRS`
and 3 epochs by default instead (docs/glue.md, "Small models"). `tupe report` reads this module too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tupe.errors import TupeError
from tupe.finetuning.glue.tasks import GlueTask
from tupe.finetuning.pipeline.grid import run_name  # noqa: F401  (re-exported)
from tupe.finetuning.pipeline.results import summarize_grid
from tupe.finetuning.pipeline.settings import GridSettings

PAPER_LRS = (2e-5, 3e-5, 4e-5, 5e-5)
PAPER_SEEDS = (1, 2, 3, 4, 5)
# Models narrower than BERT-Base's 768 (the CPU presets: 128, 256) fine-tuned at the paper's 2e-5..5e-5 predict
# the majority class on every task: their updates are far too small. The small-model grid and epochs come from
# the sweep in docs/RESULTS.md (A.6); a model is "small" below SMALL_MODEL_WIDTH.
SMALL_MODEL_WIDTH = 512
SMALL_MODEL_LRS = (5e-5, 1e-4, 3e-4)
SMALL_MODEL_EPOCHS = 3.0


def is_small_model(hidden_size: int | None) -> bool:
    """Whether the small-model grid applies (unknown width: no, the paper's grid)."""
    return hidden_size is not None and hidden_size < SMALL_MODEL_WIDTH


@dataclass
class GlueSettings(GridSettings):
    """Everything that determines a GLUE run's score, apart from the learning rate and the seed (the shared
    recipe's fields: tupe/finetuning/pipeline/settings.py `GridSettings`)."""

    seeds: list[int] = field(default_factory=lambda: list(PAPER_SEEDS))
    epochs: float | None = None  # None: the paper's (10, or 5 for MNLI/QQP/QNLI); SMALL_MODEL_EPOCHS if small

    def resolved(self, task: GlueTask, max_positions: int, hidden_size: int | None = None) -> GlueSettings:
        """Defaults filled in for this task and model: the paper's grid and epochs, or the small-model ones."""
        small = is_small_model(hidden_size)
        out = self.with_defaults(SMALL_MODEL_LRS if small else PAPER_LRS, 512, max_positions)
        out.task = task.name
        default_epochs = SMALL_MODEL_EPOCHS if small else task.epochs
        out.epochs = float(default_epochs if self.epochs is None else self.epochs)
        if out.max_seq_len < 8:
            raise TupeError(
                f"--max-seq-len {self.max_seq_len} is too short (at least 8: [CLS] A [SEP] B [SEP])"
            )
        return out


def lr_key(lr: float) -> str:
    return f"{lr:g}"


# ------------------------------------------------------------------------------------------------------ summary


def main_score(task: GlueTask, scores: dict[str, dict[str, float | None]]) -> float | None:
    """The paper's number for a run: the main metric on the first dev split (MNLI: matched)."""
    first = next(iter(task.hf_dev_splits))
    return scores[first][task.main_metric]


def summarize(task: GlueTask, runs: list[dict[str, Any]], lrs: Sequence[float], seeds: Sequence[int]) -> dict:
    """Median over seeds of every metric for each learning rate, and the best learning rate by the main metric (the
    shared summary, `summarize_grid`, with the paper's median; an undefined score counts as the lowest)."""
    return summarize_grid(runs, lrs, seeds, "median", lambda scores: main_score(task, scores))
