"""The `transformers` model contract: earlier checkpoint layouts, inputs_embeds, masked-LM logits, resizing,
problem types, and the layout PEFT users rely on."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import tupe
from tupe import TupeForMaskedLM, TupeForSequenceClassification, TupeModel

from ..helpers import tiny_config

SCHEMES = list(tupe.POSITION_SCHEMES)
MODEL_CLASSES = [TupeModel, TupeForMaskedLM, TupeForSequenceClassification]


def _perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _output(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _rewrite_weights(folder, rename):
    """Rewrite a saved model's safetensors with its keys renamed (an earlier layout)."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    save_file({rename(k): v for k, v in tensors.items()}, path, metadata={"format": "pt"})
    return tensors


def _old_positional_name(key: str) -> str:
    return key.replace("untied.pos_query.", "untied.query.").replace("untied.pos_key.", "untied.key.")


def _old_sequence_head_name(key: str) -> str:
    key = _old_positional_name(key)
    return {
        "classifier.dense.weight": "dense.weight",
        "classifier.dense.bias": "dense.bias",
        "classifier.out_proj.weight": "classifier.weight",
        "classifier.out_proj.bias": "classifier.bias",
    }.get(key, key)


@pytest.mark.parametrize("scheme", ["tupe-a", "tupe-r", "bert-a-d"])
def test_checkpoints_with_the_old_positional_names_load(tmp_path, scheme):
    model = _perturbed(TupeForMaskedLM(tiny_config(scheme)))
    model.save_pretrained(tmp_path)
    saved = _rewrite_weights(tmp_path, _old_positional_name)
    assert "tupe.positional.untied.pos_query.weight" in saved  # today's layout
    old = load_file(tmp_path / "model.safetensors")
    assert (
        "tupe.positional.untied.query.weight" in old and "tupe.positional.untied.pos_query.weight" not in old
    )

    ids = torch.randint(5, 50, (2, 9))
    loaded, info = TupeForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(loaded.eval()(ids).logits, model(ids).logits, atol=0, rtol=0)
    # the bare encoder loads from it too, and a loaded model saves in today's layout
    encoder = TupeModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(
        encoder(ids).last_hidden_state, model.tupe(ids).last_hidden_state, atol=0, rtol=0
    )
    loaded.save_pretrained(tmp_path / "again")
    assert "tupe.positional.untied.pos_query.weight" in load_file(tmp_path / "again" / "model.safetensors")
    # plain load_state_dict (e.g. the Trainer resuming an old run) upgrades the names too
    fresh = TupeForMaskedLM(tiny_config(scheme))
    fresh.load_state_dict({**old, "lm_head.decoder.weight": old["tupe.embeddings.word_embeddings.weight"]})
    torch.testing.assert_close(fresh.eval()(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_checkpoints_with_the_old_sequence_head_layout_load(tmp_path):
    model = _perturbed(TupeForSequenceClassification(tiny_config("tupe-a", num_labels=3)))
    model.save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, _old_sequence_head_name)
    old = load_file(tmp_path / "model.safetensors")
    assert {"dense.weight", "classifier.weight", "tupe.positional.untied.query.weight"} <= set(old)
    ids = torch.randint(5, 50, (2, 9))
    loaded, info = TupeForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(loaded.eval()(ids).logits, model(ids).logits, atol=0, rtol=0)
    fresh = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=3))
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh.eval()(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_old_checkpoints_pass_the_weight_check(tmp_path):
    from tupe.io.checkpoints import check_weights_match_config

    TupeForMaskedLM(tiny_config("tupe-a")).save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, _old_positional_name)
    check_weights_match_config(tmp_path)  # raises on a missing encoder tensor


def test_sequence_head_is_the_released_head_nested_under_classifier():
    model = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=2))
    names = {n for n, _ in model.named_parameters() if not n.startswith("tupe.")}
    assert names == {
        "classifier.dense.weight",
        "classifier.dense.bias",
        "classifier.out_proj.weight",
        "classifier.out_proj.bias",
    }
    head = model.classifier
    hidden = torch.randn(3, 5, 16)
    expected = head.out_proj(torch.tanh(head.dense(hidden[:, 0])))  # dense -> tanh -> (dropout) -> out_proj
    torch.testing.assert_close(head.eval()(hidden), expected)


def test_no_positional_module_answers_to_bert_attention_names():
    """PEFT matches target_modules by name suffix: `query`, `key`, `value` must name nothing in a tupe model."""
    for scheme in SCHEMES:
        names = {n.rsplit(".", 1)[-1] for n, _ in TupeForMaskedLM(tiny_config(scheme)).named_modules()}
        assert not names & {"query", "key", "value"}, scheme


def test_bert_lora_habit_is_refused_by_peft_and_the_documented_recipe_works():
    peft = pytest.importorskip("peft")
    model = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=2))
    with pytest.raises(ValueError, match="not found|No modules were targeted"):  # PEFT's own error
        peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", target_modules=["query", "value"]))
    model = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=2))
    lora = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", target_modules=["qkv"]))
    adapted = {n.split(".lora_A")[0] for n, _ in lora.named_parameters() if ".lora_A" in n}
    assert adapted == {f"base_model.model.tupe.layers.{i}.attention.qkv" for i in range(2)}
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad and "lora_" not in n}
    assert {n.split("modules_to_save.default.")[-1] for n in trainable} == {
        "dense.weight",
        "dense.bias",
        "out_proj.weight",
        "out_proj.bias",
    }


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_inputs_embeds_equal_input_ids(scheme, cls):
    model = _perturbed(cls(tiny_config(scheme, num_labels=2)))
    ids = torch.randint(5, 50, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    embeds = model.get_input_embeddings()(ids)
    torch.testing.assert_close(
        _output(model(inputs_embeds=embeds, attention_mask=mask)), _output(model(ids, attention_mask=mask))
    )
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(ids, inputs_embeds=embeds)


def test_inputs_embeds_carry_gradients():
    model = TupeForMaskedLM(tiny_config("tupe-a"))
    embeds = model.get_input_embeddings()(torch.randint(5, 50, (2, 7))).detach().requires_grad_()
    model(inputs_embeds=embeds).logits.sum().backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0


def test_masked_lm_logits_cover_every_position_by_default():
    model = TupeForMaskedLM(tiny_config("tupe-a")).eval()
    assert model.config.sparse_prediction is False
    ids = torch.randint(5, 50, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7] = 11, 12
    out = model(ids, labels=labels)
    assert out.logits.shape == (2, 12, 50)
    expected = torch.nn.functional.cross_entropy(out.logits.view(-1, 50), labels.view(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def test_configs_saved_with_sparse_prediction_keep_it(tmp_path):
    TupeForMaskedLM(tiny_config("tupe-a", sparse_prediction=True)).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["sparse_prediction"] is True
    assert TupeForMaskedLM.from_pretrained(tmp_path).config.sparse_prediction is True


def _labels_for(problem_type, num_labels, batch=4):
    if problem_type == "regression":
        return torch.randn(batch) if num_labels == 1 else torch.randn(batch, num_labels)
    if problem_type == "single_label_classification":
        return torch.randint(0, num_labels, (batch,))
    return torch.randint(0, 2, (batch, num_labels)).float()


@pytest.mark.parametrize(
    "problem_type,num_labels",
    [
        ("regression", 1),
        ("regression", 3),
        ("single_label_classification", 3),
        ("multi_label_classification", 3),
    ],
)
def test_problem_types_give_the_loss_of_their_name(problem_type, num_labels):
    model = TupeForSequenceClassification(
        tiny_config("tupe-a", num_labels=num_labels, problem_type=problem_type)
    ).eval()
    ids = torch.randint(5, 50, (4, 9))
    labels = _labels_for(problem_type, num_labels)
    out = model(ids, labels=labels)
    logits = out.logits
    expected = {
        "regression": lambda: torch.nn.MSELoss()(logits.squeeze(), labels.squeeze()),
        "single_label_classification": lambda: torch.nn.CrossEntropyLoss()(logits, labels),
        "multi_label_classification": lambda: torch.nn.BCEWithLogitsLoss()(logits, labels),
    }[problem_type]()
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize(
    "num_labels,labels,inferred",
    [
        (1, torch.tensor([0.5, 1.0]), "regression"),
        (3, torch.tensor([0, 2]), "single_label_classification"),
        (3, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), "multi_label_classification"),
    ],
)
def test_problem_type_is_inferred_as_bert_does(num_labels, labels, inferred):
    model = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=num_labels))
    model(torch.randint(5, 50, (2, 6)), labels=labels).loss.backward()
    assert model.config.problem_type == inferred


@pytest.mark.parametrize("new_size", [64, 37])
@pytest.mark.parametrize("mean_resizing", [True, False])
@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_resize_token_embeddings_then_train_and_round_trip(tmp_path, cls, new_size, mean_resizing):
    model = _perturbed(cls(tiny_config("tupe-r", num_labels=2)))
    old_bias = model.lm_head.bias.detach().clone() if cls is TupeForMaskedLM else None
    model.resize_token_embeddings(new_size, mean_resizing=mean_resizing)
    assert model.config.vocab_size == new_size
    assert model.get_input_embeddings().weight.shape == (new_size, 16)
    if cls is TupeForMaskedLM:
        assert model.lm_head.decoder.weight is model.tupe.embeddings.word_embeddings.weight
        bias = model.lm_head.bias
        assert bias.shape == (new_size,)
        keep = min(new_size, 50)
        torch.testing.assert_close(bias[:keep], old_bias[:keep], atol=0, rtol=0)
        if new_size > 50:
            fill = old_bias.mean() if mean_resizing else torch.tensor(0.0)
            torch.testing.assert_close(bias[50:], fill.expand(new_size - 50))
    ids = torch.randint(5, new_size, (2, 8))
    labels = {TupeForMaskedLM: ids, TupeForSequenceClassification: torch.tensor([0, 1])}.get(cls)
    model.train()
    out = model(ids, labels=labels) if labels is not None else model(ids)
    loss = out.loss if labels is not None else out.last_hidden_state.square().mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert model.get_input_embeddings().weight.grad.shape == (new_size, 16)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.eval().save_pretrained(tmp_path)
    loaded = cls.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_output(loaded(ids)), _output(model(ids)), atol=0, rtol=0)
