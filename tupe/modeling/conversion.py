"""Loading `transformers` BERT checkpoints as `bert-a` TUPE models (exact up to float rounding)."""

from __future__ import annotations

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


def bert_to_tupe(cls, model_or_path, **config_overrides):
    """Build `cls` (a TupePreTrainedModel class) with `position_scheme="bert-a"` from the BERT model of the matching
    class (`cls._bert_class`); the head's keys come from `cls._bert_head_keys` (tupe prefix <- BERT prefix)."""
    from .configuration_tupe import TupeConfig

    bert = _load_bert(cls._bert_class, model_or_path)
    bc = bert.config
    if getattr(bc, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"only absolute-position BERT can be converted, got {bc.position_embedding_type!r}")
    head = {f: getattr(bc, f) for f in _HEAD_FIELDS if getattr(bc, f, None) is not None}
    config = TupeConfig(
        vocab_size=bc.vocab_size,
        hidden_size=bc.hidden_size,
        num_hidden_layers=bc.num_hidden_layers,
        num_attention_heads=bc.num_attention_heads,
        intermediate_size=bc.intermediate_size,
        hidden_act=bc.hidden_act,
        hidden_dropout_prob=bc.hidden_dropout_prob,
        attention_probs_dropout_prob=bc.attention_probs_dropout_prob,
        max_position_embeddings=bc.max_position_embeddings,
        layer_norm_eps=bc.layer_norm_eps,
        initializer_range=bc.initializer_range,
        position_scheme="bert-a",
        embedding_layer_norm=True,
        pad_token_id=bc.pad_token_id if bc.pad_token_id is not None else 0,
        **{**head, **config_overrides},
    )
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
    for i in range(bc.num_hidden_layers):
        src, dst = f"{src_prefix}encoder.layer.{i}.", f"layers.{i}."
        for part in ("weight", "bias"):
            new[dst + f"attention.qkv.{part}"] = torch.cat(
                [sd[src + f"attention.self.{name}.{part}"] for name in ("query", "key", "value")]
            )
            new[dst + f"attention_output.{part}"] = sd[src + f"attention.output.dense.{part}"]
            new[dst + f"attention_norm.{part}"] = sd[src + f"attention.output.LayerNorm.{part}"]
            new[dst + f"intermediate.{part}"] = sd[src + f"intermediate.dense.{part}"]
            new[dst + f"output.{part}"] = sd[src + f"output.dense.{part}"]
            new[dst + f"output_norm.{part}"] = sd[src + f"output.LayerNorm.{part}"]
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
