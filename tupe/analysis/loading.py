"""Loading what `tupe analyze` looks at: a model directory (TUPE or `transformers` BERT), its tokenizer, and
fixed-length blocks of text."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tupe.errors import TupeError


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir)
    if not path.is_dir():
        raise TupeError(f"model directory {str(path)!r} does not exist")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise TupeError(f"{cfg}: no config.json; --model must be a directory written by save_pretrained")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as err:
        raise TupeError(f"{cfg}: line {err.lineno}: invalid JSON ({err.msg})") from err


def load_encoder(model_dir: str | Path):
    """A `TupeModel` in eval mode: TUPE checkpoints as saved, `transformers` BERT (config model_type "bert")
    converted by `TupeForMaskedLM.from_bert` (an exact `bert-a` model). Returns (encoder, description)."""
    from transformers.utils import logging as hf_logging

    config = read_config(model_dir)
    model_type = config.get("model_type")
    # loading the encoder from a task checkpoint (MLM, classification) reports the head weights as unused
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return _load(model_dir, model_type)
    finally:
        hf_logging.set_verbosity(verbosity)


def _load(model_dir: str | Path, model_type: str | None):
    import tupe  # noqa: F401  (registers the Auto classes)
    from tupe.modeling import TupeForMaskedLM, TupeModel
    from tupe.training.checkpointing import check_model_weights, check_weights_match_config

    if model_type in ("tupe", "bert"):
        check_model_weights(model_dir)  # safetensors only; truncation is one clear error, not a traceback
    if model_type == "tupe":
        check_weights_match_config(model_dir)  # weights of another shape: one line, not a RuntimeError
    if model_type == "tupe":
        encoder = TupeModel.from_pretrained(str(model_dir))
        description = f"TUPE checkpoint, position_scheme {encoder.config.position_scheme}"
    elif model_type == "bert":
        encoder = TupeForMaskedLM.from_bert(str(model_dir)).tupe
        description = "transformers BERT checkpoint, converted to bert-a (token-type 0 folded into positions)"
    else:
        raise TupeError(
            f"{Path(model_dir) / 'config.json'}: model_type {model_type!r} is not supported "
            "(expected 'tupe' or 'bert')"
        )
    encoder.eval()
    return encoder, description


def load_tokenizer(model_dir: str | Path, tokenizer: str | Path | None = None):
    """`AutoTokenizer` from --tokenizer if given, else from the model directory; a one-line error if neither has
    one."""
    from transformers import AutoTokenizer

    source = Path(tokenizer) if tokenizer is not None else Path(model_dir)
    if not source.is_dir():
        raise TupeError(f"tokenizer directory {str(source)!r} does not exist")
    if not any(
        (source / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")
    ):
        hint = "" if tokenizer is not None else "; pass one with --tokenizer DIR"
        raise TupeError(f"{source}: no tokenizer (tokenizer.json / tokenizer_config.json / vocab.txt){hint}")
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as err:
        raise TupeError(f"{source}: cannot load the tokenizer: {err}".splitlines()[0]) from err


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single sentence (e.g. [CLS] ... [SEP]), found by encoding
    a sample with and without special tokens, so any tokenizer's own convention is kept."""
    sample = "the analysis sample"
    full = tokenizer(sample, add_special_tokens=True)["input_ids"]
    bare = tokenizer(sample, add_special_tokens=False)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return list(full[:start]), list(full[start + len(bare) :])
    return [], []


def text_blocks(text: str, tokenizer, length: int, max_blocks: int, source: str = "text") -> torch.Tensor:
    """Tokenise `text` and cut it into up to `max_blocks` blocks of exactly `length` ids, each wrapped in the
    tokenizer's special tokens (`[CLS] ... [SEP]`), consecutive and without padding."""
    prefix, suffix = special_affixes(tokenizer)
    body = length - len(prefix) - len(suffix)
    if body < 2:
        raise TupeError(f"--max-length {length} is too short for the tokenizer's special tokens")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < body:
        raise TupeError(
            f"{source}: only {len(ids)} tokens, fewer than one block of {length}; give more text or a smaller "
            "--max-length"
        )
    blocks = [prefix + ids[s : s + body] + suffix for s in range(0, len(ids) - body + 1, body)][:max_blocks]
    return torch.tensor(blocks, dtype=torch.long)


def read_text(path: str | Path, max_chars: int = 2_000_000) -> str:
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.txt") if f.is_file())
        if not files:
            raise TupeError(f"{p}: directory has no .txt files")
        parts, total = [], 0
        for f in files:
            parts.append(f.read_text(encoding="utf-8", errors="replace"))
            total += len(parts[-1])
            if total >= max_chars:
                break
        text = "\n".join(parts)
    elif p.is_file():
        text = p.read_text(encoding="utf-8", errors="replace")
    else:
        raise TupeError(f"--text {str(p)!r} does not exist")
    if not text.strip():
        raise TupeError(f"{p}: no text")
    return text[:max_chars]
