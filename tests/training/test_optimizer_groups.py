"""The optimizer's parameter groups: positional tables decayed (as in the released code), lr scale, hf-bert."""

from __future__ import annotations

import pytest
import torch

from tupe.modeling import TupeConfig, TupeForMaskedLM
from tupe.training.trainer import PretrainTrainer, is_positional_parameter


def _groups(model, **kw):
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir="unused", learning_rate=1e-3, weight_decay=0.01, report_to="none", use_cpu=True
    )
    trainer = PretrainTrainer(model=model, args=args, **kw)
    opt = trainer.create_optimizer()
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}


def _model(scheme: str) -> TupeForMaskedLM:
    cfg = TupeConfig(position_scheme=scheme, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, vocab_size=100, max_position_embeddings=16)  # fmt: skip
    return TupeForMaskedLM(cfg)


def test_relative_bias_table_is_decayed_and_biases_are_not() -> None:
    g = _groups(_model("tupe-r"))
    assert g["tupe.positional.relative.bias.weight"] == (1e-3, 0.01)  # a table, although named "bias"
    assert g["tupe.positional.untied.embeddings.weight"] == (1e-3, 0.01)
    assert g["tupe.positional.untied.theta_positions"] == (1e-3, 0.01)
    assert g["tupe.positional.untied.pos_query.bias"] == (1e-3, 0.0)
    assert g["tupe.positional.untied.LayerNorm.weight"] == (1e-3, 0.0)
    assert g["tupe.layers.0.attention.qkv.weight"] == (1e-3, 0.01)
    assert g["tupe.layers.0.attention.qkv.bias"] == (1e-3, 0.0)
    assert len(g) == len(list(_model("tupe-r").parameters()))  # every parameter exactly once


def test_positional_lr_scale_and_weight_decay_apply_to_positional_parameters_only() -> None:
    g = _groups(_model("bert-r"), positional_lr_scale=10.0, positional_weight_decay=0.0)
    assert g["tupe.positional.embeddings.weight"] == pytest.approx((1e-2, 0.0))
    assert g["tupe.positional.relative.bias.weight"] == pytest.approx((1e-2, 0.0))
    assert g["tupe.embeddings.word_embeddings.weight"] == (1e-3, 0.01)


def test_hf_bert_position_table_is_positional() -> None:
    assert is_positional_parameter("bert.embeddings.position_embeddings.weight")
    assert not is_positional_parameter("bert.embeddings.word_embeddings.weight")
    assert is_positional_parameter("tupe.positional.embeddings.weight")
    assert not is_positional_parameter("tupe.layers.0.attention.qkv.weight")
    assert torch.is_tensor(_model("bert-a").tupe.positional.embeddings.weight)
