"""A small checkpoint of the released TUPE format and the released forward, written here from the released
equations (guolinke/TUPE: `transformer_sentence_encoder.py`, `transformer_sentence_encoder_layer.py`,
`multihead_attention.py`, `models/bert/model.py`), sharing no code with `tupe`.

Two layouts of the positional projections (`random_state_dict(layout=...)`):
- "released": the repository's default branch, `master` at 4c64ff7 (2021-06-28), which the authors' checkpoint
  was trained and saved with. The state dict is built from that code's module definitions, cited by file and line
  below (`fairseq/modules/transformer_sentence_encoder.py` is `TSE.py` in the citations): two projections
  `pos_q_linear`, `pos_k_linear`, and `rp_bucket` a plain tensor attribute, so not in the state dict.
- "fused": an unmerged pull request to that repository (commits 000ded0, b5b1e0b of 2021-11-08): one
  `pos_proj` (H -> 2H) and `rp_bucket` registered, so saved.

The checkpoint is what fairseq's `save_state` writes: `args` (an `argparse.Namespace`), `model` (the state dict of
the released `BertModel`, with its key names), the optimizer history and `extra_state` (with the training meters,
pickled as `fairseq.meters.*` objects).
"""

from __future__ import annotations

import argparse
import math
import sys
import types
from collections import OrderedDict

import torch

ENC = "decoder.sentence_encoder."
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<file>", "<email>", "<url>"]  # the released fork's Dictionary


def released_bucket(
    relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """The released `relative_position_bucket` (T5's, bidirectional), transcribed."""
    ret = 0
    n = -relative_position
    num_buckets //= 2
    ret += (n < 0).to(torch.long) * num_buckets
    n = torch.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    return ret + torch.where(is_small, n, val_if_large)


def released_rp_bucket(max_seq_len: int, bins: int = 32, max_rel_pos: int = 128) -> torch.Tensor:
    pos = torch.arange(max_seq_len, dtype=torch.long)
    table = released_bucket(pos[None, :] - pos[:, None], bins, max_rel_pos)
    table[:, 0] = bins  # others -> [CLS]
    table[0, :] = bins // 2  # [CLS] -> others
    return table


def fairseq_args(**overrides) -> argparse.Namespace:
    """`args` as fairseq's `train.py` saves them for `--arch bert_base --task masked_lm` (a representative subset)."""
    args = dict(
        arch="bert_base",
        task="masked_lm",
        criterion="masked_lm",
        encoder_layers=2,
        encoder_embed_dim=16,
        encoder_ffn_embed_dim=32,
        encoder_attention_heads=4,
        activation_fn="gelu",
        pooler_activation_fn="tanh",
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.0,
        pooler_dropout=0.1,
        encoder_normalize_before=False,
        embedding_normalize=True,
        max_positions=24,
        tokens_per_sample=24,
        rel_pos=True,
        fp16=True,
        lr=[0.0001],
        adam_betas="(0.9, 0.999)",
        mask_prob=0.15,
        seed=1,
        save_dir="ckpt",
        keep_updates_list=[100000, 300000],
        max_source_positions=24,
    )
    args.update(overrides)
    return argparse.Namespace(**args)


def released_state_dict(
    args: argparse.Namespace,
    vocab: int,
    heads: dict[str, int] | None = None,
    seed: int = 0,
    scale: float = 0.3,
) -> OrderedDict:
    """The state dict `BertModel.state_dict()` gives on guolinke/TUPE `master` (4c64ff7), random weights: every
    module the released `__init__`s register, with their names and shapes, in registration order.

    `BertModel` (models/bert/model.py): `decoder` = `BertEncoder` (l.81, via FairseqLanguageModel) holding
    `sentence_encoder` (l.220-236: `TransformerSentenceEncoder(padding_idx=dictionary.pad(), vocab_size=
    len(dictionary), num_encoder_layers=args.encoder_layers, embedding_dim=args.encoder_embed_dim,
    ffn_embedding_dim=args.encoder_ffn_embed_dim, num_attention_heads=args.encoder_attention_heads,
    max_seq_len=args.max_positions, embedding_normalize=args.embedding_normalize, rel_pos=args.rel_pos, ...)`, so
    `rel_pos_bins` and `max_rel_pos` keep their defaults 32 and 128, TSE.py l.110-111) and `lm_head` (l.237-242,
    its `weight` the embedding's own Parameter); `classification_heads` (l.34, l.106-112)."""
    g = torch.Generator().manual_seed(seed)
    H, F, L = args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_layers
    heads_n = args.encoder_attention_heads

    def r(*shape: int, s: float = scale) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * s

    def linear(name: str, n_in: int, n_out: int) -> None:
        """nn.Linear(n_in, n_out): weight (out, in), bias (out)."""
        sd[name + ".weight"], sd[name + ".bias"] = r(n_out, n_in), r(n_out)

    def layer_norm(name: str) -> None:
        """fairseq's LayerNorm(H): weight, bias (H)."""
        sd[name + ".weight"], sd[name + ".bias"] = 1 + r(H), r(H)

    sd: OrderedDict = OrderedDict()
    emb = r(vocab, H)
    emb[1] = 0  # nn.Embedding(vocab, H, padding_idx) (TSE.py l.122-124): the <pad> row stays 0 (l.38-39)
    sd[ENC + "embed_tokens.weight"] = emb
    sd[ENC + "pos.weight"] = r(args.max_positions + 1, H)  # nn.Embedding(max_seq_len + 1, H), TSE.py l.129
    linear(ENC + "pos_q_linear", H, H)  # nn.Linear(H, H), TSE.py l.130
    linear(ENC + "pos_k_linear", H, H)  # nn.Linear(H, H), TSE.py l.131
    layer_norm(ENC + "pos_ln")  # TSE.py l.133
    for i in range(L):  # nn.ModuleList of TransformerSentenceEncoderLayer, TSE.py l.134-150
        p = f"{ENC}layers.{i}."
        # MultiheadAttention (multihead_attention.py l.155-162): in_proj_weight (3H, H), in_proj_bias (3H),
        # out_proj = nn.Linear(H, H); no bias_k / bias_v (add_bias_kv False)
        sd[p + "self_attn.in_proj_weight"], sd[p + "self_attn.in_proj_bias"] = r(3 * H, H), r(3 * H)
        linear(p + "self_attn.out_proj", H, H)
        layer_norm(p + "self_attn_layer_norm")  # transformer_sentence_encoder_layer.py l.56
        linear(p + "fc1", H, F)  # l.57
        linear(p + "fc2", F, H)  # l.58
        layer_norm(p + "final_layer_norm")  # l.61
    if args.embedding_normalize:
        layer_norm(ENC + "emb_layer_norm")  # TSE.py l.152-153
    if args.encoder_normalize_before:
        layer_norm(ENC + "emb_out_layer_norm")  # TSE.py l.157-158
    if args.rel_pos:
        # nn.Embedding(rel_pos_bins + 1, heads), TSE.py l.171; rp_bucket (l.176-184) is a plain attribute: not saved
        sd[ENC + "relative_attention_bias.weight"] = r(32 + 1, heads_n, s=1.0)
    # BertLMHead (models/bert/model.py l.166-175): its own Parameters (weight: the embedding's, l.241; bias) come
    # before its submodules dense (l.168) and layer_norm (l.170) in state_dict order
    sd["decoder.lm_head.weight"] = emb
    sd["decoder.lm_head.bias"] = r(vocab)
    linear("decoder.lm_head.dense", H, H)
    layer_norm("decoder.lm_head.layer_norm")
    for name, classes in (heads or {}).items():  # BertClassificationHead, models/bert/model.py l.194-199
        linear(f"classification_heads.{name}.dense", H, H)
        linear(f"classification_heads.{name}.out_proj", H, classes)
    return sd


def fused_state_dict(
    args: argparse.Namespace,
    vocab: int,
    heads: dict[str, int] | None = None,
    seed: int = 0,
    scale: float = 0.3,
) -> OrderedDict:
    """The pull request's layout of the same model: `pos_proj` (H -> 2H: U^Q rows, then U^K rows) in place of the
    two projections, and `rp_bucket` saved."""
    sd = released_state_dict(args, vocab, heads, seed, scale)
    out: OrderedDict = OrderedDict()
    for key, value in sd.items():
        if key.startswith(ENC + "pos_k_linear."):
            continue
        if key.startswith(ENC + "pos_q_linear."):
            p = key.rsplit(".", 1)[1]
            out[f"{ENC}pos_proj.{p}"] = torch.cat(
                [sd[f"{ENC}pos_q_linear.{p}"], sd[f"{ENC}pos_k_linear.{p}"]]
            )
            continue
        out[key] = value
        if key == ENC + "relative_attention_bias.weight":
            out[ENC + "rp_bucket"] = released_rp_bucket(args.max_positions)
    return out


def random_state_dict(
    args: argparse.Namespace,
    vocab: int,
    heads: dict[str, int] | None = None,
    seed: int = 0,
    scale: float = 0.3,
    layout: str = "released",
) -> OrderedDict:
    """A state dict of the `layout` ("released" or "fused") with random weights (LayerNorms included, so none
    is trivial)."""
    build = {"released": released_state_dict, "fused": fused_state_dict}[layout]
    return build(args, vocab, heads, seed, scale)


def _fake_fairseq_meters() -> types.ModuleType:
    """`fairseq.meters` as a module of plain classes, so the saved pickle names them as fairseq's does."""
    meters = types.ModuleType("fairseq.meters")
    for name in ("AverageMeter", "TimeMeter", "StopwatchMeter"):
        cls = type(name, (), {"__module__": "fairseq.meters"})
        setattr(meters, name, cls)
    return meters


def save_checkpoint(path, args: argparse.Namespace, sd) -> None:
    """`torch.save` of the dict fairseq's `save_state` writes, training meters included; `fairseq` is only faked
    while saving, so loading must not need it."""
    meters = _fake_fairseq_meters()
    fairseq = types.ModuleType("fairseq")
    fairseq.meters = meters
    saved = {k: sys.modules.get(k) for k in ("fairseq", "fairseq.meters")}
    sys.modules["fairseq"], sys.modules["fairseq.meters"] = fairseq, meters
    try:
        avg = meters.AverageMeter()
        avg.__dict__.update(val=2.5, avg=2.7, sum=27.0, count=10)
        wall = meters.TimeMeter()
        wall.__dict__.update(init=0, start=1.6e9, n=3)
        stop = meters.StopwatchMeter()
        stop.__dict__.update(sum=12.5, n=4, start_time=None)
        state = {
            "args": args,
            "model": sd,
            "optimizer_history": [
                {
                    "criterion_name": "MaskedLmLoss",
                    "optimizer_name": "FairseqAdam",
                    "lr_scheduler_state": {"best": 2.7},
                    "num_updates": 1000,
                }
            ],
            "extra_state": {
                "train_iterator": {"epoch": 3, "iterations_in_epoch": 17},
                "val_loss": 2.7,
                "best": 2.7,
                "train_meters": OrderedDict(train_loss=avg, wall=wall, train_wall=stop),
            },
            "last_optimizer_state": {"state": {}, "param_groups": [{"lr": 1e-4, "params": [0, 1]}]},
        }
        torch.save(state, str(path))
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


# ------------------------------------------------------------------------------------------ released forward


def _ln(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def released_forward(
    sd, args: argparse.Namespace, tokens: torch.Tensor, padding_idx: int = 1, head: str | None = None
):
    """The released `BertModel` forward in float64, eval mode: masked-LM logits (B, T, V), or with `head` the
    classification head's logits (B, classes)."""
    g = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
    B, T = tokens.shape
    H, h = args.encoder_embed_dim, args.encoder_attention_heads
    d = H // h
    scaling = (d * 2) ** -0.5  # attn_scale_factor = 2, in the attention and pos_scaling alike
    padding = tokens.eq(padding_idx)

    x = g[ENC + "embed_tokens.weight"][tokens]
    if args.embedding_normalize:
        x = _ln(x, g[ENC + "emb_layer_norm.weight"], g[ENC + "emb_layer_norm.bias"])
    x = x * (1 - padding.unsqueeze(-1).double())  # the released code zeroes padded positions

    # positional term: pos_ln(pos[:T+1]) projected, token t on row t+1, rows 0/1 give the [CLS] values
    w = _ln(g[ENC + "pos.weight"][: T + 1], g[ENC + "pos_ln.weight"], g[ENC + "pos_ln.bias"])
    if (
        ENC + "pos_q_linear.weight" in sd
    ):  # released (TSE.py l.229-231): each projection viewed as (T+1, h, d)
        pos_q = (w @ g[ENC + "pos_q_linear.weight"].T + g[ENC + "pos_q_linear.bias"]).reshape(T + 1, h, d)
        pos_k = (w @ g[ENC + "pos_k_linear.weight"].T + g[ENC + "pos_k_linear.bias"]).reshape(T + 1, h, d)
        pos_q, pos_k = pos_q.transpose(0, 1) * scaling, pos_k.transpose(0, 1)  # (h, T+1, d)
    else:  # fused: one projection, its first H outputs U^Q, the rest U^K
        proj = (w @ g[ENC + "pos_proj.weight"].T + g[ENC + "pos_proj.bias"]).reshape(T + 1, 2, h, d)
        pos_q, pos_k = proj[:, 0].permute(1, 0, 2) * scaling, proj[:, 1].permute(1, 0, 2)  # (h, T+1, d)
    full = pos_q @ pos_k.transpose(1, 2)
    cls_2_other, other_2_cls = full[:, 0, 0].clone(), full[:, 1, 1].clone()
    bias = full[:, 1:, 1:].clone()
    bias[:, :, 0] = other_2_cls[:, None]
    bias[:, 0, :] = cls_2_other[:, None]
    if args.rel_pos:
        buckets = released_rp_bucket(args.max_positions)[
            :T, :T
        ]  # the 33-row table: 32 for column 0, 16 for row 0
        bias = bias + g[ENC + "relative_attention_bias.weight"][buckets].permute(2, 0, 1)

    for i in range(args.encoder_layers):
        p = f"{ENC}layers.{i}."
        q, k, v = (x @ g[p + "self_attn.in_proj_weight"].T + g[p + "self_attn.in_proj_bias"]).chunk(3, dim=-1)
        q = q * scaling  # after the in-projection bias
        q, k, v = (t.reshape(B, T, h, d).transpose(1, 2) for t in (q, k, v))
        logits = q @ k.transpose(-1, -2) + bias
        logits = logits.masked_fill(padding[:, None, None, :], float("-inf"))
        attn = (torch.softmax(logits, dim=-1) @ v).transpose(1, 2).reshape(B, T, H)
        attn = attn @ g[p + "self_attn.out_proj.weight"].T + g[p + "self_attn.out_proj.bias"]
        x = _ln(x + attn, g[p + "self_attn_layer_norm.weight"], g[p + "self_attn_layer_norm.bias"])  # post-LN
        ffn = _gelu(x @ g[p + "fc1.weight"].T + g[p + "fc1.bias"]) @ g[p + "fc2.weight"].T + g[p + "fc2.bias"]
        x = _ln(x + ffn, g[p + "final_layer_norm.weight"], g[p + "final_layer_norm.bias"])

    if head is not None:
        c = f"classification_heads.{head}."
        y = torch.tanh(x[:, 0] @ g[c + "dense.weight"].T + g[c + "dense.bias"])
        return y @ g[c + "out_proj.weight"].T + g[c + "out_proj.bias"]
    y = _gelu(x @ g["decoder.lm_head.dense.weight"].T + g["decoder.lm_head.dense.bias"])
    y = _ln(y, g["decoder.lm_head.layer_norm.weight"], g["decoder.lm_head.layer_norm.bias"])
    return y @ g["decoder.lm_head.weight"].T + g["decoder.lm_head.bias"]
