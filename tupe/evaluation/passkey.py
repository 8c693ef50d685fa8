"""The passkey probe for masked LMs (`tupe evaluate --probe passkey`): does a model copy, in order, a key it read
d tokens earlier?

Each probe block, for a distance d, is
`[CLS] + F filler tokens + S(shown) + d filler tokens + S(masked) + F filler tokens`, where `S(.)` is the template
sentence holding a key of k >= 5 *distinct* digits (written with a space between digits, so that every digit is a
word of its own under any BPE), `S(masked)` the same sentence with the key's digit tokens replaced by [MASK], F = 16,
and the filler a seeded random stretch of the text's token stream (as pre-training packs it). Every block is scored
three times, with three earlier sentences and the same filler and query:

- `key`: the key itself; **accuracy** is the share of masked digits recovered (the most likely of the digit tokens
  at each masked position);
- `decoy`: every digit changed to another one; its accuracy is the **guess**, what the model answers without the
  key. **token use** = accuracy - guess: the key's digits were used somewhere in the block;
- `permuted`: the key's own digits in another order with none in its place (a derangement); **copying** = accuracy
  - permuted accuracy: the key was copied *by position*. A model that knows only which digits occur (a bag of
  symbols, or a model without positions) sees the same multiset of tokens in both and scores copying 0; an exact
  copier scores 1 (the derangement puts a wrong digit at every place).

With k distinct digits, a model that knows which digits the key holds but not their order recovers 1/k of them;
`chance` is 1/A (A: the digits the tokenizer writes as one token each, e.g. 0-9 or 1-9). Intervals: percentile
bootstrap over blocks, paired (tupe.evaluation.bootstrap). Definitions and limits: docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tupe.errors import TupeError

from .bootstrap import CI_LEVEL, Ratio, bootstrap
from .evaluate import EvalModel

PASSKEY_STREAM = 104  # second seed word of the probe's random stream (shuffles 101, pppl 102, bootstrap 103)
DEFAULT_TEMPLATE = "The pass key is {key}."
DEFAULT_DISTANCES = (16, 64, 128, 256, 512, 1024)
FILLER_AROUND = 16  # filler tokens before the key sentence and after the masked one
# Distinct digits per key: a model that knows only which digits occur recovers at most 1 in 5.
MIN_KEY_DIGITS = 5


@dataclasses.dataclass
class PasskeySettings:
    template: str = DEFAULT_TEMPLATE
    key_digits: int = 5
    distances: Sequence[int] = DEFAULT_DISTANCES
    blocks: int = 100
    seed: int = 0
    bootstrap: int = 1000
    batch_size: int = 16
    extend: str = "none"  # --extend-positions, for models that must run beyond their training length
    cache_dir: str | None = None
    progress: bool = False


@dataclasses.dataclass
class KeySentence:
    """The template tokenised once per digit: ids with any key, where the key's digit tokens sit, and which digits
    the tokenizer writes as one token each there (its key alphabet)."""

    ids: np.ndarray  # (t,) the sentence's token ids with the key d d ... d, d = digits[0]
    positions: np.ndarray  # (k,) indices into `ids` of the key's digit tokens
    # (A,) the digits keys are drawn from (0..9, or those the tokenizer writes as one token)
    digits: np.ndarray
    candidates: np.ndarray  # (k, A): the token id of digit digits[a] at key place j

    def with_key(self, key: np.ndarray) -> np.ndarray:
        """(t,) ids of the sentence holding `key`: (k,) indices into `digits`."""
        out = self.ids.copy()
        out[self.positions] = self.candidates[np.arange(len(key)), key]
        return out


def key_sentence(tokenizer: Any, template: str, k: int, who: str = "the tokenizer") -> KeySentence:  # noqa: ANN401
    """Tokenise `template` with a k-digit key once per digit 0..9 and find each key digit's token. A digit belongs
    to the key alphabet when each of its k copies is one token holding that digit alone (and perhaps the space
    before it) and the rest of the sentence is cut as for the other digits of the alphabet: a BPE trained on books
    often has ` 1` .. ` 9` as tokens but writes ` 0` as a space then `0`, which would move every later token, so
    its keys use 1-9 (chance 1/9). Fewer than two such digits is a one-line error naming the template."""
    if template.count("{key}") != 1 or any(
        f[1] not in (None, "key") for f in string.Formatter().parse(template)
    ):
        raise TupeError(
            f"--probe-template must hold {{key}} exactly once and no other field, got {template!r}"
        )
    if k < MIN_KEY_DIGITS:
        raise TupeError(
            f"--probe-key-digits must be at least {MIN_KEY_DIGITS} (the key's digits are distinct, so a model that "
            f"knows only which digits occur recovers 1 in k of them), got {k}"
        )
    start = template.index("{key}")
    chars = [start + 2 * j for j in range(k)]  # the digits' characters in "d d d ..."
    layouts: dict[tuple, list[tuple[int, np.ndarray]]] = {}  # the sentence's cut -> (digit, ids) cut that way
    for c in range(10):
        enc = tokenizer(
            template.replace("{key}", " ".join([str(c)] * k)),
            add_special_tokens=False,
            return_offsets_mapping=True,
        )
        ids, spans = np.asarray(enc["input_ids"], dtype=np.int64), enc["offset_mapping"]
        at = [next((i for i, (a, b) in enumerate(spans) if a <= ch < b), None) for ch in chars]
        if None in at or len(set(at)) != k or any(spans[i][1] - spans[i][0] > 2 for i in at):  # type: ignore[index]
            continue  # this digit is not one token of its own at every place
        rest = tuple(np.delete(ids, at).tolist())
        layouts.setdefault((len(ids), tuple(at), rest), []).append((c, ids))
    best = max(layouts.values(), key=len, default=[])
    if len(best) < k:
        raise TupeError(
            f"--probe-template {template!r}: {who} writes {len(best)} digit(s) as one token each at every place "
            f"of the key; a key of {k} distinct digits needs {k} (try another template or fewer --probe-key-digits)"
        )
    ((_, positions_t, _),) = [key for key, value in layouts.items() if value is best]
    positions = np.asarray(positions_t, dtype=np.int64)
    table = np.stack([ids for _, ids in best])  # (A, t)
    if len(set(table[:, positions[0]].tolist())) != len(best):
        raise TupeError(f"--probe-template {template!r}: {who} does not tell the digits apart in the key")
    digits = np.asarray([c for c, _ in best], dtype=np.int64)
    return KeySentence(table[0].copy(), positions, digits, table[:, positions].T.copy())


def filler_stream(
    corpus: Any, tokenizer: Any, settings: PasskeySettings, log: Callable[[str], None]
) -> np.ndarray:  # noqa: ANN401
    """The text's token stream as pre-training packs it (documents joined by [SEP]), cached like it."""
    from tupe.data.packing import load_or_build_packed

    packed = load_or_build_packed(
        corpus,
        tokenizer,
        2,
        settings.cache_dir,
        progress=settings.progress,
        log=log,
        sep_id=int(tokenizer.sep_token_id),
    )
    return packed.stream


@dataclasses.dataclass
class ProbeBlocks:
    """The probe's blocks at one distance: three versions of each block that differ only in the earlier key's digits
    (the filler, the key sentence's other tokens and the masked query are the same)."""

    key: np.ndarray  # (B, n) the key shown in order
    decoy: np.ndarray  # (B, n) every digit of the shown key changed: the guess without the key
    permuted: np.ndarray  # (B, n) the key's own digits deranged: no digit in its place
    masked_at: np.ndarray  # (k,) positions of the masked digits (the same in every block)
    keys: np.ndarray  # (B, k) the key of each block, as indices into the key alphabet


def derangement(rng: np.random.Generator, k: int) -> np.ndarray:
    """A uniformly random permutation of range(k) with no fixed point (k >= 2), by rejection."""
    while True:
        order = rng.permutation(k)
        if not (order == np.arange(k)).any():
            return order


def probe_blocks(
    sentence: KeySentence,
    stream: np.ndarray,
    distance: int,
    n_blocks: int,
    seed: int,
    cls_id: int,
    mask_id: int,
) -> ProbeBlocks:
    """The key, decoy and permuted blocks at one distance. Each block's key is k distinct digits of the alphabet,
    its decoy changes every digit, its permuted key is a derangement of the key's digits; random draws from
    `(seed, PASSKEY_STREAM, distance, block)`."""
    t, k = len(sentence.ids), len(sentence.positions)
    a = len(sentence.digits)
    if k > a:
        raise TupeError(
            f"a key of {k} distinct digits needs at least {k} digits in the key alphabet, got {a}"
        )
    need = 2 * FILLER_AROUND + distance
    if len(stream) < need:
        raise TupeError(
            f"the filler text (--probe-text, default: --text) has {len(stream):,} tokens; the probe at distance "
            f"{distance} needs {need:,} filler tokens"
        )
    n = 1 + need + 2 * t
    first = 1 + FILLER_AROUND  # the key sentence starts here
    second = first + t + distance  # the masked sentence starts here
    out = ProbeBlocks(
        key=np.empty((n_blocks, n), dtype=np.int64),
        decoy=np.empty((n_blocks, n), dtype=np.int64),
        permuted=np.empty((n_blocks, n), dtype=np.int64),
        masked_at=second + sentence.positions,
        keys=np.empty((n_blocks, k), dtype=np.int64),
    )
    for b in range(n_blocks):
        rng = np.random.default_rng([seed, PASSKEY_STREAM, distance, b])
        key = rng.permutation(a)[:k]  # k distinct indices into the key alphabet
        decoy = (key + rng.integers(1, a, size=k)) % a  # every digit changed
        offset = int(rng.integers(0, len(stream) - need + 1))
        permuted = key[derangement(rng, k)]  # the same digits, none in its place
        filler = np.asarray(stream[offset : offset + need], dtype=np.int64)
        query = sentence.with_key(key)
        query[sentence.positions] = mask_id
        for blocks, shown in ((out.key, key), (out.decoy, decoy), (out.permuted, permuted)):
            blocks[b, 0] = cls_id
            blocks[b, 1:first] = filler[:FILLER_AROUND]
            blocks[b, first : first + t] = sentence.with_key(shown)
            blocks[b, first + t : second] = filler[FILLER_AROUND : FILLER_AROUND + distance]
            blocks[b, second : second + t] = query
            blocks[b, second + t :] = filler[FILLER_AROUND + distance :]
        out.keys[b] = key
    return out


def score_blocks(
    m: EvalModel,
    blocks: np.ndarray,
    masked_at: np.ndarray,
    keys: np.ndarray,
    candidates: np.ndarray,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per block: (digits recovered (B,), sum of -log p(true digit token) over the vocabulary (B,)). `keys` (B, k)
    index the A columns of `candidates` (k, A); a digit is recovered when the true one has the highest logit of
    the A digit tokens at its place."""
    n_blocks, k = keys.shape
    correct, nll = np.zeros(n_blocks), np.zeros(n_blocks)
    selected = torch.zeros(blocks.shape, dtype=torch.bool)
    selected[:, torch.from_numpy(masked_at)] = True
    cand = torch.from_numpy(candidates)  # (k, A)
    with torch.inference_mode():
        for start in range(0, n_blocks, batch_size):
            stop = min(n_blocks, start + batch_size)
            logits = m.logits_at(torch.from_numpy(blocks[start:stop]), selected[start:stop]).cpu()
            logits = logits.reshape(stop - start, k, -1)  # (b, k, vocab): positions in row-major order
            digit_logits = torch.gather(
                logits, 2, cand.unsqueeze(0).expand(stop - start, -1, -1)
            )  # (b, k, A)
            truth = torch.from_numpy(keys[start:stop])  # (b, k)
            correct[start:stop] = (digit_logits.argmax(-1) == truth).sum(-1).double().numpy()
            true_ids = cand[torch.arange(k), truth]  # (b, k)
            logp = torch.log_softmax(logits.double(), -1).gather(2, true_ids.unsqueeze(-1)).squeeze(-1)
            nll[start:stop] = (-logp).sum(-1).numpy()
    return correct, nll


def score_distance(
    m: EvalModel, blocks: ProbeBlocks, candidates: np.ndarray, settings: PasskeySettings
) -> dict[str, Any]:
    """One model at one distance: accuracy and -log p of the true digits on the key, decoy and permuted blocks,
    token use (accuracy - guess) and copying (accuracy - permuted accuracy), each with a paired percentile bootstrap
    interval over blocks, and the per-block counts."""
    scored = {
        name: score_blocks(
            m, getattr(blocks, name), blocks.masked_at, blocks.keys, candidates, settings.batch_size
        )
        for name in ("key", "decoy", "permuted")
    }
    digits = np.full(len(blocks.keys), float(blocks.keys.shape[1]))
    acc = {name: Ratio(correct, digits) for name, (correct, _) in scored.items()}
    nll = {name: Ratio(loss, digits) for name, (_, loss) in scored.items()}
    ci = bootstrap(
        {
            "accuracy": [(1.0, acc["key"])],
            "guess_accuracy": [(1.0, acc["decoy"])],
            "permuted_accuracy": [(1.0, acc["permuted"])],
            "accuracy_minus_guess": [(1.0, acc["key"]), (-1.0, acc["decoy"])],  # token use
            "copying": [(1.0, acc["key"]), (-1.0, acc["permuted"])],
            "nll": [(1.0, nll["key"])],
            "guess_nll": [(1.0, nll["decoy"])],
            "permuted_nll": [(1.0, nll["permuted"])],
            "guess_nll_minus_nll": [(1.0, nll["decoy"]), (-1.0, nll["key"])],
            "permuted_nll_minus_nll": [(1.0, nll["permuted"]), (-1.0, nll["key"])],
        },
        len(blocks.keys),
        settings.bootstrap,
        settings.seed,
    )
    return {
        "blocks": len(blocks.keys),
        "key_tokens": int(digits.sum()),
        **ci,
        "per_block": {
            "recovered": scored["key"][0].tolist(),
            "guess_recovered": scored["decoy"][0].tolist(),
            "permuted_recovered": scored["permuted"][0].tolist(),
            "nll": scored["key"][1].tolist(),
            "guess_nll": scored["decoy"][1].tolist(),
            "permuted_nll": scored["permuted"][1].tolist(),
        },
    }


Prepared = dict[
    int, tuple[KeySentence, np.ndarray]
]  # by tokenizer object: its key sentence and filler stream


def prepare_passkey(
    models: Sequence[EvalModel],
    corpus: Any,  # noqa: ANN401
    settings: PasskeySettings,
    log: Callable[[str], None] = print,
) -> Prepared:
    """Everything of the probe that can fail on its inputs, done before any model runs (`tupe evaluate` calls it
    before the loss evaluation): the settings, each tokenizer's key sentence and the filler text, long enough for
    the largest distance."""
    distances = sorted(dict.fromkeys(int(d) for d in settings.distances))
    if not distances or distances[0] < 0:
        raise TupeError(f"--probe-distances must be integers >= 0, got {list(settings.distances)}")
    if settings.blocks < 1:
        raise TupeError(f"--probe-blocks must be at least 1, got {settings.blocks}")
    prepared: Prepared = {}
    for m in models:
        tok = m.tokenizer
        if id(tok) not in prepared:
            sentence = key_sentence(tok, settings.template, settings.key_digits, f"the tokenizer of {m.name}")
            stream = filler_stream(corpus, tok, settings, log)
            need = 2 * FILLER_AROUND + distances[-1]
            if len(stream) < need:
                raise TupeError(
                    f"the filler text (--probe-text, default: --text) has {len(stream):,} tokens; the probe at "
                    f"distance {distances[-1]} needs {need:,} filler tokens"
                )
            prepared[id(tok)] = (sentence, stream)
    return prepared


def passkey_probe(
    models: Sequence[EvalModel],
    corpus: Any,  # noqa: ANN401
    settings: PasskeySettings | None = None,
    log: Callable[[str], None] = print,
    prepared: Prepared | None = None,
    on_model: Callable[[str, list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """The probe for every model at every distance; `by_distance` has one entry per model and distance (one the
    model cannot run at says why, as `--lengths` does). `prepared`: `prepare_passkey`'s result, if already made.
    `on_model(name, entries)` is called as each model is done with its entries (the study keeps them, so that an
    interrupted stage resumes after the last finished model)."""
    from .lengths import at_length

    settings = settings or PasskeySettings()
    if prepared is None:
        prepared = prepare_passkey(models, corpus, settings, log)
    distances = sorted(dict.fromkeys(int(d) for d in settings.distances))
    entries: list[dict[str, Any]] = []
    for m in models:
        start = len(entries)  # this model's entries follow
        tok = m.tokenizer
        sentence, stream = prepared[id(tok)]
        for d in distances:
            blocks = probe_blocks(
                sentence,
                stream,
                d,
                settings.blocks,
                settings.seed,
                int(tok.cls_token_id),
                int(tok.mask_token_id),
            )
            n = blocks.key.shape[1]
            ready, note = at_length(m, n, settings.extend)
            entry: dict[str, Any] = {
                "model": m.name,
                "distance": d,
                "block_length": n,
                "digits": sentence.digits.tolist(),
                "chance": 1.0 / len(sentence.digits),
                "symbols_guess": 1.0 / len(sentence.positions),
                "train_length": m.train_length,
                "evaluated": ready is not None,
                "note": note,
            }
            entries.append(entry)
            if ready is None:
                log(f"passkey, distance {d}: {m.name}: {note}")
                continue
            log(f"passkey, distance {d} (blocks of {n}): {m.name}")
            entry |= score_distance(ready, blocks, sentence.candidates, settings)
        if on_model is not None:
            on_model(m.name, entries[start:])
    return {
        "text": {
            "description": corpus.describe(),
            "files": [str(p) for p in corpus.files],
            "bytes": corpus.total_bytes,
        },
        "settings": {
            "template": settings.template,
            "key_digits": settings.key_digits,
            "distances": distances,
            "blocks": settings.blocks,
            "seed": settings.seed,
            "filler_around": FILLER_AROUND,
            "extend_positions": settings.extend,
            "bootstrap_resamples": settings.bootstrap,
            "ci_level": CI_LEVEL,
        },
        "by_distance": entries,
    }
