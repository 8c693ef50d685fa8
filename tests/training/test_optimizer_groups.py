"""The optimizer's parameter groups (positional tables decayed, as in the released code; lr scale; hf-bert) and
optimizers by name (`tupe.training.optimizers.OPTIMIZERS`)."""

from __future__ import annotations

import tempfile

import pytest
import torch

from tupe.modeling import POSITION_SCHEMES, TupeConfig, TupeForMaskedLM, TupeForSequenceClassification
from tupe.training.optimizers import OPTIMIZERS, positional_parameter_names
from tupe.training.trainer import PretrainTrainer

_OUT = tempfile.mkdtemp(prefix="tupe-test-optimizer-")  # the Trainer's output_dir; nothing is saved there


def _groups(model, **kw):
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=_OUT, learning_rate=1e-3, weight_decay=0.01, report_to="none", use_cpu=True
    )
    trainer = PretrainTrainer(model=model, args=args, **kw)
    opt = trainer.create_optimizer()
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}


def _config(scheme: str) -> TupeConfig:
    return TupeConfig(position_scheme=scheme, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, vocab_size=100, max_position_embeddings=16)  # fmt: skip


def _model(scheme: str) -> TupeForMaskedLM:
    return TupeForMaskedLM(_config(scheme))


def _hf_bert():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=100, max_position_embeddings=16))  # fmt: skip


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


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_the_model_names_its_positional_parameters(scheme: str) -> None:
    """Every parameter of the scheme's module, and nothing else, for both heads."""
    for model in (TupeForMaskedLM(_config(scheme)), TupeForSequenceClassification(_config(scheme))):
        scheme_params = {id(p) for p in model.base_model.positional.parameters()}
        named = dict(model.named_parameters())
        assert {id(named[n]) for n in model.positional_parameter_names()} == scheme_params


def test_hf_bert_position_table_is_positional() -> None:
    assert positional_parameter_names(_hf_bert()) == {"bert.embeddings.position_embeddings.weight"}


@pytest.mark.parametrize("scheme", [*POSITION_SCHEMES, "hf-bert"])
def test_non_positional_parameters_are_decayed_as_the_trainer_decays_them(scheme: str) -> None:
    """Groups decay matrices and tables only: for every parameter outside the positional scheme that is exactly
    the Trainer's own rule (no biases, no LayerNorm), so the default run is the Trainer's AdamW."""
    from transformers import Trainer

    model = _hf_bert() if scheme == "hf-bert" else _model(scheme)
    trainer_rule = set(Trainer.get_decay_parameter_names(None, model))
    g = _groups(model)
    positional = positional_parameter_names(model)
    for name, (_, wd) in g.items():
        if name not in positional:
            assert (wd > 0) == (name in trainer_rule), name


def test_default_optimizer_is_the_papers_adamw() -> None:
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=_OUT, learning_rate=1e-3, weight_decay=0.01, adam_beta1=0.9,
                             adam_beta2=0.98, adam_epsilon=1e-6, report_to="none", use_cpu=True)  # fmt: skip
    opt = PretrainTrainer(model=_model("tupe-a"), args=args).create_optimizer()
    assert type(opt) is torch.optim.AdamW
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-6 and opt.defaults["lr"] == 1e-3


def test_adding_an_optimizer_is_one_table_entry(monkeypatch) -> None:  # noqa: ANN001
    """A new entry is offered by `--optimizer`, built by the Trainer with the same groups, and recorded in the
    run's identity."""
    from tupe.cli import build_parser
    from tupe.training.arguments import config_from_args
    from tupe.training.run_folder import run_identity

    monkeypatch.setitem(OPTIMIZERS, "sgd", lambda groups, s: torch.optim.SGD(groups, lr=s.lr, momentum=0.9))
    args = build_parser("pretrain").parse_args(["pretrain", "--out", "unused", "--optimizer", "sgd"])
    run = config_from_args(args).resolve()
    assert run.optim.optimizer == "sgd"
    identity = run_identity(run, {}, "corpus", "tokenizer")
    assert identity["optim"]["optimizer"] == "sgd"
    assert (
        "optimizer"
        not in run_identity(config_from_args(args, optimizer=None).resolve(), {}, "c", "t")["optim"]
    )

    from transformers import TrainingArguments

    targs = TrainingArguments(output_dir=_OUT, learning_rate=1e-3, weight_decay=0.01, report_to="none",
                              use_cpu=True)  # fmt: skip
    opt = PretrainTrainer(model=_model("tupe-r"), args=targs, optimizer_name="sgd").create_optimizer()
    assert type(opt) is torch.optim.SGD
    wd = sorted({g["weight_decay"] for g in opt.param_groups})
    assert wd == [0.0, 0.01] and opt.defaults["momentum"] == 0.9


def test_adafactor_trains_a_step() -> None:
    from transformers import TrainingArguments

    model = _model("tupe-a")
    targs = TrainingArguments(output_dir=_OUT, learning_rate=1e-3, report_to="none", use_cpu=True)
    opt = PretrainTrainer(model=model, args=targs, optimizer_name="adafactor").create_optimizer()
    before = model.tupe.embeddings.word_embeddings.weight.detach().clone()
    ids = torch.randint(5, 100, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert not torch.equal(before, model.tupe.embeddings.word_embeddings.weight)


def test_resume_refuses_a_changed_optimizer(tmp_path) -> None:  # noqa: ANN001
    import json

    from tupe.errors import TupeError
    from tupe.training.arguments import PretrainConfig
    from tupe.training.run_folder import RUN_FILE, check_out_dir, run_identity

    old = run_identity(PretrainConfig(out=str(tmp_path)).resolve(), {}, "c", "t")
    (tmp_path / RUN_FILE).write_text(json.dumps(old))
    assert check_out_dir(tmp_path, old, resume=True, overwrite=False) == "resume"
    new = run_identity(PretrainConfig(out=str(tmp_path), optimizer="adafactor").resolve(), {}, "c", "t")
    with pytest.raises(TupeError, match="optim.optimizer: None -> 'adafactor'"):
        check_out_dir(tmp_path, new, resume=True, overwrite=False)
