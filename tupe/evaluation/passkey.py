"""The passkey probe for masked LMs (`tupe evaluate --probe passkey`): can a model copy a key it read d tokens
earlier?

Each probe block, for a distance d, is
`[CLS] + F filler tokens + S(key) + d filler tokens + S(masked) + F filler tokens`, where `S(key)` is the template
sentence with a key of k random digits (written with a space between digits, so that every digit is a word of its
own under any BPE), `S(masked)` the same sentence with the key's digit tokens replaced by [MASK], F = 16, and the
filler a seeded random stretch of the text's token stream (as pre-training packs it). The score is the accuracy
of recovering the masked digits (the most likely of the digit tokens at each masked position) against the
same blocks with the first key replaced by other digits (each digit changed): the guess a model makes without
the key. A model that copies scores near 1 with the key and near 0 on the decoy; one that does not use the key
scores the same on both, about 1/10 (1/A where the tokenizer writes only A digits as one token each, e.g. 1-9).
Intervals: percentile bootstrap over blocks (tupe.evaluation.bootstrap).
Definitions and limits: docs/evaluation.md.
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
    digits: (
        np.ndarray
    )  # (A,) the digits keys are drawn from (0..9, or those the tokenizer writes as one token)
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
    if k < 1:
        raise TupeError(f"--probe-key-digits must be at least 1, got {k}")
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
    if len(best) < 2:
        raise TupeError(
            f"--probe-template {template!r}: {who} writes fewer than two digits as one token each at every place "
            "of the key; the probe needs that (try another template)"
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


def probe_blocks(
    sentence: KeySentence,
    stream: np.ndarray,
    distance: int,
    n_blocks: int,
    seed: int,
    cls_id: int,
    mask_id: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(key blocks (B, n), decoy blocks (B, n), masked positions (k,), keys (B, k)) at one distance: the same
    filler, key sentence, masked sentence in both, only the first key's digits differ (each changed)."""
    t, k = len(sentence.ids), len(sentence.positions)
    need = 2 * FILLER_AROUND + distance
    if len(stream) < need:
        raise TupeError(
            f"the filler text (--probe-text, default: --text) has {len(stream):,} tokens; the probe at distance "
            f"{distance} needs {need:,} filler tokens"
        )
    n = 1 + need + 2 * t
    first = 1 + FILLER_AROUND  # the key sentence starts here
    second = first + t + distance  # the masked sentence starts here
    masked_at = second + sentence.positions
    key_blocks = np.empty((n_blocks, n), dtype=np.int64)
    decoy_blocks = np.empty((n_blocks, n), dtype=np.int64)
    keys = np.empty((n_blocks, k), dtype=np.int64)
    for b in range(n_blocks):
        rng = np.random.default_rng([seed, PASSKEY_STREAM, distance, b])
        a = len(sentence.digits)
        key = rng.integers(0, a, size=k)  # indices into the key alphabet
        decoy = (key + rng.integers(1, a, size=k)) % a  # every digit changed
        offset = int(rng.integers(0, len(stream) - need + 1))
        filler = np.asarray(stream[offset : offset + need], dtype=np.int64)
        query = sentence.with_key(key)
        query[sentence.positions] = mask_id
        for out, shown in ((key_blocks, key), (decoy_blocks, decoy)):
            out[b, 0] = cls_id
            out[b, 1:first] = filler[:FILLER_AROUND]
            out[b, first : first + t] = sentence.with_key(shown)
            out[b, first + t : second] = filler[FILLER_AROUND : FILLER_AROUND + distance]
            out[b, second : second + t] = query
            out[b, second + t :] = filler[FILLER_AROUND + distance :]
        keys[b] = key
    return key_blocks, decoy_blocks, masked_at, keys


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
) -> dict[str, Any]:
    """The probe for every model at every distance; `by_distance` has one entry per model and distance (one the
    model cannot run at says why, as `--lengths` does). `prepared`: `prepare_passkey`'s result, if already made."""
    from .lengths import at_length

    settings = settings or PasskeySettings()
    if prepared is None:
        prepared = prepare_passkey(models, corpus, settings, log)
    distances = sorted(dict.fromkeys(int(d) for d in settings.distances))
    entries: list[dict[str, Any]] = []
    for m in models:
        tok = m.tokenizer
        sentence, stream = prepared[id(tok)]
        for d in distances:
            key_blocks, decoy_blocks, masked_at, keys = probe_blocks(
                sentence,
                stream,
                d,
                settings.blocks,
                settings.seed,
                int(tok.cls_token_id),
                int(tok.mask_token_id),
            )
            n = key_blocks.shape[1]
            ready, note = at_length(m, n, settings.extend)
            entry: dict[str, Any] = {
                "model": m.name,
                "distance": d,
                "block_length": n,
                "digits": sentence.digits.tolist(),
                "chance": 1.0 / len(sentence.digits),
                "train_length": m.train_length,
                "evaluated": ready is not None,
                "note": note,
            }
            entries.append(entry)
            if ready is None:
                log(f"passkey, distance {d}: {m.name}: {note}")
                continue
            log(f"passkey, distance {d} (blocks of {n}): {m.name}")
            ck, nk = score_blocks(
                ready, key_blocks, masked_at, keys, sentence.candidates, settings.batch_size
            )
            cd, nd = score_blocks(
                ready, decoy_blocks, masked_at, keys, sentence.candidates, settings.batch_size
            )
            digits = np.full(len(keys), float(keys.shape[1]))
            ci = bootstrap(
                {
                    "accuracy": [(1.0, Ratio(ck, digits))],
                    "guess_accuracy": [(1.0, Ratio(cd, digits))],
                    "accuracy_minus_guess": [(1.0, Ratio(ck, digits)), (-1.0, Ratio(cd, digits))],
                    "nll": [(1.0, Ratio(nk, digits))],
                    "guess_nll": [(1.0, Ratio(nd, digits))],
                    "guess_nll_minus_nll": [(1.0, Ratio(nd, digits)), (-1.0, Ratio(nk, digits))],
                },
                len(keys),
                settings.bootstrap,
                settings.seed,
            )
            entry |= {
                "blocks": len(keys),
                "key_tokens": int(digits.sum()),
                **ci,
                "per_block": {
                    "recovered": ck.tolist(),
                    "guess_recovered": cd.tolist(),
                    "nll": nk.tolist(),
                    "guess_nll": nd.tolist(),
                },
            }
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
