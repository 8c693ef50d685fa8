"""Checkpoints on disk: check a `save_pretrained` folder before loading it, say what it is, load it.

Why checks first: `from_pretrained` re-initialises missing or mis-shaped tensors with only a log warning, and a
truncated weights file gives a deserialisation traceback; every command wants one clear line instead. Weights are
loaded from safetensors only (unpickling can run code).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tupe.errors import TupeError, one_line
from tupe.io.files import sha256_files
from tupe.io.model_folder import check_model_folder, check_tokenizer_folder
from tupe.io.reading import RECORD_LIMIT, read_json

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


# What makes two checkpoints the same model: its scheme and shape (a resumed run's checkpoint must match them)
MODEL_SHAPE_KEYS = (
    "position_scheme",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


def check_safetensors(path: str | os.PathLike) -> None:
    """Raise a one-line `TupeError` if `path` is not a complete safetensors file (truncated, corrupt, empty).

    Reads the header only: safetensors checks that the tensors it declares exactly cover the file, which catches
    truncation and most corruption of the header. Flipped bytes inside tensor data are only caught by a manifest.
    """
    from safetensors import safe_open

    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise TupeError(f"{path}: cannot read the weights file ({err.strerror or err})") from None
    if size < 8:
        raise TupeError(f"{path}: corrupt or truncated safetensors file ({size} bytes)")
    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except Exception as err:  # noqa: BLE001 - SafetensorError and OSError: the reason is what the user needs
        reason = " ".join(str(err).split())
        raise TupeError(f"{path}: corrupt or truncated safetensors file ({reason})") from None


def check_model_weights(model_dir: str | os.PathLike) -> list[Path]:
    """The safetensors weight files of a `save_pretrained` folder, each checked; a `TupeError` if none or broken.

    Pickle weights (`pytorch_model.bin`) are refused: unpickling can run code, and `tupe` always writes safetensors.
    """
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(read_json(index, "safetensors index", RECORD_LIMIT)["weight_map"].values()))
        except (TupeError, KeyError, TypeError, AttributeError) as err:
            raise TupeError(f"{index}: unreadable safetensors index ({err})") from None
        files = [model_dir / s for s in shards]
        for f in files:
            if not f.is_file():
                raise TupeError(f"{f}: missing weights shard listed in {index.name}")
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        if any(model_dir.glob("pytorch_model*.bin")) or any(model_dir.glob("*.pt")):
            raise TupeError(
                f"{model_dir}: only pickle weights (pytorch_model.bin), which tupe does not load because unpickling "
                "can run code; re-save the model with save_pretrained(DIR) (safetensors)"
            )
        ckpts = list_checkpoints(model_dir)
        hint = f"; a pre-training run not finished yet? use --model {ckpts[0]}" if ckpts else ""
        raise TupeError(f"{model_dir}: no model weights (model.safetensors){hint}")
    for f in files:
        check_safetensors(f)
    return files


def checkpoint_step(path: str | os.PathLike) -> int | None:
    m = _CHECKPOINT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` folders of `run_dir`, newest (highest N) first; staging/trash folders are never listed."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0, reverse=True)


def check_weights_match_config(model_dir: str | os.PathLike) -> None:
    """Raise a one-line `TupeError` if a tupe folder's weights do not fit its config.json (shape or missing tensor).

    Why: `from_pretrained` re-initialises mismatched or missing tensors with only a log warning (GLUE loads with
    `ignore_mismatched_sizes=True` for the new head), so an edited config or weights copied from another model
    would train from random encoder weights without any error. Only the encoder (`tupe.*`) is compared: heads
    differ legitimately between masked-LM and classification checkpoints. Reads shapes from the safetensors
    headers and builds the model on the meta device: no weights are loaded.
    """
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig

    from tupe.modeling import TupeForMaskedLM
    from tupe.modeling.modeling_tupe import upgrade_legacy_key

    model_dir = Path(model_dir)
    files = check_model_weights(model_dir)
    check_model_folder(model_dir)
    config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False)
    with torch.device("meta"):
        expected = {
            k: tuple(v.shape)
            for k, v in TupeForMaskedLM(config).state_dict().items()
            if k.startswith("tupe.")
        }
    found: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for stored in fh.keys():
                name = upgrade_legacy_key(stored)  # checkpoints of an earlier layout load too
                if name not in expected:
                    continue
                found.add(name)
                got = tuple(fh.get_slice(stored).get_shape())
                if got != expected[name]:
                    raise TupeError(
                        f"{f}: tensor {name} has shape {list(got)} but {model_dir / 'config.json'} implies "
                        f"{list(expected[name])}: the weights and the config belong to different models"
                    )
    missing = sorted(set(expected) - found)
    if missing:
        raise TupeError(
            f"{model_dir}: {len(missing)} encoder tensor(s) that config.json implies are not in the weights "
            f"(first: {missing[0]}): the weights and the config belong to different models"
        )


@dataclass
class ModelInfo:
    """What a fine-tuning result records about the checkpoint it started from."""

    path: str
    scheme: str
    pretrain_steps: int | None
    config: dict[str, Any]
    weights_sha256: str


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
                step = read_json(state, fname, RECORD_LIMIT).get(key)
            except TupeError:
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

    from tupe.modeling import TupeConfig  # importing the package registers the Auto classes

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
    check_model_folder(model_dir)  # regular files, no custom code, every config field typed and in range
    try:
        config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False)
    except (ValueError, OSError, KeyError, TypeError) as err:
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
    # safetensors only (pickle weights can run code), each file checked: truncation is one clear error, here
    files = check_model_weights(model_dir)
    # from_pretrained(ignore_mismatched_sizes=True) would silently re-initialise an encoder that does not fit
    check_weights_match_config(model_dir)
    keep = (*MODEL_SHAPE_KEYS, "hidden_dropout_prob", "attention_probs_dropout_prob")
    info = ModelInfo(
        path=str(model_dir.resolve()),
        scheme=config.position_scheme,
        pretrain_steps=pretrain_steps_of(model_dir, config),
        config={k: getattr(config, k, None) for k in keep},
        weights_sha256=sha256_files(files),
    )
    return info, config


def read_config(model_dir: str | os.PathLike) -> dict:
    """`config.json` of a model folder as a dict, with one-line errors."""
    path = Path(model_dir)
    if not path.is_dir():
        raise TupeError(f"model directory {str(path)!r} does not exist")
    cfg = path / "config.json"
    if not os.path.lexists(cfg):
        raise TupeError(f"{cfg}: no config.json; --model must be a directory written by save_pretrained")
    return check_model_folder(path)  # regular files, no custom code, every config field typed and in range


def has_tokenizer_files(folder: str | os.PathLike) -> bool:
    """Whether a folder holds a saved tokenizer (`tokenizer.json`, `tokenizer_config.json` or `vocab.txt`)."""
    return any((Path(folder) / f).is_file() for f in _TOKENIZER_FILES)


def load_tokenizer(source: str | os.PathLike, config: Any = None, explicit: bool = True) -> Any:
    """The tokenizer saved in a folder (a model's, or one given with --tokenizer), with one-line errors.

    With the model's `config`, also checks what the model's heads rely on: a padding token, [CLS] first (the
    sentence head reads token 0), and no id beyond the model's vocabulary. `explicit=False` (the model's own
    folder) adds the hint to pass --tokenizer.
    """
    from transformers import AutoTokenizer

    path = Path(source)
    if not path.is_dir():
        raise TupeError(f"tokenizer directory {str(path)!r} does not exist")
    if not has_tokenizer_files(path):
        hint = "" if explicit else "; save the tokenizer with the model or pass --tokenizer DIR"
        raise TupeError(f"{path}: no tokenizer files ({' / '.join(_TOKENIZER_FILES)}){hint}")
    check_tokenizer_folder(path)  # regular files only, and no code of its own (auto_map): never a prompt
    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - unreadable tokenizer files: the first line of the reason is enough
        raise TupeError(f"{path}: cannot load a tokenizer ({type(err).__name__}: {one_line(err)})") from None
    from tupe.modeling.word_spans import exact_word_spans

    exact_word_spans(tok)  # a tupe tokenizer saved before its spans were exact: the same ids
    if config is None:
        return tok
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
    limit = getattr(config, "max_position_embeddings", None)
    if limit and (tok.model_max_length is None or tok.model_max_length > limit):
        tok.model_max_length = int(limit)  # older tupe tokenizers say 1e30: truncation=True must cut here
    if len(tok) > config.vocab_size:
        raise TupeError(
            f"{path}: tokenizer has {len(tok)} tokens but the model's vocab_size is {config.vocab_size}"
        )
    return tok


def load_model(model_dir: str | os.PathLike, model_class: Any = None, **kwargs: Any) -> tuple[Any, str]:
    """A checked model in eval mode and a one-line description: tupe checkpoints as saved, `transformers` BERT
    folders (model_type "bert") converted exactly to `bert-a` by `TupeForMaskedLM.from_bert`.

    `model_class`: `TupeForMaskedLM` (default), `TupeModel` or `TupeForSequenceClassification`; `kwargs` go to
    `from_pretrained` (e.g. `attn_implementation="eager"`), or for a BERT folder to `from_bert` (e.g. `tokenizer`,
    whose special-token ids the converted config takes; by default the folder's own tokenizer's).
    """
    from transformers.utils import logging as hf_logging

    from tupe.modeling import TupeForMaskedLM, TupeModel

    model_class = model_class or TupeForMaskedLM
    model_type = read_config(model_dir).get("model_type")
    if model_type not in ("tupe", "bert"):
        raise TupeError(
            f"{Path(model_dir) / 'config.json'}: model_type {model_type!r} is not supported "
            "(expected 'tupe' or 'bert')"
        )
    check_model_weights(model_dir)  # safetensors only; truncation is one clear error, not a traceback
    # loading an encoder from a task checkpoint (MLM, classification) reports the head weights as unused
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if model_type == "tupe":
            check_weights_match_config(model_dir)  # weights of another shape: one line, not a RuntimeError
            model = model_class.from_pretrained(str(model_dir), **kwargs)
            description = f"TUPE checkpoint, position_scheme {model.config.position_scheme}"
        else:
            if model_class not in (TupeForMaskedLM, TupeModel):
                raise TupeError(
                    f"{model_dir}: a BERT checkpoint converts to TupeForMaskedLM or TupeModel only"
                )
            model = TupeForMaskedLM.from_bert(str(model_dir), **kwargs)
            model = model.tupe if model_class is TupeModel else model
            description = (
                "transformers BERT checkpoint, converted to bert-a (token-type 0 folded into positions)"
            )
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.eval(), description


def load_model_and_tokenizer(
    model_dir: str | os.PathLike,
    model_class: Any = None,
    tokenizer_dir: str | os.PathLike | None = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """`(model, tokenizer)` of a checkpoint folder (see `load_model`): the tokenizer from `tokenizer_dir` if
    given, else from the model's folder, checked against the model's config."""
    model, _ = load_model(model_dir, model_class, **kwargs)
    explicit = tokenizer_dir is not None
    tokenizer = load_tokenizer(tokenizer_dir if explicit else model_dir, model.config, explicit=explicit)
    return model, tokenizer
