"""LoRA through PEFT on every model class: a training step, the adapter saved and reloaded into a fresh model with
identical logits, and `merge_and_unload()` giving the same logits."""

import pytest
import torch

from tupe import (
    TupeForMaskedLM,
    TupeForMultipleChoice,
    TupeForQuestionAnswering,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeModel,
)

from ..helpers import tiny_config

peft = pytest.importorskip("peft")

# class -> PEFT task type (None: no task head; PEFT has no multiple-choice task, so the head is saved explicitly)
TASKS = {
    TupeModel: None,
    TupeForMaskedLM: None,
    TupeForSequenceClassification: "SEQ_CLS",
    TupeForTokenClassification: "TOKEN_CLS",
    TupeForQuestionAnswering: "QUESTION_ANS",
    TupeForMultipleChoice: None,
}


def _batch(cls):
    ids = torch.randint(5, 50, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    if cls is TupeForMultipleChoice:
        return dict(input_ids=ids.view(1, 2, 9), attention_mask=mask.view(1, 2, 9)), dict(
            labels=torch.tensor([1])
        )
    labels = {
        TupeForMaskedLM: dict(labels=ids),
        TupeForSequenceClassification: dict(labels=torch.tensor([0, 1])),
        TupeForTokenClassification: dict(labels=torch.randint(0, 2, (2, 9))),
        TupeForQuestionAnswering: dict(
            start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 4])
        ),
    }.get(cls, {})
    return dict(input_ids=ids, attention_mask=mask), labels


def _outputs(model, inputs):
    out = model(**inputs)
    if hasattr(out, "start_logits"):
        return torch.stack([out.start_logits, out.end_logits])
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _lora_config(cls):
    kwargs = dict(target_modules=["qkv"], r=4, lora_alpha=8, init_lora_weights=False)
    if TASKS[cls] is not None:
        return peft.LoraConfig(task_type=TASKS[cls], **kwargs)
    if cls is TupeForMultipleChoice:
        kwargs["modules_to_save"] = ["classifier"]
    return peft.LoraConfig(**kwargs)


@pytest.mark.parametrize("scheme", ["tupe-a", "tupe-r", "bert-a"])
@pytest.mark.parametrize("cls", list(TASKS))
def test_lora_trains_saves_reloads_and_merges(tmp_path, cls, scheme):
    config = tiny_config(scheme, num_labels=2)
    torch.manual_seed(0)
    base = cls(config)
    base.save_pretrained(tmp_path / "base")  # the fresh model below is this one, reloaded
    model = peft.get_peft_model(base, _lora_config(cls))
    adapted = {n for n, _ in model.named_modules() if n.endswith(".qkv") and hasattr(_, "lora_A")}
    assert len(adapted) == config.num_hidden_layers

    inputs, labels = _batch(cls)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    out = model(**inputs, **labels)
    # a bare encoder's LayerNorm-ed output has a constant mean square: weigh it by fixed random values instead
    loss = out.loss if labels else (out.last_hidden_state * torch.randn_like(out.last_hidden_state)).sum()
    loss.backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    changed = {n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])}
    assert any("lora_A" in n for n in changed) and any("lora_B" in n for n in changed)
    head = {n for n in changed if "modules_to_save" in n}
    if cls not in (TupeModel, TupeForMaskedLM):  # the whole head trains (and is saved below)
        assert head, "the task head is not trained"

    model.eval()
    expected = _outputs(model, inputs)
    model.save_pretrained(tmp_path / "adapter")

    fresh = cls.from_pretrained(tmp_path / "base")
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    torch.testing.assert_close(_outputs(reloaded, inputs), expected, atol=1e-6, rtol=1e-6)

    merged = reloaded.merge_and_unload()
    assert type(merged) is cls and not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_outputs(merged, inputs), expected, atol=1e-5, rtol=1e-5)
