"""Loading `transformers` BERT checkpoints as `bert-a` TUPE models (exact up to float rounding)."""

from __future__ import annotations

import torch


def bert_to_tupe(cls, model_or_path, **config_overrides):
    """Build `cls` (a TupeForMaskedLM class) with `position_scheme="bert-a"` from a `BertForMaskedLM`."""
    from transformers import BertForMaskedLM

    from .configuration_tupe import TupeConfig

    bert = model_or_path
    if not isinstance(bert, BertForMaskedLM):
        bert = BertForMaskedLM.from_pretrained(model_or_path)
    bc = bert.config
    if getattr(bc, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"only absolute-position BERT can be converted, got {bc.position_embedding_type!r}")
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
        **config_overrides,
    )
    model = cls(config)
    sd = bert.state_dict()
    emb = "bert.embeddings."
    new = {
        "tupe.embeddings.word_embeddings.weight": sd[emb + "word_embeddings.weight"],
        # token type 0 is added to every token: fold it into the position table
        "tupe.positional.embeddings.weight": sd[emb + "position_embeddings.weight"]
        + sd[emb + "token_type_embeddings.weight"][0],
        "tupe.embeddings.LayerNorm.weight": sd[emb + "LayerNorm.weight"],
        "tupe.embeddings.LayerNorm.bias": sd[emb + "LayerNorm.bias"],
    }
    for i in range(bc.num_hidden_layers):
        src, dst = f"bert.encoder.layer.{i}.", f"tupe.layers.{i}."
        for part in ("weight", "bias"):
            new[dst + f"attention.qkv.{part}"] = torch.cat(
                [sd[src + f"attention.self.{name}.{part}"] for name in ("query", "key", "value")]
            )
            new[dst + f"attention_output.{part}"] = sd[src + f"attention.output.dense.{part}"]
            new[dst + f"attention_norm.{part}"] = sd[src + f"attention.output.LayerNorm.{part}"]
            new[dst + f"intermediate.{part}"] = sd[src + f"intermediate.dense.{part}"]
            new[dst + f"output.{part}"] = sd[src + f"output.dense.{part}"]
            new[dst + f"output_norm.{part}"] = sd[src + f"output.LayerNorm.{part}"]
    head = "cls.predictions."
    for part in ("weight", "bias"):
        new[f"lm_head.dense.{part}"] = sd[head + f"transform.dense.{part}"]
        new[f"lm_head.LayerNorm.{part}"] = sd[head + f"transform.LayerNorm.{part}"]
    new["lm_head.bias"] = sd[head + "bias"]
    new["lm_head.decoder.weight"] = sd[emb + "word_embeddings.weight"]
    missing, unexpected = model.load_state_dict(new, strict=False)
    missing = [k for k in missing if k != "lm_head.decoder.weight"]
    if missing or unexpected:
        raise RuntimeError(f"BERT conversion left weights unset: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    return model
