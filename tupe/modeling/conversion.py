"""Loading `transformers` BERT checkpoints as `bert-a` TUPE models (exact up to float rounding)."""

from __future__ import annotations

from typing import Any

import torch

# BertConfig fields a head takes over as they are (the head's shape and labels)
_HEAD_FIELDS = ("num_labels", "id2label", "label2id", "problem_type", "classifier_dropout")


def _load_bert(class_name: str, model_or_path):
    """A BERT model instance: `model_or_path` itself, or loaded from a local path with `class_name`."""
    import transformers
    from transformers import BertPreTrainedModel

    if isinstance(model_or_path, BertPreTrainedModel):
        return model_or_path
    return getattr(transformers, class_name).from_pretrained(model_or_path)


def _shared_config(src) -> dict:
    """The TupeConfig values a BERT or DeBERTa-v2 config carries under the same names (encoder shape, dropout,
    norms), with a post-LN embedding norm as both have."""
    fields = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "max_position_embeddings",
        "layer_norm_eps",
        "initializer_range",
    )
    values = {f: getattr(src, f) for f in fields}
    return dict(
        values,
        embedding_layer_norm=True,
        pad_token_id=src.pad_token_id if src.pad_token_id is not None else 0,
    )


def _encoder_layers(sd: dict, src_layer: str, num_layers: int, qkv: str) -> dict:
    """Tupe's encoder-layer weights from a BERT-layout state dict (DeBERTa-v2 shares it): layer i's keys start
    with `{src_layer}{i}.`; `qkv` names a query/key/value projection from `{name}` ("{name}" in BERT,
    "{name}_proj" in DeBERTa-v2). Q, K and V are stacked into tupe's one `qkv` projection."""
    new = {}
    for i in range(num_layers):
        src, dst = f"{src_layer}{i}.", f"layers.{i}."
        for part in ("weight", "bias"):
            new[dst + f"attention.qkv.{part}"] = torch.cat(
                [
                    sd[src + f"attention.self.{qkv.format(name=name)}.{part}"]
                    for name in ("query", "key", "value")
                ]
            )
            new[dst + f"attention_output.{part}"] = sd[src + f"attention.output.dense.{part}"]
            new[dst + f"attention_norm.{part}"] = sd[src + f"attention.output.LayerNorm.{part}"]
            new[dst + f"intermediate.{part}"] = sd[src + f"intermediate.dense.{part}"]
            new[dst + f"output.{part}"] = sd[src + f"output.dense.{part}"]
            new[dst + f"output_norm.{part}"] = sd[src + f"output.LayerNorm.{part}"]
    return new


# The special tokens whose ids a converted config carries (`{name}_token_id`), as a BERT tokenizer names them
SPECIAL_TOKENS = ("pad", "cls", "sep", "mask", "unk")


def _folder_tokenizer(path) -> Any:
    """The tokenizer saved in the folder `path` (never code of its own), or None where it has none it can load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception:  # noqa: BLE001 - no tokenizer files, or unreadable ones: the ids then come from the config
        return None


def special_token_ids(bert_config, tokenizer=None) -> dict[str, int]:
    """The ids of BERT's special tokens for a converted config (`pad_token_id`, `cls_token_id`, ...): the
    tokenizer's (BERT checkpoints of Google's vocabulary have [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102,
    [MASK] 103, tupe's own 0-3), the padding id the BERT config's own where it gives one; without a tokenizer the
    BERT config's padding id only, the others left to TupeConfig's defaults."""
    ids = {}
    for name in SPECIAL_TOKENS:
        value = getattr(tokenizer, f"{name}_token_id", None) if tokenizer is not None else None
        if isinstance(value, int):
            ids[f"{name}_token_id"] = value
    if bert_config.pad_token_id is not None:
        ids["pad_token_id"] = bert_config.pad_token_id
    return ids


def bert_to_tupe(cls, model_or_path, tokenizer=None, **config_overrides):
    """Build `cls` (a TupePreTrainedModel class) with `position_scheme="bert-a"` from the BERT model of the matching
    class (`cls._bert_class`); the head's keys come from `cls._bert_head_keys` (tupe prefix <- BERT prefix). The
    special-token ids are `tokenizer`'s, or those of the tokenizer saved in the folder `model_or_path`
    (`special_token_ids`)."""
    from .configuration_tupe import TupeConfig

    bert = _load_bert(cls._bert_class, model_or_path)
    bc = bert.config
    if getattr(bc, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"only absolute-position BERT can be converted, got {bc.position_embedding_type!r}")
    if tokenizer is None and not isinstance(model_or_path, torch.nn.Module):
        tokenizer = _folder_tokenizer(model_or_path)
    head = {f: getattr(bc, f) for f in _HEAD_FIELDS if getattr(bc, f, None) is not None}
    shared = _shared_config(bc) | special_token_ids(bc, tokenizer)
    config = TupeConfig(**shared, position_scheme="bert-a", **{**head, **config_overrides})
    model = cls(config)
    sd = bert.state_dict()
    # a bare BertModel has no "bert." prefix; tupe's bare TupeModel none either
    src_prefix = "bert." if any(k.startswith("bert.") for k in sd) else ""
    dst_prefix = "" if cls.base_model_prefix not in dict(model.named_children()) else "tupe."
    emb = src_prefix + "embeddings."
    new = {
        "embeddings.word_embeddings.weight": sd[emb + "word_embeddings.weight"],
        # token type 0 is added to every token: fold it into the position table
        "positional.embeddings.weight": sd[emb + "position_embeddings.weight"]
        + sd[emb + "token_type_embeddings.weight"][0],
        "embeddings.LayerNorm.weight": sd[emb + "LayerNorm.weight"],
        "embeddings.LayerNorm.bias": sd[emb + "LayerNorm.bias"],
    }
    new.update(_encoder_layers(sd, f"{src_prefix}encoder.layer.", bc.num_hidden_layers, "{name}"))
    new = {dst_prefix + k: v for k, v in new.items()}
    for tupe_name, bert_name in cls._bert_head_keys.items():
        found = {
            k[len(bert_name) :]: v for k, v in sd.items() if k == bert_name or k.startswith(bert_name + ".")
        }
        if not found:
            raise ValueError(
                f"{type(bert).__name__} has no {bert_name!r} weights for {cls.__name__}.{tupe_name}; "
                f"convert a {cls._bert_class}"
            )
        new.update({tupe_name + suffix: v for suffix, v in found.items()})
    tied = set(getattr(cls, "_tied_weights_keys", None) or {})
    missing, unexpected = model.load_state_dict(new, strict=False)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise RuntimeError(f"BERT conversion left weights unset: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    return model


# ------------------------------------------------------------------------------------------------------------------
# DeBERTa-v2/v3 -> deberta
# ------------------------------------------------------------------------------------------------------------------

# tupe's masked-LM head <- DeBERTa's, for its two layouts (`DebertaV2Config.legacy`: `cls.predictions`, BERT's
# layout; otherwise `lm_predictions.lm_head`, the original DeBERTa code's).
_DEBERTA_MLM_HEADS = {
    "cls.predictions.": {
        "lm_head.dense": "transform.dense",
        "lm_head.LayerNorm": "transform.LayerNorm",
        "lm_head.bias": "bias",
    },
    "lm_predictions.lm_head.": {
        "lm_head.dense": "dense",
        "lm_head.LayerNorm": "LayerNorm",
        "lm_head.bias": "bias",
    },
}


def deberta_refusals(dc) -> list[str]:
    """What of a `DebertaV2Config` the `deberta` scheme cannot represent (empty: it converts exactly)."""
    hidden, heads = dc.hidden_size, dc.num_attention_heads
    checks = [
        (
            getattr(dc, "relative_attention", False),
            "relative_attention=False (no disentangled attention at all)",
        ),
        (
            sorted(dc.pos_att_type or []) == ["c2p", "p2c"],
            f"pos_att_type={dc.pos_att_type!r} (only both c2p and p2c)",
        ),
        (getattr(dc, "share_att_key", False), "share_att_key=False (per-layer positional projections)"),
        (
            not getattr(dc, "position_biased_input", True),
            "position_biased_input=True (absolute positions added to the input)",
        ),
        (
            "layer_norm" in str(getattr(dc, "norm_rel_ebd", "none")).lower(),
            f"norm_rel_ebd={getattr(dc, 'norm_rel_ebd', 'none')!r} (only 'layer_norm')",
        ),
        (getattr(dc, "conv_kernel_size", 0) <= 0, "conv_kernel_size > 0 (DeBERTa-v2's convolution layer)"),
        (getattr(dc, "embedding_size", hidden) == hidden, "embedding_size != hidden_size (embed_proj)"),
        (dc.type_vocab_size == 0, f"type_vocab_size={dc.type_vocab_size} (token-type embeddings)"),
        (
            getattr(dc, "attention_head_size", hidden // heads) == hidden // heads,
            "attention_head_size != hidden_size / num_attention_heads",
        ),
        (getattr(dc, "z_steps", 0) <= 1, "z_steps > 1"),
    ]
    return [why for ok, why in checks if not ok]


def deberta_to_tupe(cls, model_or_path, **config_overrides):
    """Build `cls` (`TupeModel` or `TupeForMaskedLM`) with `position_scheme="deberta"` from a `transformers`
    `DebertaV2Model` / `DebertaV2ForMaskedLM` (an instance or a local folder); exact up to float rounding."""
    import transformers

    from .configuration_tupe import TupeConfig

    masked_lm = "lm_head.dense" in {k for k, _ in cls._deberta_head_keys}
    if isinstance(model_or_path, transformers.DebertaV2PreTrainedModel):
        deberta = model_or_path
    else:
        name = "DebertaV2ForMaskedLM" if masked_lm else "DebertaV2Model"
        deberta = getattr(transformers, name).from_pretrained(model_or_path)
    dc = deberta.config
    refusals = deberta_refusals(dc)
    if refusals:
        source = model_or_path if isinstance(model_or_path, str) else type(deberta).__name__
        raise ValueError(
            f"{source}: the deberta scheme cannot represent this DeBERTa configuration: "
            + "; ".join(refusals)
        )
    config = TupeConfig(
        **_shared_config(dc),
        position_scheme="deberta",
        position_buckets=getattr(dc, "position_buckets", -1),
        max_relative_positions=dc.max_relative_positions,
        **config_overrides,
    )
    model = cls(config).to(deberta.dtype)  # the source's precision (a float64 model stays exact)
    sd = deberta.state_dict()
    src_prefix = "deberta." if any(k.startswith("deberta.") for k in sd) else ""
    dst_prefix = "" if cls.base_model_prefix not in dict(model.named_children()) else "tupe."
    emb, enc = src_prefix + "embeddings.", src_prefix + "encoder."
    new = {
        "embeddings.word_embeddings.weight": sd[emb + "word_embeddings.weight"],
        "embeddings.LayerNorm.weight": sd[emb + "LayerNorm.weight"],
        "embeddings.LayerNorm.bias": sd[emb + "LayerNorm.bias"],
        "positional.relative.rel_embeddings.weight": sd[enc + "rel_embeddings.weight"],
        "positional.relative.LayerNorm.weight": sd[enc + "LayerNorm.weight"],
        "positional.relative.LayerNorm.bias": sd[enc + "LayerNorm.bias"],
    }
    new.update(_encoder_layers(sd, f"{enc}layer.", dc.num_hidden_layers, "{name}_proj"))
    new = {dst_prefix + k: v for k, v in new.items()}
    if masked_lm:
        head = next((p for p in _DEBERTA_MLM_HEADS if any(k.startswith(p) for k in sd)), None)
        if head is None:
            raise ValueError(
                f"{type(deberta).__name__} has no masked-LM head; convert a DebertaV2ForMaskedLM"
            )
        for tupe_name, name in _DEBERTA_MLM_HEADS[head].items():
            found = {k[len(head + name) :]: v for k, v in sd.items() if k.startswith(head + name)}
            new.update({tupe_name + suffix: v for suffix, v in found.items()})
        decoder = sd.get(head + "decoder.weight")
        if decoder is not None and not torch.equal(decoder, sd[emb + "word_embeddings.weight"]):
            raise ValueError(
                "the DeBERTa decoder is not tied to the word embeddings; tupe's masked-LM head is"
            )
    tied = set(getattr(cls, "_tied_weights_keys", None) or {})
    missing, unexpected = model.load_state_dict(new, strict=False)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise RuntimeError(
            f"DeBERTa conversion left weights unset: missing={missing} unexpected={unexpected}"
        )
    model.tie_weights()
    return model
