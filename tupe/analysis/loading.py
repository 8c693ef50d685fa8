"""What `tupe analyze` looks at: a model directory (TUPE or `transformers` BERT, loaded by `tupe.io`) and
fixed-length blocks of text."""

from __future__ import annotations

from pathlib import Path

import torch

from tupe.errors import TupeError
from tupe.io.checkpoints import load_model


def load_encoder(model_dir: str | Path):
    """A `TupeModel` in eval mode (BERT folders converted to `bert-a`) and its description."""
    from tupe.modeling import TupeModel

    return load_model(model_dir, TupeModel)


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
