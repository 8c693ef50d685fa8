"""What `tupe analyze` looks at: a model directory (TUPE or `transformers` BERT, loaded by `tupe.io`) and
fixed-length blocks of text."""

from __future__ import annotations

import os
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


def read_text_sample(path: str | Path, max_chars: int = 2_000_000) -> str:
    """At most `max_chars` characters of text from a file or a folder's `.txt` files, read incrementally (never
    more than about 4 bytes per character), regular files only; a file with NUL bytes is not text and is refused."""
    from tupe.io.reading import check_regular

    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.txt") if f.is_file())
        if not files:
            raise TupeError(f"{p}: directory has no .txt files")
    elif os.path.lexists(p):
        check_regular(p, "--text file")
        files = [p]
    else:
        raise TupeError(f"--text {str(p)!r} does not exist")
    parts, total = [], 0
    for f in files:
        part = _read_prefix(f, max_chars - total)
        parts.append(part)
        total += len(part) + 1
        if total >= max_chars:
            break
    text = "\n".join(parts)
    if not text.strip():
        raise TupeError(f"{p}: no text")
    return text[:max_chars]


def _read_prefix(path: Path, max_chars: int) -> str:
    """The first `max_chars` characters of a UTF-8 file (invalid bytes replaced), read in 1 MiB pieces."""
    import codecs

    from tupe.io.reading import open_regular

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out: list[str] = []
    n = 0
    offset = 0
    with open_regular(path, "--text file") as fh:
        while n < max_chars:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            nul = chunk.find(b"\0")
            if nul >= 0:
                raise TupeError(f"{path}: NUL byte at offset {offset + nul}: a binary file, not text")
            offset += len(chunk)
            piece = decoder.decode(chunk)
            out.append(piece)
            n += len(piece)
        out.append(decoder.decode(b"", final=True))
    return "".join(out)[:max_chars]
