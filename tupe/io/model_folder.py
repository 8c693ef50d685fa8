"""A model or tokenizer folder checked before any library reads it: regular files only, no custom code, and a
`config.json` whose every field has the type and range the model needs.

Why: `transformers` would block on a FIFO, offer to run a `.py` that `auto_map` names (a terminal prompt that
blocks when nobody answers), and turn a wrong-typed field (`num_attention_heads: 0`, `hidden_size: "32"`,
`hidden_act: "bogus"`) into a ZeroDivisionError, TypeError or KeyError deep inside model construction. Each
check here is one line naming the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.io.reading import (
    CONFIG_LIMIT,
    TOKENIZER_LIMIT,
    check_folder_files,
    check_regular,
    json_type_name,
    read_json,
)

# files a library may open in a model/tokenizer folder
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
# the code a tupe checkpoint carries for users without tupe (auto_map); tupe itself never runs it
_TUPE_CODE = ("configuration_tupe.", "modeling_tupe.")
# ... and a folder of `tupe convert fairseq`, for its tokenizer (tupe loads its installed class of that name)
_TUPE_TOKENIZER = "FairseqMosesBPETokenizer"
_TUPE_TOKENIZER_CODE = (f"tokenization_fairseq.{_TUPE_TOKENIZER}", f"fairseq_tokenizer.{_TUPE_TOKENIZER}")

DTYPES = ("float32", "float16", "bfloat16", "float64", "auto", "fp32", "fp16", "bf16")


def nested_repetition(pattern: str) -> bool:
    """Whether a regular expression repeats a group that itself holds an unbounded repetition (`(a+)+`, `(\\w*)*`,
    `(x+y)+`): the shape whose backtracking is exponential on a long non-matching run, which the tokenizers
    library's regex engine (Oniguruma) answers with a Rust panic. The pre-tokenizer patterns of GPT-2, RoBERTa,
    BERT and Llama have no such group."""
    stack: list[bool] = []  # per open group: whether its body repeats without bound
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 2 if pattern[i + 1 : i + 2] == "]" else 1  # "[]...]": a literal "]" first
            continue
        elif c == "(":
            stack.append(False)
        elif c in "+*" or (c == "{" and re.match(r"\{\d*,\}", pattern[i:])):
            if stack:
                stack[-1] = True
        elif c == ")" and stack:
            inner = stack.pop()
            after = pattern[i + 1 : i + 2]
            repeated = after in ("+", "*") or (after == "{" and re.match(r"\{\d*,\d*\}", pattern[i + 1 :]))
            if inner and repeated:
                return True
            if inner and stack:
                stack[-1] = True
        i += 1
    return False


def check_tokenizer_patterns(path: Path) -> None:
    """Refuse a tokenizer.json whose normalizer or pre-tokenizer regex repeats a repetition (`nested_repetition`):
    on a long input the tokenizers library would panic in Rust (a 14 KB stack dump) instead of tokenizing."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read(TOKENIZER_LIMIT)
    for match in re.finditer(r'"Regex"\s*:\s*("(?:[^"\\]|\\.)*")', text):
        try:
            pattern = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(pattern, str) and nested_repetition(pattern):
            raise TupeError(
                f"{path}: regex {pattern[:80]!r} repeats a group that repeats (catastrophic backtracking: the "
                "tokenizers library fails on long inputs); tupe refuses this tokenizer"
            )


def check_files(folder: str | os.PathLike, what: str = "model folder") -> None:
    """Every file a library may open in `folder` is a regular file of a sane size (see `tupe.io.reading`), and its
    tokenizer.json has no catastrophic regex (`check_tokenizer_patterns`)."""
    check_folder_files(folder, MODEL_FILES, what)
    for name in ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt"):
        p = Path(folder) / name
        if p.is_file() and p.stat().st_size > TOKENIZER_LIMIT:
            raise TupeError(f"{p}: {p.stat().st_size} bytes, far more than a tokenizer file holds")
    check_tokenizer_patterns(Path(folder) / "tokenizer.json")
    for name in ("config.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        p = Path(folder) / name
        if p.is_file() and p.stat().st_size > CONFIG_LIMIT:
            raise TupeError(f"{p}: {p.stat().st_size} bytes, far more than a {name} holds")


def _auto_map_targets(auto_map: Any) -> list[str]:  # noqa: ANN401
    targets: list[str] = []
    values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    for v in values:
        if isinstance(v, list | tuple):
            targets += [str(x) for x in v if x]
        elif v:
            targets.append(str(v))
    return targets


def refuse_custom_code(folder: str | os.PathLike, what: str = "model folder") -> None:
    """Refuse a folder whose `config.json` or `tokenizer_config.json` asks for code of its own (`auto_map`), in
    one line and without a prompt. A tupe checkpoint's own `auto_map` (its modeling code, for users without tupe)
    is allowed: tupe loads its installed classes, never the copy."""
    folder = Path(folder)
    for name in ("tokenizer_config.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = read_json(path, name, CONFIG_LIMIT, expect=None)
        except TupeError:
            continue  # the loader reports an unreadable file itself
        if not isinstance(data, dict) or not data.get("auto_map"):
            continue
        targets = _auto_map_targets(data["auto_map"])
        if (
            name == "config.json"
            and data.get("model_type") == "tupe"
            and all(t.startswith(_TUPE_CODE) for t in targets)
        ):
            continue
        if (
            name == "tokenizer_config.json"
            and data.get("tokenizer_class") == _TUPE_TOKENIZER
            and all(t in _TUPE_TOKENIZER_CODE for t in targets)
        ):
            continue
        shown = next((t for t in targets), "?")
        module = shown.split("--")[-1].rsplit(".", 1)[0] + ".py" if "." in shown else shown
        raise TupeError(
            f"{path}: auto_map asks to run custom code ({shown} from {module}); tupe never runs code from a "
            f"{what}: use a folder written by tupe or transformers' own classes"
        )


def _int(cfg: dict, key: str, lo: int, hi: int, path: Path, required: bool = False) -> None:
    if key not in cfg:
        if required:
            raise TupeError(f"{path}: no {key}")
        return
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int):
        shown = "" if v is None else f" {_show(v)}"  # null is all there is to show
        raise TupeError(f"{path}: {key} must be an integer from {lo} to {hi}, got {json_type_name(v)}{shown}")
    if not lo <= v <= hi:
        raise TupeError(f"{path}: {key} must be an integer from {lo} to {hi}, got {v}")


def _float(
    cfg: dict, key: str, lo: float, hi: float, path: Path, lo_open: bool = False, hi_open: bool = False
) -> None:
    if key not in cfg or cfg[key] is None:
        return
    v = cfg[key]
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if ok:
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        rng = f"{'>' if lo_open else '>='} {lo:g} and {'<' if hi_open else '<='} {hi:g}"
        raise TupeError(f"{path}: {key} must be a finite number {rng}, got {_show(v)}")


def _scheme_fields(cfg: dict, path: Path) -> None:
    """The positional schemes' own fields, each as its scheme declares it (`SchemeField`: kind and range)."""
    from tupe.modeling.positional import scheme_fields

    for field in scheme_fields().values():
        if field.low is None or field.high is None:
            continue
        if field.kind is int:
            _int(cfg, field.name, int(field.low), int(field.high), path)
        else:
            _float(cfg, field.name, field.low, field.high, path, lo_open=field.low_open)


def _show(v: Any) -> str:  # noqa: ANN401
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def validate_config(
    cfg: Any,  # noqa: ANN401
    path: str | os.PathLike,
    model_types: tuple[str, ...] = ("tupe", "bert"),
) -> dict:
    """Check a model's `config.json` (already parsed) field by field before any model is built; returns it.

    Checked: `model_type` (one of `model_types`: 'tupe' or 'bert' unless a caller converts more), the sizes (integers in range, width divisible by the heads), the
    activation (a name `transformers` knows), dropout, LayerNorm epsilon (> 0), the dtype, the special-token ids
    (inside the vocabulary) and, for tupe, the positional scheme and its relative-position settings."""
    path = Path(path)
    if not isinstance(cfg, dict):
        raise TupeError(f"{path}: expected a JSON object (model config), got {json_type_name(cfg)}")
    model_type = cfg.get("model_type")
    expected = " or ".join(repr(t) for t in model_types)
    if model_type is None:
        raise TupeError(
            f"{path}: no model_type (expected {expected}); not a config written by save_pretrained"
        )
    if model_type not in model_types:
        raise TupeError(f"{path}: model_type {_show(model_type)} is not supported (expected {expected})")
    _check_sizes(cfg, path)
    _scheme_fields(cfg, path)
    _check_activation_and_dtype(cfg, path)
    _check_token_ids(cfg, path)
    if model_type == "tupe":
        from tupe.modeling.positional import SCHEMES, find_scheme

        scheme = cfg.get("position_scheme", "tupe-a")
        if not isinstance(scheme, str) or find_scheme(scheme) is None:
            raise TupeError(f"{path}: position_scheme {_show(scheme)} is not one of {', '.join(SCHEMES)}")
        for key in ("attn_implementation", "attention_kernel"):  # the kernel setting; its older name
            kernel = cfg.get(key, "auto")
            if not isinstance(kernel, str):
                raise TupeError(f"{path}: {key} must be a string, got {json_type_name(kernel)}")
    for key in ("id2label", "label2id"):
        if key in cfg and cfg[key] is not None and not isinstance(cfg[key], dict):
            raise TupeError(f"{path}: {key} must be an object, got {json_type_name(cfg[key])}")
    return cfg


def _check_sizes(cfg: dict, path: Path) -> None:
    """The sizes, in the bounds the command-line flags have (tupe/validators.py), the width divisible by the
    heads, dropout, LayerNorm epsilon and the initialiser's range."""
    _int(cfg, "vocab_size", 1, V.MAX_VOCAB, path)
    _int(cfg, "hidden_size", 1, V.MAX_WIDTH, path)
    _int(cfg, "num_hidden_layers", 1, V.MAX_LAYERS, path)
    _int(cfg, "num_attention_heads", 1, V.MAX_WIDTH, path)
    _int(cfg, "intermediate_size", 1, 16 * V.MAX_WIDTH, path)
    _int(cfg, "max_position_embeddings", 1, V.MAX_LENGTH, path)
    _int(cfg, "type_vocab_size", 0, 1 << 16, path)
    hidden, heads = cfg.get("hidden_size", 768), cfg.get("num_attention_heads", 12)
    if hidden % heads:
        raise TupeError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    _float(cfg, "hidden_dropout_prob", 0, 1, path, hi_open=True)
    _float(cfg, "attention_probs_dropout_prob", 0, 1, path, hi_open=True)
    _float(cfg, "classifier_dropout", 0, 1, path, hi_open=True)
    _float(cfg, "layer_norm_eps", 0, 1, path, lo_open=True)
    _float(cfg, "initializer_range", 0, 1e3, path)


def _check_activation_and_dtype(cfg: dict, path: Path) -> None:
    """The activation (a name `transformers` knows) and the dtype."""
    from transformers.activations import ACT2FN

    act = cfg.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ACT2FN:
        raise TupeError(
            f"{path}: hidden_act {_show(act)} is not an activation transformers knows (e.g. 'gelu')"
        )
    for key in ("dtype", "torch_dtype"):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, str) or v.replace("torch.", "") not in DTYPES):
            raise TupeError(
                f"{path}: {key} {_show(v)} is not a dtype (expected one of {', '.join(DTYPES[:4])})"
            )


_TOKEN_ID_KEYS = (
    "pad_token_id",
    "cls_token_id",
    "sep_token_id",
    "mask_token_id",
    "unk_token_id",
    "bos_token_id",
    "eos_token_id",
)


def _check_token_ids(cfg: dict, path: Path) -> None:
    """The special-token ids, inside the vocabulary."""
    vocab = cfg.get("vocab_size", 32768)
    for key in _TOKEN_ID_KEYS:
        v = cfg.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
            raise TupeError(
                f"{path}: {key} {_show(v)} is not a token id of the vocabulary (0 to {vocab - 1})"
            )


def check_model_folder(
    folder: str | os.PathLike, what: str = "model folder", model_types: tuple[str, ...] = ("tupe", "bert")
) -> dict:
    """All the checks above for a model folder: its files, no custom code, a valid `config.json` (returned)."""
    folder = Path(folder)
    check_files(folder, what)
    path = folder / "config.json"
    check_regular(path, "model config")
    cfg = validate_config(read_json(path, "model config", CONFIG_LIMIT, expect=None), path, model_types)
    refuse_custom_code(folder, what)
    return cfg


def check_tokenizer_folder(folder: str | os.PathLike) -> None:
    """A tokenizer folder's files are regular and it asks for no code of its own."""
    check_files(folder, "tokenizer folder")
    refuse_custom_code(folder, "tokenizer folder")
