"""What a task family of `tupe finetune` provides to the shared pipeline (tupe/finetuning/pipeline/family.py
`TaskFamily`): its reader, its encoding for the model, its head, its metrics and its predictions, on one training
and one validation file. One subclass per family (ner.py, qa.py, choice.py, classification.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

from tupe.errors import TupeError
from tupe.finetuning.pipeline.family import TaskFamily
from tupe.finetuning.pipeline.grid import run_name
from tupe.finetuning.pipeline.results import GridResults


class Family(TaskFamily):
    """A task family: the files it reads, how it encodes them, its head and how it scores predictions. Its scores
    are x 100 and summarised by the mean over seeds; the validation predictions of a run are
    `predictions.jsonl`, and those of the best run are copied to OUT/predictions.jsonl."""

    name: ClassVar[str]
    metrics: ClassVar[tuple[str, ...]]  # reported in results.json, x 100; the first picks the learning rate
    # (column, metric) of `tupe report`
    report_columns: ClassVar[tuple[tuple[str, str], ...]]
    auto_class: ClassVar[str]  # the transformers Auto class of the head
    outputs: ClassVar[tuple[str, ...]] = ("predictions.jsonl",)

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.train: list[Any] = []
        self.dev: list[Any] = []
        self.paths: tuple[Path, Path] = (Path(), Path())

    def use(self, train: list[Any], dev: list[Any], paths: tuple[Path, Path]) -> None:
        """The examples the grid trains and scores on, read (and checked) from the files at `paths`."""
        self.train, self.dev, self.paths = train, dev, paths

    # -- data
    def read(self, path: Path) -> list[Any]:
        """The examples of one file; a file that is not this family's format is a one-line error."""
        raise NotImplementedError

    def check(self, train: list[Any], dev: list[Any], train_path: Path, dev_path: Path) -> None:
        """Refuse what cannot be scored (a validation label never seen in training)."""

    def fingerprint(self, train: list[Any], dev: list[Any]) -> str:
        """A hash of the exact examples, so resumed runs are known to be comparable."""
        h = hashlib.sha256()
        for name, examples in (("train", train), ("dev", dev)):
            h.update(name.encode())
            for ex in examples:
                record = dict(asdict(ex) if is_dataclass(ex) else ex)
                record.pop("where", None)  # where it was read from: moving the files changes nothing
                record.pop("line", None)
                h.update(json.dumps(record, sort_keys=True).encode() + b"\n")
        return h.hexdigest()

    def data_fingerprint(self) -> str:
        return self.fingerprint(self.train, self.dev)

    # -- model
    def model_class(self) -> Any:
        import transformers

        import tupe.modeling  # noqa: F401  (registers the tupe classes with the Auto classes)

        return getattr(transformers, self.auto_class)

    def model_kwargs(self) -> dict[str, Any]:
        names = self.label_names()
        if names is None:
            return {}
        return {
            "num_labels": len(names),
            "id2label": dict(enumerate(names)),
            "label2id": {n: i for i, n in enumerate(names)},
        }

    # -- encoding and scoring
    def encode_train(self, tokenizer: Any, examples: list[Any]) -> Any:
        """A `datasets.Dataset` of model inputs with labels."""
        raise NotImplementedError

    def encode_eval(self, tokenizer: Any, examples: list[Any]) -> tuple[Any, Any]:
        """(a `datasets.Dataset` with labels, for the validation loss, whatever `score` needs to map back)."""
        raise NotImplementedError

    def encode(self, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
        self._train_ds = self.encode_train(tokenizer, self.train)
        self._eval_ds, self._aux = self.encode_eval(tokenizer, self.dev)
        return self._train_ds, {"validation": self._eval_ds}

    def score(self, output: Any, aux: Any, examples: list[Any]) -> tuple[dict[str, float], list[dict]]:
        """(metrics x 100, one prediction record per validation example) from `Trainer.predict`'s output."""
        raise NotImplementedError

    def evaluate(
        self, trainer: Any, evals: dict[str, Any], run_dir: Path
    ) -> tuple[dict[str, Any], dict[str, str]]:
        from tupe.io.files import atomic_write_text

        scores, rows = self.score(trainer.predict(evals["validation"]), self._aux, self.dev)
        atomic_write_text(run_dir / "predictions.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        return scores, {"validation": "predictions.jsonl"}

    def describe_run(self, scores: dict[str, Any]) -> str:
        return ", ".join(f"{m}={scores[m]:.2f}" for m in self.metrics)

    def baseline(self, train: list[Any], dev: list[Any]) -> dict[str, Any]:
        """A trivial predictor's scores on the validation set, to read small models by."""
        return {}

    def describe_data(self, train: list[Any], dev: list[Any]) -> dict[str, Any]:
        return {}

    # -- the grid's record
    def introduce(self, model_dir: Path, info: Any, n_train: int) -> str:
        return (
            f"{self.name}: {len(self.train)} train / {len(self.dev)} validation examples ({n_train} / "
            f"{len(self._eval_ds)} model inputs) from {self.paths[0]}, {self.paths[1]}; model {model_dir} (scheme "
            f"{info.scheme})"
        )

    def data_summary(self) -> dict[str, Any]:
        return {
            "train": str(self.paths[0]),
            "validation": str(self.paths[1]),
            "train_examples": len(self.train),
            "validation_examples": len(self.dev),
            "train_features": len(self._train_ds),
            "validation_features": len(self._eval_ds),
            **self.describe_data(self.train, self.dev),
        }

    def protocol(self) -> str:
        return (
            "mean over seeds per learning rate; best learning rate by the mean main metric; scores on the validation "
            "file after the last epoch"
            + (" (the best epoch by validation loss: early stopping)" if self.settings.early_stopping else "")
        )

    def results_fields(self, summary: dict[str, Any], runs: list[dict]) -> dict[str, Any]:
        """The best learning rate's mean of every metric at the top level (the family's metrics first, then any
        others its scores have: SQuAD v2.0's HasAns_*, NoAns_*), its seeds' scores, its best run, the baseline."""
        best = summary["best"]
        best_run = None
        if best is not None:
            mine = [r for r in runs if r["lr"] == best["lr"]]
            best_run = max(mine, key=lambda r: r["main"])
        if not hasattr(self, "_baseline"):
            self._baseline = self.baseline(self.train, self.dev)
        return {
            "command": "finetune",
            "scale": 100,
            "columns": [[col, metric] for col, metric in self.report_columns],
            "headline": {}
            if best is None
            else {**{m: best["mean"][m] for m in self.metrics}, **best["mean"]},
            "per_seed": None if best is None else summary["per_lr"][f"{best['lr']:g}"]["per_seed"],
            "best_run": None if best_run is None else run_name(best_run["lr"], best_run["seed"]),
            "baseline": self._baseline,
        }

    def publish(self, out_dir: Path, results: GridResults, info: Any) -> None:
        """OUT/predictions.jsonl: the validation predictions of the best run."""
        from tupe.io.files import atomic_write_text

        if results.best_run is not None:
            src = out_dir / "runs" / results.best_run / "predictions.jsonl"
            atomic_write_text(out_dir / "predictions.jsonl", src.read_text(encoding="utf-8"))

    def best_line(self, results: GridResults, out_dir: Path) -> str:
        b = results.best
        return (
            f"best lr {b['lr']:g}: mean {self.main_metric} {b['mean'][self.main_metric]:.2f} over {b['n_seeds']} "
            f"seeds -> {out_dir / 'results.json'}"
        )

    def write_run_card(
        self,
        folder: Path,
        info: Any,
        lr: float,
        seed: int,
        scores: dict[str, Any],
        trainer: dict[str, Any] | None = None,
    ) -> None:
        """README.md of one run's saved model, a Hub card: `base_model` (the pre-trained folder's name), `datasets`
        (the training data's name), the `model-index` of its validation scores, the training hyper-parameters
        (`trainer`: what the Trainer used, `trainer_used`), the framework versions, how to load it (for NER with
        the pipeline aggregation strategy that matches its training labels, saved in config.json)."""
        from tupe.io.model_card import base_model_name, write_model_card

        extras = self.config_extras()
        labels = (
            "every sub-token (--label-all-tokens)"
            if self.settings.label_all_tokens
            else ("a word's first sub-token" if self.name == "ner" else None)
        )
        out_dir = folder.parent.parent.parent  # OUT/runs/<run>/model
        train, dev = self.paths
        write_model_card(
            folder,
            kind=self.card_kind,
            scheme=info.scheme,
            recipe=self.hyperparameters(info, lr, seed, trainer or {}) | {"labels": labels},
            data=f"Training file {train.name} ({len(self.train):,} examples); validation file {dev.name} "
            f"({len(self.dev):,}).",
            metrics={f"validation {m}": v for m, v in scores.items()},
            aggregation_strategy=extras.get("aggregation_strategy"),
            notes=(
                f"The labels were trained on {labels}: the pipeline reads words with "
                f'`aggregation_strategy="{extras["aggregation_strategy"]}"` (config.json), unless a call names '
                "another."
                if "aggregation_strategy" in extras
                else ""
            ),
            base_model=base_model_name(info.path),
            datasets=[train.name],
            model_index={
                "name": f"{out_dir.name}-{run_name(lr, seed)}",
                "dataset": {"name": dev.name, "type": dev.name, "split": "validation"},
                "metrics": {m: scores[m] for m in self.metrics if m in scores},
            },
        )

    def hyperparameters(self, info: Any, lr: float, seed: int, used: dict[str, Any]) -> dict[str, Any]:
        """The card's table of what trained the run: the settings, and what the Trainer used where it decided
        (`used`: its warm-up and total steps, optimizer, batch); a value that does not apply is left out."""
        from tupe.io.model_card import base_model_name

        s = self.settings
        accum = int(s.grad_accum or 1)
        warmup = (
            f"{s.warmup_steps} steps" if s.warmup_steps is not None else f"{s.warmup_ratio:g} of the steps"
        )
        if "warmup_steps" in used:
            warmup += f" ({used['warmup_steps']} steps)"
        betas = used.get("adam_betas", [s.adam_beta1, s.adam_beta2])
        return {
            "task": self.name,
            "pre-trained model": f"{base_model_name(info.path)} ({info.pretrain_steps or 'unknown'} pre-training "
            "steps)",
            "learning rate": f"{lr:g}",
            "seed": seed,
            "epochs": s.epochs if s.max_steps is None else None,
            "max steps": s.max_steps,
            "optimizer steps": used.get("total_steps"),
            "batch size": s.batch_size
            if accum == 1
            else f"{s.batch_size} ({accum} accumulated forward passes of {s.batch_size // accum})",
            "eval batch size": s.eval_batch_size,
            "optimizer": f"{used.get('optimizer', 'adamw_torch')} (betas {betas[0]}, {betas[1]}; epsilon "
            f"{used.get('adam_epsilon', s.adam_epsilon):g})",
            "learning-rate schedule": used.get("lr_scheduler", s.lr_scheduler),
            "warm-up": warmup,
            "weight decay": s.weight_decay,
            "max gradient norm": s.max_grad_norm,
            "max sequence length": s.max_seq_len,
            "dropout": s.dropout,
            "precision": "fp16" if s.fp16 else "bf16" if s.bf16 else "fp32",
            "batches": used.get("batches"),
        }


def one_split(path: Path, what: str) -> Any:
    """A `datasets.Dataset` saved with `save_to_disk` (one split); a `DatasetDict` must be named by split."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - a damaged or foreign folder: one line for the user
        from tupe.errors import one_line

        raise TupeError(
            f"{path}: cannot load it as a dataset saved with save_to_disk: {one_line(err)}"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        raise TupeError(
            f"{path}: a DatasetDict with splits {', '.join(ds)}; give the split's own folder ({path}/train)"
        )
    if len(ds) == 0:
        raise TupeError(f"{path}: no {what}")
    return ds


DATA_LIMIT = 4 * 1024**3  # a training file larger than this is not a text file of examples


def read_data_file(path: Path) -> str:
    """A data file's text (a regular file, UTF-8, byte-order mark dropped, every line ending as "\n": `\n`,
    `\r\n` and CR-only `\r` files read the same); empty or unreadable is one line."""
    from tupe.io.reading import line_ends
    from tupe.io.reading import read_text as read_bounded

    text = line_ends(read_bounded(path, DATA_LIMIT, "data file"))
    if not text.strip():
        raise TupeError(f"{path}: empty file")
    return text


def json_records(path: Path, text: str) -> list[tuple[str, dict]]:
    """(location, record) of a JSON list/object of records or of JSON lines."""
    try:
        if path.suffix.lower() == ".jsonl":
            raise json.JSONDecodeError("JSON lines", text, 0)
        data = json.loads(text)
        if isinstance(data, dict):  # an object of records ({"0": {...}}), or one record
            data = list(data.values()) if all(isinstance(v, dict) for v in data.values()) else [data]
        if not isinstance(data, list):
            raise TupeError(f"{path}: expected JSON records (a list, or one object per line)")
        records = [(f"{path} record {i}", r) for i, r in enumerate(data)]
    except json.JSONDecodeError:
        records = []
        for lineno, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    records.append((f"{path}:{lineno}", json.loads(line)))
                except json.JSONDecodeError as err:
                    raise TupeError(f"{path}:{lineno}: not JSON ({err.msg})") from None
    for where, r in records:
        if not isinstance(r, dict):
            raise TupeError(f"{where}: expected a JSON object")
    return records


def csv_records(path: Path, text: str) -> list[tuple[str, dict]]:
    """(path:line, record) of a CSV file with a header."""
    from tupe.finetuning.glue.tasks import csv_rows

    rows = csv_rows(path, text)
    header = [h.strip() for h in rows[0][1]]
    out = []
    for lineno, fields in rows[1:]:
        if fields == [""]:
            continue
        if len(fields) != len(header):
            raise TupeError(
                f"{path}:{lineno}: {len(fields)} comma-separated fields, the header has {len(header)}"
            )
        out.append((f"{path}:{lineno}", dict(zip(header, fields))))
    return out
