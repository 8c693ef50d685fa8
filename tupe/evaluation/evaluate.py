"""Masked-LM evaluation of checkpoints on text: loss, perplexity, pseudo-perplexity, a unigram baseline, a
word-order check, and bootstrap confidence intervals. The exact definitions are in docs/evaluation.md.

Data follow pre-training exactly: the text is tokenised and packed by `tupe.data.packing` (RoBERTa
full-sentences: documents joined with [SEP], blocks of `[CLS] + L-1` stream tokens) and masked by
`tupe.data.mlm.MaskedLMCollator.mask_one` (15%, 80/10/10), keyed by (seed, EVAL_SPLIT, block index), so every
model sharing a tokenizer sees the same blocks and the same masks and their differences are paired.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tupe.errors import TupeError
from tupe.evaluation.bootstrap import BOOTSTRAP_STREAM, CI_LEVEL, Ratio, bootstrap, bootstrap_rng  # noqa: F401
from tupe.evaluation.report import format_report  # noqa: F401 - re-exported for the command

EVAL_SPLIT = 2  # mask key (EVAL_SPLIT, block index): apart from pre-training's train (0) and valid (1) keys
SHUFFLE_STREAM, PPPL_STREAM = 101, 102  # second seed word of each random stream (bootstrap: 103)


# ---------------------------------------------------------------------------------------------------- models
@dataclass
class EvalModel:
    """A masked-LM checkpoint ready for evaluation: the model (eval mode), its tokenizer, its block length.

    `load_eval_model` makes one from a folder; `EvalModel.of` wraps a model in memory, including one that is
    neither tupe's nor BERT (kind "module": any module whose `forward(input_ids=, attention_mask=)` returns
    masked-LM logits (rows, n, vocab), as `.logits` or as the tensor itself)."""

    path: Path
    name: str
    kind: str  # "tupe", "bert" or "module"
    description: str
    model: torch.nn.Module
    tokenizer: Any
    max_length: int
    num_parameters: int
    train_length: int | None = None  # block length of pre-training, when the run recorded it (tupe_run.json)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (the CPU for a module without any)."""
        first = next(self.model.parameters(), None)
        return torch.device("cpu") if first is None else first.device

    def target_nll(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-row sum of -log p(label) over the positions whose label is not -100 (float64, shape (rows,)).

        The head runs on the labelled positions only (the hidden x vocab matmul dominates at small sizes).
        Inputs go to the model's device and the sums come back to the CPU."""
        device = self.device
        inputs, labels = inputs.to(device), labels.to(device)
        selected = labels != -100
        logits = self.logits_at(inputs, selected)
        nll = torch.nn.functional.cross_entropy(logits, labels[selected], reduction="none").double()
        rows = torch.arange(inputs.shape[0], device=device).unsqueeze(1).expand_as(inputs)[selected]
        sums = torch.zeros(inputs.shape[0], dtype=torch.float64, device=device).index_add_(0, rows, nll)
        return sums.cpu()

    def logits_at(self, inputs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        """(selected positions, vocab) float32 masked-LM logits of (rows, n) `inputs` (no padding) at the True
        positions of the (rows, n) `selected`, in row-major order, on the model's device."""
        device = self.device
        inputs, selected = inputs.to(device), selected.to(device)
        attention = torch.ones_like(inputs)
        if self.kind == "tupe":
            hidden = self.model.tupe(inputs, attention_mask=attention, return_dict=True).last_hidden_state
            head = self.model.lm_head
        elif self.kind == "bert":
            hidden = self.model.bert(
                input_ids=inputs, attention_mask=attention, token_type_ids=torch.zeros_like(inputs)
            ).last_hidden_state
            head = self.model.cls
        else:
            out = self.model(input_ids=inputs, attention_mask=attention)
            return getattr(out, "logits", out)[selected].float()
        return head(hidden[selected]).float()

    @classmethod
    def of(
        cls,
        model: torch.nn.Module,
        tokenizer: Any,  # noqa: ANN401 - a transformers tokenizer with [CLS], [SEP], [MASK] and padding
        name: str = "model",
        max_length: int | None = None,
        train_length: int | None = None,
    ) -> EvalModel:
        """A model in memory, ready for `evaluate` and `passkey_probe`: a TupeForMaskedLM, a transformers
        BertForMaskedLM, or any masked LM (kind "module"; see the class). `max_length`: the longest input it takes
        (default: its config's `max_position_embeddings`, else no limit); `train_length`: its training length,
        where rows beyond it were never trained (default: unknown)."""
        from transformers import BertForMaskedLM

        from tupe.modeling import TupeForMaskedLM

        kind = (
            "tupe"
            if isinstance(model, TupeForMaskedLM)
            else "bert"
            if isinstance(model, BertForMaskedLM)
            else "module"
        )
        if max_length is None:
            max_length = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 1 << 30)
        return cls(
            path=Path(name),
            name=name,
            kind=kind,
            description=f"{type(model).__name__} in memory",
            model=model.eval(),
            tokenizer=tokenizer,
            max_length=max_length,
            num_parameters=sum(p.numel() for p in model.parameters()),
            train_length=train_length,
        )


_TIED = {"lm_head.decoder.weight", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}


def load_eval_model(
    path: str | Path, tokenizer_dir: str | Path | None = None, device: str | torch.device | None = None
) -> EvalModel:
    """Load a `tupe pretrain` checkpoint (TupeForMaskedLM) or a `transformers` BERT folder (BertForMaskedLM, run
    with transformers' own code), each with its tokenizer; a one-line `TupeError` naming the folder and what is
    missing otherwise. `device` None: the GPU when there is one (evaluation is float32 either way)."""
    from tupe.io.checkpoints import has_tokenizer_files, load_tokenizer

    path = Path(path).expanduser()
    what = f"{path}: not a masked-LM checkpoint"
    cls, kind = checked_model_class(path, what)
    model = load_masked_lm(cls, path, what)
    model.eval()
    model.to(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    config = model.config
    source = path if has_tokenizer_files(path) or tokenizer_dir is None else Path(tokenizer_dir).expanduser()
    tokenizer = load_tokenizer(source, config)
    for role in ("cls", "sep", "mask", "pad"):
        if getattr(tokenizer, f"{role}_token_id") is None:
            raise TupeError(f"{source}: the tokenizer has no {role} token; a masked-LM tokenizer needs one")
    if kind == "tupe":
        description = f"tupe checkpoint, position_scheme {config.position_scheme}"
    else:
        description = "transformers BertForMaskedLM (transformers' own code)"
    return EvalModel(
        train_length=training_length(path),
        path=path,
        name=str(path),
        kind=kind,
        description=description,
        model=model,
        tokenizer=tokenizer,
        max_length=int(config.max_position_embeddings),
        num_parameters=sum(p.numel() for p in model.parameters()),
    )


def checked_model_class(path: Path, what: str) -> tuple[type, str]:
    """(model class, kind) of the folder `path`, whose files are checked: a tupe checkpoint or a transformers
    BERT folder, else a one-line error."""
    from transformers import BertForMaskedLM

    import tupe.modeling  # noqa: F401  (registers the tupe model type with the Auto classes)
    from tupe.io.checkpoints import check_model_weights, inspect_checkpoint, list_checkpoints, read_config
    from tupe.modeling import TupeForMaskedLM

    if not path.exists():
        raise TupeError(f"--model {path}: no such folder")
    if not path.is_dir():
        raise TupeError(f"{what}: a file, not a folder written by `tupe pretrain` or save_pretrained")
    if not (path / "config.json").is_file():
        ckpts = list_checkpoints(path)
        hint = f"; pass a checkpoint folder such as {ckpts[0]}" if ckpts else ""
        raise TupeError(
            f"{what}: no config.json (expected a folder written by `tupe pretrain` or save_pretrained){hint}"
        )
    model_type = read_config(path).get("model_type")
    if model_type == "tupe":
        inspect_checkpoint(path)  # safetensors checked, weights fit the config
        return TupeForMaskedLM, "tupe"
    if model_type == "bert":
        check_model_weights(path)  # safetensors only, each file checked
        return BertForMaskedLM, "bert"
    raise TupeError(
        f"{what}: config.json has model_type {model_type!r}; tupe evaluate reads tupe checkpoints "
        "and transformers BERT folders (model_type 'bert')"
    )


def load_masked_lm(cls: type, path: Path, what: str) -> Any:
    """`cls.from_pretrained(path)`, quietly; weights missing (other than the tied decoder) are one line."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the missing/unused weights are checked below, in one line
    hf_logging.disable_progress_bar()  # a bar per small checkpoint is noise
    try:
        model, info = cls.from_pretrained(str(path), output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = sorted(k for k in info.get("missing_keys", ()) if k not in _TIED)
    if missing:
        head = [k for k in missing if k.startswith(("lm_head.", "cls."))]
        why = "no masked-LM head (a fine-tuned classifier or a bare encoder?)" if head else "weights missing"
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise TupeError(f"{what}: {why}: the weights lack {shown}")
    return model


def training_length(path: Path) -> int | None:
    """The block length a `tupe pretrain` run trained on (`data.max_length` of its tupe_run.json, in the run
    folder or above a checkpoint-N folder); None for other folders. Table rows beyond it were never trained."""
    import json

    for folder in (path, path.parent):
        try:
            value = json.loads((folder / "tupe_run.json").read_text())["data"]["max_length"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return int(value) if isinstance(value, int) else None
    return None


# ------------------------------------------------------------------------------------------------ masking
class Masker:
    """The pre-training masking rule for any tokenizer, by reusing `MaskedLMCollator.mask_one` unchanged.

    `mask_one` assumes the project's contract (specials are ids 0..k-1, [MASK] is id 3). Ids are mapped to a
    canonical order that satisfies it ([PAD], [CLS], [SEP], [MASK], [UNK], other specials, then every other id
    in order), masked, and mapped back. For a tokenizer following the contract the map is the identity, so
    masks are bit-for-bit those of pre-training; for a BERT WordPiece, specials are never selected and random
    replacements are never specials, as in pre-training.
    """

    def __init__(self, tokenizer: Any, seed: int = 0, mlm_probability: float = 0.15) -> None:
        from tupe.data.mlm import MaskedLMCollator
        from tupe.data.tokenizer import MASK_ID

        vocab = len(tokenizer)
        named = [tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id]
        named += [tokenizer.mask_token_id, tokenizer.unk_token_id]
        specials = sorted({int(i) for i in [*tokenizer.all_special_ids, *named] if i is not None})
        order = [int(i) for i in dict.fromkeys(i for i in named if i is not None)]
        order += [i for i in specials if i not in order]
        if order.index(int(tokenizer.mask_token_id)) != MASK_ID:
            order.remove(int(tokenizer.mask_token_id))
            if len(order) < MASK_ID:
                raise TupeError("the tokenizer has too few special tokens for the masking rule")
            order.insert(MASK_ID, int(tokenizer.mask_token_id))
        self.special_ids = np.asarray(specials, dtype=np.int64)
        self.is_special = np.zeros(vocab, dtype=bool)
        self.is_special[self.special_ids] = True
        rest = np.flatnonzero(~self.is_special)
        self.from_canon = np.concatenate([np.asarray(order, dtype=np.int64), rest]).astype(np.int64)
        self.to_canon = np.empty(vocab, dtype=np.int64)
        self.to_canon[self.from_canon] = np.arange(vocab)
        self.identity = bool((self.from_canon == np.arange(vocab)).all())
        self.mask_id = int(tokenizer.mask_token_id)
        self.seed = seed
        self.collator = MaskedLMCollator(
            vocab, seed=seed, mlm_probability=mlm_probability, num_special=len(order)
        )

    def mask(self, ids: np.ndarray, block_index: int) -> tuple[np.ndarray, np.ndarray]:
        """(masked input ids, labels) of one block: labels are the original ids at selected positions, else -100."""
        canon = ids if self.identity else self.to_canon[ids]
        inputs, labels = self.collator.mask_one(canon, (EVAL_SPLIT, int(block_index)))
        if self.identity:
            return inputs, labels
        return self.from_canon[inputs], np.where(labels < 0, -100, self.from_canon[np.maximum(labels, 0)])

    def shuffle(
        self, ids: np.ndarray, inputs: np.ndarray, labels: np.ndarray, block_index: int
    ) -> np.ndarray:
        """The masked input with its other tokens permuted: positions selected for masking and special tokens
        ([CLS], document [SEP]s) stay in place, every other token moves to a seeded random free position."""
        free = np.flatnonzero((labels == -100) & ~self.is_special[ids])
        rng = np.random.default_rng([self.seed, EVAL_SPLIT, int(block_index), SHUFFLE_STREAM])
        out = inputs.copy()
        out[free] = inputs[rng.permutation(free)]
        return out


# ------------------------------------------------------------------------------------------------- blocks
@dataclass
class TextBlocks:
    """The evaluated blocks of one text under one tokenizer: full blocks of `length` ids, [CLS] first."""

    packed: Any  # tupe.data.packing.PackedCorpus
    length: int
    cls_id: int
    indices: np.ndarray  # evaluated block indices (into the full blocks of the stream), increasing
    full_blocks: int

    def ids(self, k: int) -> np.ndarray:
        block = self.packed.block(int(self.indices[k]))
        block[0] = self.cls_id  # the packer writes the project's [CLS]; another tokenizer has its own
        return block

    def __len__(self) -> int:
        return len(self.indices)


def make_blocks(
    corpus: Any,
    tokenizer: Any,
    length: int,
    max_blocks: int | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    log: Callable[[str], None] = print,
    source: str = "text",
) -> TextBlocks:
    """Tokenise and pack the text as pre-training does (cached like it), and pick the full blocks to evaluate:
    all of them, or `max_blocks` evenly spaced ones (block `floor(k * n / max_blocks)` for k < max_blocks)."""
    from tupe.data.packing import load_or_build_packed

    packed = load_or_build_packed(
        corpus, tokenizer, length, cache_dir, progress=progress, log=log, sep_id=int(tokenizer.sep_token_id)
    )
    full = packed.num_tokens // packed.content_len
    if full == 0:
        raise TupeError(
            f"{source}: {packed.num_tokens} tokens (with document separators) under this tokenizer make no block "
            f"of {length} tokens, which needs {length - 1} tokens after [CLS]; give more text"
        )
    if max_blocks is not None and max_blocks < full:
        indices = (np.arange(max_blocks, dtype=np.int64) * full) // max_blocks
    else:
        indices = np.arange(full, dtype=np.int64)
    return TextBlocks(packed, length, int(tokenizer.cls_token_id), indices, int(full))


def budget_blocks(blocks: TextBlocks, masker: Masker, n_tokens: int) -> np.ndarray:
    """`--masked-tokens N`: the fewest evenly spaced full blocks (block `floor(k * n / B)`, as `--max-blocks B`)
    whose masked targets number at least N (every full block when they all hold fewer); the indices, increasing.

    B starts at `ceil(N / (p (L - 1)))` (the expected masked targets per block) and grows until the count, taken
    from the blocks' own seeded masks, reaches N; so at every length the loss rests on about N targets."""
    full, length = blocks.full_blocks, blocks.length
    per_block = max(masker.collator.p * (length - 1), 1e-9)
    counts: dict[int, int] = {}

    def masked(i: int) -> int:
        if i not in counts:
            ids = blocks.packed.block(i)
            ids[0] = blocks.cls_id
            counts[i] = int((masker.mask(ids, i)[1] != -100).sum())
        return counts[i]

    b = min(full, max(1, math.ceil(n_tokens / per_block)))
    while True:
        indices = (np.arange(b, dtype=np.int64) * full) // b
        total = sum(masked(int(i)) for i in indices)
        if total >= n_tokens or b == full:
            return indices
        b = min(full, b + max(1, math.ceil((n_tokens - total) / per_block)))


_WORDS: dict[str, int] = {}  # corpus fingerprint -> words (one count per text and process)


def count_words(corpus: Any) -> int:
    """Whitespace-separated words of the text, read as the packer reads it (its lines, every document)."""
    from tupe.data.corpus import iter_line_batches

    key = corpus.fingerprint()
    if key not in _WORDS:
        _WORDS[key] = sum(
            len(line.split()) for lines, _ends, _done in iter_line_batches(corpus) for line in lines
        )
    return _WORDS[key]


def sample_pppl_positions(
    blocks: TextBlocks, masker: Masker, n_tokens: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded uniform sample, without replacement, of `n_tokens` non-special positions of the evaluated
    blocks: (block k, position) arrays sorted by block then position."""
    eligible = np.array([int((~masker.is_special[blocks.ids(k)]).sum()) for k in range(len(blocks))])
    total = int(eligible.sum())
    n = min(int(n_tokens), total)
    if n <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng([seed, EVAL_SPLIT, PPPL_STREAM])
    ranks = np.sort(rng.choice(total, size=n, replace=False))
    starts = np.concatenate([[0], np.cumsum(eligible)])
    ks = np.searchsorted(starts, ranks, side="right") - 1
    positions = np.empty(n, dtype=np.int64)
    for k in np.unique(ks):
        where = np.flatnonzero(~masker.is_special[blocks.ids(int(k))])
        sel = ks == k
        positions[sel] = where[ranks[sel] - starts[k]]
    return ks.astype(np.int64), positions


# ----------------------------------------------------------------------------------------------- evaluate
def check_eval_memory(m: EvalModel, length: int, batch_size: int, what: str) -> None:
    """Refuse, before building or running anything, an evaluation of `m` at `length` whose weights and one forward
    pass of `batch_size` blocks cannot fit in this machine's memory; the error names `what` (the options)."""
    from tupe.validators import activation_bytes, check_memory

    c = m.model.config
    heads = int(getattr(c, "num_attention_heads", 1))
    check_memory(
        f"{what} ({m.name})",
        4 * m.num_parameters
        + activation_bytes(
            max(1, int(batch_size)),
            length,
            int(c.hidden_size),
            int(c.num_hidden_layers),
            heads,
            int(getattr(c, "intermediate_size", 4 * c.hidden_size)),
            int(c.vocab_size),
            training=False,
        ),  # fmt: skip
    )


@dataclass
class Settings:
    seed: int = 0
    mlm_probability: float = 0.15
    max_blocks: int | None = None
    max_length: int | None = None
    masked_tokens: int | None = None  # a budget of masked targets (at each length), instead of max_blocks
    batch_size: int = 16
    pppl_tokens: int = 2000
    bootstrap: int = 1000
    cache_dir: str | None = None
    progress: bool = True
    text_flag: str = "--text"  # the option that named the text, as errors name it
    length_note: str | None = (
        None  # how the options chose this length (`--lengths N with --extend-positions M`)
    )


@dataclass
class _Group:
    """Models sharing one tokenizer: one set of blocks, masks and shuffles; paired comparisons."""

    models: list[EvalModel]
    fingerprint: str
    blocks: TextBlocks | None = None
    masker: Masker | None = None
    per_block: dict[str, np.ndarray] = field(default_factory=dict)


def _batches(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def _bar(total: int, desc: str, enabled: bool, unit: str = "block"):  # noqa: ANN202
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False, file=sys.stderr)


def _model_pass(
    m: EvalModel, g: _Group, settings: Settings, ppl_ks: np.ndarray, ppl_pos: np.ndarray
) -> dict[str, np.ndarray]:
    """Per-block sums of -log p over the masked targets (normal and word-shuffled input) and over the
    pseudo-perplexity sample, for one model."""
    blocks, masker = g.blocks, g.masker
    assert blocks is not None and masker is not None
    n = len(blocks)
    nll, shuffled = np.zeros(n), np.zeros(n)
    bs = max(1, int(settings.batch_size))
    with torch.inference_mode(), _bar(n, f"{Path(m.name).name}: loss", settings.progress) as bar:
        for ks in _batches(n, bs):
            rows, shuf, labs = [], [], []
            for k in ks:
                ids = blocks.ids(k)
                inputs, labels = masker.mask(ids, int(blocks.indices[k]))
                rows.append(inputs)
                labs.append(labels)
                shuf.append(masker.shuffle(ids, inputs, labels, int(blocks.indices[k])))
            labels_t = torch.from_numpy(np.stack(labs))
            # one forward for the normal and the shuffled copies
            both = torch.from_numpy(np.stack(rows + shuf))
            sums = m.target_nll(both, torch.cat([labels_t, labels_t])).numpy()
            nll[ks.start : ks.stop] = sums[: len(ks)]
            shuffled[ks.start : ks.stop] = sums[len(ks) :]
            bar.update(len(ks))
    pppl = np.zeros(n)
    order = np.arange(len(ppl_ks))
    with (
        torch.inference_mode(),
        _bar(len(order), f"{Path(m.name).name}: pppl", settings.progress, "token") as bar,
    ):
        for sel in _batches(len(order), bs):
            rows, labs = [], []
            for j in sel:
                ids = blocks.ids(int(ppl_ks[j]))
                inputs = ids.copy()
                inputs[ppl_pos[j]] = masker.mask_id
                labels = np.full_like(ids, -100)
                labels[ppl_pos[j]] = ids[ppl_pos[j]]
                rows.append(inputs)
                labs.append(labels)
            sums = m.target_nll(torch.from_numpy(np.stack(rows)), torch.from_numpy(np.stack(labs))).numpy()
            np.add.at(pppl, ppl_ks[sel.start : sel.stop], sums)
            bar.update(len(sel))
    return {"nll": nll, "shuffled_nll": shuffled, "pppl_nll": pppl}


def _group_models(models: Sequence[EvalModel]) -> list[_Group]:
    from tupe.data.tokenizer import tokenizer_fingerprint

    groups: dict[str, _Group] = {}
    for m in models:
        fp = (
            tokenizer_fingerprint(m.tokenizer)
            + f"/sep{m.tokenizer.sep_token_id}/cls{m.tokenizer.cls_token_id}"
        )
        groups.setdefault(fp, _Group([], fp)).models.append(m)
    return list(groups.values())


def _ci(d: dict[str, float | None], transform: Callable[[float], float] | None = None) -> dict[str, Any]:
    f = transform or (lambda x: x)
    return {k: (None if v is None else f(v)) for k, v in d.items()}


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else math.inf


def evaluate(
    models: Sequence[EvalModel],
    corpus: Any,
    settings: Settings | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Evaluate every model on the corpus; returns the JSON-ready results (see docs/evaluation.md)."""
    settings = settings or Settings()
    _check_settings(settings)
    t0 = time.perf_counter()
    source = corpus.describe()
    words = count_words(corpus)
    results_models: dict[str, dict[str, Any]] = {}
    results_groups = []
    for gi, g in enumerate(_group_models(models), start=1):
        group_models, group = _evaluate_group(f"tokenizer-{gi}", g, corpus, settings, source, words, log)
        results_models.update(group_models)
        results_groups.append(group)
    return {
        "text": {
            "description": source,
            "files": [str(p) for p in corpus.files],
            "bytes": corpus.total_bytes,
            "words": words,
        },
        "settings": _settings_record(settings),
        "tokenizer_groups": results_groups,
        "models": [results_models[m.name] | {"name": m.name} for m in models],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _check_settings(settings: Settings) -> None:
    """Bad settings refused before any work, each in one line naming the option."""
    if not 0.0 < settings.mlm_probability < 1.0:
        raise TupeError(f"--mlm-probability must be in (0, 1), got {settings.mlm_probability}")
    if settings.max_blocks is not None and settings.max_blocks <= 0:
        raise TupeError(f"--max-blocks must be positive, got {settings.max_blocks}")
    if settings.masked_tokens is not None:
        if settings.masked_tokens <= 0:
            raise TupeError(f"--masked-tokens must be positive, got {settings.masked_tokens}")
        if settings.max_blocks is not None:
            raise TupeError("--masked-tokens and --max-blocks exclude each other: give one budget")
    if settings.batch_size <= 0:
        raise TupeError(f"--batch-size must be positive, got {settings.batch_size}")
    if settings.pppl_tokens < 0 or settings.bootstrap < 0:
        raise TupeError("--pppl-tokens and --bootstrap must be 0 or more")


def _settings_record(settings: Settings) -> dict[str, Any]:
    """The results' `settings` section."""
    return {
        "seed": settings.seed,
        "mlm_probability": settings.mlm_probability,
        "mask_rule": "pre-training's: select each non-special token with p; 80% [MASK], 10% random, 10% kept",
        "max_blocks": settings.max_blocks,
        "masked_tokens": settings.masked_tokens,
        "max_length": settings.max_length,
        "batch_size": settings.batch_size,
        "pppl_tokens": settings.pppl_tokens,
        "bootstrap_resamples": settings.bootstrap,
        "ci_level": CI_LEVEL,
        "ci_method": "percentile bootstrap over blocks, one set of resamples shared by all statistics",
        "unigram": "token frequencies of the evaluated blocks themselves (optimistic: fitted on the test text)",
    }


def _group_length(g: _Group, settings: Settings) -> int:
    """The block length of a tokenizer group: the rows every model was trained on, or `--max-seq-len`."""
    limit = min(m.max_length for m in g.models)
    length = min(min(m.train_length or m.max_length, m.max_length) for m in g.models)  # trained rows only
    if settings.max_length is not None:
        if settings.max_length < 2 or settings.max_length > limit:
            raise TupeError(
                f"--max-seq-len {settings.max_length} must be between 2 and the models' max length {limit}"
            )
        length = settings.max_length
    return length


def _prepare_group(
    g: _Group, corpus: Any, length: int, settings: Settings, source: str, log: Callable[[str], None]
) -> None:
    """The group's blocks and masker; then, before any forward pass, a pass of this batch at this length beyond
    memory is one line naming them."""
    g.blocks = make_blocks(
        corpus,
        g.models[0].tokenizer,
        length,
        settings.max_blocks,
        settings.cache_dir,
        progress=settings.progress,
        log=log,
        source=f"{settings.text_flag} ({source}) under the tokenizer of {g.models[0].name}",
    )
    g.masker = Masker(g.models[0].tokenizer, settings.seed, settings.mlm_probability)
    if settings.masked_tokens is not None:
        g.blocks.indices = budget_blocks(g.blocks, g.masker, settings.masked_tokens)
    bs = min(max(1, int(settings.batch_size)), len(g.blocks))
    for m in g.models:
        where = settings.length_note or f"length {length}"
        what = (
            f"{where} and --batch-size {settings.batch_size}"
            if settings.length_note
            else (f"--batch-size {settings.batch_size} at {where}")
        )
        check_eval_memory(m, length, bs, what)


@dataclass
class _Targets:
    """A group's masked targets per block, the text's own unigram model over them, and the pseudo-perplexity
    positions."""

    masked: np.ndarray  # masked targets per block
    uni_nll: np.ndarray  # the unigram's -log p summed over each block's targets
    n_unigram: int  # tokens the unigram was counted on
    ppl_ks: np.ndarray  # block of each pseudo-perplexity position
    ppl_pos: np.ndarray  # and its position in the block
    ppl_count: np.ndarray  # pseudo-perplexity positions per block
    uni_ppl: np.ndarray  # the unigram's -log p summed over each block's pseudo-perplexity positions


def _targets(g: _Group, settings: Settings) -> _Targets:
    """The text's own unigram distribution (over the evaluated blocks' non-special tokens) and the targets."""
    blocks, masker, vocab = g.blocks, g.masker, len(g.models[0].tokenizer)
    n = len(blocks)
    counts = np.zeros(vocab, dtype=np.int64)
    masked = np.zeros(n)
    targets: list[np.ndarray] = []
    for k in range(n):
        ids = blocks.ids(k)
        counts += np.bincount(ids[~masker.is_special[ids]], minlength=vocab)
        _, labels = masker.mask(ids, int(blocks.indices[k]))
        targets.append(labels[labels != -100])
        masked[k] = len(targets[-1])
    if masked.sum() == 0:
        raise TupeError(
            f"no token of the {n} block(s) was selected for masking; give more text or a larger --mlm-probability"
        )
    n_unigram = int(counts.sum())
    neg_log_p = np.full(vocab, np.inf)
    neg_log_p[counts > 0] = -np.log(counts[counts > 0] / n_unigram)
    uni_nll = np.array([neg_log_p[t].sum() for t in targets])
    ppl_ks, ppl_pos = sample_pppl_positions(blocks, masker, settings.pppl_tokens, settings.seed)
    ppl_count = np.bincount(ppl_ks, minlength=n).astype(np.float64)
    uni_ppl = np.zeros(n)
    for k, pos in zip(ppl_ks, ppl_pos):
        uni_ppl[k] += neg_log_p[blocks.ids(int(k))[pos]]
    return _Targets(masked, uni_nll, n_unigram, ppl_ks, ppl_pos, ppl_count, uni_ppl)


def _evaluate_group(
    gid: str,
    g: _Group,
    corpus: Any,
    settings: Settings,
    source: str,
    words: int,
    log: Callable[[str], None],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """One tokenizer group: its blocks and targets, every model's pass, the intervals; returns the models' results
    and the group's."""
    length = _group_length(g, settings)
    _prepare_group(g, corpus, length, settings, source, log)
    t = _targets(g, settings)
    blocks = g.blocks
    log(
        f"text: {len(blocks):,} of {blocks.full_blocks:,} full blocks of {length} tokens, {int(t.masked.sum()):,} "
        f"masked targets, pseudo-perplexity on {len(t.ppl_ks):,} tokens; models: "
        f"{', '.join(m.name for m in g.models)}"
    )
    per_model = {}
    for m in g.models:
        log(f"evaluating {m.name} ({m.description})")
        if m.train_length and length > m.train_length:
            log(
                f"note: {m.name} was trained on blocks of {m.train_length}: positions {m.train_length}+ are new"
            )
        per_model[m.name] = _model_pass(m, g, settings, t.ppl_ks, t.ppl_pos)
    pairs = [(a, b) for i, a in enumerate(g.models) for b in g.models[i + 1 :]]
    ci = bootstrap(_statistics(g, per_model, t, pairs), len(blocks), settings.bootstrap, settings.seed)
    has_pppl = len(t.ppl_ks) > 0
    text_tokens = blocks.packed.num_tokens - int(blocks.packed.meta.get("num_documents") or 0)  # no [SEP]s
    tokens_per_word = text_tokens / words if words else None
    models = {
        m.name: _model_result(m, ci, per_model[m.name], gid, tokens_per_word, has_pppl) for m in g.models
    }
    group = _group_result(g, ci, t, pairs, gid, length, words, tokens_per_word)
    return models, group


def _statistics(
    g: _Group,
    per_model: dict[str, dict[str, np.ndarray]],
    t: _Targets,
    pairs: list[tuple[EvalModel, EvalModel]],
) -> dict[str, list[tuple[float, Ratio]]]:
    """Every statistic the bootstrap gives an interval: each a sum of weighted ratios over blocks."""
    masked, ppl_count = t.masked, t.ppl_count
    stats: dict[str, list[tuple[float, Ratio]]] = {
        "unigram/loss": [(1.0, Ratio(t.uni_nll, masked))],
        "unigram/pseudo_loss": [(1.0, Ratio(t.uni_ppl, ppl_count))],
    }
    for m in g.models:
        r = per_model[m.name]
        stats[f"{m.name}/loss"] = [(1.0, Ratio(r["nll"], masked))]
        stats[f"{m.name}/shuffled_loss"] = [(1.0, Ratio(r["shuffled_nll"], masked))]
        stats[f"{m.name}/word_order"] = [
            (1.0, Ratio(r["shuffled_nll"], masked)),
            (-1.0, Ratio(r["nll"], masked)),
        ]
        stats[f"{m.name}/pseudo_loss"] = [(1.0, Ratio(r["pppl_nll"], ppl_count))]
        stats[f"{m.name}/minus_unigram"] = [
            (1.0, Ratio(r["nll"], masked)),
            (-1.0, Ratio(t.uni_nll, masked)),
        ]
    for a, b in pairs:
        ra, rb = per_model[a.name], per_model[b.name]
        stats[f"{a.name}/minus/{b.name}/loss"] = [
            (1.0, Ratio(ra["nll"], masked)),
            (-1.0, Ratio(rb["nll"], masked)),
        ]
        stats[f"{a.name}/minus/{b.name}/pseudo_loss"] = [
            (1.0, Ratio(ra["pppl_nll"], ppl_count)),
            (-1.0, Ratio(rb["pppl_nll"], ppl_count)),
        ]
    return stats


def _model_result(
    m: EvalModel,
    ci: dict[str, Any],
    r: dict[str, np.ndarray],
    gid: str,
    tokens_per_word: float | None,
    has_pppl: bool,
) -> dict[str, Any]:
    """One model's entry of the results (`r`: its per-block sums)."""
    return {
        "path": str(m.path),
        "kind": m.kind,
        "description": m.description,
        "num_parameters": m.num_parameters,
        "max_length": m.max_length,
        "train_length": m.train_length,
        "tokenizer_group": gid,
        "tokens_per_word": tokens_per_word,
        "loss": _ci(ci[f"{m.name}/loss"]),
        "perplexity": _ci(ci[f"{m.name}/loss"], _exp),
        "pseudo_loss": _ci(ci[f"{m.name}/pseudo_loss"]) if has_pppl else None,
        "pseudo_perplexity": _ci(ci[f"{m.name}/pseudo_loss"], _exp) if has_pppl else None,
        "shuffled_loss": _ci(ci[f"{m.name}/shuffled_loss"]),
        "word_order_delta": _ci(ci[f"{m.name}/word_order"]),
        "minus_unigram": _ci(ci[f"{m.name}/minus_unigram"]),
        # sums over each evaluated block (in `per_block.index` order) of -log p of its masked targets:
        # loss = sum(nll) / sum(masked_tokens); with the same blocks and masks, pairs across calls
        "per_block": {
            "nll": r["nll"].tolist(),
            "shuffled_nll": r["shuffled_nll"].tolist(),
            "pppl_nll": r["pppl_nll"].tolist() if has_pppl else None,
        },
    }


def _group_result(
    g: _Group,
    ci: dict[str, Any],
    t: _Targets,
    pairs: list[tuple[EvalModel, EvalModel]],
    gid: str,
    length: int,
    words: int,
    tokens_per_word: float | None,
) -> dict[str, Any]:
    """One tokenizer group's entry of the results: its text, blocks, unigram and paired differences."""
    blocks, n, has_pppl = g.blocks, len(g.blocks), len(t.ppl_ks) > 0
    return {
        "id": gid,
        "models": [m.name for m in g.models],
        "tokenizer_vocab": len(g.models[0].tokenizer),
        "block_length": length,
        "tokens": blocks.packed.num_tokens,
        "documents": blocks.packed.meta.get("num_documents"),
        "words": words,
        "tokens_per_word": tokens_per_word,
        "full_blocks": blocks.full_blocks,
        "blocks": n,
        "tokens_in_blocks": n * length,
        "tokens_after_last_full_block": blocks.packed.num_tokens - blocks.full_blocks * (length - 1),
        "masked_tokens": int(t.masked.sum()),
        "per_block": {  # the evaluated blocks, in the order of every per_block list of this group
            "index": blocks.indices.tolist(),  # among the text's full blocks of this length
            "masked_tokens": t.masked.astype(np.int64).tolist(),
            "pppl_tokens": t.ppl_count.astype(np.int64).tolist() if has_pppl else None,
            "unigram_nll": t.uni_nll.tolist(),
        },
        "pppl_tokens": len(t.ppl_ks),
        "unigram_tokens": t.n_unigram,
        "unigram": {
            "loss": _ci(ci["unigram/loss"]),
            "perplexity": _ci(ci["unigram/loss"], _exp),
            "pseudo_loss": _ci(ci["unigram/pseudo_loss"]) if has_pppl else None,
            "pseudo_perplexity": _ci(ci["unigram/pseudo_loss"], _exp) if has_pppl else None,
        },
        "differences": [
            {
                "a": a.name,
                "b": b.name,
                "loss": _ci(ci[f"{a.name}/minus/{b.name}/loss"]),
                "pseudo_loss": _ci(ci[f"{a.name}/minus/{b.name}/pseudo_loss"]) if has_pppl else None,
            }
            for a, b in pairs
        ],
        "data_cache": str(blocks.packed.path),
    }
