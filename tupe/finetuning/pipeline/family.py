"""What a task family brings to the shared pipeline (`TaskFamily`): its data, encoding, head and collator, how
it scores a run and writes its predictions, and how its grid is summarised. GLUE's tasks:
tupe/finetuning/glue/family.py; `tupe finetune`'s families: tupe/finetuning/family.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from tupe.finetuning.pipeline.results import GridResults


class TaskFamily:
    """What a task brings to the shared pipeline: its data (read and checked by its command before anything is
    written), its encoding, head and collator, how it scores a run and writes its predictions, and how its grid is
    summarised (`aggregate`: "mean" over seeds, or "median" where the paper's protocol asks for it, GLUE's).
    GLUE's tasks: tupe/finetuning/glue/family.py; `tupe finetune`'s families: tupe/finetuning/family.py."""

    name: str  # results.json's `task`
    metrics: tuple[str, ...]  # the first picks the learning rate (unless `main_metric` says otherwise)
    aggregate: ClassVar[str] = "mean"  # a key of AGGREGATES
    # what the family writes at the top of --out beside results.json and runs/
    outputs: ClassVar[tuple[str, ...]] = ()
    card_kind: ClassVar[str] = "text-classification"  # the pipeline tag of a saved model's card

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    # -- the model
    def model_class(self) -> Any:
        """The head's class (an Auto class or a tupe class), loaded with `from_pretrained`."""
        raise NotImplementedError

    def model_kwargs(self) -> dict[str, Any]:
        """`from_pretrained`'s keyword arguments for the head (its labels)."""
        return {}

    def config_extras(self) -> dict[str, Any]:
        """Values set on the fine-tuned model's config (saved in its config.json), e.g. NER's pipeline
        aggregation strategy."""
        return {}

    def label_names(self) -> list[str] | None:
        return None

    # padding-free batches (`FlattenedBatches`: a batch's examples in one row, `position_ids` restarting at 0):
    # "sequence" where the head scores each example from its first token (one label per example), "token" where it
    # scores every token (a label per token), None where its loss or scores need each example in its own row (then
    # the batches are padded whatever --padding says)
    flattened: ClassVar[str | None] = "sequence"
    flattened_refusal: ClassVar[str] = ""  # why not, where `flattened` is None (said once in the log)

    def collator(self, tokenizer: Any) -> Any:
        """The family's padded batches, each padded to its longest sequence (read through `data_collator`)."""
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    # -- the data
    def data_fingerprint(self) -> str:
        """A hash of the exact examples, so resumed runs are known to be comparable (part of every run's
        fingerprint: it must not change for the same examples)."""
        raise NotImplementedError

    def encode(self, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
        """(the training `datasets.Dataset`, the evaluation sets by name); the first evaluation set gives the
        validation loss (--eval-steps, --early-stopping)."""
        raise NotImplementedError

    def introduce(self, model_dir: Path, info: Any, n_train: int) -> str:
        """The line a command prints before its grid: the examples, where they come from, the model."""
        raise NotImplementedError

    def data_summary(self) -> dict[str, Any]:
        """results.json's `data` (its `sha256` is added)."""
        return {}

    # -- scoring
    def evaluate(
        self, trainer: Any, evals: dict[str, Any], run_dir: Path
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """(the run's scores, its prediction files by evaluation set, relative to `run_dir`) after training."""
        raise NotImplementedError

    def main_score(self, scores: dict[str, Any]) -> float | None:
        """The number that picks the learning rate, from one run's scores."""
        return scores[self.main_metric]

    def describe_run(self, scores: dict[str, Any]) -> str:
        """One finished run, for the log."""
        return ", ".join(f"{m}={v:.4f}" if v is not None else f"{m}=nan" for m, v in scores.items())

    # -- results
    def protocol(self) -> str:
        """results.json's `protocol`: how the grid's scores were summarised."""
        return f"{self.aggregate} over seeds per learning rate; best learning rate by the {self.aggregate} main metric"

    def results_fields(self, summary: dict[str, Any], runs: list[dict]) -> dict[str, Any]:
        """The family's own fields of the results record (`GridResults`), from the grid's summary."""
        return {}

    def publish(self, out_dir: Path, results: GridResults, info: Any) -> None:
        """What the family writes beside results.json after each run (a model card, the best run's predictions)."""

    def write_run_card(
        self,
        folder: Path,
        info: Any,
        lr: float,
        seed: int,
        scores: dict[str, Any],
        trainer: dict[str, Any] | None = None,
    ) -> None:
        """README.md of one run's saved model (--save-models); `trainer`: what the Trainer used (`trainer_used`)."""

    def best_line(self, results: GridResults, out_dir: Path) -> str:
        best = results.best
        agg = self.aggregate
        return (
            f"best lr {best['lr']:g}: {agg} {self.main_metric} {best[f'main_{agg}']:.4f} over {best['n_seeds']} "
            f"seeds -> {out_dir / 'results.json'}"
        )
