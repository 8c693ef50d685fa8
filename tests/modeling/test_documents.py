"""Positions and documents as inputs: `position_ids` through every scheme and head, and documents packed in a row.

The oracle: each document of a packed row (positions restarting at 0, as transformers' `DataCollatorWithFlattening`
writes them) gives the hidden states, masked-LM logits and loss gradients of the same document alone in its own
row, for every scheme and every kernel that takes documents; a padded batch and the same sequences flattened
padding-free agree; gradient checkpointing keeps both; the eager path equals the naive float64 reference
(`reference.py`, per pair, from positions) on packed rows; and the default (no `position_ids`) is today's
computation, checked against outputs of the code before positions existed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import tupe
from tupe import (
    TupeForMaskedLM,
    TupeForMultipleChoice,
    TupeForQuestionAnswering,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeModel,
)
from tupe.modeling import resolve_attention_kernel
from tupe.modeling.positional import SCHEMES as SCHEME_CLASSES

from ..helpers import tiny_config
from .reference import naive_forward

SCHEMES = list(tupe.POSITION_SCHEMES)
DOCUMENT_KERNELS = ("eager", "sdpa", "fused")  # the CPU kernels that keep attention inside documents
LENGTHS = ([5, 9, 3], [7, 4])  # two packed rows: three documents, then two plus padding
PAD = 3  # padded tokens at the end of the second row
# Of the larger of 1 and the tensor's largest |value|: hidden states; logits and parameter gradients (a vocabulary
# projection and sums over tokens further) get twice that in float32, where the packed row's longer products round
# differently (measured worst over every scheme and kernel, 2 threads: hidden 5.7e-7, logits 1.1e-6, gradients
# 1.2e-6 of their scale; float64: below 1e-14).
TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12}
DEEPER = {torch.float32: 2.0, torch.float64: 1.0}


def _close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str = "") -> None:
    """max |got - want| <= tol * max(1, max |want|): `tol` relative to the tensor's scale (a float32 logit of 5
    has a resolution of 5e-7, so an absolute 1e-6 would be 2 units in the last place)."""
    assert got.shape == want.shape, what
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    error = float((got - want).abs().max()) if want.numel() else 0.0
    assert error <= tol * scale, f"{what}: max |difference| {error:.3g} > {tol:g} x {scale:.3g}"


def _model(scheme: str, dtype=torch.float64, cls=TupeForMaskedLM, **overrides):
    torch.manual_seed(0)
    labels = 2 if cls is TupeForQuestionAnswering else 3  # start and end logits; three classes
    model = cls(tiny_config(scheme, num_labels=labels, **overrides)).to(dtype)
    with torch.no_grad():  # away from the init, so that every term (theta, biases, LayerNorms) matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def _documents(seed: int = 0):
    """Token ids and masked-LM labels of every document (each starts with [CLS])."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for row in LENGTHS:
        for length in row:
            ids = torch.randint(5, 50, (length,), generator=g)
            ids[0] = 1
            labels = torch.where(torch.rand(length, generator=g) < 0.4, ids, torch.full_like(ids, -100))
            labels[1] = ids[1]  # at least one predicted token in each document
            docs.append((ids, labels))
    return docs


def _packed(docs):
    """The documents packed into `LENGTHS`' rows: ids, labels, position_ids, attention_mask (padding at the end
    of the second row, positions continuing there)."""
    width = max(sum(row) for row in LENGTHS)
    ids = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    positions = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    k = 0
    for r, row in enumerate(LENGTHS):
        start = 0
        for length in row:
            ids[r, start : start + length], labels[r, start : start + length] = docs[k]
            positions[r, start : start + length] = torch.arange(length)
            mask[r, start : start + length] = 1
            start, k = start + length, k + 1
        positions[r, start:] = torch.arange(1, width - start + 1) + positions[r, start - 1]
    return ids, labels, positions, mask


def _spans():
    """(row, start, end) of every document in `_packed`'s rows, in order."""
    spans = []
    for r, row in enumerate(LENGTHS):
        start = 0
        for length in row:
            spans.append((r, start, start + length))
            start += length
    return spans


def _step(model, **batch):
    """Outputs and parameter gradients of the summed masked-LM loss (the model's mean times its predicted tokens:
    the sum over documents of their own sums)."""
    model.zero_grad()
    out = model(**batch, output_hidden_states=True)
    count = (batch["labels"] != -100).sum()
    (out.loss * count).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out, grads


def _kernels(scheme: str) -> list[str]:
    return [k for k in DOCUMENT_KERNELS if k in SCHEME_CLASSES[scheme].kernels()]


@pytest.mark.parametrize(
    "scheme, kernel, dtype",
    [(s, k, torch.float32) for s in SCHEMES for k in _kernels(s)]
    + [(s, "eager", torch.float64) for s in SCHEMES],
)
def test_packed_documents_equal_each_document_alone(scheme, kernel, dtype):
    model = _model(scheme, dtype)
    model.set_attn_implementation(kernel)
    docs = _documents()
    ids, labels, positions, mask = _packed(docs)
    packed, packed_grads = _step(
        model, input_ids=ids, labels=labels, position_ids=positions, attention_mask=mask
    )
    tol = TOLERANCE[dtype]
    grads = None
    for (r, s, e), (doc, doc_labels) in zip(_spans(), docs):
        alone, alone_grads = _step(model, input_ids=doc[None], labels=doc_labels[None])
        for layer, hidden in enumerate(alone.hidden_states):
            _close(packed.hidden_states[layer][r, s:e], hidden[0], tol, f"hidden states {layer}")
        _close(packed.logits[r, s:e], alone.logits[0], tol * DEEPER[dtype], "logits")
        grads = alone_grads if grads is None else {n: grads[n] + g for n, g in alone_grads.items()}
    assert packed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        _close(packed_grads[name], grad, tol * DEEPER[dtype], name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_packed_rows_match_the_naive_reference(scheme):
    """The eager path on packed rows against reference.py's per-pair formulas of positions and documents."""
    model = _model(scheme).eval()
    model.set_attn_implementation("eager")
    ids, _, positions, mask = _packed(_documents())
    documents = (torch.cumsum(positions == 0, dim=1) - 1).tolist()
    hiddens, _, mlm = naive_forward(model, ids, mask, positions.tolist(), documents)
    out = model(ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
    real = mask.bool()
    tol = _naive_tolerance(scheme)
    for layer, expected in enumerate(hiddens):
        torch.testing.assert_close(out.hidden_states[layer + 1][real], expected[real], atol=tol, rtol=tol)
    torch.testing.assert_close(out.logits[real], mlm[real], atol=tol, rtol=tol)


def _naive_tolerance(scheme: str) -> float:
    """Float64 against reference.py: 1e-12; rope computes its angles in float32 (as transformers does), the
    reference in float64, so rope agrees to float32's resolution of the angles."""
    return 1e-6 if SCHEME_CLASSES[scheme].rotary else 1e-12


@pytest.mark.parametrize("scheme", SCHEMES)
def test_positions_not_from_zero_match_the_naive_reference(scheme):
    """A row of positions 3..14 (a document's later part), against reference.py."""
    model = _model(scheme).eval()
    ids = torch.randint(5, 50, (1, 12))
    positions = torch.arange(3, 15)[None]
    hiddens, _, mlm = naive_forward(model, ids, None, positions.tolist())
    out = model(ids, position_ids=positions)
    tol = _naive_tolerance(scheme)
    torch.testing.assert_close(out.logits, mlm, atol=tol, rtol=tol)
    cls = SCHEME_CLASSES[scheme]
    if (
        cls.report.absolute_input or cls.report.untied_projections
    ):  # a table read at positions 3..14, not 0..11
        assert (model(ids).logits - out.logits).abs().max() > 1e-6
    elif scheme != "fire":  # relative terms only: a shift changes nothing (fire: N = 15, not 12)
        torch.testing.assert_close(out.logits, model(ids).logits, atol=tol, rtol=tol)


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kernel", DOCUMENT_KERNELS)
def test_padded_batch_equals_the_same_sequences_flattened(scheme, kernel, explicit):
    """transformers' DataCollatorWithFlattening against a padded batch of the same sequences, with position_ids
    0..n-1 given (`explicit`) or not. fire without them is not compared: its normaliser N is then the padded
    length (today's computation), with them each sequence's own, as flattened."""
    from transformers import DataCollatorWithFlattening

    if kernel not in SCHEME_CLASSES[scheme].kernels():
        pytest.skip(f"{kernel} does not run {scheme}")
    if scheme == "fire" and not explicit:
        pytest.skip("fire normalises by the padded length when no position_ids are given")
    if kernel != "sdpa" and not explicit:
        pytest.skip("the padding path without positions is today's, checked against eager in test_fast_paths")
    model = _model(scheme, torch.float32).eval()
    model.set_attn_implementation(kernel)
    docs = [ids for ids, _ in _documents()]
    flat = DataCollatorWithFlattening()([{"input_ids": d.tolist()} for d in docs])
    width = max(len(d) for d in docs)
    padded = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(padded)
    for i, d in enumerate(docs):
        padded[i, : len(d)], mask[i, : len(d)] = d, 1
    with torch.no_grad():
        got = model(flat["input_ids"], position_ids=flat["position_ids"]).logits[0]
        positions = torch.arange(width).expand(len(docs), width) if explicit else None
        want = model(padded, attention_mask=mask, position_ids=positions).logits[mask.bool()]
    _close(got, want, 2e-6, "logits")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_default_positions_take_the_fast_path_bit_for_bit(scheme):
    """position_ids equal to 0..n-1 in every row are the default: the same computation, the same bits."""
    model = _model(scheme, torch.float32).eval()
    ids = torch.randint(5, 50, (2, 11))
    with torch.no_grad():
        assert torch.equal(model(ids, position_ids=torch.arange(11).expand(2, 11)).logits, model(ids).logits)


# Outputs of the code before positions existed (commit 37d7939, tiny float64 models, `_reference_statistics`):
# two weighted sums of the padded batch's logits and of the gradient of every parameter, per scheme.
BEFORE_POSITIONS = {
    "bert-a": [-12.41522959432804, 57.46249282248799],
    "bert-r": [-40.03243154859353, 20.675414174316806],
    "bert-a-d": [56.582623870901976, 33.3631466470917],
    "tupe-a": [-34.96788043947682, 50.5180765018124],
    "tupe-a-tie-cls": [49.117997089197665, 22.961184690625803],
    "tupe-r": [-32.602538185921446, 34.62562519875908],
    "tupe-r-tie-cls": [10.627039832505567, -48.227288531631295],
    "rope": [-41.52195486803531, -70.42926452471771],
    "nope": [-38.326885252224244, -68.75141084562665],
    "sinusoidal": [-40.718840398081866, -70.27752942536902],
    "t5": [38.94472102959581, -18.861396377102434],
    "alibi": [-37.534219753497005, -69.38445727748929],
    "deberta": [7.440767829009256, 16.101360264243432],
    "fire": [-31.52662679336787, -13.890040147310213],
    "kerple-log": [41.0417986389015, 24.778381161746545],
    "kerple-power": [41.48198722318725, 21.473718293209963],
}


def _reference_statistics(scheme: str) -> list[float]:
    model = _model(scheme).train()
    ids = torch.randint(5, 50, (3, 13), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    labels = torch.where(ids % 3 == 0, ids, torch.full_like(ids, -100))
    out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    g = torch.Generator().manual_seed(6)
    values = [out.logits.detach()] + [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([v.reshape(-1) for v in values])
    return [float(flat @ torch.randn(flat.shape, generator=g, dtype=flat.dtype)) for _ in range(2)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_default_path_gives_the_outputs_of_the_code_before_positions(scheme):
    if scheme not in BEFORE_POSITIONS:
        pytest.skip(f"no recorded statistics for {scheme} (a scheme added later)")
    # Recorded with torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 reproduces them to 0). Other vector widths draw
    # the float32 initialisation and evaluate log/exp in other last bits: measured up to 4e-9 relative under
    # avx512 and 2.5e-7 under default. A change of the computation moves these sums by O(1); the default path's
    # bit-for-bit identity is test_default_positions_take_the_fast_path_bit_for_bit's.
    rtol = 1e-12 if torch.backends.cpu.get_cpu_capability() == "AVX2" else 1e-6
    torch.testing.assert_close(
        torch.tensor(_reference_statistics(scheme), dtype=torch.float64),
        torch.tensor(BEFORE_POSITIONS[scheme], dtype=torch.float64),
        atol=0,
        rtol=rtol,
    )


@pytest.mark.parametrize("cls", [TupeModel, TupeForMaskedLM, TupeForSequenceClassification,
                                 TupeForTokenClassification, TupeForQuestionAnswering])  # fmt: skip
def test_every_head_takes_position_ids(cls):
    model = _model("tupe-r", cls=cls).eval()
    ids = torch.randint(5, 50, (2, 9))
    shifted = torch.arange(4, 13).expand(2, 9)

    def first_output(**kwargs):
        out = model(ids, **kwargs)
        return out[0] if isinstance(out, tuple) else next(iter(out.values()))

    with torch.no_grad():
        assert (first_output(position_ids=shifted) - first_output()).abs().max() > 1e-6
        assert torch.equal(first_output(position_ids=torch.arange(9).expand(2, 9)), first_output())


def test_multiple_choice_takes_per_choice_positions_and_refuses_documents():
    model = _model("tupe-r", cls=TupeForMultipleChoice).eval()
    ids = torch.randint(5, 50, (2, 3, 8))
    shifted = torch.arange(2, 10).expand(2, 3, 8)
    with torch.no_grad():
        assert (model(ids, position_ids=shifted).logits - model(ids).logits).abs().max() > 1e-6
        packed = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]).expand(2, 3, 8)
        with pytest.raises(ValueError, match="TupeForMultipleChoice.*several documents"):
            model(ids, position_ids=packed)


def test_sequence_classification_pools_each_documents_first_token():
    model = _model("tupe-r", cls=TupeForSequenceClassification).eval()
    docs = [ids for ids, _ in _documents()]
    ids, _, positions, mask = _packed(_documents())
    labels = torch.tensor([0, 1, 2, 1, 0])
    out = model(ids, attention_mask=mask, position_ids=positions, labels=labels)
    alone = torch.cat([model(d[None]).logits for d in docs])
    assert out.logits.shape == (len(docs), 3)
    torch.testing.assert_close(out.logits, alone, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(out.loss, F.cross_entropy(alone.float(), labels), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="2 labels for 5 documents"):
        model(ids, attention_mask=mask, position_ids=positions, labels=labels[:2])


def test_explicit_boundaries_equal_position_ids():
    """cu_seq_lens_q (one flattened row) and seq_idx mark the same documents as position_ids restarting at 0;
    seq_idx also lets a document start at a position other than 0."""
    from transformers import DataCollatorWithFlattening

    model = _model("tupe-r").eval()
    docs = [{"input_ids": ids.tolist()} for ids, _ in _documents()]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(docs)
    ids, positions = batch["input_ids"], batch["position_ids"]
    with torch.no_grad():
        want = model(ids, position_ids=positions).logits
        torch.testing.assert_close(model(ids, cu_seq_lens_q=batch["cu_seq_lens_q"]).logits, want)
        torch.testing.assert_close(model(ids, seq_idx=batch["seq_idx"]).logits, want)
        torch.testing.assert_close(model(**batch).logits, want)
        # two documents at positions 3..7 and 0..5, told apart by seq_idx alone
        ids = torch.randint(5, 50, (1, 11))
        positions = torch.tensor([[3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5]])
        seq_idx = torch.tensor([[0] * 5 + [1] * 6])
        got = model(ids, position_ids=positions, seq_idx=seq_idx).logits
        torch.testing.assert_close(got[:, :5], model(ids[:, :5], position_ids=positions[:, :5]).logits)
        torch.testing.assert_close(got[:, 5:], model(ids[:, 5:]).logits)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        model(ids, cu_seq_lens_q=torch.tensor([0, 4, 9]))


@pytest.mark.parametrize("scheme", ["tupe-r", "fire"])
def test_documents_from_position_zero_run_as_rows_of_their_own(scheme):
    """Packed documents at positions 0..m-1 are attended as rows of their own (`DocumentRows`: grouped by length,
    one positional term shared by all) where the scheme's terms allow it; fire (its normaliser is a document's
    length) and a document starting at another position keep the block-diagonal mask. The outputs of both paths
    are checked above against each document alone and against reference.py."""
    model = _model(scheme).eval()
    ids, _, positions, mask = _packed(_documents())

    def rows(position_ids, seq_idx=None):
        found = model.tupe.positions(tuple(ids.shape), position_ids, None, seq_idx, attention_mask=mask)
        return model.tupe._attention_inputs(ids.shape[1], mask, torch.float64, positions=found).rows

    layout = rows(positions)
    if not SCHEME_CLASSES[scheme].document_rows:
        assert layout is None
        return
    b, n = ids.shape
    assert torch.equal(layout.reads[layout.writes], torch.arange(b * n))  # each token's slot reads it
    slots = sum(count * length for count, length in layout.groups)
    assert layout.reads.shape == (slots,) and layout.length == max(
        int(row.bincount().max()) for row in torch.cumsum(positions == 0, 1)
    )
    masked = sum(int((p < 0).sum()) for p in layout.paddings if p is not None)
    assert masked == slots - int(mask.sum())  # every slot but the real tokens' is a masked key
    shifted = positions.clone()
    shifted[0, :5] += 3  # the first document at positions 3..7, told apart by seq_idx
    seq_idx = torch.cumsum(positions == 0, dim=1)
    assert rows(shifted, seq_idx) is None


def test_length_limit_applies_to_positions_not_to_the_row():
    model = _model("bert-a").eval()  # max_position_embeddings 40
    ids = torch.randint(5, 50, (1, 60))
    with torch.no_grad():
        positions = torch.arange(60)[None] % 30  # two documents of 30: a row of 60 is fine
        assert model(ids, position_ids=positions).logits.shape == (1, 60, 50)
        with pytest.raises(ValueError, match="max_position_embeddings"):
            model(ids)
        with pytest.raises(ValueError, match=r"position_ids holds position 45.*'bert-a'.*0\.\.39"):
            model(ids, position_ids=torch.arange(60)[None] % 46)
        with pytest.raises(ValueError, match="position_ids holds position -1"):
            model(ids[:, :5], position_ids=torch.tensor([[0, 1, -1, 2, 3]]))


def test_kernels_without_documents_refuse_them_and_auto_picks_another():
    model = _model("tupe-a", torch.float32).eval()
    ids = torch.randint(5, 50, (1, 10))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])
    model.set_attn_implementation("fold")
    with pytest.raises(ValueError, match="'tupe_fold' cannot keep attention inside the documents"):
        model(ids, position_ids=positions)
    # per-row positions without documents: fold takes them (its extra columns per row)
    with torch.no_grad():
        shifted = torch.arange(5, 15)[None]
        folded = model(ids, position_ids=shifted).logits
        model.set_attn_implementation("eager")
        torch.testing.assert_close(folded, model(ids, position_ids=shifted).logits, atol=1e-5, rtol=1e-5)
    model.set_attn_implementation("auto")
    for device in ("cpu", "cuda"):
        auto = resolve_attention_kernel(model.config, device, documents=True)
        assert auto in ("sdpa", "flex") and auto != "fold"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("scheme", ["bert-r", "tupe-a", "alibi"])
def test_flex_keeps_documents_with_a_block_mask_forward(scheme):
    """flex has no CPU backward; its (unfused) forward with the document BlockMask is checked here."""
    model = _model(scheme, torch.float32).eval()
    ids, _, positions, mask = _packed(_documents())
    outs = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kernel in ("eager", "flex"):
            model.set_attn_implementation(kernel)
            outs[kernel] = model(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    torch.testing.assert_close(outs["flex"][real], outs["eager"][real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gradient_checkpointing_keeps_packed_gradients(scheme, use_reentrant):
    """Float64, dropout on (the recomputation must replay the same masks), packed rows with padding."""
    ids, labels, positions, mask = _packed(_documents())

    def gradients(checkpointing):
        model = _model(scheme, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1).train()
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": use_reentrant}
            )
        torch.manual_seed(1)
        return _step(model, input_ids=ids, labels=labels, position_ids=positions, attention_mask=mask)[1]

    plain, checkpointed = gradients(False), gradients(True)
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-12, rtol=1e-10, msg=name)


def _blind_scheme(takes_positions: bool):
    """A scheme whose terms are those of positions 0..n-1 whatever it is given (the old recipe's `forward(n)`)."""
    from tupe.modeling.positional import PositionalContext, PositionalScheme, SchemeReport

    class Blind(PositionalScheme):
        name = "toy-blind"
        report = SchemeReport("Toy", "a scheme of positions 0..n-1 only")
        terms = frozenset({"content_free"})

        def forward(self, n, positions):
            assert positions is None or self.takes_positions  # the model never passes it positions it refused
            i = torch.arange(n, dtype=torch.float32)
            return PositionalContext(self.logit_scale, content_free=-(i[None, :] - i[:, None]).abs()[None])

    Blind.takes_positions = takes_positions
    return Blind


def test_a_scheme_that_declares_it_takes_no_positions_refuses_position_ids_and_documents_by_name():
    """`takes_positions = False` is a declaration, not read off the signature: such a scheme runs without
    position_ids, and position_ids, `cu_seq_lens_q` or `seq_idx` (packed documents) are refused, naming it."""
    from tupe.modeling.positional import register_scheme, unregister_scheme

    register_scheme(_blind_scheme(takes_positions=False))
    try:
        model = TupeModel(tiny_config("toy-blind")).eval()
        ids = torch.randint(5, 50, (1, 6))
        model(ids)
        with pytest.raises(ValueError, match="'toy-blind' takes no position_ids"):
            model(ids, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]))
        with pytest.raises(ValueError, match="'toy-blind' takes no position_ids"):
            model(ids, seq_idx=torch.tensor([[0, 0, 0, 1, 1, 1]]))
    finally:
        unregister_scheme("toy-blind")


def test_a_scheme_always_receives_the_positions():
    """The contract passes `positions` to every scheme's forward (None: 0..n-1): a scheme that ignores them has
    to say so (above); one that takes them gets the packed documents' positions, and no signature is read."""
    from tupe.modeling.positional import register_scheme, unregister_scheme

    seen = []
    cls = _blind_scheme(takes_positions=True)
    forward = cls.forward
    cls.forward = lambda self, n, positions: seen.append(positions) or forward(self, n, positions)
    register_scheme(cls)
    try:
        model = TupeModel(tiny_config("toy-blind")).eval()
        ids = torch.randint(5, 50, (1, 6))
        model(ids)
        model(ids, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]))
        assert seen[0] is None and seen[1].ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    finally:
        unregister_scheme("toy-blind")


def test_trainer_with_data_collator_with_flattening_equals_the_padded_path(tmp_path):
    """transformers' Trainer trains a tiny tupe masked LM on DataCollatorWithFlattening's padding-free batches:
    the same parameters as the padded batches of the same examples (same order, same predicted tokens)."""
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    examples = []
    for ids, labels in _documents(seed=4) + _documents(seed=5)[:3]:
        labels = labels.clone()
        labels[0] = -100  # [CLS] is never predicted (the flattening collator puts its separator there)
        examples.append({"input_ids": ids.tolist(), "labels": labels.tolist()})

    def pad(features):
        width = max(len(f["input_ids"]) for f in features)
        batch = {"input_ids": [], "labels": [], "attention_mask": []}
        for f in features:
            extra = width - len(f["input_ids"])
            batch["input_ids"].append(f["input_ids"] + [0] * extra)
            batch["labels"].append(f["labels"] + [-100] * extra)
            batch["attention_mask"].append([1] * len(f["input_ids"]) + [0] * extra)
        return {k: torch.tensor(v) for k, v in batch.items()}

    def train(collator, name):
        model = _model("tupe-r", torch.float32).train()
        args = TrainingArguments(
            output_dir=str(tmp_path / name),
            per_device_train_batch_size=4,
            max_steps=3,
            learning_rate=0.5,
            # SGD: Adam scales a gradient of rounding size (theta_1's: it cancels in the softmax) to a full step
            optim="sgd",
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        Trainer(model=model, args=args, train_dataset=examples, data_collator=collator).train()
        return model

    flat = train(DataCollatorWithFlattening(), "flat")
    padded = train(pad, "padded")
    assert flat.tupe.resolve_attention_kernel() == padded.tupe.resolve_attention_kernel()
    start = _model("tupe-r", torch.float32)
    for (name, a), (_, b) in zip(flat.named_parameters(), padded.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)
    assert any(not torch.equal(a, s) for a, s in zip(flat.parameters(), start.parameters()))  # it trained


def test_torch_compile_keeps_packed_documents():
    """torch.compile traces the positions path (no Python branch on tensor values while compiling): packed rows
    give the uncompiled outputs and gradients. Dynamo's own backend ("eager"): inductor's code generation takes
    minutes on a 2-core CPU and adds nothing to what the trace decides."""
    model = _model("tupe-r", torch.float32).train()
    ids, labels, positions, mask = _packed(_documents())
    batch = dict(input_ids=ids, labels=labels, position_ids=positions, attention_mask=mask)
    want, want_grads = _step(model, **batch)
    torch._dynamo.reset()
    got, got_grads = _step(torch.compile(model, backend="eager"), **batch)
    # traced, the documents take the block-diagonal mask (no host decision while tracing); uncompiled, rows of
    # their own (`DocumentRows`): the two agree to float32's rounding, as a packed row and its documents alone do
    tol = TOLERANCE[torch.float32] * DEEPER[torch.float32]
    _close(got.logits, want.logits, tol, "logits")
    for name, grad in want_grads.items():
        _close(got_grads["_orig_mod." + name], grad, tol, name)


@pytest.mark.parametrize("scheme", ["tupe-r", "rope", "bert-a"])
@pytest.mark.parametrize(
    "name, value",
    [
        ("position_ids", torch.tensor([[0.0, 0.5, 1.0, 2.0, 3.0]])),  # was truncated: 0, 0, 1, 2, 3
        ("position_ids", torch.ones(1, 5, dtype=torch.bool)),  # was all ones
        (
            "position_ids",
            torch.tensor([[0.0, 1.0, float("nan"), 3.0, 4.0]]),
        ),  # was position -9223372036854775808
        ("position_ids", torch.arange(5, dtype=torch.float16)[None]),
        ("cu_seq_lens_q", torch.tensor([0.0, 2.5, 5.0])),  # was truncated to [0, 2, 5]
        ("seq_idx", torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]])),
    ],
)
def test_positions_and_boundaries_that_are_not_integers_are_refused(scheme, name, value):
    """Issue 49, item 14: float and bool position ids were truncated to other positions; BERT refuses them."""
    model = _model(scheme).eval()
    ids = torch.randint(5, 50, (1, 5))
    with pytest.raises(
        ValueError, match=rf"^{name} must be an integer tensor \(torch.long\), got torch\.\w+$"
    ):
        model(ids, **{name: value})
    integer = value.nan_to_num(2).long() if name != "cu_seq_lens_q" else torch.tensor([0, 2, 5])
    with torch.no_grad():
        model(ids, **{name: integer})  # the same values as integers run


def test_multiple_choice_takes_one_row_of_positions_for_every_choice_as_bert_does():
    """Issue 49, item 16: (n,) position_ids failed with `not enough values to unpack`; BERT broadcasts them."""
    model = _model("tupe-r", cls=TupeForMultipleChoice).eval()
    ids = torch.randint(5, 50, (2, 3, 8))
    shifted = torch.arange(2, 10)
    with torch.no_grad():
        want = model(ids, position_ids=shifted.expand(2, 3, 8)).logits
        torch.testing.assert_close(model(ids, position_ids=shifted).logits, want, atol=0, rtol=0)
    with pytest.raises(
        ValueError, match=r"position_ids has shape \(2, 8\); .*\(2, 3, 8\) or \(length,\) = \(8,\)"
    ):
        model(ids, position_ids=shifted.expand(2, 8))
    with pytest.raises(ValueError, match="position_ids must be an integer tensor"):
        model(ids, position_ids=shifted.float())


def test_sequence_classification_does_not_count_padding_at_position_0_as_documents():
    """Issue 49, item 16: padding given position 0 (a common way to write positions of a padded batch) made every
    pad token a "document": logits for 5 documents of a batch of 2, and no error without labels."""
    model = _model("tupe-r", cls=TupeForSequenceClassification).eval()
    ids = torch.randint(5, 50, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0) * mask  # 0..5 / 0, 1, 2, 0, 0, 0
    with torch.no_grad():
        got = model(ids, attention_mask=mask, position_ids=positions).logits
        want = model(ids, attention_mask=mask).logits
    assert got.shape == (2, 3)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_one_document_object_per_forward_read_on_the_host_once(monkeypatch):
    """`position_ids` of packed documents become one document object per forward pass: its lengths,
    `cu_seqlens` and maximum length come from one device -> host read, the length groups from no other, and a
    head that reads the documents (one logit row per document) shares its encoder's object."""
    from tupe.modeling import documents, modeling_tupe

    built = []
    original = documents.build_positions

    def counted_build(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(modeling_tupe, "build_positions", counted_build)
    reads = []
    for name in ("tolist", "item", "__bool__", "__int__", "__index__"):
        method = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, *a, _m=method, _n=name, **k: reads.append(_n) or _m(self, *a, **k),
        )
    ids = torch.randint(5, 50, (1, 9))
    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1]])  # documents of 3, 4 and 2 tokens
    model = TupeForMaskedLM(tiny_config("tupe-a")).eval()
    with torch.no_grad():
        model(input_ids=ids, position_ids=packed)
    assert reads == ["tolist"] and len(built) == 1
    (positions,) = built
    assert positions.lengths == (3, 4, 2) and positions.max_length == 4
    assert positions.cu_seqlens.tolist() == [0, 3, 7, 9]
    assert positions.rows(torch.float32).groups == ((2, 4), (1, 2))  # 4 and 3 (>= 3/4 of 4), then 2

    built.clear()
    classifier = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=2)).eval()
    with torch.no_grad():
        logits = classifier(input_ids=ids, position_ids=packed).logits
    assert logits.shape == (3, 2) and len(built) == 1  # one row per document, one object for head and encoder
