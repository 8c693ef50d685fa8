"""How examples become a batch, the one place for every run of every family (`data_collator`): padding-free
batches (`FlattenedBatches`, a batch's examples in one row) where `padding_free_refusal` has no objection, else the
family's padded batches; and a padding-free output back to one row per example (`unflattened`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tupe.finetuning.pipeline.family import TaskFamily


def data_collator(family: TaskFamily, tokenizer: Any, padding_free: bool = False) -> Any:
    """The batches of every run of every family: the one place that decides how examples become a batch.
    `padding_free` (where `padding_free_refusal` has no objection): `FlattenedBatches`; else the family's padded
    batches."""
    return FlattenedBatches() if padding_free else family.collator(tokenizer)


@dataclass
class FlattenedBatches:
    """Padding-free batches: the examples of a batch concatenated into one row `input_ids` (1, T) with
    `position_ids` (1, T) restarting at 0 for each example, as `transformers.DataCollatorWithFlattening` writes
    them (its `input_ids` and `position_ids` are these; tests/training/test_padding_free.py checks), so a tupe model
    keeps attention inside each example and computes nothing on padding. Its labels do not fit a classifier:
    it replaces each example's first label with -100 (for a causal LM's shifted labels) and expects a list per
    example. Here a label per example (classification, regression) stays one per example, `labels` (examples,),
    which the sequence-classification head matches with each example's first token; a list per example (NER's
    per-token labels) is concatenated as it is, `labels` (1, T). No attention mask: there is no padding.

    Public (`from tupe import FlattenedBatches`): the Trainer's `data_collator` for padding-free classification
    with `TupeForSequenceClassification`, which pools each example's first token (docs/model.md, "Heads with
    documents", has the example); `tupe glue` and `tupe finetune` use it."""

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch

        if not features:
            raise ValueError("FlattenedBatches: an empty batch")
        ids: list[int] = []
        positions: list[int] = []
        for i, f in enumerate(features):
            row = f["input_ids"]
            row = row.tolist() if hasattr(row, "tolist") else list(row)
            if not row:
                raise ValueError(f"FlattenedBatches: example {i} of the batch has no tokens")
            ids += row
            positions += range(len(row))
        batch: dict[str, Any] = {
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "position_ids": torch.tensor([positions], dtype=torch.long),
        }
        key = "labels" if "labels" in features[0] else "label" if "label" in features[0] else None
        if key is not None:
            values = [f[key] for f in features]
            values = [v.tolist() if hasattr(v, "tolist") else v for v in values]
            if isinstance(values[0], list):  # a label per token
                batch["labels"] = torch.tensor([[x for v in values for x in v]], dtype=torch.long)
            else:  # a label per example: int64 class ids, float32 scores (regression)
                batch["labels"] = torch.tensor(
                    values, dtype=torch.float32 if isinstance(values[0], float) else torch.long
                )
        return batch


def unflattened(tensor: Any, starts: Any, pad: float = -100) -> Any:
    """A token-level output of a flattened row, (1, T, ...), back to one row per example (examples, longest,
    ...), padded with `pad` (what the Trainer pads batches with when it joins them); `starts` (T,) bool marks each
    example's first token. Anything else (a per-example output, a nested tuple of them) is returned as it is."""
    import torch

    if isinstance(tensor, tuple | list):
        return type(tensor)(unflattened(t, starts, pad) for t in tensor)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2 or tensor.shape[:2] != (1, starts.shape[0]):
        return tensor
    bounds = torch.nonzero(starts.to(tensor.device)).flatten().tolist() + [starts.shape[0]]
    pieces = [tensor[0, a:b] for a, b in zip(bounds, bounds[1:])]
    return torch.nn.utils.rnn.pad_sequence(pieces, batch_first=True, padding_value=pad)


def padding_free_refusal(family: TaskFamily, model: Any, examples: Sequence[dict[str, Any]]) -> str | None:
    """Why `family`'s runs on `model` cannot have padding-free batches, or None: the family's head needs padded
    rows (`TaskFamily.flattened`), or the model's attention kernel refuses documents in a row, in training or
    evaluation (tried on a padding-free batch of `examples`, a few training examples, without gradients)."""
    import torch

    if family.flattened is None:
        return family.flattened_refusal or f"the {family.name} head scores each example from its own row"
    if torch.cuda.device_count() > 1 and "LOCAL_RANK" not in os.environ:
        return "several GPUs in one process: the Trainer's DataParallel splits a batch by rows, and a padding-free batch is one row"
    from tupe.modeling.modeling_tupe import resolve_attention_kernel

    batch = FlattenedBatches()([{"input_ids": e["input_ids"]} for e in examples])

    was_training = model.training
    try:
        resolve_attention_kernel(model, training=True, grad=True, documents=True)
        model.eval()
        device = next(model.parameters()).device
        with torch.no_grad():
            model(**{k: v.to(device) for k, v in batch.items()})
    except ValueError as e:
        return str(e).split("\n")[0]
    finally:
        model.train(was_training)
    return None
