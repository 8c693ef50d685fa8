"""Gradient checkpointing: every model class and scheme, reentrant or not, gives the gradients of plain training.

The content-free term is computed once per forward pass and shared by every layer; the layers must receive it
as a checkpoint input, or the recomputation saves a different number of tensors (non-reentrant) or backward
runs twice through the shared graph and leaves the positional parameters without a gradient (reentrant).
"""

import pytest
import torch
from transformers import Trainer, TrainingArguments

import tupe
from tupe import (
    TupeForMaskedLM,
    TupeForMultipleChoice,
    TupeForQuestionAnswering,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeModel,
)

from ..helpers import tiny_config

SCHEMES = list(tupe.POSITION_SCHEMES)
CLASSES = [
    TupeModel,
    TupeForMaskedLM,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeForQuestionAnswering,
    TupeForMultipleChoice,
]


def _batch(cls):
    ids = torch.randint(5, 50, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    if cls is TupeForMultipleChoice:
        return dict(input_ids=ids.view(1, 2, 9), attention_mask=mask.view(1, 2, 9), labels=torch.tensor([1]))
    if cls is TupeForQuestionAnswering:
        return dict(
            input_ids=ids,
            attention_mask=mask,
            start_positions=torch.tensor([1, 2]),
            end_positions=torch.tensor([3, 4]),
        )
    labels = {
        TupeForMaskedLM: ids,
        TupeForSequenceClassification: torch.tensor([0, 1]),
        TupeForTokenClassification: torch.randint(0, 2, (2, 9)),
    }.get(cls)
    return dict(input_ids=ids, attention_mask=mask) | ({} if labels is None else {"labels": labels})


def _gradients(cls, scheme, use_reentrant):
    """Parameter gradients of one float64 training step (dropout on: checkpointing must replay the same masks)."""
    torch.manual_seed(0)
    config = tiny_config(scheme, num_labels=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = cls(config).double().train()
    if use_reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        assert model.is_gradient_checkpointing
    batch = _batch(cls)
    torch.manual_seed(1)
    out = model(**batch)
    # a bare encoder's LayerNorm-ed output has a constant mean square: weigh it by fixed random values instead
    weights = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    loss = (out.last_hidden_state * weights).sum() if cls is TupeModel else out.loss
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cls", CLASSES)
def test_checkpointed_gradients_equal_plain_ones(cls, scheme, use_reentrant):
    expected = _gradients(cls, scheme, None)
    got = _gradients(cls, scheme, use_reentrant)
    assert [n for n, g in got.items() if g is None] == []  # every parameter is trained
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_trainer_with_gradient_checkpointing_matches_plain_training(tmp_path, use_reentrant):
    class Batches(torch.utils.data.Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(3)
            self.ids = torch.randint(5, 50, (8, 12), generator=g)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": torch.tensor(i % 2)}

    def train(checkpointing):
        torch.manual_seed(0)
        model = TupeForSequenceClassification(tiny_config("tupe-r", num_labels=2))
        args = TrainingArguments(
            output_dir=str(tmp_path / str(checkpointing)),
            per_device_train_batch_size=4,
            max_steps=2,
            learning_rate=1e-2,
            gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": use_reentrant},
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        )
        Trainer(model=model, args=args, train_dataset=Batches()).train()
        return model, all(layer.gradient_checkpointing for layer in model.tupe.layers)

    plain, _ = train(False)
    checkpointed, enabled = train(True)
    assert enabled
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)
