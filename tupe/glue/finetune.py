"""Fine-tune a pre-trained `tupe` checkpoint on one GLUE task with the paper's protocol (TUPE spec, section 5).

Grid: learning rates {2e-5, 3e-5, 4e-5, 5e-5} x 5 seeds, batch 32, 10 epochs (5 for MNLI, QQP, QNLI), linear
warm-up over 6% of the steps then linear decay, Adam (0.9, 0.999), eps 1e-6, weight decay 0.01, clip 1.0. A
learning rate's score is the median of its seeds' dev scores, and the best learning rate is reported. Training
runs on the `transformers` Trainer, like pre-training.

Each finished run writes `runs/lr<LR>_seed<S>/result.json` (atomically, last) and its dev predictions; an
interrupted grid started again with the same command skips the runs that finished. `results.json` is rewritten
after every run with all scores, the median per learning rate and the best one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tupe.errors import TupeError
from tupe.glue.metrics import compute_metrics, predictions_from_logits
from tupe.glue.tasks import TASKS, GlueTask, Split, TaskData, get_task, load_task, one_line, read_split_file

PAPER_LRS = (2e-5, 3e-5, 4e-5, 5e-5)
PAPER_SEEDS = (1, 2, 3, 4, 5)
RESULTS_FORMAT = 1
_RUN_SUMMARY_KEYS = (
    "lr",
    "seed",
    "scores",
    "main",
    "train_loss",
    "steps",
    "train_seconds",
    "seconds",
    "trainer",
)


@dataclass
class GlueSettings:
    """Everything that determines a run's score, apart from the learning rate and the seed."""

    task: str
    lrs: list[float] = field(default_factory=lambda: list(PAPER_LRS))
    seeds: list[int] = field(default_factory=lambda: list(PAPER_SEEDS))
    epochs: float | None = None  # None: the paper's (10, or 5 for MNLI/QQP/QNLI)
    batch_size: int = 32
    eval_batch_size: int = 64
    max_seq_len: int | None = None  # None: min(512, the model's max_position_embeddings)
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    lr_scheduler: str = "linear"
    dropout: float | None = 0.1  # the paper's fine-tuning dropout; None keeps the checkpoint's
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    fp16: bool = False
    bf16: bool = False

    def resolved(self, task: GlueTask, max_positions: int) -> GlueSettings:
        out = GlueSettings(**asdict(self))
        out.task = task.name
        out.lrs = list(dict.fromkeys(float(x) for x in self.lrs))  # "2e-5,2e-5" is one learning rate
        out.seeds = list(dict.fromkeys(int(x) for x in self.seeds))
        out.epochs = float(task.epochs if self.epochs is None else self.epochs)
        limit = max_positions
        if self.max_seq_len is None:
            out.max_seq_len = min(512, limit)
        elif self.max_seq_len > limit:
            raise TupeError(
                f"--max-seq-len {self.max_seq_len} exceeds the model's max_position_embeddings {limit}"
            )
        elif self.max_seq_len < 8:
            raise TupeError(
                f"--max-seq-len {self.max_seq_len} is too short (at least 8: [CLS] A [SEP] B [SEP])"
            )
        return out

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings a finished run must share with the current command to be reused (not the grid itself)."""
        d = asdict(self)
        d.pop("lrs")
        d.pop("seeds")
        d.pop("eval_batch_size")
        return d


# ----------------------------------------------------------------------------------------------------------- io


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_clean(x: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_clean(v) for v in x]
    return x


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_json_clean(obj), indent=2, allow_nan=False) + "\n")


def run_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}_seed{seed}"


def lr_key(lr: float) -> str:
    return f"{lr:g}"


# -------------------------------------------------------------------------------------------------- checkpoint


@dataclass
class ModelInfo:
    path: str
    scheme: str
    pretrain_steps: int | None
    config: dict[str, Any]
    weights_sha256: str


def _weights_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("pytorch_model*.bin"))
    return files


def _sha256(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def pretrain_steps_of(model_dir: Path, config: Any = None) -> int | None:
    """Pre-training steps of a checkpoint: its config's record, `tupe pretrain`'s summary, its trainer state, or a
    `checkpoint-N` folder name; None if none says."""
    for attr in ("pretrain_steps", "pretraining_steps", "global_step"):
        value = getattr(config, attr, None) if config is not None else None
        if isinstance(value, int) and value >= 0:
            return value
    # `tupe pretrain` writes pretrain_summary.json next to the final model; Trainer checkpoints hold trainer_state
    for fname, key in (("pretrain_summary.json", "steps"), ("trainer_state.json", "global_step")):
        state = model_dir / fname
        if state.is_file():
            try:
                step = json.loads(state.read_text()).get(key)
            except (OSError, json.JSONDecodeError, AttributeError):
                step = None
            if isinstance(step, int) and step >= 0:
                return step
    name = model_dir.name
    if name.startswith("checkpoint-") and name[len("checkpoint-") :].isdigit():
        return int(name[len("checkpoint-") :])
    return None


def inspect_checkpoint(model_dir: str | Path, scheme: str | None = None) -> tuple[ModelInfo, Any]:
    """Read the checkpoint's config; fine-tuning with a scheme other than the pre-trained one is an error."""
    from transformers import AutoConfig

    import tupe  # noqa: F401  (registers the tupe model type with the Auto classes)
    from tupe import TupeConfig

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        ckpts = (
            sorted(model_dir.glob("checkpoint-*"), key=lambda p: (len(p.name), p.name))
            if model_dir.is_dir()
            else []
        )
        hint = f"; pass a checkpoint folder such as {ckpts[-1]}" if ckpts else ""
        raise TupeError(
            f"{model_dir}: no config.json (expected a directory written by save_pretrained){hint}"
        )
    try:
        config = AutoConfig.from_pretrained(str(model_dir))
    except (ValueError, OSError, KeyError) as err:
        raise TupeError(
            f"{model_dir / 'config.json'}: cannot read the model config: {one_line(err)}"
        ) from None
    if not isinstance(config, TupeConfig):
        raise TupeError(
            f"{model_dir / 'config.json'}: model_type {getattr(config, 'model_type', '?')!r} is not a tupe model; "
            "convert a BERT checkpoint with TupeForMaskedLM.from_bert(PATH).save_pretrained(DIR)"
        )
    if scheme is not None and scheme != config.position_scheme:
        raise TupeError(
            f"--scheme {scheme} does not match the checkpoint's position_scheme {config.position_scheme!r} "
            f"({model_dir / 'config.json'}): fine-tuning must use the scheme the model was pre-trained with"
        )
    from tupe.training.checkpointing import check_model_weights, check_weights_match_config

    # safetensors only (pickle weights can run code), each file checked: truncation is one clear error, here
    files = check_model_weights(model_dir)
    # from_pretrained(ignore_mismatched_sizes=True) would silently re-initialise an encoder that does not fit
    check_weights_match_config(model_dir)
    keep = (
        "position_scheme",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
    )
    info = ModelInfo(
        path=str(model_dir.resolve()),
        scheme=config.position_scheme,
        pretrain_steps=pretrain_steps_of(model_dir, config),
        config={k: getattr(config, k, None) for k in keep},
        weights_sha256=_sha256(files),
    )
    return info, config


def load_tokenizer(path: str | Path, config: Any) -> Any:
    """The model's own tokenizer; it must start every sequence with [CLS], which the model's head reads."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        raise TupeError(
            f"{path}: no tokenizer files (tokenizer.json); save the tokenizer with the model or pass --tokenizer DIR"
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # unreadable tokenizer files: the first line of the reason is enough
        raise TupeError(f"{path}: cannot load a tokenizer ({type(err).__name__}: {one_line(err)})") from None
    if tok.pad_token_id is None:
        if "[PAD]" in tok.get_vocab():
            tok.pad_token = "[PAD]"
        else:
            raise TupeError(f"{path}: the tokenizer has no padding token ([PAD])")
    tok.padding_side = "right"
    ids = tok("a", "b")["input_ids"]
    cls_id = getattr(config, "cls_token_id", None)
    if cls_id is None:
        cls_id = tok.convert_tokens_to_ids("[CLS]")
    if not ids or ids[0] != cls_id:
        raise TupeError(
            f"{path}: the tokenizer does not start a sequence with [CLS] (id {cls_id}); got ids {ids[:4]}... "
            "(its post-processor must produce [CLS] A [SEP] B [SEP])"
        )
    if len(tok) > config.vocab_size:
        raise TupeError(
            f"{path}: tokenizer has {len(tok)} tokens but the model's vocab_size is {config.vocab_size}"
        )
    return tok


# ------------------------------------------------------------------------------------------------------ encoding


@dataclass
class Encoded:
    features: dict[str, list]  # input_ids, attention_mask, labels
    at_max_length: int  # examples that hit max_seq_len (truncated, or exactly that long)


def encode_split(tokenizer: Any, split: Split, max_seq_len: int, regression: bool) -> Encoded:
    """Tokenize `[CLS] A [SEP] B [SEP]` with the model's tokenizer, truncating the longer side first."""
    enc = tokenizer(
        split.text_a,
        split.text_b,
        truncation="longest_first",
        max_length=max_seq_len,
        padding=False,
        return_token_type_ids=False,
    )
    labels = [float(x) for x in split.labels] if regression else [int(x) for x in split.labels]
    ids = enc["input_ids"]
    return Encoded(
        {"input_ids": ids, "attention_mask": enc["attention_mask"], "labels": labels},
        sum(len(x) >= max_seq_len for x in ids),
    )


def to_dataset(encoded: Encoded, regression: bool) -> Any:
    import datasets

    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "attention_mask": datasets.Sequence(datasets.Value("int8")),
            "labels": datasets.Value("float32" if regression else "int64"),
        }
    )
    return datasets.Dataset.from_dict(encoded.features, features=features)


def data_fingerprint(data: TaskData) -> str:
    """A hash of the exact examples (texts and labels) used, so resumed runs are known to be comparable."""
    h = hashlib.sha256()
    for name, split in [("train", data.train), *sorted(data.dev.items())]:
        h.update(name.encode())
        for i in range(len(split)):
            h.update(split.text_a[i].encode())
            h.update(b"\t")
            if split.text_b is not None:
                h.update(split.text_b[i].encode())
            h.update(f"\t{split.labels[i]!r}\n".encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------------ summary


def _median(values: Sequence[float | None]) -> float | None:
    """Median where a missing/NaN score (e.g. an undefined correlation) counts as the lowest."""
    if not values:
        return None
    arr = np.array([-np.inf if v is None or not math.isfinite(v) else v for v in values], dtype=np.float64)
    m = float(np.median(arr))
    return m if math.isfinite(m) else None


def main_score(task: GlueTask, scores: dict[str, dict[str, float | None]]) -> float | None:
    """The paper's number for a run: the main metric on the first dev split (MNLI: matched)."""
    first = next(iter(task.hf_dev_splits))
    return scores[first][task.main_metric]


def summarize(task: GlueTask, runs: list[dict[str, Any]], lrs: Sequence[float], seeds: Sequence[int]) -> dict:
    """Median over seeds of every metric for each learning rate, and the best learning rate by the main metric."""
    per_lr: dict[str, Any] = {}
    # MNLI given only its matched dev file has no mismatched scores
    splits = [s for s in task.hf_dev_splits if runs and all(s in r["scores"] for r in runs)]
    for lr in lrs:
        mine = sorted((r for r in runs if r["lr"] == lr), key=lambda r: r["seed"])
        if not mine:
            continue
        medians = {
            split: {m: _median([r["scores"][split][m] for r in mine]) for m in task.metrics}
            for split in splits
        }
        per_lr[lr_key(lr)] = {
            "lr": lr,
            "seeds": [r["seed"] for r in mine],
            "n_seeds": len(mine),
            "complete": all(any(r["seed"] == s for r in mine) for s in seeds),
            "main_scores": [main_score(task, r["scores"]) for r in mine],
            "main_median": _median([main_score(task, r["scores"]) for r in mine]),
            "median": medians,
        }
    best = None
    ranked = [v for v in per_lr.values() if v["main_median"] is not None]
    if ranked:
        b = max(ranked, key=lambda v: v["main_median"])
        best = {
            "lr": b["lr"],
            "main_median": b["main_median"],
            "median": b["median"],
            "n_seeds": b["n_seeds"],
        }
    return {"per_lr": per_lr, "best": best}


# ---------------------------------------------------------------------------------------------------- training


def _progress_callback(bar: Any, label: str) -> Any:
    from transformers import TrainerCallback

    class GridProgress(TrainerCallback):
        """Advances one bar over every optimisation step of the whole grid (so its ETA covers the grid)."""

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            bar.update(1)

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "loss" in logs:
                bar.set_postfix_str(f"{label} loss={logs['loss']:.4f}", refresh=False)

    return GridProgress()


def _write_predictions(path: Path, split: Split, predictions: np.ndarray, regression: bool) -> None:
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


def train_one(
    model_dir: str,
    task: GlueTask,
    settings: GlueSettings,
    lr: float,
    seed: int,
    train_ds: Any,
    dev: dict[str, tuple[Split, Any]],
    tokenizer: Any,
    run_dir: Path,
    callbacks: list[Any],
    save_model: bool = False,
) -> dict[str, Any]:
    """One (lr, seed) run: fresh classification head on the checkpoint, train, predict every dev split."""
    import torch
    import transformers
    from transformers import DataCollatorWithPadding, PrinterCallback, Trainer, TrainingArguments

    from tupe import TupeForSequenceClassification

    transformers.set_seed(seed)  # the new head's initialisation depends on the seed too
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "newly initialized head" is expected here
    transformers.logging.disable_progress_bar()  # one bar for the whole grid
    try:
        kwargs: dict[str, Any] = {"num_labels": task.num_labels}
        if settings.dropout is not None:  # the pre-training dropout may differ (the mini preset uses 0)
            kwargs["hidden_dropout_prob"] = settings.dropout
            kwargs["attention_probs_dropout_prob"] = settings.dropout
        if not task.is_regression:
            kwargs["id2label"] = dict(enumerate(task.label_names))
            kwargs["label2id"] = {n: i for i, n in enumerate(task.label_names)}
        model = TupeForSequenceClassification.from_pretrained(
            model_dir, ignore_mismatched_sizes=True, **kwargs
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()

    work = run_dir / "trainer"
    args = TrainingArguments(
        output_dir=str(work),
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=settings.eval_batch_size,
        learning_rate=lr,
        num_train_epochs=settings.epochs,
        warmup_steps=settings.warmup_ratio,  # a float < 1 is a ratio of the total steps
        lr_scheduler_type=settings.lr_scheduler,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_epsilon=settings.adam_epsilon,
        max_grad_norm=settings.max_grad_norm,
        optim="adamw_torch",
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="steps",
        logging_steps=max(1, min(50, len(train_ds) // settings.batch_size)),
        report_to="none",
        disable_tqdm=True,
        fp16=settings.fp16,
        bf16=settings.bf16,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)
    t0 = time.time()
    train_out = trainer.train()
    train_seconds = time.time() - t0

    scores: dict[str, dict[str, float]] = {}
    pred_files: dict[str, str] = {}
    for split_name, (split, ds) in dev.items():
        out = trainer.predict(ds)
        preds = predictions_from_logits(out.predictions, task.is_regression)
        scores[split_name] = compute_metrics(task.metrics, split.labels, preds)
        fname = f"predictions-{split_name}.tsv"
        _write_predictions(run_dir / fname, split, preds, task.is_regression)
        pred_files[split_name] = fname
    if save_model:
        trainer.save_model(str(run_dir / "model"))
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    a = trainer.args
    # what the Trainer actually used (not just what was asked), so results.json can be audited
    used = {
        "learning_rate": a.learning_rate,
        "warmup_steps": a.get_warmup_steps(trainer.state.max_steps),
        "total_steps": trainer.state.max_steps,
        "lr_scheduler": str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)),
        "optimizer": str(getattr(a.optim, "value", a.optim)),
        "adam_betas": [a.adam_beta1, a.adam_beta2],
        "adam_epsilon": a.adam_epsilon,
        "weight_decay": a.weight_decay,
        "max_grad_norm": a.max_grad_norm,
        "train_batch_size": a.per_device_train_batch_size * max(1, a.n_gpu),
        "dropout": [model.config.hidden_dropout_prob, model.config.attention_probs_dropout_prob],
        "device": str(a.device),
    }
    shutil.rmtree(work, ignore_errors=True)
    return {
        "lr": lr,
        "seed": seed,
        "scores": scores,
        "main": main_score(task, scores),
        "predictions": pred_files,
        "train_loss": float(train_out.training_loss),
        "loss_curve": losses,
        "steps": int(trainer.state.global_step),
        "trainer": used,
        "train_seconds": round(train_seconds, 2),
        "seconds": round(time.time() - t0, 2),  # training and evaluation
    }


@dataclass
class GridResult:
    out_dir: Path
    results: dict[str, Any]


def _load_data(
    task: GlueTask, data_dir: str | None, train_file: str | None, dev_files: Sequence[str] | None
) -> TaskData:
    if train_file or dev_files:
        if not (train_file and dev_files):
            raise TupeError("--train-file and --dev-file go together")
        names = list(task.hf_dev_splits)
        if len(dev_files) > len(names):
            raise TupeError(
                f"{len(dev_files)} --dev-file given; {task.name} has {len(names)} dev split(s): {', '.join(names)}"
            )
        return TaskData(
            task,
            read_split_file(task, train_file),
            {name: read_split_file(task, f) for name, f in zip(names, dev_files)},
            f"{train_file} + {' + '.join(dev_files)}",
        )
    if data_dir is None:
        raise TupeError("give --data-dir (or --train-file and --dev-file)")
    return load_task(task, data_dir)


def _subsample(split: Split, n: int | None) -> Split:
    """A fixed random subset (seed 0, the same for every run of the grid), kept in file order."""
    if n is None or n >= len(split):
        return split
    if n <= 0:
        raise TupeError(f"sample limit must be positive, got {n}")
    rows = sorted(np.random.default_rng(0).choice(len(split), size=n, replace=False).tolist())
    return split.subset(rows)


@contextlib.contextmanager
def grid_lock(out_dir: Path) -> Iterator[None]:
    """One `tupe glue` per output folder at a time: two would train the same runs and overwrite each other."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = out_dir / ".lock"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            alive = False
            if pid > 0:
                try:
                    os.kill(pid, 0)
                    alive = True
                except ProcessLookupError:
                    alive = False
                except PermissionError:
                    alive = True
            if alive and pid != os.getpid():
                raise TupeError(
                    f"{out_dir}: another `tupe glue` (pid {pid}) is writing here; wait for it"
                ) from None
            lock.unlink(missing_ok=True)  # left by a process that is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def run_grid(model_dir: str | Path, settings: GlueSettings, out_dir: str | Path, **kwargs: Any) -> GridResult:
    """Fine-tune every (lr, seed) of the grid that has not finished yet in `out_dir`, then summarise.

    Keyword arguments: data_dir, train_file, dev_files, scheme, tokenizer_dir, save_models, overwrite, log.
    """
    with grid_lock(Path(out_dir)):
        return _run_grid(model_dir, settings, out_dir, **kwargs)


def _run_grid(
    model_dir: str | Path,
    settings: GlueSettings,
    out_dir: str | Path,
    data_dir: str | None = None,
    train_file: str | None = None,
    dev_files: Sequence[str] | None = None,
    scheme: str | None = None,
    tokenizer_dir: str | None = None,
    save_models: bool = False,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> GridResult:
    from tqdm.auto import tqdm

    task = get_task(settings.task)
    model_dir = Path(model_dir)
    out_dir = Path(out_dir)
    info, config = inspect_checkpoint(model_dir, scheme)
    settings = settings.resolved(task, config.max_position_embeddings)
    if not settings.lrs or not settings.seeds:
        raise TupeError("the grid is empty: give at least one learning rate and one seed")
    tokenizer = load_tokenizer(tokenizer_dir or model_dir, config)

    data = _load_data(task, data_dir, train_file, dev_files)
    data.train = _subsample(data.train, settings.max_train_samples)
    data.dev = {k: _subsample(v, settings.max_eval_samples) for k, v in data.dev.items()}
    fingerprint = {
        "settings": settings.fingerprint_fields(),
        "model_weights_sha256": info.weights_sha256,
        "data_sha256": data_fingerprint(data),
    }

    # Resume: reuse finished runs made with the same model, data and settings.
    runs_dir = out_dir / "runs"
    done: dict[tuple[float, int], dict] = {}
    if runs_dir.is_dir():
        for f in sorted(runs_dir.glob("*/result.json")):
            try:
                r = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # not finished (result.json is written last, atomically)
            if r.get("fingerprint") != fingerprint:
                if not overwrite:
                    raise TupeError(
                        f"{f}: a run made with other settings, model or data is in {out_dir}; "
                        "use a new --out, or --overwrite to discard those runs"
                    )
                shutil.rmtree(f.parent)
                continue
            done[(r["lr"], r["seed"])] = r

    grid = [(lr, seed) for lr in settings.lrs for seed in settings.seeds]
    todo = [g for g in grid if g not in done]
    n_train = len(data.train)
    steps_per_run = int(math.ceil(math.ceil(n_train / settings.batch_size) * settings.epochs))

    log(
        f"{task.name}: {n_train} train / "
        + ", ".join(f"{len(v)} {k}" for k, v in data.dev.items())
        + f" examples from {data.source}; model {model_dir} (scheme {info.scheme}, "
        f"pre-training steps {info.pretrain_steps if info.pretrain_steps is not None else 'unknown'})"
    )
    log(
        f"grid: {len(settings.lrs)} lr x {len(settings.seeds)} seeds = {len(grid)} runs, "
        f"{len(grid) - len(todo)} already done; {settings.epochs:g} epochs x "
        f"{math.ceil(n_train / settings.batch_size)} steps (batch {settings.batch_size}, max length "
        f"{settings.max_seq_len})"
    )

    train_enc = encode_split(tokenizer, data.train, settings.max_seq_len, task.is_regression)
    train_ds = to_dataset(train_enc, task.is_regression)
    dev: dict[str, tuple[Split, Any]] = {}
    dev_at_max = {}
    for name, split in data.dev.items():
        enc = encode_split(tokenizer, split, settings.max_seq_len, task.is_regression)
        dev[name] = (split, to_dataset(enc, task.is_regression))
        dev_at_max[name] = enc.at_max_length

    import tupe

    def write_summary(runs: list[dict]) -> dict:
        summary = summarize(task, runs, settings.lrs, settings.seeds)
        results = {
            "format": RESULTS_FORMAT,
            "task": task.name,
            "metrics": list(task.metrics),
            "main_metric": task.main_metric,
            "main_split": next(iter(task.hf_dev_splits)),
            "dev_splits": list(data.dev),
            "label_names": list(task.label_names),
            "model": asdict(info),
            "scheme": info.scheme,
            "pretrain_steps": info.pretrain_steps,
            "data": {
                "source": data.source,
                "train_examples": n_train,
                "dev_examples": {k: len(v) for k, v in data.dev.items()},
                "train_at_max_length": train_enc.at_max_length,
                "dev_at_max_length": dev_at_max,
                # what always predicting the most frequent dev label scores (accuracy), to read small models by
                "dev_majority_accuracy": {
                    k: None if task.is_regression else max(np.bincount(v.labels)) / len(v)
                    for k, v in data.dev.items()
                },
                "sha256": fingerprint["data_sha256"],
            },
            "settings": asdict(settings),
            "protocol": "median over seeds per learning rate; best learning rate by the median main metric "
            "(TUPE paper, Table 2); scores are the dev scores after the last epoch",
            "engine": {"trainer": "transformers.Trainer", "tupe": tupe.__version__, **_versions()},
            "complete": all(g in {(r["lr"], r["seed"]) for r in runs} for g in grid),
            "runs": sorted(
                (
                    {k: r.get(k) for k in _RUN_SUMMARY_KEYS}
                    | {
                        "predictions": {
                            s: f"runs/{run_name(r['lr'], r['seed'])}/{p}" for s, p in r["predictions"].items()
                        }
                    }
                    for r in runs
                ),
                key=lambda r: (r["lr"], r["seed"]),
            ),
            **summary,
        }
        atomic_write_json(out_dir / "results.json", results)
        return results

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [done[g] for g in grid if g in done]
    results = write_summary(runs)
    if todo:
        bar = tqdm(total=steps_per_run * len(todo), desc=f"{task.name} grid", unit="step", dynamic_ncols=True)
        try:
            for k, (lr, seed) in enumerate(todo, 1):
                label = f"run {k}/{len(todo)} lr={lr:g} seed={seed}"
                bar.set_postfix_str(label)
                run_dir = runs_dir / run_name(lr, seed)
                if run_dir.exists():
                    shutil.rmtree(run_dir)  # an unfinished run from an interrupted grid
                run_dir.mkdir(parents=True)
                start = bar.n
                r = train_one(
                    str(model_dir),
                    task,
                    settings,
                    lr,
                    seed,
                    train_ds,
                    dev,
                    tokenizer,
                    run_dir,
                    [_progress_callback(bar, label)],
                    save_model=save_models,
                )
                bar.n = start + steps_per_run  # keep the ETA right if the Trainer's step count differed
                bar.refresh()
                r["fingerprint"] = fingerprint
                atomic_write_json(run_dir / "result.json", r)  # last: marks the run finished
                runs.append(r)
                results = write_summary(runs)
                shown = ", ".join(
                    f"{split}/{m}={v:.4f}" if v is not None else f"{split}/{m}=nan"
                    for split, ms in r["scores"].items()
                    for m, v in ms.items()
                )
                bar.write(f"lr={lr:g} seed={seed}: {shown} ({r['seconds']:.0f} s)")
        finally:
            bar.close()
    best = results["best"]
    if best is not None:
        log(
            f"best lr {best['lr']:g}: median {task.main_metric} {best['main_median']:.4f} "
            f"over {best['n_seeds']} seeds -> {out_dir / 'results.json'}"
        )
    return GridResult(out_dir, results)


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


# --------------------------------------------------------------------------------------------------------- CLI


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="pre-trained tupe checkpoint directory (save_pretrained)")
    p.add_argument("--task", required=True, help=f"GLUE task: {', '.join(TASKS)}")
    p.add_argument(
        "--data-dir",
        help="GLUE root (TASK/train.tsv, TASK/dev.tsv), a task directory, a `datasets` copy saved with "
        "save_to_disk, or hub[:REPO] to load nyu-mll/glue from the hub",
    )
    p.add_argument(
        "--train-file", help="instead of --data-dir: a train file (task's TSV layout, or .json/.jsonl)"
    )
    p.add_argument(
        "--dev-file",
        action="append",
        help="with --train-file: a dev file (task's TSV layout, or .json/.jsonl); MNLI: matched, then mismatched",
    )
    p.add_argument("--out", required=True, help="output directory (results.json, runs/)")
    p.add_argument(
        "--lrs", type=_floats, default=list(PAPER_LRS), help="learning rates (default 2e-5,3e-5,4e-5,5e-5)"
    )
    p.add_argument("--seeds", type=_ints, default=list(PAPER_SEEDS), help="seeds (default 1,2,3,4,5)")
    p.add_argument("--epochs", type=float, help="epochs (default: the paper's 10, or 5 for MNLI/QQP/QNLI)")
    p.add_argument("--batch-size", type=int, default=32, help="train batch size (default 32)")
    p.add_argument("--eval-batch-size", type=int, default=64, help="evaluation batch size (default 64)")
    p.add_argument("--max-seq-len", type=int, help="max tokens per example (default min(512, model's max))")
    p.add_argument("--max-train-samples", type=int, help="use a fixed random subset of the training set")
    p.add_argument(
        "--max-eval-samples", type=int, help="use a fixed random subset of each dev set (not comparable)"
    )
    p.add_argument("--warmup-ratio", type=float, default=0.06, help="linear warm-up fraction (default 0.06)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="default 0.01")
    p.add_argument("--adam-betas", default="0.9,0.999", help="Adam betas (default the paper's 0.9,0.999)")
    p.add_argument("--adam-eps", type=float, default=1e-6, help="Adam epsilon (default 1e-6)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping norm (default 1.0)")
    p.add_argument(
        "--dropout",
        type=float,
        default=0.1,
        help="hidden and attention dropout while fine-tuning (default the paper's 0.1; -1 keeps the checkpoint's)",
    )
    p.add_argument("--scheme", help="expected position scheme; an error if the checkpoint's differs")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the model directory)")
    p.add_argument(
        "--save-models", action="store_true", help="keep every run's fine-tuned model (runs/*/model)"
    )
    p.add_argument("--overwrite", action="store_true", help="discard runs in --out made with other settings")
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--fp16", action="store_true", help="mixed precision (GPU)")
    prec.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")


def run(args: argparse.Namespace) -> int:
    betas = _floats(args.adam_betas)
    if len(betas) != 2:
        raise TupeError(f"--adam-betas needs two numbers, got {args.adam_betas!r}")
    for name in ("batch_size", "eval_batch_size"):
        if getattr(args, name) <= 0:
            raise TupeError(f"--{name.replace('_', '-')} must be positive")
    if args.epochs is not None and args.epochs <= 0:
        raise TupeError("--epochs must be positive")
    if not (args.dropout < 0 or 0 <= args.dropout < 1):
        raise TupeError(f"--dropout must be in [0, 1) (or -1 for the checkpoint's), got {args.dropout}")
    if any(lr <= 0 for lr in args.lrs):
        raise TupeError(f"learning rates must be positive, got {args.lrs}")
    settings = GlueSettings(
        task=get_task(args.task).name,
        lrs=args.lrs,
        seeds=args.seeds,
        epochs=args.epochs,
        batch_size=args.batch_size,
        eval_batch_size=args.eval_batch_size,
        max_seq_len=args.max_seq_len,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_epsilon=args.adam_eps,
        max_grad_norm=args.clip,
        dropout=None if args.dropout < 0 else args.dropout,
        max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples,
        fp16=args.fp16,
        bf16=args.bf16,
    )
    run_grid(
        args.model,
        settings,
        args.out,
        data_dir=args.data_dir,
        train_file=args.train_file,
        dev_files=args.dev_file,
        scheme=args.scheme,
        tokenizer_dir=args.tokenizer,
        save_models=args.save_models,
        overwrite=args.overwrite,
    )
    return 0
