"""Train one small model per scheme and seed on the synthetic tasks of tupe/diagnostics/tasks.py, test it at 1x-8x
its training length with each extension method that applies, and fit a linear probe of absolute position on its
last hidden states (`tupe diagnose`).

One job is one (scheme or checkpoint, seed): a fresh `TupeForMaskedLM` of the `--preset`-independent diagnostic
shape (or the checkpoint's own weights), trained with AdamW on batches that mix the three tasks, then scored on test
sets drawn from their own random stream (the same for every scheme). Its result is a small JSON; a finished job is
kept on `--resume`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .tasks import BUCKETS, TASKS, Batch, Vocabulary, make_batch, symbols_needed, task_rng

SPECIAL = (0, 1, 2, 3, 4)  # [PAD] [CLS] [SEP] [MASK] [UNK]: tupe's own layout for a fresh model


@dataclasses.dataclass(frozen=True)
class Settings:
    train_length: int = 32
    multiples: tuple[int, ...] = (1, 2, 4, 8)
    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    test_examples: int = 256
    probe_examples: int = 128  # sequences to fit the position probe on, and as many to score it on


@dataclasses.dataclass(frozen=True)
class Job:
    name: str  # "<scheme>/seed-<s>"
    scheme: str | None  # a fresh model of this scheme, or
    checkpoint: str | None  # a checkpoint's weights
    seed: int
    folder: str
    pretrain_seed: int | None = None  # a run folder <scheme>/seed-<k> given to --model: k


def fresh_vocabulary(settings: Settings = Settings()) -> Vocabulary:
    """The tasks' token ids for a model made for them: tupe's special ids 0-4 ([CLS] 1, [MASK] 3, as a fresh
    `TupeConfig`), then the three task tokens, the marker, the four answers and as many symbols as the copy task
    needs at the longest test length; `vocab.size` ids in all (the vocabulary size to give a model of your own)."""
    symbols = symbols_needed(settings.train_length * max(settings.multiples))
    size = len(SPECIAL) + len(TASKS) + 1 + BUCKETS + symbols
    return Vocabulary.build(size, SPECIAL, cls_id=1, mask_id=3, symbols=symbols)


def fresh_model(scheme: str, settings: Settings) -> tuple[torch.nn.Module, Vocabulary]:
    from tupe.modeling import TupeConfig, TupeForMaskedLM

    vocab = fresh_vocabulary(settings)
    config = TupeConfig(
        position_scheme=scheme,
        vocab_size=vocab.size,
        hidden_size=settings.hidden_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        intermediate_size=settings.intermediate_size,
        max_position_embeddings=settings.train_length,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    assert (config.cls_token_id, config.mask_token_id) == (vocab.cls, vocab.mask)
    return TupeForMaskedLM(config), vocab


def checkpoint_model(path: str, settings: Settings) -> tuple[torch.nn.Module, Vocabulary]:
    """A checkpoint's TupeForMaskedLM, to fine-tune on the tasks: a `tupe pretrain` folder, any folder a
    TupeForMaskedLM was saved to (`save_pretrained`, with or without a tokenizer), or a `transformers` BERT folder
    (BertForMaskedLM), converted exactly to bert-a. The task tokens are ids of its vocabulary that are not special
    (the config's special ids, and its tokenizer's where the folder has one)."""
    from tupe.evaluation.evaluate import checked_model_class, load_masked_lm, training_length
    from tupe.io.checkpoints import has_tokenizer_files, load_tokenizer
    from tupe.modeling import TupeForMaskedLM

    folder = Path(path).expanduser()
    what = f"{folder}: not a masked-LM checkpoint"
    cls, kind = checked_model_class(folder, what)
    tokenizer = load_tokenizer(folder, explicit=False) if has_tokenizer_files(folder) else None
    if kind == "tupe":
        model = load_masked_lm(cls, folder, what)
    else:  # BERT: the special ids are its tokenizer's (Google's vocabulary: [CLS] 101, ...), or BERT's defaults
        model = TupeForMaskedLM.from_bert(load_masked_lm(cls, folder, what), tokenizer)
    config = model.config
    rows = min(config.max_position_embeddings, training_length(folder) or config.max_position_embeddings)
    if rows < settings.train_length:
        raise ValueError(
            f"{path}: trained at {rows} positions, fewer than --train-length {settings.train_length}"
        )
    special = {config.pad_token_id, config.cls_token_id, config.sep_token_id, config.mask_token_id}
    special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    symbols = symbols_needed(settings.train_length * max(settings.multiples))
    try:
        vocab = Vocabulary.build(
            config.vocab_size,
            sorted(i for i in special if i is not None),
            config.cls_token_id,
            config.mask_token_id,
            symbols,
        )
    except ValueError as err:  # the copy task's symbols grow with the longest test length
        raise ValueError(
            f"{path}: {err} (fewer --multiples or a shorter --train-length need fewer)"
        ) from None
    return model.train(), vocab


def training_batch(
    vocab: Vocabulary, settings: Settings = Settings(), seed: int = 0, step: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batch `step` of seed `seed`, as `tupe diagnose` trains on: `batch_size` sequences of the training
    length, the three tasks in equal shares. (inputs, labels), each (rows, L) int64; labels are -100 except at the
    questions. A loop of your own can train on these and `diagnose_model` score the result."""
    rng = task_rng(seed, 0, step)
    per = -(-settings.batch_size // len(TASKS))
    parts = [make_batch(t, rng, vocab, per, settings.train_length, settings.train_length) for t in TASKS]
    inputs = torch.from_numpy(np.concatenate([p.inputs for p in parts]))
    return inputs, torch.from_numpy(np.concatenate([p.labels for p in parts]))


def train(model: torch.nn.Module, vocab: Vocabulary, settings: Settings, seed: int) -> list[dict[str, float]]:
    """AdamW (weight decay 0.01), linear warm-up then linear decay to 0, gradients clipped at 1; the loss every 100
    steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.01)
    warm, total = settings.warmup_steps, settings.steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, 1 - s / total)
    )
    model.train()
    curve = []
    for step in range(total):
        inputs, labels = training_batch(vocab, settings, seed, step)
        loss = model(input_ids=inputs, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if (step + 1) % 100 == 0 or step == 0:
            curve.append({"step": step + 1, "loss": float(loss.detach())})
    return curve


def correct_per_example(m: Any, batch: Batch) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN401 - EvalModel
    """(answers right, answers) per sequence: the answer is the candidate with the highest logit."""
    selected = torch.from_numpy(batch.labels != -100)
    with torch.inference_mode():
        logits = m.logits_at(torch.from_numpy(batch.inputs), selected).cpu()
    picked = torch.from_numpy(batch.candidates)[logits[:, torch.from_numpy(batch.candidates)].argmax(-1)]
    right = (picked == torch.from_numpy(batch.labels)[selected]).double()
    rows = selected.nonzero()[:, 0]
    counts = torch.zeros(len(batch.inputs), dtype=torch.float64).index_add_(0, rows, right)
    return counts.numpy(), selected.sum(1).double().numpy()


def methods_for(m: Any) -> list[str]:  # noqa: ANN401 - EvalModel
    """`none` for every model, and the extension methods that change this model's positions."""
    from tupe.evaluation import EXTEND_METHODS
    from tupe.evaluation.lengths import applies

    return [method for method in EXTEND_METHODS if applies(m, method)]


def score_tasks(m: Any, vocab: Vocabulary, settings: Settings) -> list[dict[str, Any]]:  # noqa: ANN401
    """Accuracy and chance of every task at every length and method (None where the model cannot run there)."""
    from tupe.evaluation.lengths import at_length

    from ..evaluation.bootstrap import Ratio, bootstrap

    out = []
    for multiple in settings.multiples:
        n = multiple * settings.train_length
        for method in methods_for(m) if multiple > 1 else ["none"]:
            ready, note = at_length(m, n, method)
            for k, task in enumerate(TASKS):
                entry: dict[str, Any] = {"task": task, "length": n, "method": method, "note": note}
                if ready is not None:
                    batch = make_batch(
                        task, task_rng(0, 1, k, n), vocab, settings.test_examples, n, m.train_length
                    )
                    right, asked = correct_per_example(ready, batch)
                    ci = bootstrap({"accuracy": [(1.0, Ratio(right, asked))]}, len(right), 1000, 0)[
                        "accuracy"
                    ]
                    entry |= {"accuracy": ci, "chance": batch.chance, "answers": int(asked.sum())}
                out.append(entry)
    return out


def encoder_states(m: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:  # noqa: ANN401 - EvalModel
    """(rows, n) ids -> (rows, n, width) last hidden states of tupe's and BERT's encoders; None for another
    module."""
    if m.kind == "tupe":
        return lambda ids: m.model.tupe(ids, return_dict=True).last_hidden_state
    if m.kind == "bert":
        return lambda ids: m.model.bert(input_ids=ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    return None


def position_probe(
    states: Callable[[torch.Tensor], torch.Tensor], vocab: Vocabulary, settings: Settings
) -> dict[str, float]:
    """R^2 of a ridge regression from the last hidden state (`states`: (rows, n) ids -> (rows, n, width)) to the
    absolute position (2 .. L-1), fitted on `probe_examples` random sequences of the training length and scored on
    as many others (positions 0 and 1, [CLS] and the task token, left out)."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score

    n = settings.train_length
    features, targets = [], []
    for part in (0, 1):
        rng = task_rng(0, 2, part)
        inputs = rng.choice(vocab.symbols, size=(settings.probe_examples, n)).astype(np.int64)
        inputs[:, 0], inputs[:, 1] = vocab.cls, vocab.task["copy"]
        with torch.inference_mode():
            hidden = states(torch.from_numpy(inputs))[:, 2:].cpu()
        features.append(hidden.reshape(-1, hidden.shape[-1]).double().numpy())
        targets.append(np.tile(np.arange(2, n, dtype=np.float64), settings.probe_examples))
    fit = Ridge(alpha=1.0).fit(features[0], targets[0])
    return {"r2": float(r2_score(targets[1], fit.predict(features[1]))), "positions": n - 2}


def _check_vocabulary(m: Any, vocab: Vocabulary) -> None:  # noqa: ANN401 - EvalModel
    """One short sequence holding the tasks' largest id: a model that cannot read it, or answers over fewer ids
    than the tasks use, is refused in one line naming the vocabulary it needs."""
    ids = torch.tensor([[vocab.cls, vocab.task["copy"], vocab.mask, int(vocab.symbols.max())]])
    need = f"a vocabulary of at least {vocab.size} ids (`fresh_vocabulary(settings).size`)"
    try:
        with torch.inference_mode():
            logits = m.logits_at(ids, ids == vocab.mask)
    except IndexError as err:  # an embedding smaller than the tasks' ids
        raise ValueError(f"{m.name} cannot read the tasks' token ids ({err}): they need {need}") from err
    if logits.ndim != 2 or logits.shape[-1] < vocab.size:
        raise ValueError(
            f"{m.name}: its logits at a question are {tuple(logits.shape)}; the tasks need (questions, vocabulary) "
            f"with {need}"
        )


def diagnose_model(
    model: torch.nn.Module | Any,  # noqa: ANN401 - or an EvalModel
    vocab: Vocabulary,
    settings: Settings = Settings(),
    hidden: Callable[[torch.Tensor], torch.Tensor] | None = None,
    name: str = "model",
) -> dict[str, Any]:
    """Score a model already trained on the tasks, by `tupe diagnose` or by a loop of your own (on
    `training_batch`): its accuracy (bootstrap interval over test sequences) and chance on every task at each
    length `k * settings.train_length` of `settings.multiples`, without extension and with each extension method
    that applies, and the position probe's R^2.

    `model`: a TupeForMaskedLM, a transformers BertForMaskedLM, any module whose `forward(input_ids=,
    attention_mask=)` returns masked-LM logits (rows, n, vocab) (as `.logits` or the tensor), or an `EvalModel`.
    `hidden`: (rows, n) ids -> (rows, n, width) states for the position probe; by default the encoder's last
    hidden states of tupe's and BERT's models, and no probe (`position_probe` None) for another module.
    Returns {"tasks": [...], "position_probe": {"r2", "positions"} or None}, as a `tupe diagnose` job's result."""
    from tupe.evaluation.evaluate import EvalModel

    m = (
        model
        if isinstance(model, EvalModel)
        else EvalModel.of(model, None, name, train_length=settings.train_length)
    )
    m.model.eval()
    _check_vocabulary(m, vocab)
    states = hidden or encoder_states(m)
    return {
        "tasks": score_tasks(m, vocab, settings),
        "position_probe": None if states is None else position_probe(states, vocab, settings),
    }


def run_job(job: Job, settings: Settings) -> dict[str, Any]:
    """Train, score and probe one job, on one thread (the caller's thread count is restored after); its result is
    also written to `<folder>/result.json`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_job(job, settings)
    finally:
        torch.set_num_threads(threads)


def _run_job(job: Job, settings: Settings) -> dict[str, Any]:
    start = time.perf_counter()
    torch.manual_seed(job.seed)
    if job.checkpoint is not None:
        model, vocab = checkpoint_model(job.checkpoint, settings)
    else:
        model, vocab = fresh_model(job.scheme, settings)
    curve = train(model, vocab, settings, job.seed)
    trained = time.perf_counter() - start
    scored = diagnose_model(model, vocab, settings, name=job.name)
    result = {
        "name": job.name,
        "scheme": model.config.position_scheme,
        "seed": job.seed,
        **({} if job.pretrain_seed is None else {"pretrain_seed": job.pretrain_seed}),
        "checkpoint": job.checkpoint,
        "parameters": sum(p.numel() for p in model.parameters()),
        "curve": curve,
        **scored,
        "train_seconds": round(trained, 1),
        "seconds": round(time.perf_counter() - start, 1),
    }
    from tupe.io.files import atomic_write_text

    Path(job.folder).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(job.folder) / "result.json", json.dumps(result, indent=1) + "\n")
    return result


def finished(job: Job) -> dict[str, Any] | None:
    """A job's kept result, or None where it has none or the file is damaged (then it runs again)."""
    path = Path(job.folder) / "result.json"
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    keys = {"name", "tasks", "position_probe", "seconds"}
    return result if isinstance(result, dict) and keys <= set(result) and result["name"] == job.name else None
