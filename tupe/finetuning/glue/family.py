"""GLUE as a task family of the shared fine-tuning pipeline (tupe/finetuning/pipeline/): a registered task's
train and dev splits, its `[CLS] A [SEP] B [SEP]` encoding and sequence-classification head, its metrics on every
dev split, its prediction files, and the paper's summary (the median over seeds; Ke et al., ICLR 2021, Table 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tupe.finetuning.glue.encoding import data_fingerprint, encode_split, to_dataset
from tupe.finetuning.glue.metrics import compute_metrics, predictions_from_logits
from tupe.finetuning.glue.protocol import GlueSettings, main_score
from tupe.finetuning.glue.tasks import GlueTask, Split, TaskData
from tupe.finetuning.pipeline.family import TaskFamily
from tupe.finetuning.pipeline.results import GridResults
from tupe.io.files import atomic_write_text


class GlueFamily(TaskFamily):
    """One GLUE(-style) task (`tupe/finetuning/glue/tasks.py` `TASKS`) on the files read for it."""

    aggregate: ClassVar[str] = "median"  # the paper's protocol
    outputs: ClassVar[tuple[str, ...]] = ("README.md",)  # the model card of the grid

    def __init__(self, task: GlueTask, data: TaskData, settings: GlueSettings) -> None:
        self.task, self.data, self.settings = task, data, settings
        self.name = task.name
        self.metrics = tuple(task.metrics)
        self.at_max_length: dict[str, int] = {}  # examples that reached --max-seq-len, per split

    @property
    def main_metric(self) -> str:
        return self.task.main_metric

    # -- the model
    def model_class(self) -> Any:
        from tupe.modeling import TupeForSequenceClassification

        return TupeForSequenceClassification

    def model_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_labels": self.task.num_labels}
        if not self.task.is_regression:
            kwargs["id2label"] = dict(enumerate(self.task.label_names))
            kwargs["label2id"] = {n: i for i, n in enumerate(self.task.label_names)}
        return kwargs

    def label_names(self) -> list[str]:
        return list(self.task.label_names)

    # -- the data
    def data_fingerprint(self) -> str:
        return data_fingerprint(self.data)

    def encode(self, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
        regression = self.task.is_regression

        def encoded(name: str, split: Split) -> Any:
            enc = encode_split(tokenizer, split, self.settings.max_seq_len, regression)
            self.at_max_length[name] = enc.at_max_length
            return to_dataset(enc, regression)

        train = encoded("train", self.data.train)
        return train, {name: encoded(name, split) for name, split in self.data.dev.items()}

    def introduce(self, model_dir: Path, info: Any, n_train: int) -> str:
        steps = info.pretrain_steps if info.pretrain_steps is not None else "unknown"
        return (
            f"{self.task.name}: {n_train} train / "
            + ", ".join(f"{len(v)} {k}" for k, v in self.data.dev.items())
            + f" examples from {self.data.source}; model {model_dir} (scheme {info.scheme}, pre-training steps {steps})"
        )

    def data_summary(self) -> dict[str, Any]:
        dev = self.data.dev
        return {
            "source": self.data.source,
            "train_examples": len(self.data.train),
            "dev_examples": {k: len(v) for k, v in dev.items()},
            "train_at_max_length": self.at_max_length.get("train"),
            "dev_at_max_length": {k: self.at_max_length.get(k) for k in dev},
            # what always predicting the most frequent dev label scores (accuracy), to read small models by
            "dev_majority_accuracy": {
                k: None if self.task.is_regression else max(np.bincount(v.labels)) / len(v)
                for k, v in dev.items()
            },
        }

    # -- scoring
    def evaluate(
        self, trainer: Any, evals: dict[str, Any], run_dir: Path
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Every dev split's scores and its predictions file `predictions-<split>.tsv`."""
        regression = self.task.is_regression
        scores: dict[str, dict[str, float | None]] = {}
        files: dict[str, str] = {}
        for name, ds in evals.items():
            split = self.data.dev[name]
            preds = predictions_from_logits(trainer.predict(ds).predictions, regression)
            scores[name] = compute_metrics(self.task.metrics, split.labels, preds)
            files[name] = f"predictions-{name}.tsv"
            write_predictions(run_dir / files[name], split, preds, regression)
        return scores, files

    def main_score(self, scores: dict[str, Any]) -> float | None:
        return main_score(self.task, scores)

    def describe_run(self, scores: dict[str, Any]) -> str:
        return ", ".join(
            f"{split}/{m}={v:.4f}" if v is not None else f"{split}/{m}=nan"
            for split, ms in scores.items()
            for m, v in ms.items()
        )

    # -- results
    def protocol(self) -> str:
        return (
            "median over seeds per learning rate; best learning rate by the median main metric (TUPE paper, Table 2); "
            "scores are the dev scores after the last epoch"
        )

    def results_fields(self, summary: dict[str, Any], runs: list[dict]) -> dict[str, Any]:
        return {"main_split": next(iter(self.task.hf_dev_splits)), "dev_splits": list(self.data.dev)}

    def publish(self, out_dir: Path, results: GridResults, info: Any) -> None:
        if results.runs:
            self._write_card(out_dir, info, self._grid_metrics(results))

    def write_run_card(
        self,
        folder: Path,
        info: Any,
        lr: float,
        seed: int,
        scores: dict[str, Any],
        trainer: dict[str, Any] | None = None,
    ) -> None:
        metrics = {f"{split} {m}": v for split, ms in scores.items() for m, v in ms.items()}
        self._write_card(folder, info, metrics, lr, seed)

    @staticmethod
    def _grid_metrics(results: GridResults) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        if results.best:
            best = results.best
            metrics["best learning rate"] = f"{best['lr']:g} ({best['n_seeds']} seeds)"
            for split, ms in best["median"].items():
                metrics.update({f"{split} {m} (median)": v for m, v in ms.items()})
        metrics["runs finished"] = f"{len(results.runs)}{'' if results.complete else ' (grid not complete)'}"
        return metrics

    def _write_card(
        self,
        folder: Path,
        info: Any,
        metrics: dict[str, Any],
        lr: float | None = None,
        seed: int | None = None,
    ) -> None:
        """README.md of a GLUE result folder (or of one run's saved model): scheme, recipe, data, dev scores."""
        from tupe.io.model_card import base_model_name, write_model_card

        if not folder.is_dir():
            return
        settings, task = self.settings, self.task
        recipe = {
            "task": task.name,
            "pre-trained model": f"{base_model_name(info.path)} ({info.pretrain_steps or 'unknown'} pre-training "
            "steps)",
            "learning rates": ", ".join(f"{x:g}" for x in settings.lrs or []) if lr is None else f"{lr:g}",
            "seeds": ", ".join(map(str, settings.seeds)) if seed is None else str(seed),
            "epochs": settings.epochs,
            "batch size": settings.batch_size,
            "max sequence length": settings.max_seq_len,
            "warm-up": f"{settings.warmup_steps} steps"
            if settings.warmup_steps is not None
            else f"{settings.warmup_ratio:g} of the steps",
            "weight decay": settings.weight_decay,
            "Adam betas": f"{settings.adam_beta1}, {settings.adam_beta2}",
            "Adam epsilon": settings.adam_epsilon,
            "dropout": settings.dropout,
            "protocol": "median over seeds per learning rate, best learning rate reported (the TUPE paper's)",
        }
        data = (
            f"GLUE {task.name} from {self.data.source}: {len(self.data.train):,} training examples; dev: "
            + ", ".join(f"{len(v):,} ({k})" for k, v in self.data.dev.items())
            + (" (a subset: not comparable with published numbers)" if settings.max_eval_samples else "")
            + "."
        )
        write_model_card(
            folder,
            kind=self.card_kind,
            scheme=info.scheme,
            recipe=recipe,
            data=data,
            metrics=metrics,
            base_model=base_model_name(info.path),
            datasets=["nyu-mll/glue"],
            notes=""
            if seed is not None
            else "The fine-tuned models are in `runs/*/model` with `--save-models`.",
        )


def write_predictions(path: Path, split: Split, predictions: np.ndarray, regression: bool) -> None:
    """A dev split's predictions file: `index`, `label`, `prediction` (label ids, or STS-B's scores) per line."""
    lines = ["index\tlabel\tprediction"]
    for idx, y, p in zip(split.index, split.labels, predictions):
        if regression:
            lines.append(f"{idx}\t{float(y)!r}\t{float(p)!r}")
        else:
            lines.append(f"{idx}\t{int(y)}\t{int(p)}")
    atomic_write_text(path, "\n".join(lines) + "\n")


def read_predictions(path: str | Path) -> tuple[list, list]:
    """(labels, predictions) from a saved predictions file, for recomputing metrics by hand."""
    rows = Path(path).read_text().strip().split("\n")[1:]
    labels, preds = [], []

    def num(x: str) -> int | float:
        try:
            return int(x)
        except ValueError:
            return float(x)

    for row in rows:
        _, y, p = row.split("\t")
        labels.append(num(y))
        preds.append(num(p))
    return labels, preds
