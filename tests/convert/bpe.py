"""fastBPE, written here from its source (`fastBPE.hpp`: `learnbpe`, `process_bpe`), for tests: codes learned on a
small Moses-tokenized text, their application, and a fairseq `dict.txt` of the result."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sacremoses import MosesTokenizer

END = "</w>"
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Mr. Smith went to Washington, and the dog followed him.",
    "Dr. Jones' dogs don't like foxes; the foxes like the dogs.",
    "It cost $3.50 -- a lot, e.g. for a dog food of 2.5 kg!",
    '"Quick," said the fox, "jump over the brown dogs."',
    "Washington is quick to follow the lazy ones (mostly).",
    "the dog and the fox were friends after all .",
]


def moses(line: str) -> list[str]:
    """`tokenizer.perl -no-escape -l en`, as sacremoses ports it."""
    return MosesTokenizer(lang="en").tokenize(line, escape=False)


def learn_codes(words: Counter, n_merges: int) -> list[tuple[str, str, int]]:
    """fastBPE `learnbpe`: repeatedly merge the most frequent adjacent pair (ties: the smallest pair)."""
    split = {w: [*w[:-1], w[-1] + END] for w in words}
    codes = []
    for _ in range(n_merges):
        pairs: Counter = Counter()
        for w, pieces in split.items():
            for a, b in zip(pieces, pieces[1:]):
                pairs[a, b] += words[w]
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda pair: pairs[pair])  # the first (smallest) of the most frequent
        codes.append((best[0], best[1], pairs[best]))
        for w, pieces in split.items():
            out, i = [], 0
            while i < len(pieces):
                if i + 1 < len(pieces) and (pieces[i], pieces[i + 1]) == best:
                    out.append(pieces[i] + pieces[i + 1])
                    i += 2
                else:
                    out.append(pieces[i])
                    i += 1
            split[w] = out
    return codes


def apply_bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """fastBPE `process_bpe` on one word: merge the adjacent pair of lowest rank (all its occurrences, left to
    right) until none is in the codes; pieces that continue a word get `@@`, `</w>` is dropped."""
    pieces = [*word[:-1], word[-1] + END]
    while len(pieces) > 1:
        best_rank, best = None, None
        for a, b in zip(pieces, pieces[1:]):
            r = ranks.get((a, b))
            if r is not None and (best_rank is None or r < best_rank):
                best_rank, best = r, (a, b)
        if best is None:
            break
        out, i = [], 0
        while i < len(pieces):
            if i + 1 < len(pieces) and (pieces[i], pieces[i + 1]) == best:
                out.append(pieces[i] + pieces[i + 1])
                i += 2
            else:
                out.append(pieces[i])
                i += 1
        pieces = out
    return [p + "@@" for p in pieces[:-1]] + [pieces[-1][: -len(END)]]


def released_pieces(line: str, ranks: dict[tuple[str, str], int], lowercase: bool = False) -> list[str]:
    if lowercase:
        line = line.lower()
    return [p for w in moses(line) for p in apply_bpe(w, ranks)]


def write_codes_and_dict(
    folder: Path, n_merges: int = 60, lowercase: bool = False
) -> tuple[Path, Path, dict]:
    """Codes learned on `TEXT`, and the dict.txt of the BPE'd text (fairseq's: count order, then the symbol)."""
    lines = [t.lower() if lowercase else t for t in TEXT]
    words = Counter(w for line in lines for w in moses(line))
    codes = learn_codes(words, n_merges)
    ranks = {(a, b): i for i, (a, b, _) in enumerate(codes)}
    counts = Counter(p for line in lines for p in released_pieces(line, ranks))
    for ch in "abcdefghijklmnopqrstuvwxyz":  # single characters, so unseen words still have pieces
        counts.setdefault(ch, 1)
        counts.setdefault(ch + "@@", 1)
    codes_path, dict_path = folder / "bpe-code", folder / "dict.txt"
    codes_path.write_text("".join(f"{a} {b} {c}\n" for a, b, c in codes), encoding="utf-8")
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    dict_path.write_text("".join(f"{w} {c}\n" for w, c in ordered), encoding="utf-8")
    return codes_path, dict_path, ranks
