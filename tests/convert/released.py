"""A small checkpoint of the released TUPE format and the released forward, written here from the released
equations (guolinke/TUPE: `transformer_sentence_encoder.py`, `transformer_sentence_encoder_layer.py`,
`multihead_attention.py`, `models/bert/model.py`), sharing no code with `tupe`.

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
        save_dir="/tmp/ckpt",
        keep_updates_list=[100000, 300000],
        max_source_positions=24,
    )
    args.update(overrides)
    return argparse.Namespace(**args)


def random_state_dict(
    args: argparse.Namespace,
    vocab: int,
    heads: dict[str, int] | None = None,
    seed: int = 0,
    scale: float = 0.3,
):
    """The released `BertModel`'s state dict with random weights (LayerNorms included, so none is trivial)."""
    g = torch.Generator().manual_seed(seed)
    H, F, L = args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_layers

    def r(*shape, scale=scale):
        return torch.randn(*shape, generator=g) * scale

    sd = OrderedDict()
    emb = r(vocab, H)
    sd[ENC + "embed_tokens.weight"] = emb
    sd[ENC + "pos.weight"] = r(args.max_positions + 1, H)
    sd[ENC + "pos_proj.weight"] = r(2 * H, H)
    sd[ENC + "pos_proj.bias"] = r(2 * H)
    sd[ENC + "pos_ln.weight"] = 1 + r(H)
    sd[ENC + "pos_ln.bias"] = r(H)
    for i in range(L):
        p = f"{ENC}layers.{i}."
        sd[p + "self_attn.in_proj_weight"] = r(3 * H, H)
        sd[p + "self_attn.in_proj_bias"] = r(3 * H)
        sd[p + "self_attn.out_proj.weight"] = r(H, H)
        sd[p + "self_attn.out_proj.bias"] = r(H)
        sd[p + "self_attn_layer_norm.weight"] = 1 + r(H)
        sd[p + "self_attn_layer_norm.bias"] = r(H)
        sd[p + "fc1.weight"] = r(F, H)
        sd[p + "fc1.bias"] = r(F)
        sd[p + "fc2.weight"] = r(H, F)
        sd[p + "fc2.bias"] = r(H)
        sd[p + "final_layer_norm.weight"] = 1 + r(H)
        sd[p + "final_layer_norm.bias"] = r(H)
    if args.embedding_normalize:
        sd[ENC + "emb_layer_norm.weight"] = 1 + r(H)
        sd[ENC + "emb_layer_norm.bias"] = r(H)
    if args.rel_pos:
        sd[ENC + "relative_attention_bias.weight"] = r(33, args.encoder_attention_heads, scale=1.0)
        sd[ENC + "rp_bucket"] = released_rp_bucket(args.max_positions)
    sd["decoder.lm_head.weight"] = emb  # tied: the same tensor under both names
    sd["decoder.lm_head.bias"] = r(vocab)
    sd["decoder.lm_head.dense.weight"] = r(H, H)
    sd["decoder.lm_head.dense.bias"] = r(H)
    sd["decoder.lm_head.layer_norm.weight"] = 1 + r(H)
    sd["decoder.lm_head.layer_norm.bias"] = r(H)
    for name, classes in (heads or {}).items():
        sd[f"classification_heads.{name}.dense.weight"] = r(H, H)
        sd[f"classification_heads.{name}.dense.bias"] = r(H)
        sd[f"classification_heads.{name}.out_proj.weight"] = r(classes, H)
        sd[f"classification_heads.{name}.out_proj.bias"] = r(classes)
    return sd


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
