"""The project's tokenizer: byte-level BPE trained with `tokenizers`, wrapped as a `PreTrainedTokenizerFast`.

Contract relied on by every other part of `tupe` (see docs/pretraining.md): special tokens "[PAD]"=0, "[CLS]"=1,
"[SEP]"=2, "[MASK]"=3, "[UNK]"=4; a post-processor producing `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]`;
`model_input_names=["input_ids", "attention_mask"]` (no token types). Saved next to the model, so
`AutoTokenizer.from_pretrained(DIR)` works.

Word spans are exact: offsets cover a word without the space before it (the post-processor is
`ByteLevel(trim_offsets=True)` then the template; whole-word masking, NER entities and QA answers read them), and
decoding drops the space `add_prefix_space` put before the first word (the decoder is `ByteLevel` then a `Strip` of
one leading space; NER entities' `word`). Tokenizers tupe trained before had the template and the `ByteLevel`
decoder alone; `exact_word_spans` (tupe/modeling/word_spans.py) adds both steps whenever tupe loads one. Ids are the
same either way, so `tokenizer_fingerprint`, which keys the packed-data and evaluation caches and a run's identity
for `--resume`, leaves the two steps out: those keys do not change, and what was cached before stays valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tupe.errors import TupeError
from tupe.io.files import is_write_failure, sha256_file, write_error

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")
PAD_ID, CLS_ID, SEP_ID, MASK_ID, UNK_ID = range(5)
TOKENIZER_VERSION = "bytebpe-v1"


def wrap_backend(backend) -> PreTrainedTokenizerFast:  # noqa: ANN001 - backend is a tokenizers.Tokenizer
    """Wrap a `tokenizers.Tokenizer` (with our special tokens and post-processor) for transformers."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        unk_token="[UNK]",
        bos_token="[CLS]",
        eos_token="[SEP]",
        model_input_names=["input_ids", "attention_mask"],
        padding_side="right",
        model_max_length=int(1e30),
    )
    return tok


def _new_backend(vocab_size: int):  # noqa: ANN202
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    # decoded text without the space add_prefix_space put before the first word (" hello" -> "hello")
    backend.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    template = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS_ID), ("[SEP]", SEP_ID)],
    )
    # offsets without the space before a word (" world" -> "world"); ids are the template's alone
    trim = processors.ByteLevel(add_prefix_space=True, trim_offsets=True)
    backend.post_processor = processors.Sequence([trim, template])
    return backend


def train_tokenizer(
    corpus,  # noqa: ANN001 - tupe.data.corpus.Corpus
    vocab_size: int = 32768,
    min_frequency: int = 2,
    max_bytes: int | None = None,
    show_progress: bool = True,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the corpus (or its first `max_bytes` characters) and return it wrapped.

    Training is deterministic for a given corpus and settings, so the cached result is shared by all runs.
    """
    from tokenizers import AddedToken, pre_tokenizers, trainers

    from tupe.data.corpus import iter_line_batches

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise TupeError(f"--vocab-size {vocab_size} is too small for a byte-level BPE (needs at least 262)")
    backend = _new_backend(vocab_size)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )

    # the tokenizers library draws its bars on a terminal only: this one (the corpus read, the long part on a large
    # corpus) shows in a log too, as `tokenize+pack`'s does; its own merge bars follow on a terminal
    from tqdm.auto import tqdm

    total = max_bytes if max_bytes is not None else (corpus.total_bytes or None)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="BPE", disable=not show_progress, leave=False)

    def batches():  # noqa: ANN202
        seen = 0
        for lines, _ends, done in iter_line_batches(corpus):
            yield lines
            seen += sum(map(len, lines))
            if total:
                bar.n = min(total, seen if max_bytes is not None else done)
                bar.refresh()
            if max_bytes is not None and seen >= max_bytes:
                return

    try:
        backend.train_from_iterator(batches(), trainer=trainer)
    finally:
        bar.close()
    # "The [MASK] sat": let the mask absorb the space before it, as RoBERTa's <mask> does
    backend.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True, normalized=False)])
    vocab = backend.get_vocab()
    for i, t in enumerate(SPECIAL_TOKENS):
        if vocab.get(t) != i:
            raise RuntimeError(f"special token {t} got id {vocab.get(t)}, expected {i}")
    return wrap_backend(backend)


def check_tokenizer(tok, where: str = "tokenizer") -> None:  # noqa: ANN001
    """Raise a `TupeError` unless `tok` follows the project's special-token contract."""
    for i, t in enumerate(SPECIAL_TOKENS):
        got = tok.convert_tokens_to_ids(t)
        if got != i:
            raise TupeError(
                f"{where}: special token {t} has id {got}, the tupe models need {i}; "
                "train one with `tupe pretrain --vocab-size N` or fix its special tokens"
            )
    # what GLUE fine-tuning relies on (tupe.io.checkpoints.load_tokenizer): a tokenizer pretrain accepts must be
    # one the fine-tuning of its model accepts, not a refusal hours later
    cls_id, sep_id = tok.convert_tokens_to_ids("[CLS]"), tok.convert_tokens_to_ids("[SEP]")
    ids = tok("a", "b")["input_ids"]
    if not ids or ids[0] != cls_id or ids[-1] != sep_id or ids.count(sep_id) < 2:
        raise TupeError(
            f"{where}: the tokenizer does not wrap a sentence pair as [CLS] A [SEP] B [SEP] (got ids {ids[:6]}): "
            "its post-processor is missing or wrong, and fine-tuning (tupe glue) needs it"
        )


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Load an existing tokenizer directory (or a `tokenizer.json` file) and check the special-token contract."""
    from tokenizers import Tokenizer

    from tupe.io.checkpoints import load_tokenizer as load_saved_tokenizer
    from tupe.modeling.word_spans import exact_word_spans

    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        from tupe.io.reading import TOKENIZER_LIMIT, check_regular

        if check_regular(path, "tokenizer file").st_size > TOKENIZER_LIMIT:
            raise TupeError(f"{path}: far larger than a tokenizer file; is it the right file?")
        try:
            tok = wrap_backend(Tokenizer.from_file(str(path)))
        except Exception as err:  # noqa: BLE001
            raise TupeError(f"{path}: not a tokenizers JSON file ({err})") from err
        exact_word_spans(tok)  # a folder's tokenizer gets it in load_saved_tokenizer
    elif path.is_dir():
        tok = load_saved_tokenizer(path)
    elif path.exists():
        raise TupeError(
            f"tokenizer {path} is a file, but not a tokenizer.json; give the tokenizer's folder or its tokenizer.json"
        )
    else:
        raise TupeError(f"tokenizer not found: {path}")
    if not getattr(tok, "is_fast", False):
        raise TupeError(f"{path}: tupe needs a fast (tokenizers-backed) tokenizer")
    check_tokenizer(tok, str(path))
    tok.model_input_names = ["input_ids", "attention_mask"]
    return tok


def _definition_without_span_steps(backend) -> str:  # noqa: ANN001 - a tokenizers.Tokenizer
    """The backend's JSON definition without the steps that make word spans exact (a `ByteLevel` step of the
    post-processor, a `Strip` step of the decoder, see `exact_word_spans`): they change offsets and decoded text,
    never ids, so a tokenizer with them is hashed as the same tokenizer without them (byte for byte the definition
    tupe's tokenizers had before they had the steps); and without the truncation and padding settings earlier
    calls left in the backend."""
    from tokenizers import Tokenizer

    text = backend.to_str()
    definition = json.loads(text)
    # the truncation and padding a call left set (`tok(..., truncation=True)` keeps them in the backend): state of
    # the object, not of the tokenizer; null in a tokenizer as loaded, so its hash is the one it always had
    changed = any(definition.get(key) is not None for key in ("truncation", "padding"))
    definition.update(truncation=None, padding=None)
    for key, list_key, step in (
        ("post_processor", "processors", "ByteLevel"),
        ("decoder", "decoders", "Strip"),
    ):
        part = definition.get(key) or {}
        if part.get("type") != "Sequence":
            continue
        kept = [p for p in part.get(list_key, []) if p.get("type") != step]
        if len(kept) == len(part.get(list_key, [])):
            continue
        definition[key] = kept[0] if len(kept) == 1 else ({**part, list_key: kept} if kept else None)
        changed = True
    return Tokenizer.from_str(json.dumps(definition)).to_str() if changed else text


def tokenizer_fingerprint(tok) -> str:  # noqa: ANN001
    """Hash of the tokenizer's full definition (vocab, merges, normalisation); keys the packed-data cache.

    What changes offsets and decoded text only (`_definition_without_span_steps`) is left out: the ids, and so
    every cache this keys, are the same with it and without it. A slow (Python) tokenizer, such as the released TUPE
    pipeline's Moses + BPE, is hashed by its class, vocabulary, BPE merges and scalar options."""
    if getattr(tok, "is_fast", False):
        definition = _definition_without_span_steps(tok.backend_tokenizer)
        return hashlib.sha256(definition.encode()).hexdigest()[:20]
    ranks = getattr(tok, "bpe_ranks", {}) or {}
    options = {
        k: v
        for k, v in sorted(tok.init_kwargs.items())
        if isinstance(v, (bool, int, float, str)) and not k.endswith("_file") and k != "name_or_path"
    }
    definition = {
        "class": f"{type(tok).__module__.rsplit('.', 1)[-1]}.{type(tok).__name__}",
        "vocab": sorted(tok.get_vocab().items(), key=lambda kv: kv[1]),
        "merges": [list(pair) for pair, _ in sorted(ranks.items(), key=lambda kv: kv[1])],
        "options": options,
    }
    return hashlib.sha256(json.dumps(definition, ensure_ascii=False).encode()).hexdigest()[:20]


CACHE_RECORD = "tupe_cache.json"  # SHA-256 of the cached tokenizer.json, checked before each reuse


def _cached_tokenizer_problem(target: Path) -> str | None:
    """None if the cached tokenizer is the one tupe trained (its recorded SHA-256), else what is wrong with it: a
    changed, swapped or corrupt cache entry is trained again instead of trusted."""
    from tupe.io.reading import check_regular, read_json

    try:
        check_regular(target / "tokenizer.json", "cached tokenizer")
        if not (target / CACHE_RECORD).is_file():
            return None  # written by an older tupe: the special-token and pair checks still run
        want = read_json(target / CACHE_RECORD, "cache record").get("tokenizer.json")
    except TupeError as err:
        return str(err)
    if want != sha256_file(target / "tokenizer.json"):
        return "tokenizer.json does not match its recorded SHA-256 (changed or corrupt)"
    return None


def get_or_train_tokenizer(
    corpus,  # noqa: ANN001
    cache_dir: Path,
    vocab_size: int,
    min_frequency: int = 2,
    max_bytes: int | None = None,
    log=print,  # noqa: ANN001
    progress: bool = True,
) -> PreTrainedTokenizerFast:
    """Train the BPE once per (corpus, settings) and keep it in `cache_dir/tokenizers/KEY`; reuse it later."""
    from transformers import AutoTokenizer

    from tupe.data.corpus import text_rule
    from tupe.modeling.word_spans import exact_word_spans

    # the line rule too: BPE trained on text cut another way is another tokenizer
    key_src = json.dumps(
        [TOKENIZER_VERSION, corpus.fingerprint(), text_rule(), vocab_size, min_frequency, max_bytes]
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
    target = Path(cache_dir) / "tokenizers" / key
    if (target / "tokenizer.json").exists():
        problem = _cached_tokenizer_problem(target)
        if problem is None:
            log(f"tokenizer: reusing cached BPE ({vocab_size} entries) from {target}")
            tok = AutoTokenizer.from_pretrained(str(target), trust_remote_code=False)
            exact_word_spans(tok)  # cached before spans were exact: the same ids, so the same cache key
            check_tokenizer(tok, str(target))
            return tok
        print(
            f"warning: cached tokenizer {target}: {problem}; training it again", file=sys.stderr, flush=True
        )
        shutil.rmtree(target, ignore_errors=True)
    log(f"tokenizer: training byte-level BPE with {vocab_size} entries on {corpus.describe()}")
    tok = train_tokenizer(corpus, vocab_size, min_frequency, max_bytes, show_progress=progress)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
        tok.save_pretrained(str(tmp))
        (tmp / CACHE_RECORD).write_text(
            json.dumps({"tokenizer.json": sha256_file(tmp / "tokenizer.json")}) + "\n"
        )
    except Exception as err:  # the tokenizers library reports a full disk as a plain Exception, not OSError
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not is_write_failure(err):
            raise
        raise write_error(
            getattr(err, "filename", None) or target,
            err,
            "the trained tokenizer was not cached (partial files removed): free space or use another --cache-dir",
        ) from None
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(str(target), trust_remote_code=False)
