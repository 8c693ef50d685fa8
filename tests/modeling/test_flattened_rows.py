"""Rows as transformers' `DataCollatorWithFlattening` writes them, with the documents test_documents.py does not
hold: a document of one token (a lone [CLS]), one of two, and a row longer than `max_position_embeddings` whose
documents each fit; for every scheme, each document gives what it gives alone (float64, eager), gradients of the
summed loss included. An outside check written apart from test_documents.py's helpers."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithFlattening

import tupe

LENGTHS = (1, 2, 17, 3, 30, 9)  # 62 tokens in one row, 32 positions


def _model(scheme: str) -> tupe.TupeForMaskedLM:
    torch.manual_seed(0)
    config = tupe.TupeConfig(
        position_scheme=scheme, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        vocab_size=60, max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = tupe.TupeForMaskedLM(config).double()
    with torch.no_grad():  # away from the initialisation, so that every term matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.set_attn_implementation("eager")
    return model


def _documents() -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(1)
    docs = []
    for n in LENGTHS:
        ids = [1, *torch.randint(5, 60, (n - 1,), generator=generator).tolist()]
        labels = [-100] + [t if k % 2 else -100 for k, t in enumerate(ids[1:])]
        docs.append({"input_ids": ids, "labels": labels})
    return docs


def _summed_loss_step(model, **batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(**batch)
    count = int((batch["labels"] != -100).sum())
    if count:
        (out.loss * count).backward()
    grads = {
        k: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for k, p in model.named_parameters()
    }
    return out.logits, grads


@pytest.mark.parametrize("scheme", list(tupe.POSITION_SCHEMES))
def test_flattened_row_with_one_token_documents_equals_each_document_alone(scheme):
    model, docs = _model(scheme), _documents()
    batch = DataCollatorWithFlattening()(docs)  # position_ids restarting at 0, no attention mask
    assert batch["input_ids"].shape[1] == sum(LENGTHS) > model.config.max_position_embeddings
    logits, grads = _summed_loss_step(model, input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                                      labels=batch["labels"])  # fmt: skip
    start, summed = 0, None
    for doc in docs:
        n = len(doc["input_ids"])
        alone, alone_grads = _summed_loss_step(
            model, input_ids=torch.tensor([doc["input_ids"]]), labels=torch.tensor([doc["labels"]])
        )
        torch.testing.assert_close(logits[0, start : start + n], alone[0], atol=1e-12, rtol=1e-12)
        summed = alone_grads if summed is None else {k: summed[k] + g for k, g in alone_grads.items()}
        start += n
    for name, grad in summed.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-12, rtol=1e-10, msg=name)
