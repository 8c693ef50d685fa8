"""The authors' released TUPE checkpoints (fairseq format, `guolinke/TUPE`) as tupe models, exactly.

A released checkpoint is a `torch.save` of a dict: `args` (an `argparse.Namespace`), `model` (the state dict of
the released `BertModel`: `decoder.sentence_encoder.*`, `decoder.lm_head.*`, `classification_heads.*`), plus
optimizer and training state, which are ignored. It is unpickled with `torch.load(weights_only=True)` and an
allow-list of the few types the format holds, so a checkpoint that would run code is refused without running it.

How the released positional side maps onto tupe's (`positional.py`), for `T` tokens, `H` hidden:
- `pos` has `max_positions + 1` rows; the released forward uses `pos_ln(pos[:T+1])`, gives token `t` row `t + 1`
  and takes the [CLS] reset values from rows 0 (`theta_1`, [CLS] -> others) and 1 (`theta_2`, others -> [CLS]).
  So `UntiedPositions.theta_positions = pos[0:2]` and `UntiedPositions.embeddings = pos[1:]` (token t on row t; row
  0 is token 0's, which the reset always overrides), `LayerNorm = pos_ln`.
- `U^Q` and `U^K` come in one of two layouts, told apart by their key names (`positional_layout`):
  - **released** (`guolinke/TUPE` `master`, 4c64ff7, what the authors' 2020 checkpoint was saved with):
    `pos_q_linear` and `pos_k_linear`, H -> H each, are `U^Q` and `U^K`;
  - **fused** (an unmerged pull request to that repository, 2021-11-08): `pos_proj`, H -> 2H, is `U^Q` (output
    rows `:H`) and `U^K` (rows `H:`).
  Either is split into heads like `W^Q`/`W^K`.
- `rp_bucket` (tupe-r): the released code keeps it as a plain attribute, so a released checkpoint does not hold it;
  tupe builds the same table (T5's buckets of `j - i`, column 0 -> bucket 32, row 0 -> bucket 16). The fused
  layout saves it; then it is checked equal to that rule.
- `relative_attention_bias` (33 rows for 32 buckets) is `RelativeBias(cls_bucket=True).bias` row for row: row 32
  holds others -> [CLS] (column 0) in both. The released code gives [CLS] -> others (row 0) row 16, which T5's
  bucketing never produces; tupe gives row 0 row 32 too. Row 0 of the logits is one constant per head across
  all keys, so it cancels in the softmax: the outputs are the same.
- Content logits: the released code scales `q = x W^Q + b^Q` by `(2d)^-1/2`, tupe scales `q k^T` by the same.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tupe.errors import TupeError, one_line

if TYPE_CHECKING:
    from .modeling_tupe import TupeForMaskedLM, TupeForSequenceClassification

ENC = "decoder.sentence_encoder."
HEAD = "decoder.lm_head."
CLS_HEADS = "classification_heads."

# fairseq's names for activations -> transformers' ACT2FN names of the same function
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_accurate": "gelu_new",
    "gelu_fast": "gelu_new",
    "relu": "relu",
    "tanh": "tanh",
}


class _InertTrainingRecord:
    """Stand-in for the fairseq training meters a checkpoint may hold (`extra_state["train_meters"]`): plain data
    (counts, sums, times), restored as attributes and never used. No method of fairseq runs."""


# The only globals a released checkpoint's pickle may name. Tensors, dicts, lists and numbers are allowed by
# `weights_only` itself; these are data records. Anything else (e.g. `os.system`) is refused before it is called.
_SAFE_GLOBALS: list[Any] = [
    argparse.Namespace,
    (_InertTrainingRecord, "fairseq.meters.AverageMeter"),
    (_InertTrainingRecord, "fairseq.meters.TimeMeter"),
    (_InertTrainingRecord, "fairseq.meters.StopwatchMeter"),
]


def _numpy_scalar_globals() -> list[Any]:
    """numpy scalars (a validation loss saved as `numpy.float64`): the names numpy 1 and 2 pickle them under."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    scalar = core.multiarray.scalar
    allowed: list[Any] = [
        np.dtype,
        (scalar, "numpy.core.multiarray.scalar"),
        (scalar, "numpy._core.multiarray.scalar"),
    ]
    for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_):
        allowed.append(type(np.dtype(t)))
    return allowed


def _check_torch_format(path: Path) -> None:
    """Refuse, in one line, a file that is neither of `torch.save`'s formats: a zip archive (`PK`, torch >= 1.6)
    or the legacy pickle stream (a pickle `PROTO` opcode, 0x80, first). Without this a text file reaches the
    unpickler, which reads its letters as opcodes (`KeyError: 101`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as err:
        raise TupeError(f"{path}: cannot be read ({one_line(err)})") from None
    if not head:
        raise TupeError(f"{path}: empty file, not a torch checkpoint")
    if head.startswith(b"PK") or head[0] == 0x80:
        return
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in head) / len(head)
    what = "a text file" if printable > 0.95 else f"starts with bytes {head[:4].hex(' ')}"
    raise TupeError(
        f"{path}: not a torch checkpoint ({what}; a fairseq checkpoint is a .pt file written by torch.save)"
    )


def load_fairseq_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Unpickle a released checkpoint without running code: `weights_only=True` plus the format's allow-list.

    A pickle that names any other global (a function to call, a class of another library) is refused with a
    one-line `TupeError` naming it; nothing it names is imported or called.
    """
    path = Path(path)
    if not path.is_file():
        raise TupeError(
            f"fairseq checkpoint {str(path)!r} does not exist" if not path.exists() else f"{path}: not a file"
        )
    _check_torch_format(path)
    try:
        with torch.serialization.safe_globals(_SAFE_GLOBALS + _numpy_scalar_globals()):
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception:  # noqa: BLE001 - the names are for the message only
            names = []
        allowed = {
            "argparse.Namespace",
            "fairseq.meters.AverageMeter",
            "fairseq.meters.TimeMeter",
            "fairseq.meters.StopwatchMeter",
            "numpy.dtype",
            "numpy.core.multiarray.scalar",
            "numpy._core.multiarray.scalar",
        }
        named = [n for n in names if n not in allowed and not n.startswith("numpy.dtypes.")]
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if named or found:
            what = f"it names {', '.join(named[:3]) if named else found.group(1)}"
        else:  # e.g. a raw pickle (not torch.save): an instruction the safe unpickler does not run
            reason = re.search(r"WeightsUnpickler error:\s*(.+)", str(err))
            what = reason.group(1).strip() if reason else "an instruction outside the checkpoint format"
        raise TupeError(
            f"{path}: refused to load: the pickle needs more than a fairseq checkpoint holds ({what}); "
            "loading it could run code, so nothing in it was run"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, TypeError) as err:
        # a damaged legacy pickle trips the unpickler anywhere (a memo key, an empty stack): all are "unreadable"
        raise TupeError(
            f"{path}: not a readable torch checkpoint ({type(err).__name__}: {one_line(err)})"
        ) from None
    if not isinstance(state, dict) or "model" not in state or "args" not in state:
        keys = sorted(state)[:5] if isinstance(state, dict) else type(state).__name__
        raise TupeError(
            f"{path}: not a fairseq checkpoint (expected a dict with 'args' and 'model', got {keys})"
        )
    if not isinstance(state["args"], argparse.Namespace):
        raise TupeError(
            f"{path}: 'args' is a {type(state['args']).__name__}, not the argparse.Namespace fairseq saves"
        )
    if not isinstance(state["model"], dict):
        raise TupeError(f"{path}: 'model' is a {type(state['model']).__name__}, not a state dict")
    return state


# ------------------------------------------------------------------------------------------------ dictionary


@dataclass
class FairseqDictionary:
    """The fairseq dictionary of a checkpoint: ids are list positions (specials, dict.txt, `<mask>` last)."""

    symbols: list[str]
    specials: list[str]
    path: str = ""
    extra_specials: list[str] = field(default_factory=list)

    def index(self, symbol: str) -> int:
        return self.symbols.index(symbol)


def _read_lines(path: Path, option: str) -> list[str]:
    """The lines of a UTF-8 text file given by `option`; a one-line error naming the option or the file."""
    if path.is_dir():
        raise TupeError(f"{option} {path}: a folder, not a file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TupeError(f"{option} {str(path)!r} does not exist") from None
    except UnicodeDecodeError as err:
        raise TupeError(f"{option} {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise TupeError(f"{option} {path}: cannot be read ({err.strerror or one_line(err)})") from None


def _read_entries(
    path: str | os.PathLike, option: str, parse: Callable[[str], Any], expected: str, kind: str, empty: str
) -> list:
    """The entries `parse` makes of a text file's non-blank lines, in order (it returns None for a malformed
    line); one-line errors naming the line of a malformed or repeated entry."""
    path = Path(path)
    entries: list = []
    seen: dict[Any, int] = {}
    for n, line in enumerate(_read_lines(path, option), 1):
        if not line.strip():
            continue
        entry = parse(line)
        if entry is None:
            raise TupeError(f"{path}: line {n}: expected {expected}, got {line[:60]!r}")
        if entry in seen:
            shown = " ".join(entry) if isinstance(entry, tuple) else entry
            raise TupeError(f"{path}: line {n}: {kind} {shown!r} repeats line {seen[entry]}")
        seen[entry] = n
        entries.append(entry)
    if not entries:
        raise TupeError(f"{path}: {empty}")
    return entries


def _dict_symbol(line: str) -> str | None:
    word, sep, count = line.rstrip("\r").rpartition(" ")
    return word if sep and word and count.lstrip("-").isdigit() else None


def read_dict_txt(path: str | os.PathLike) -> list[str]:
    """The symbols of a fairseq `dict.txt` (`<symbol> <count>` per line), in order; one-line errors naming the line."""
    return _read_entries(path, "--dict", _dict_symbol, "'<symbol> <count>'", "symbol", "no entries")


def build_dictionary(dict_txt: str | os.PathLike, vocab_size: int) -> FairseqDictionary:
    """The checkpoint's full dictionary: fairseq's specials, dict.txt, `<mask>` (added last by the masked-LM task).

    Stock fairseq has 4 specials (`<s> <pad> </s> <unk>`); the released fork adds `<file> <email> <url>` (7). Which
    one the checkpoint used follows from its embedding rows."""
    from tupe.modeling.tokenization_fairseq import FAIRSEQ_SPECIALS, MASK, RELEASED_EXTRA_SPECIALS

    entries = read_dict_txt(dict_txt)
    n_special = vocab_size - len(entries) - 1
    if n_special == len(FAIRSEQ_SPECIALS):
        extra: list[str] = []
    elif n_special == len(FAIRSEQ_SPECIALS) + len(RELEASED_EXTRA_SPECIALS):
        extra = list(RELEASED_EXTRA_SPECIALS)
    else:
        raise TupeError(
            f"{dict_txt}: {len(entries)} entries do not fit the checkpoint's {vocab_size} embedding rows (fairseq's "
            f"4 specials, or the released fork's 7, + dict.txt + <mask> would need {vocab_size - 5} or "
            f"{vocab_size - 8} entries): is it the dictionary this checkpoint was trained with?"
        )
    specials = list(FAIRSEQ_SPECIALS) + extra
    clash = [s for s in entries if s in specials or s == MASK]
    if clash:
        raise TupeError(f"{dict_txt}: lists the special symbol {clash[0]!r}, which fairseq adds itself")
    return FairseqDictionary(specials + entries + [MASK], specials, str(dict_txt), extra)


# ------------------------------------------------------------------------------------------------ config


def _arg(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def _int_arg(args: argparse.Namespace, name: str, default: int, ckpt: str) -> int:
    """An integer of the checkpoint's `args`: a string `"2"` or a float is named as such (it used to read
    `args.encoder_layers=2 but the weights hold 2 layers`)."""
    value = _arg(args, name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TupeError(f"{ckpt}: args.{name}={value!r} is a {type(value).__name__}, not an integer")
    return value


def _shape(sd: dict[str, torch.Tensor], key: str, ckpt: str) -> tuple[int, ...]:
    if key not in sd:
        raise TupeError(f"{ckpt}: missing tensor {key}")
    if not isinstance(sd[key], torch.Tensor):
        raise TupeError(f"{ckpt}: {key} is a {type(sd[key]).__name__}, not a tensor")
    return tuple(sd[key].shape)


def _representable_activation(args: argparse.Namespace, sd: dict[str, torch.Tensor], ckpt: str) -> str:
    """The checkpoint's activation; pre-LayerNorm layers, an unknown activation or a scaled embedding refused."""
    if _arg(args, "encoder_normalize_before", False):
        raise TupeError(
            f"{ckpt}: encoder_normalize_before=True (pre-LayerNorm layers) cannot be represented: tupe's layers "
            "are post-LayerNorm, as the released BERT-Base"
        )
    if any(k.startswith(ENC + "emb_out_layer_norm.") for k in sd):
        raise TupeError(
            f"{ckpt}: tensor {ENC}emb_out_layer_norm.weight (pre-LayerNorm encoder) cannot be represented"
        )
    act = _arg(args, "activation_fn", "gelu")
    if act not in ACTIVATIONS:
        raise TupeError(f"{ckpt}: activation_fn={act!r} is not one tupe has ({', '.join(ACTIVATIONS)})")
    if _arg(args, "embed_scale") not in (None, 1, 1.0):
        raise TupeError(f"{ckpt}: embed_scale={args.embed_scale!r} cannot be represented (tupe scales by 1)")
    return act


def _layer_count(args: argparse.Namespace, sd: dict[str, torch.Tensor], hidden: int, ckpt: str) -> int:
    """The encoder's layers, numbered 0..n-1 in the weights and agreeing with `args` (layers and width)."""
    layers = sorted(
        {int(k[len(ENC + "layers.") :].split(".")[0]) for k in sd if k.startswith(ENC + "layers.")}
    )
    if layers != list(range(len(layers))) or not layers:
        raise TupeError(f"{ckpt}: encoder layers {layers[:5]}... are not numbered 0..n-1")
    n_layers = len(layers)
    if _int_arg(args, "encoder_layers", n_layers, ckpt) != n_layers:
        raise TupeError(
            f"{ckpt}: args.encoder_layers={args.encoder_layers!r} but the weights hold {n_layers} layers"
        )
    if _int_arg(args, "encoder_embed_dim", hidden, ckpt) != hidden:
        raise TupeError(
            f"{ckpt}: args.encoder_embed_dim={args.encoder_embed_dim!r} but the embeddings are {hidden} wide"
        )
    return n_layers


def _head_count(args: argparse.Namespace, sd: dict[str, torch.Tensor], hidden: int, ckpt: str) -> int:
    """The attention heads: `args`, else the relative table's columns, else fairseq's bert_base default (12)."""
    heads = _arg(args, "encoder_attention_heads")
    if heads is None:  # not saved: the relative table's columns, else fairseq's bert_base default
        rel = sd.get(ENC + "relative_attention_bias.weight")
        heads = int(rel.shape[1]) if rel is not None and rel.dim() == 2 else 12
    if not isinstance(heads, int) or heads <= 0 or hidden % heads:
        raise TupeError(
            f"{ckpt}: args.encoder_attention_heads={heads!r} does not divide the hidden size {hidden}"
        )
    return heads


def _relative_buckets(
    args: argparse.Namespace, sd: dict[str, torch.Tensor], heads: int, ckpt: str
) -> tuple[bool, int]:
    """(TUPE-R: a relative bias table, its buckets): `args.rel_pos` and the table agree, and its shape fits."""
    rel_pos = bool(_arg(args, "rel_pos", False))
    has_rel = ENC + "relative_attention_bias.weight" in sd
    if rel_pos != has_rel:
        raise TupeError(
            f"{ckpt}: args.rel_pos={rel_pos} but the tensor {ENC}relative_attention_bias.weight is "
            f"{'present' if has_rel else 'missing'}"
        )
    buckets = 32
    if rel_pos:
        rows, cols = _shape(sd, ENC + "relative_attention_bias.weight", ckpt)
        if cols != heads or rows < 3 or (rows - 1) % 2:
            raise TupeError(
                f"{ckpt}: {ENC}relative_attention_bias.weight is {rows} x {cols}, expected (even buckets + 1) x {heads}"
            )
        buckets = rows - 1
    return rel_pos, buckets


def config_from_fairseq(
    args: argparse.Namespace, sd: dict[str, torch.Tensor], ckpt: str = "checkpoint"
) -> Any:
    """The `TupeConfig` of a released checkpoint, from its `args` and tensor shapes; what tupe cannot represent is
    refused, named."""
    from .configuration_tupe import TupeConfig

    act = _representable_activation(args, sd, ckpt)
    vocab, hidden = _shape(sd, ENC + "embed_tokens.weight", ckpt)
    pos_rows = _shape(sd, ENC + "pos.weight", ckpt)[0]
    n_layers = _layer_count(args, sd, hidden, ckpt)
    heads = _head_count(args, sd, hidden, ckpt)
    ffn = _shape(sd, ENC + "layers.0.fc1.weight", ckpt)[0]
    rel_pos, buckets = _relative_buckets(args, sd, heads, ckpt)
    max_positions = pos_rows - 1
    if _arg(args, "max_positions", max_positions) != max_positions:
        raise TupeError(
            f"{ckpt}: args.max_positions={args.max_positions} but {ENC}pos.weight has {pos_rows} rows "
            f"(max_positions + 1)"
        )
    dropout = float(_arg(args, "dropout", 0.1))
    return TupeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        hidden_act=ACTIVATIONS[act],
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=float(_arg(args, "attention_dropout", 0.1)),
        max_position_embeddings=max_positions,
        position_scheme="tupe-r" if rel_pos else "tupe-a",
        **(  # tupe-r's bucketing; tupe-a reads none of it
            {
                "relative_attention_num_buckets": buckets,
                "relative_attention_max_distance": int(_arg(args, "max_rel_pos", 128)),
            }
            if rel_pos
            else {}
        ),
        embedding_layer_norm=ENC + "emb_layer_norm.weight" in sd,
        layer_norm_eps=1e-5,  # fairseq's LayerNorm (and apex's FusedLayerNorm) default
        classifier_dropout=float(_arg(args, "pooler_dropout", dropout)),
        pad_token_id=1,  # fairseq Dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3
        cls_token_id=0,
        sep_token_id=2,
        bos_token_id=0,
        eos_token_id=2,
        mask_token_id=vocab - 1,  # the masked-LM task adds <mask> last
    )


# ------------------------------------------------------------------------------------------------ weights


def _released_buckets(n: int, buckets: int, max_distance: int) -> torch.Tensor:
    """The released `rp_bucket` table for n positions: T5 buckets of `j - i`, column 0 -> `buckets`, row 0 ->
    `buckets // 2` ([CLS] -> others, the bucket T5 never produces)."""
    from .positional import relative_position_bucket

    pos = torch.arange(n)
    table = relative_position_bucket(pos[None, :] - pos[:, None], buckets, max_distance)
    table[:, 0] = buckets
    table[0, :] = buckets // 2
    return table


POSITIONAL_LAYOUTS = {
    "released": ("pos_q_linear", "pos_k_linear"),  # guolinke/TUPE master (4c64ff7): the authors' checkpoint
    "fused": ("pos_proj",),  # the unmerged pull request of 2021-11-08
}


def positional_layout(sd: dict[str, torch.Tensor], ckpt: str = "checkpoint") -> str:
    """Which layout holds the positional projections `U^Q`, `U^K`: "released" (`pos_q_linear`, `pos_k_linear`)
    or "fused" (`pos_proj`), told apart by the key names; a state dict with both or neither is refused."""
    found = [
        name for name, modules in POSITIONAL_LAYOUTS.items() if any(f"{ENC}{m}.weight" in sd for m in modules)
    ]
    if len(found) == 1:
        return found[0]
    if found:
        raise TupeError(
            f"{ckpt}: holds both {ENC}pos_q_linear/pos_k_linear (the released layout) and {ENC}pos_proj (the fused "
            "one): not a checkpoint of either code"
        )
    raise TupeError(
        f"{ckpt}: missing tensor {ENC}pos_q_linear.weight (the released layout; {ENC}pos_proj.weight in the fused "
        "one): the positional projections U^Q, U^K"
    )


def _finite(t: Any, key: str, ckpt: str) -> torch.Tensor:
    """`t`, checked to be a tensor of finite values: a NaN or inf weight is named as such, before any comparison
    (NaN != NaN) could blame something else."""
    if not isinstance(t, torch.Tensor):
        raise TupeError(f"{ckpt}: {key} is a {type(t).__name__}, not a tensor")
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise TupeError(
            f"{ckpt}: tensor {key} holds non-finite weights ({bad} of {t.numel()} values NaN or inf): a diverged "
            "or damaged checkpoint; refusing to convert it"
        )
    return t


def encoder_tensors(
    sd: dict[str, torch.Tensor], config: Any, ckpt: str = "checkpoint"
) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The tupe tensors (`tupe.*` and `lm_head.*`) of a released state dict, and the released keys they used."""
    from .positional import scheme_class

    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in sd:
            raise TupeError(f"{ckpt}: missing tensor {key}")
        used.add(key)
        return _finite(sd[key], key, ckpt)

    H = config.hidden_size
    out: dict[str, torch.Tensor] = {}
    emb = take(ENC + "embed_tokens.weight")
    out["tupe.embeddings.word_embeddings.weight"] = emb
    if config.embedding_layer_norm:
        for p in ("weight", "bias"):
            out[f"tupe.embeddings.LayerNorm.{p}"] = take(ENC + f"emb_layer_norm.{p}")
    pos = take(ENC + "pos.weight")
    out["tupe.positional.untied.theta_positions"] = pos[0:2]  # rows 0, 1: theta_1, theta_2
    out["tupe.positional.untied.embeddings.weight"] = pos[1:]  # token t: released row t + 1
    layout = positional_layout(sd, ckpt)
    for p in ("weight", "bias"):
        out[f"tupe.positional.untied.LayerNorm.{p}"] = take(ENC + f"pos_ln.{p}")
        if layout == "released":
            query, key = take(ENC + f"pos_q_linear.{p}"), take(ENC + f"pos_k_linear.{p}")
        else:
            proj = take(ENC + f"pos_proj.{p}")
            if proj.shape[0] != 2 * H:
                raise TupeError(
                    f"{ckpt}: {ENC}pos_proj.{p} has {proj.shape[0]} rows, expected 2 x hidden = {2 * H} (U^Q, U^K)"
                )
            query, key = proj[:H], proj[H:]
        out[f"tupe.positional.untied.pos_query.{p}"] = query  # U^Q
        out[f"tupe.positional.untied.pos_key.{p}"] = key  # U^K
    if scheme_class(config.position_scheme).report.relative_bias:  # tupe-r
        out["tupe.positional.relative.bias.weight"] = take(ENC + "relative_attention_bias.weight")
        # the released code keeps rp_bucket as a plain attribute (not saved); the fused layout's pull request
        # registers it, so it is saved: tupe rebuilds the table either way and checks a saved one equal
        if ENC + "rp_bucket" in sd:
            saved = take(ENC + "rp_bucket")
            expected = _released_buckets(
                saved.shape[0], config.relative_attention_num_buckets, config.relative_attention_max_distance
            )
            if saved.shape != expected.shape or not torch.equal(saved.long(), expected):
                raise TupeError(
                    f"{ckpt}: {ENC}rp_bucket is not T5's bucketing with {config.relative_attention_num_buckets} "
                    f"buckets and max distance {config.relative_attention_max_distance} (+ the [CLS] rows): "
                    "cannot be represented"
                )
    for i in range(config.num_hidden_layers):
        src, dst = f"{ENC}layers.{i}.", f"tupe.layers.{i}."
        out[dst + "attention.qkv.weight"] = take(src + "self_attn.in_proj_weight")
        out[dst + "attention.qkv.bias"] = take(src + "self_attn.in_proj_bias")
        for p in ("weight", "bias"):
            out[dst + f"attention_output.{p}"] = take(src + f"self_attn.out_proj.{p}")
            out[dst + f"attention_norm.{p}"] = take(src + f"self_attn_layer_norm.{p}")
            out[dst + f"intermediate.{p}"] = take(src + f"fc1.{p}")
            out[dst + f"output.{p}"] = take(src + f"fc2.{p}")
            out[dst + f"output_norm.{p}"] = take(src + f"final_layer_norm.{p}")
    if HEAD + "weight" in sd:  # the tied projection, saved under both names
        if not torch.equal(take(HEAD + "weight"), emb):
            raise TupeError(
                f"{ckpt}: {HEAD}weight differs from the token embeddings: an untied LM head cannot be represented"
            )
    for p in ("weight", "bias"):
        out[f"lm_head.dense.{p}"] = take(HEAD + f"dense.{p}")
        out[f"lm_head.LayerNorm.{p}"] = take(HEAD + f"layer_norm.{p}")
    out["lm_head.bias"] = take(HEAD + "bias")
    out["lm_head.decoder.weight"] = emb
    return out, used


def classification_head_names(sd: dict[str, torch.Tensor]) -> list[str]:
    return sorted({k[len(CLS_HEADS) :].split(".")[0] for k in sd if k.startswith(CLS_HEADS)})


def _head_tensors(sd: dict[str, torch.Tensor], name: str, ckpt: str) -> tuple[dict, set]:
    """A released `BertClassificationHead` (dense -> tanh -> dropout -> out_proj) onto tupe's sentence head."""
    src = f"{CLS_HEADS}{name}."
    if src + "dense.weight" not in sd:
        raise TupeError(
            f"{ckpt}: classification head {name!r} has no {src}dense.weight (the early released head, dropout -> "
            "out_proj, without dense and tanh): tupe's sentence head cannot represent it"
        )
    out, used = {}, set()
    for p in ("weight", "bias"):
        for s, d in ((f"dense.{p}", f"classifier.dense.{p}"), (f"out_proj.{p}", f"classifier.out_proj.{p}")):
            if src + s not in sd:
                raise TupeError(f"{ckpt}: missing tensor {src}{s}")
            out[d] = _finite(sd[src + s], src + s, ckpt)
            used.add(src + s)
    return out, used


def _check_all_used(sd: dict[str, torch.Tensor], used: set[str], ckpt: str) -> None:
    unknown = sorted(k for k in sd if k not in used and not k.startswith(CLS_HEADS))
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise TupeError(f"{ckpt}: unknown tensor {unknown[0]}{more}: not part of the released TUPE encoder")


def _load(model: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    target = model.state_dict()
    for name, t in tensors.items():
        if name not in target:
            raise RuntimeError(f"tupe has no tensor {name} ({what})")  # a bug in this module, not user input
        if tuple(t.shape) != tuple(target[name].shape):
            raise TupeError(
                f"{what}: tensor for {name} has shape {list(t.shape)}, tupe expects {list(target[name].shape)}"
            )
    missing, unexpected = model.load_state_dict(
        {k: v.to(target[k].dtype) for k, v in tensors.items()}, strict=False
    )
    missing = [k for k in missing if k != "lm_head.decoder.weight"]
    if missing or unexpected:
        raise RuntimeError(f"conversion left tensors unset: missing={missing} unexpected={unexpected}")


def weights_dtype(sd: dict[str, torch.Tensor]) -> torch.dtype:
    """The precision to keep: float64 for a float64 checkpoint, else float32 (fp16/bf16 training checkpoints are
    widened exactly)."""
    floats = [t.dtype for t in sd.values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return torch.float64 if torch.float64 in floats else torch.float32


def _state(
    checkpoint: str | os.PathLike | dict, source: str | os.PathLike | None
) -> tuple[dict[str, Any], str]:
    """The loaded checkpoint and the name its errors start with: its path (`source` for a loaded dict)."""
    if isinstance(checkpoint, dict):
        return checkpoint, str(source) if source is not None else "checkpoint"
    return load_fairseq_checkpoint(checkpoint), str(checkpoint)


def masked_lm_from_fairseq(
    checkpoint: str | os.PathLike | dict,
    dictionary: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
    source: str | os.PathLike | None = None,
) -> TupeForMaskedLM:
    """`TupeForMaskedLM` with the weights of a released checkpoint (a path, or the loaded dict), in `dtype`
    (default: `weights_dtype`, so a float64 checkpoint is not rounded).

    `dictionary`: the checkpoint's `dict.txt`, checked against the embedding rows (and recorded in the config as
    `fairseq_dictionary`); the ids are fairseq's either way (`<pad>` 1, `<s>` 0, `</s>` 2, `<mask>` last).
    `source`: the file a loaded dict came from, which errors name."""
    from transformers import AutoModelForMaskedLM  # TupeForMaskedLM: modeling_tupe imports this module

    state, ckpt = _state(checkpoint, source)
    sd = state["model"]
    config = config_from_fairseq(state["args"], sd, ckpt)
    if dictionary is not None:
        build_dictionary(dictionary, config.vocab_size)
    model = AutoModelForMaskedLM.from_config(config).to(
        dtype or weights_dtype(sd)
    )  # before loading: no rounding
    tensors, used = encoder_tensors(sd, config, ckpt)
    _check_all_used(sd, used, ckpt)
    _load(model, tensors, ckpt)
    model.tie_weights()
    return model.eval()


def classifiers_from_fairseq(
    checkpoint: str | os.PathLike | dict,
    dtype: torch.dtype | None = None,
    source: str | os.PathLike | None = None,
) -> dict[str, TupeForSequenceClassification]:
    """One `TupeForSequenceClassification` per classification head of a released (fine-tuned) checkpoint
    (`source`: as for `masked_lm_from_fairseq`)."""
    from transformers import AutoModelForSequenceClassification  # as above: no import of modeling_tupe

    state, ckpt = _state(checkpoint, source)
    sd, args = state["model"], state["args"]
    names = classification_head_names(sd)
    if names and _arg(args, "pooler_activation_fn", "tanh") != "tanh":
        raise TupeError(
            f"{ckpt}: pooler_activation_fn={args.pooler_activation_fn!r}: tupe's sentence head uses tanh"
        )
    heads = {}
    for name in names:
        config = config_from_fairseq(args, sd, ckpt)
        config.num_labels = int(sd[f"{CLS_HEADS}{name}.out_proj.weight"].shape[0])
        model = AutoModelForSequenceClassification.from_config(config).to(dtype or weights_dtype(sd))
        tensors, _ = encoder_tensors(sd, config, ckpt)
        tensors = {k: v for k, v in tensors.items() if k.startswith("tupe.")}
        head, _ = _head_tensors(sd, name, ckpt)
        _load(model, {**tensors, **head}, f"{ckpt} head {name}")
        heads[name] = model.eval()
    return heads


# ------------------------------------------------------------------------------------------------ tokenizer


def _bpe_merge(line: str) -> tuple[str, str] | None:
    parts = line.split(" ")
    return (parts[0], parts[1]) if len(parts) in (2, 3) and all(parts[:2]) else None


def read_bpe_codes(path: str | os.PathLike) -> list[tuple[str, str]]:
    """The merges of a fastBPE codes file (`first second count` per line), in rank order; errors name the line."""
    return _read_entries(
        path, "--bpe-codes", _bpe_merge, "fastBPE's 'first second count'", "merge", "no BPE codes"
    )


def build_tokenizer(
    dictionary: FairseqDictionary,
    bpe_codes: str | os.PathLike,
    lowercase: bool = False,
    model_max_length: int = 512,
) -> Any:
    """The released pipeline's tokenizer (`FairseqMosesBPETokenizer`) for a dictionary and its BPE codes."""
    import json

    from tupe.modeling.tokenization_fairseq import FairseqMosesBPETokenizer, fairseq_to_xlm_piece

    merges = read_bpe_codes(bpe_codes)
    specials = set(dictionary.specials) | {dictionary.symbols[-1]}
    vocab: dict[str, int] = {}
    for i, sym in enumerate(dictionary.symbols):
        key = sym if sym in specials else fairseq_to_xlm_piece(sym)
        if key in vocab:
            raise TupeError(
                f"{dictionary.path}: entries {dictionary.symbols[vocab[key]]!r} and {sym!r} are the same piece"
            )
        vocab[key] = i
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file = Path(tmp) / "vocab.json", Path(tmp) / "merges.txt"
        vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        merges_file.write_text("".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
        tok = FairseqMosesBPETokenizer(
            str(vocab_file),
            str(merges_file),
            lowercase=lowercase,
            additional_special_tokens=dictionary.extra_specials,
            model_max_length=model_max_length,
        )
    return tok
