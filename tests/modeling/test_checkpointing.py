"""Gradient checkpointing: every model class and scheme gives the gradients of plain training.

The content-free term is computed once per forward pass and shared by every layer. Checkpointing is non-reentrant
only (a request for `use_reentrant=True` runs non-reentrant, with one warning): the recomputation of a layer reads
the same shared tensors, and their gradient flows back through every layer's use of them, wherever the scheme
keeps them (the context's fields, a closure, an attribute of the scheme), as schemes registered from outside the
package show below.
"""

import pytest
import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

import tupe
from tupe import (
    TupeForMaskedLM,
    TupeForMultipleChoice,
    TupeForQuestionAnswering,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeModel,
)
from tupe.modeling import AttentionKernel, register_attention_kernel, unregister_attention_kernel
from tupe.modeling.kernels import eager_attention
from tupe.modeling.positional import (
    PositionalContext,
    PositionalScheme,
    SchemeReport,
    TupeA,
    register_scheme,
    unregister_scheme,
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


def _gradients(cls, scheme, use_reentrant, kernel="auto"):
    """Parameter gradients of one float64 training step (dropout on: checkpointing must replay the same masks)."""
    torch.manual_seed(0)
    config = tiny_config(scheme, num_labels=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = cls(config).double().train()
    if kernel != "auto":
        model.set_attn_implementation(kernel)
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


class DeferredToy(PositionalScheme):
    """A scheme registered from outside that defers all its work to methods reading its context: a content-free
    term built on first read from `parts` (tensors its forward computed from its parameters), and a per-layer
    term of the layer's queries and keys gated by another such tensor."""

    name = "toy-deferred"
    report = SchemeReport("Toy deferred", "a deferred content-free and layer term")
    terms = frozenset({"content_free", "layer"})
    takes_positions = False  # positions 0..n-1 only

    def __init__(self, config):
        super().__init__(config)
        self.slopes = nn.Parameter(torch.empty(config.num_attention_heads))
        self.gates = nn.Parameter(torch.empty(config.num_attention_heads))

    def init_positional_weights(self, std):
        nn.init.normal_(self.slopes)
        nn.init.normal_(self.gates)

    def forward(self, n, positions):
        i = torch.arange(n, dtype=self.slopes.dtype)
        parts = {
            "slopes": nn.functional.softplus(self.slopes)[:, None, None],
            "distance": (i[None, :] - i[:, None]).abs(),
            "gates": torch.tanh(self.gates)[:, None, None],
        }
        return PositionalContext(
            self.logit_scale, parts=parts, content_free_method=self.distance_term, layer_term=self.gated_term
        )

    def distance_term(self, ctx):
        return -ctx.parts["slopes"] * ctx.parts["distance"]

    def gated_term(self, ctx, q, k, project):
        return ctx.parts["gates"] * (q @ k.transpose(-1, -2)) * self.logit_scale


class ClosureToy(DeferredToy):
    """The same terms computed in closures over the tensors its forward computed (the way schemes once did)."""

    name = "toy-closure"

    def forward(self, n, positions):
        ctx = PositionalContext(self.logit_scale)
        gates = torch.tanh(self.gates)[:, None, None]
        ctx.layer_term = lambda ctx, q, k, project: gates * (q @ k.transpose(-1, -2)) * self.logit_scale
        return ctx


class KeepingToy(DeferredToy):
    """The per-layer term reads a tensor its forward computed and kept on the scheme, not in the context."""

    name = "toy-keeping"

    def forward(self, n, positions):
        self.kept_gates = torch.tanh(self.gates)[:, None, None]
        return super().forward(n, positions)

    def gated_term(self, ctx, q, k, project):
        return self.kept_gates * (q @ k.transpose(-1, -2)) * self.logit_scale


@pytest.fixture
def toy_schemes():
    toys = (DeferredToy, ClosureToy, KeepingToy)
    for toy in toys:
        register_scheme(toy)
    # a kernel that never builds the deferred term before the layers (`reads_content_free=False`) yet reads it: each
    # checkpointed layer then builds its own from the checkpoint's copies of `parts`
    register_attention_kernel(
        AttentionKernel(
            "late-term", eager_attention, "eager, the term built in each layer",
            handles=frozenset({"content_free", "layer"}), reads_content_free=False,
        )
    )  # fmt: skip
    yield
    unregister_attention_kernel("late-term")
    for toy in toys:
        unregister_scheme(toy.name)


@pytest.mark.parametrize("kernel", ["auto", "late-term"])
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_scheme_that_defers_its_work_to_methods_checkpoints_exactly(toy_schemes, use_reentrant, kernel):
    expected = _gradients(TupeForMaskedLM, "toy-deferred", None, kernel)
    got = _gradients(TupeForMaskedLM, "toy-deferred", use_reentrant, kernel)
    assert [n for n, g in got.items() if g is None] == []
    assert (
        expected["tupe.positional.slopes"].abs().sum() > 0
        and expected["tupe.positional.gates"].abs().sum() > 0
    )
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("scheme", ["toy-closure", "toy-keeping"])
def test_a_scheme_computing_in_a_closure_or_keeping_a_tensor_checkpoints_exactly(toy_schemes, scheme):
    """A term computed in a closure over the forward pass's tensors, or read from a tensor the scheme kept on
    itself: the checkpointed layers read the same tensors, and the gradient reaches the scheme's parameters."""
    expected = _gradients(TupeForMaskedLM, scheme, None)
    got = _gradients(TupeForMaskedLM, scheme, False)
    assert expected["tupe.positional.gates"].abs().sum() > 0
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-12, rtol=1e-10, msg=name)


def test_a_reentrant_request_runs_non_reentrant_and_says_so():
    model = TupeForMaskedLM(tiny_config("tupe-r")).train()
    with CaptureLogger(logging.get_logger("tupe.modeling.modeling_tupe")) as captured:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    assert "use_reentrant=True runs as use_reentrant=False" in captured.out
    assert all(
        layer._gradient_checkpointing_func.keywords == {"use_reentrant": False} for layer in model.tupe.layers
    )


def test_a_reentrant_checkpoint_set_around_the_model_api_is_refused():
    """A reentrant checkpoint function put on the layers without `gradient_checkpointing_enable` (transformers'
    own setter, as an older transformers would call it) is refused in one line, not run with lost gradients."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    model = TupeForMaskedLM(tiny_config("tupe-r")).train()
    model._set_gradient_checkpointing(True, partial(checkpoint, use_reentrant=True))
    ids = torch.randint(5, 50, (2, 9))
    with pytest.raises(ValueError, match=r"tupe models checkpoint non-reentrantly only"):
        model(input_ids=ids, labels=ids)


@pytest.mark.parametrize("use_reentrant", [None, False, True])
@pytest.mark.parametrize("kernel, builds", [("fold", 0), ("fused", 1), ("sdpa", 1)])
def test_tupe_a_term_is_built_once_per_pass_and_never_when_folded(monkeypatch, kernel, builds, use_reentrant):
    """The deferred content-free term: one build per forward pass shared by every layer (none in a checkpoint's
    recomputation), none at all when the kernel folds it."""
    calls = []
    build = TupeA.content_free_term

    def counted(self, ctx):
        calls.append(1)
        return build(self, ctx)

    monkeypatch.setattr(TupeA, "content_free_term", counted)
    model = TupeForMaskedLM(tiny_config("tupe-a", num_hidden_layers=3)).train()
    model.set_attn_implementation(kernel)
    if use_reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    ids = torch.randint(5, 50, (2, 9))
    model(input_ids=ids, labels=ids).loss.backward()
    assert len(calls) == builds
    assert model.tupe.positional.untied.pos_query.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("use_reentrant", [None, False, True])
@pytest.mark.parametrize("kernel", ["eager", "fused", "sdpa"])
def test_tupe_a_term_is_built_once_per_pass_with_documents_as_rows(monkeypatch, kernel, use_reentrant):
    """Packed documents at positions 0..m-1 run as rows of their own (`DocumentRows`) on one term of positions
    0..L-1: it too is built once per pass, before the layers, not by each (checkpointed) layer."""
    calls = []
    build = TupeA.content_free_term

    def counted(self, ctx):
        calls.append(1)
        return build(self, ctx)

    monkeypatch.setattr(TupeA, "content_free_term", counted)
    model = TupeForMaskedLM(tiny_config("tupe-a", num_hidden_layers=3)).train()
    model.set_attn_implementation(kernel)
    if use_reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    ids = torch.randint(5, 50, (1, 9))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])  # two documents
    model(input_ids=ids, position_ids=positions, labels=ids).loss.backward()
    assert len(calls) == 1
    assert model.tupe.positional.untied.pos_query.weight.grad.abs().sum() > 0
