"""`tupe pretrain --init-from PATH`: continued pre-training from existing weights, for the same scheme or another.

Why: the cheapest comparison of positional encodings keeps a trained model's content weights (word embeddings,
attention, FFN, LM head), changes only how positions enter, and continues training. The source is a tupe run
folder (its final model) or model folder, a `transformers` BERT folder or a DeBERTa-v2 folder; BERT and DeBERTa
weights go through the exact conversions `TupeForMaskedLM.from_bert` / `from_deberta`, so the copy below is one
rule for every source: a tensor of the new model whose name and shape the (converted) source has is copied;
the rest, the positional parts the new scheme adds, keep the fresh initialisation a new model of that scheme
gets. The source's tokenizer and shape are the run's: a conflicting shape flag is refused in one line.

`pretrain.py` calls `with_source` (settings, before anything is built), `load_source` (the converted weights and
the config values that come with them) and `Source.copy_into` (after the model is built); the report says what
was kept and what is new, in one printed line, the summary and the model card.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tupe.errors import TupeError

KINDS = {"tupe": "tupe model", "bert": "transformers BERT", "deberta-v2": "transformers DeBERTa-v2"}
# PretrainConfig field -> (the flag that sets it, the source config.json key)
SHAPE_FLAGS = {
    "vocab_size": ("--vocab-size", "vocab_size"),
    "hidden_size": ("--hidden-size", "hidden_size"),
    "num_hidden_layers": ("--num-layers", "num_hidden_layers"),
    "num_attention_heads": ("--num-heads", "num_attention_heads"),
    "intermediate_size": ("--intermediate-size", "intermediate_size"),
    "max_position_embeddings": ("--max-position-embeddings", "max_position_embeddings"),
}
# config values that come with the weights (the new model must compute what the source computed), besides the
# positional schemes' own fields declared `with_weights` (`source_fields`)
_SOURCE_FIELDS = (
    "vocab_size",
    "hidden_act",
    "layer_norm_eps",
    "embedding_layer_norm",
    "initializer_range",
    "tie_word_embeddings",
)
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spm.model", "vocab.json")  # vocab.json: with merges.txt
_WHAT = "--init-from takes a tupe run or model folder, a transformers BERT folder or a DeBERTa-v2 folder"


def model_folder(path: str) -> tuple[Path, str]:
    """The model folder `--init-from PATH` names and how it was picked: PATH itself, or a run folder's final model
    (the model `tupe pretrain` saves at the top of its --out, not one of its checkpoints)."""
    from tupe.io.checkpoints import list_checkpoints

    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        parent = folder.parent
        hint = (
            f"give the folder that holds it: --init-from {parent}"
            if (parent / "config.json").is_file()
            else _WHAT
        )
        raise TupeError(f"--init-from {path}: a file, not a folder; {hint}")
    if not folder.is_dir():
        raise TupeError(f"--init-from {path}: no such folder; {_WHAT}")
    is_run = (folder / "tupe_run.json").is_file()
    if not (folder / "config.json").is_file():
        ckpts = list_checkpoints(folder)
        if is_run and ckpts:
            raise TupeError(
                f"--init-from {path}: a tupe run without a final model (unfinished?); give one of its "
                f"checkpoints, e.g. --init-from {ckpts[0]}, or finish it with --resume"
            )
        raise TupeError(f"--init-from {path}: no config.json, so not a model folder; {_WHAT}")
    picked = f"the final model of the tupe run {folder}" if is_run else str(folder)
    return folder.resolve(), picked


def read_source(path: str) -> tuple[Path, str, dict]:
    """(model folder, how it was picked, its checked config.json): files regular, no custom code, fields typed,
    weights in safetensors, a tokenizer present; an unknown kind refused in one line."""
    from tupe.io.checkpoints import check_model_weights
    from tupe.io.model_folder import check_model_folder

    folder, picked = model_folder(path)
    try:
        config = check_model_folder(folder, "--init-from folder", tuple(KINDS))
    except TupeError as err:
        if "model_type" in str(err):
            raise TupeError(f"{err}; {_WHAT}") from None
        raise
    check_model_weights(folder)
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise TupeError(
            f"--init-from {path}: no tokenizer in {folder} (no {' / '.join(_TOKENIZER_FILES)}); continued "
            "pre-training uses the source's tokenizer: save it there (tokenizer.save_pretrained)"
        )
    return folder, picked, config


def with_source(config: Any) -> Any:
    """`config` (a `PretrainConfig`) with the source's tokenizer and shape; unchanged without --init-from.

    A shape flag given explicitly with another value than the source's is refused, naming the flag and both
    values (the preset's values are not "given": they yield to the source's)."""
    if config.init_from is None:
        return config
    from tupe.training.model import HF_BERT
    from tupe.training.presets import get_preset

    if config.scheme == HF_BERT:
        raise TupeError(
            f"--init-from builds a tupe model; --scheme {HF_BERT} (transformers' BERT) cannot take it"
        )
    folder, _, source = read_source(config.init_from)
    if config.tokenizer is not None:
        raise TupeError(
            f"--tokenizer {config.tokenizer} and --init-from {config.init_from}: continued pre-training uses the "
            "source's tokenizer; drop --tokenizer"
        )
    changes: dict[str, Any] = {"tokenizer": _check_tokenizer(folder, config.init_from, config.cache_dir)}
    for name, (flag, key) in SHAPE_FLAGS.items():
        value = source.get(key)
        if value is None:
            continue
        given = getattr(config, name)
        if given is not None and int(given) != int(value):
            raise TupeError(
                f"{flag} {given} conflicts with --init-from {config.init_from}: its {key} is {value}; drop {flag}"
            )
        changes[name] = int(value)
    length = config.max_length or get_preset(config.preset)["max_length"]
    if length > changes["max_position_embeddings"]:
        raise TupeError(
            f"--max-seq-len {length} is longer than --init-from {config.init_from}'s max_position_embeddings "
            f"{changes['max_position_embeddings']}; give --max-seq-len {changes['max_position_embeddings']} or less"
        )
    return dataclasses.replace(config, **changes)


def _check_tokenizer(folder: Path, given: str, cache_dir: str | None) -> str:
    """The tokenizer the run uses: the source's own when it has the special-token ids tupe's data pipeline writes
    (packing, masking: a tokenizer trained by tupe does), else the source's tokenizer with its five special
    tokens moved to those ids (`contract_order`; a stock BERT WordPiece vocabulary has [CLS] at 101), saved under
    the cache folder: the same tokens and segmentation, and the model's rows are moved alike, so the model
    computes the same function. A tokenizer without the five special tokens is refused in one line."""
    from tupe.data.tokenizer import SPECIAL_TOKENS, load_tokenizer

    try:
        load_tokenizer(folder)
        return str(folder)
    except TupeError as err:
        problem = str(err).split(": ", 1)[-1].split(";")[0]
    from tupe.io.checkpoints import load_tokenizer as load_saved_tokenizer

    tok = load_saved_tokenizer(folder)
    if not getattr(tok, "is_fast", False):
        files = " + ".join(
            n for n in ("vocab.json", "merges.txt", "vocab.txt", "spm.model") if (folder / n).is_file()
        )
        raise TupeError(
            f"--init-from {given}: its tokenizer ({type(tok).__name__}{', ' + files if files else ''}) is a Python "
            "tokenizer without a tokenizer.json; tupe pretrain's data pipeline needs a fast tokenizer "
            "(tokenizer.json) with the special tokens at tupe's ids, so this folder cannot be pre-trained further"
        )
    order = contract_order(tok)
    if order is not None:
        reordered = _reordered_tokenizer(tok, order, cache_dir)
        try:
            load_tokenizer(reordered)
            return str(reordered)
        except TupeError:
            pass
    ids = ", ".join(f"{t}={i}" for i, t in enumerate(SPECIAL_TOKENS))
    raise TupeError(
        f"--init-from {given}: its tokenizer cannot feed tupe pretrain's data pipeline, which needs the special "
        f"tokens {ids} ({problem}), and moving them there failed; a tokenizer trained by tupe has them"
    )


def contract_order(tok: Any) -> list[int] | None:  # noqa: ANN401
    """`order[new_id] = old_id`: the swaps that put [PAD], [CLS], [SEP], [MASK], [UNK] at ids 0-4, or None if
    the (fast) tokenizer lacks one of them."""
    from tupe.data.tokenizer import SPECIAL_TOKENS

    vocab = tok.get_vocab()
    if not getattr(tok, "is_fast", False) or any(t not in vocab for t in SPECIAL_TOKENS):
        return None
    order = list(range(max(len(tok), max(vocab.values()) + 1)))
    for new, token in enumerate(SPECIAL_TOKENS):
        old = order.index(vocab[token])
        order[new], order[old] = order[old], order[new]
    return order


def _reordered_tokenizer(tok: Any, order: list[int], cache_dir: str | None) -> Path:  # noqa: ANN401
    """`tok` with token `order[i]` at id i, saved once in `CACHE/init-from-tokenizers/HASH/`."""
    import json

    from tokenizers import Tokenizer

    from tupe.data.packing import default_cache_dir
    from tupe.data.tokenizer import wrap_backend

    new_of = {old: new for new, old in enumerate(order)}
    spec = json.loads(tok.backend_tokenizer.to_str())
    model = spec["model"]
    if isinstance(model.get("vocab"), dict):
        model["vocab"] = {t: new_of[i] for t, i in model["vocab"].items()}
    elif isinstance(model.get("vocab"), list):  # Unigram: the list order is the id
        model["vocab"] = [model["vocab"][old] for old in order]
    else:
        raise TupeError(f"{tok.name_or_path}: a {model.get('type')} tokenizer's ids cannot be reordered")
    for added in spec.get("added_tokens") or []:
        added["id"] = new_of[added["id"]]

    def remap(node: Any) -> None:  # noqa: ANN401 - post-processor JSON: TemplateProcessing, BertProcessing, ...
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "ids" and isinstance(value, list):
                    node[key] = [new_of[i] for i in value]
                elif key in ("cls", "sep") and isinstance(value, list) and len(value) == 2:
                    node[key] = [value[0], new_of[value[1]]]
                else:
                    remap(value)
        elif isinstance(node, list):
            for item in node:
                remap(item)

    remap(spec.get("post_processor"))
    text = json.dumps(spec, ensure_ascii=False)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    out = root / "init-from-tokenizers" / hashlib.sha256(text.encode()).hexdigest()[:20]
    if not (out / "tokenizer.json").is_file():
        wrap_backend(Tokenizer.from_str(text)).save_pretrained(out)
    return out


@dataclass
class Source:
    """The source's weights as a tupe `TupeForMaskedLM` state dict (BERT and DeBERTa converted exactly), the
    config values that come with them, and what identifies it in `tupe_run.json`."""

    folder: Path
    picked: str
    kind: str
    scheme: str
    state: dict[str, Any]
    config: dict[str, Any]
    identity: dict[str, Any]

    def model_kwargs(self, model_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The run's model config values with those of the source that its weights need (norm epsilon,
        activation, vocabulary size, ...)."""
        fields = source_fields()
        return {**model_kwargs, **{k: v for k, v in self.config.items() if k in fields}}

    def copy_into(self, model: Any) -> InitReport:
        """Copy every tensor of `model` (a freshly initialised `TupeForMaskedLM`) that the source has under the
        same name and shape; the others keep their fresh initialisation."""
        import torch

        target = model.state_dict()
        tied = _tied_names(model)
        kept = [k for k, v in target.items() if k in self.state and self.state[k].shape == v.shape]
        copied = set(kept)
        with torch.no_grad():
            model.load_state_dict({k: self.state[k] for k in kept}, strict=False)
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
        return InitReport(
            source=self.picked,
            kind=KINDS[self.kind],
            source_scheme=self.scheme,
            scheme=model.config.position_scheme,
            kept=[k for k in kept if k not in tied],
            new=[k for k in target if k not in copied and k not in tied],
            dropped=[k for k in self.state if k not in copied],
        )


def source_fields() -> tuple[str, ...]:
    """The config values a source's weights bring: `_SOURCE_FIELDS` and every registered scheme's fields that
    come with its weights (`SchemeField.with_weights`)."""
    from tupe.modeling.positional import scheme_fields

    return (*_SOURCE_FIELDS, *(f.name for f in scheme_fields().values() if f.with_weights))


def load_source(run: Any, tokenizer: Any) -> Source:
    """The source of `run.model.init_from` (`run`: the `ResolvedConfig`), converted to a tupe masked LM; a
    tokenizer longer than its vocabulary is refused (the source's own tokenizer never is)."""
    from transformers.utils import logging as hf_logging

    from tupe.io.checkpoints import check_weights_match_config
    from tupe.modeling import TupeForMaskedLM, TupeModel

    folder, picked, raw = read_source(run.model.init_from)
    kind = raw["model_type"]
    masked_lm = any("MaskedLM" in a or "PreTraining" in a for a in raw.get("architectures") or [])
    model_class = TupeForMaskedLM if masked_lm else TupeModel
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a head-less source reports its missing head; the report says it
    try:
        if kind == "tupe":
            check_weights_match_config(folder)  # weights of another shape: one line, not a RuntimeError
            model = model_class.from_pretrained(str(folder))
        elif kind == "bert":
            model = model_class.from_bert(str(folder))
        else:
            model = model_class.from_deberta(str(folder))
    except (ValueError, OSError, RuntimeError) as err:
        raise TupeError(f"--init-from {run.model.init_from}: cannot load its weights ({err})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model_class is TupeModel:
        state = {f"{TupeForMaskedLM.base_model_prefix}.{k}": v for k, v in state.items()}
    vocab = int(model.config.vocab_size)
    if str(run.data.tokenizer) != str(
        folder
    ):  # the source's tokenizer with its special tokens moved: rows alike
        from tupe.io.checkpoints import load_tokenizer as load_saved_tokenizer

        order = contract_order(load_saved_tokenizer(folder))
        state = _reorder_rows(state, order + list(range(len(order), vocab)), vocab)
    if len(tokenizer) > vocab:
        raise TupeError(
            f"--init-from {run.model.init_from}: its tokenizer has {len(tokenizer)} tokens, its model {vocab}"
        )
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    for path in sorted(folder.glob("*.safetensors")):
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    identity = {"path": str(folder), "kind": kind, "config_and_weights": digest.hexdigest()[:20]}
    return Source(
        folder=folder,
        picked=picked,
        kind=kind,
        scheme=str(model.config.position_scheme),
        state=state,
        config=model.config.to_dict(),
        identity=identity,
    )


def _reorder_rows(state: dict[str, Any], order: list[int], vocab: int) -> dict[str, Any]:
    """The vocabulary-indexed tensors (word embeddings, LM bias and decoder) with row `order[i]` at row i."""
    import torch

    index = torch.tensor(order[:vocab])
    return {
        k: v.index_select(0, index) if v.ndim and v.shape[0] == vocab and _by_token(k) else v
        for k, v in state.items()
    }


def _by_token(name: str) -> bool:
    return name.endswith(
        ("word_embeddings.weight", "lm_head.bias", "lm_head.decoder.weight", "lm_head.decoder.bias")
    )


def _tied_names(model: Any) -> set[str]:
    """State-dict names that share storage with an earlier name (the LM decoder tied to the word embeddings)."""
    seen: set[int] = set()
    tied = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        ptr = tensor.data_ptr()
        if ptr in seen:
            tied.add(name)
        seen.add(ptr)
    return tied


_GROUPS = (  # (substring of a state-dict name, group name), first match wins; positional parameters by scheme
    ("embeddings.word_embeddings", "word embeddings"),
    ("embeddings.LayerNorm", "embedding LayerNorm"),
    (".attention", "attention"),
    (".intermediate", "FFN"),
    (".output", "FFN"),
    ("lm_head", "LM head"),
)


def group_of(name: str) -> str:
    """The part of the model a state-dict name belongs to, as the report names it: the positional parameters as
    their scheme names them (`PositionalScheme.parameter_groups`), the rest by `_GROUPS`."""
    from tupe.modeling.positional import parameter_group

    if not any(key in name for key, _ in _GROUPS[:2]):
        group = parameter_group(name)
        if group is not None:
            return group
    return next((group for key, group in _GROUPS if key in name), name.rsplit(".", 1)[0])


def _groups(names: list[str]) -> str:
    counts = Counter(group_of(n) for n in names)
    return ", ".join(counts) if counts else "none"


@dataclass
class InitReport:
    """What `--init-from` kept and what is new (state-dict names, tied copies counted once)."""

    source: str
    kind: str
    source_scheme: str
    scheme: str
    kept: list[str]
    new: list[str]
    dropped: list[str]

    def line(self) -> str:
        """The one line `tupe pretrain` prints."""
        text = (
            f"init from {self.source} ({self.kind}, {self.source_scheme} -> {self.scheme}): kept "
            f"{len(self.kept)} tensors ({_groups(self.kept)}); new: {len(self.new)} ({_groups(self.new)})"
        )
        if self.dropped:
            text += f"; not used: {len(self.dropped)} ({_groups(self.dropped)})"
        return text

    def summary(self) -> dict[str, Any]:
        """The record in `pretrain_summary.json`."""
        return {
            "source": self.source,
            "kind": self.kind,
            "source_scheme": self.source_scheme,
            "kept": len(self.kept),
            "kept_groups": sorted(set(map(group_of, self.kept))),
            "new": self.new,
            "not_used": self.dropped,
        }

    def card(self) -> str:
        """The model card's paragraph."""
        new = ", ".join(f"`{n}`" for n in self.new) or "none"
        text = (
            f"**Continued pre-training** (`--init-from`): initialised from {self.source} ({self.kind}, scheme "
            f"{self.source_scheme}). Kept {len(self.kept)} tensors ({_groups(self.kept)}). New, freshly "
            f"initialised as a new {self.scheme} model: {len(self.new)} ({_groups(self.new)}): {new}."
        )
        if self.dropped:
            text += f" Not used: {len(self.dropped)} ({_groups(self.dropped)})."
        return text
