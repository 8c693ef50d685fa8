"""The attention kernel registry, and the fast exact kernels behind it (plus the one-pass masked-LM loss).

**The registry.** An attention kernel is one function with one signature,

    fn(q, k, v, ctx, mask, dropout_p, probabilities) -> (output, probabilities or None)

on projected (b, h, n, d) queries, keys and values (rotary positions and added positional queries/keys already
applied), the scheme's `PositionalContext`, the additive key mask (the (b, 1, 1, n) padding, or what the kernel's
`prepare` made of it once per forward pass), the attention-dropout probability (0 outside training) and whether
the attention probabilities are wanted; registered once as an `AttentionKernel` entry that says what it needs
(`needs`: context terms such as a low-rank fold), what it can take (`handles`), the dtypes and devices it runs on,
whether it has dropout, and when "auto" picks it. `TupeConfig.attention_kernel`, `PositionalScheme.kernels()`,
`from_pretrained(attn_implementation=...)`, `--attention-kernel` and `tupe bench` all read this one table: adding a
kernel is one function plus one `register_attention_kernel(AttentionKernel(...))` (docs/model.md "Attention
kernels"). Kernel names are compared here only.

**Why the fast kernels exist** (measured on the project's 2-core CPUs, see `docs/benchmarks.md`):
- `torch.nn.functional.dropout` on CPU draws its mask with `bernoulli_`, several times slower than 16 random
  bits per element and a comparison (`keep_scale_mask`); with attention dropout, or with a content-free term as
  a mask that needs a gradient, SDPA on CPU falls back to its unfused "math" kernel, which materialises scores,
  scaled scores, biased scores, probabilities and dropped probabilities as separate n x n tensors.
  `biased_attention` keeps one n x n buffer in the forward pass (probabilities, softmax in place) plus the
  scaled keep mask, takes the content-free term (computed once per forward pass) as a broadcast (h, n, n)
  tensor, never a (b x h, n, n) copy, and returns its gradient summed over the batch.
- `masked_lm_loss`: the decoder, its bias and the cross-entropy in one function whose softmax becomes the gradient.
- `fold_queries_keys` turns a low-rank content-free term (TUPE-A) and the key padding into extra query/key
  columns, padded to a multiple of 8, so SDPA runs without any n x n tensor (long sequences). The query/key
  heads become wider than the value heads, which rules out SDPA's flash kernel; CUDA runs the memory-efficient one.
- `flex_bias_attention` (CUDA): `flex_attention` with the content-free term read inside the kernel (no dropout:
  the registry refuses it when training with attention dropout).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------------------------------------------
# What a positional scheme hands the kernels (positional.py builds it; `PositionalScheme.terms` names its parts)
# ----------------------------------------------------------------------------------------------------------------


class Positions:
    """Positions given as data (`position_ids`), and the documents of each row: what a scheme reads instead of
    `0..n-1` when the model is given positions, and what the kernels keep attention inside.

    - ids (b, n) long: each token's position (`position_ids`); a document's first token has position 0.
    - documents (b, n) long or None: each token's document, numbered from 0 in each row (None: one document per
      row). A document is a run of tokens that starts where `position_ids` restart at 0 (or where explicit
      boundaries, `cu_seq_lens_q` / `seq_idx`, say); no token attends outside its own document.
    - real (b, n) bool or None: the tokens that are not padding (`attention_mask`); None: no padding.

    Integer data, no gradient: not among the context's `tensors()` a checkpoint passes to each layer.
    """

    def __init__(
        self, ids: torch.Tensor, documents: torch.Tensor | None = None, real: torch.Tensor | None = None
    ):
        self.ids = ids
        self.documents = documents
        self.real = real

    def offsets(self) -> torch.Tensor:
        """(b, n, n) `[i, j] = p_j - p_i` (key minus query), the relative positions of every pair."""
        return self.ids[:, None, :] - self.ids[:, :, None]

    def first(self) -> torch.Tensor:
        """(b, n) bool: tokens at position 0, a document's first token ([CLS], where TUPE's reset applies)."""
        return self.ids == 0

    def document_lengths(self) -> torch.Tensor:
        """(b, n) long: for each token, 1 + the largest position of a real (not padded) token of its document:
        the document's length when its positions are 0..m-1, whatever padding follows it."""
        ids = self.ids if self.real is None else self.ids.masked_fill(~self.real, -1)
        if self.documents is None:
            return (ids.amax(dim=1, keepdim=True) + 1).expand_as(ids)
        largest = torch.full_like(ids, -1).scatter_reduce(1, self.documents, ids, "amax", include_self=False)
        return largest.gather(1, self.documents) + 1


# A group of `DocumentRows` takes every document at least this fraction of its longest one's length: padding then
# costs at most 1 / GROUP_RATIO^2 (1.78x) of a group's attention work, and lengths 1..512 make at most 22 groups.
GROUP_RATIO = 0.75


class DocumentRows:
    """The documents of flattened rows laid out one per row, for attention only (`document_attention`): where
    every document's positions are 0..m-1 (what `DataCollatorWithFlattening` and `--packing documents` write), a
    document is attended exactly as if alone in its own row, so attention costs the sum of the documents' m^2
    instead of the rows' n^2, and the positional terms are those of positions 0..L-1, shared by every document
    (`PositionalContext.leading`), not one (n, n) term per row. The linear layers stay on the flattened tokens.

    Documents are sorted by length (longest first) and grouped (`GROUP_RATIO`); a group of g documents padded to
    the length L of its longest is one (g, h, L, d) batch of the kernel, the extra slots of its shorter documents
    masked as keys (they read the document's first token; their outputs are dropped). The layout's S slots are
    the groups' g * L, group after group, each document's L slots in a run.
    - reads (S,) long: the token (index into the b * n flattened tokens) each slot reads.
    - writes (b * n,) long: each token's slot.
    - groups ((g, L), ...) in layout order; paddings: per group, its (g, 1, 1, L) additive key mask (0 /
      dtype-min for extra slots and padded tokens), or None where it has neither.
    - length: the longest document (the positional terms are built for positions 0..length-1).
    """

    def __init__(
        self,
        reads: torch.Tensor,
        writes: torch.Tensor,
        groups: tuple[tuple[int, int], ...],
        paddings: tuple[torch.Tensor | None, ...],
    ):
        self.reads = reads
        self.writes = writes
        self.groups = groups
        self.paddings = paddings
        self.length = groups[0][1]

    @classmethod
    def of(cls, positions: Positions, dtype: torch.dtype) -> DocumentRows | None:
        """The layout of `positions`' documents, or None where a document's positions are not 0..m-1 (a
        document's later part; boundaries from `seq_idx`): such rows keep the (b, 1, n, n) block-diagonal mask.
        Padded tokens stay in their document, as masked keys. Decided on the host (from tensor values), so not
        while tracing."""
        b, n = positions.ids.shape
        device = positions.ids.device
        documents = (
            positions.documents if positions.documents is not None else torch.zeros_like(positions.ids)
        )
        counts = documents[:, -1] + 1  # (b,) documents per row (numbered 0.. in each row)
        document = (documents + (torch.cumsum(counts, 0) - counts)[:, None]).reshape(-1)  # (b * n,) global id
        token = torch.arange(b * n, device=device)
        first = torch.full((int(counts.sum()),), b * n, device=device).scatter_reduce(
            0, document, token, "amin"
        )  # (documents,) each document's first token
        ids = positions.ids.reshape(-1)
        if not torch.equal(ids, token - first[document]):
            return None
        lengths = torch.bincount(document)  # (documents,)
        order = torch.argsort(lengths, descending=True, stable=True)
        groups, begin, sorted_lengths = [], 0, lengths[order].tolist()
        while begin < len(sorted_lengths):
            length, end = sorted_lengths[begin], begin
            while end < len(sorted_lengths) and sorted_lengths[end] >= GROUP_RATIO * length:
                end += 1
            groups.append((end - begin, length))
            begin = end
        widths = torch.tensor([length for count, length in groups for _ in range(count)], device=device)
        start = torch.zeros_like(lengths)
        start[order] = torch.cumsum(widths, 0) - widths  # each document's first slot
        writes = start[document] + ids  # (b * n,) each token's slot: its position in its document's run
        reads = first[torch.repeat_interleave(order, widths)].index_copy_(0, writes, token)
        real = torch.zeros(reads.shape[0], dtype=torch.bool, device=device)
        real[writes] = True if positions.real is None else positions.real.reshape(-1)
        paddings, begin = [], 0
        for count, length in groups:
            keep = real[begin : begin + count * length].view(count, 1, 1, length)
            padding = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(
                ~keep, torch.finfo(dtype).min
            )
            paddings.append(None if bool(keep.all()) else padding)
            begin += count * length
        return cls(reads, writes, tuple(groups), tuple(paddings))


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: DocumentRows,
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """Attention of (b, h, n, d) queries, keys and values inside each document, one group of `rows` at a time:
    `attend(q, k, v, L, padding)` runs a kernel on a group's (g, h, L, d) rows with its (g, 1, 1, L) key padding
    (or None) and returns (g, h, L, d). Returns (b, h, n, d), a transposed view of a contiguous (b, n, h, d)
    tensor, as the output projection reads it. One gather (`index_select`) per input and one for the output;
    the groups are split off the gathered slots, so their gradients join in one concatenation."""
    b, h, n, d = q.shape
    sizes = [count * length for count, length in rows.groups]
    # (b, h, n, d) -> (b * n, h, d) tokens (a view of the fused projection's output) -> (S, h, d) slots
    q, k, v = (
        x.transpose(1, 2).reshape(b * n, h, d).index_select(0, rows.reads).split(sizes) for x in (q, k, v)
    )
    outputs = [
        attend(*(x.view(count, length, h, d).transpose(1, 2) for x in group), length, padding)
        .transpose(1, 2)
        .reshape(count * length, h, d)
        for (count, length), padding, *group in zip(rows.groups, rows.paddings, q, k, v)
    ]
    return torch.cat(outputs).index_select(0, rows.writes).view(b, n, h, d).transpose(1, 2)


class PositionalContext:
    """What a scheme contributes to one forward pass; shapes use n = sequence length, h = heads, d = head dim.

    - logit_scale: factor on the content logits `q k^T` (1/sqrt(d), 1/sqrt(2d) or 1/sqrt(4d)).
    - input_embedding (n, hidden): added to the word embeddings (BERT-style absolute positions).
    - content_free (h, n, n): the content-free term, logits added to every layer whatever the tokens (TUPE's
      untied position correlations as much as a relative bias; after the [CLS] reset where there is one).
    - query_add / key_add (h, n, d): added to every layer's queries / keys (BERT-A^d: `p U^Q`, `p U^K`).
    - rotary (cos, sin), each (n, d): rotation of queries and keys (RoPE).
    - fold (h, n, r) x 2: extra query / key columns whose products equal `content_free` up to a per-query constant
      (which cancels in the softmax), so attention can run without an n x n tensor. Already scaled.
    - relative_embeddings (m, hidden): position vectors shared by all layers that each layer projects with its own
      weights (DeBERTa's relative embeddings, one row per offset `i - j` that occurs).
    - relative_index: the row of `relative_embeddings` each offset (DeBERTa: (2n - 1,), None when there is one row
      per offset) or, with positions given as data, each pair ((b, n, n)) reads.
    - parts: the scheme's own tensors, by name, that its methods below read (TUPE-A: the projected positions
      `p U^Q`, `p U^K` and the [CLS] values its `content_free` is built from).
    - content_free_method: a method of the scheme, `content_free_method(ctx) -> content_free`, that builds the
      term from this context on first read (then cached), so a pass that folds never materialises it (long
      sequences on GPU); `has_content_free` tells whether there is a term without building it.
    - layer_term: a method of the scheme, `layer_term(ctx, q, k, project) -> (b, h, n, n)`, an additive logit term
      of the layer's queries and keys, of `project(r) -> (r W^Q, r W^K)`, the layer's own projections (each
      (h, m, d)), and of this context (DeBERTa: its `relative_embeddings`). Each attention layer calls it once and
      hands the result to the kernel as `layer_logits`.
    - layer_logits (b, h, n, n): that term for the layer being run (set on the layer's copy of the context).
    - positions: the `Positions` of this pass when the model was given `position_ids` (else None: `0..n-1` in
      every row). With positions, `content_free`, `query_add` / `key_add`, `fold` and `rotary` carry a leading batch
      dimension: (b, h, n, n), (b, h, n, d), (b, h, n, r), (b, 1, n, d); `input_embedding` is (b, n, hidden).

    Every tensor a layer reads is one of these fields (`tensors()`), so gradient checkpointing hands each layer
    its own copies (`with_tensors`). What a scheme computes later is one of its methods, called with the context:
    a closure would hide the tensors it captures from the checkpoint, so `content_free_method` and `layer_term`
    refuse anything but a method, and the context refuses attributes it does not declare.
    """

    __slots__ = (
        "logit_scale",
        "input_embedding",
        "_content_free",
        "query_add",
        "key_add",
        "rotary",
        "fold",
        "relative_embeddings",
        "relative_index",
        "parts",
        "content_free_method",
        "layer_term",
        "layer_logits",
        "positions",
    )
    # the fields `tensors()` flattens, in order: a tensor, a tuple of tensors or None each (`parts` follows them)
    _TENSOR_FIELDS = (
        "input_embedding",
        "_content_free",
        "query_add",
        "key_add",
        "rotary",
        "fold",
        "relative_embeddings",
        "relative_index",
        "layer_logits",
    )

    def __init__(
        self,
        logit_scale: float,
        input_embedding: torch.Tensor | None = None,
        content_free: torch.Tensor | None = None,
        query_add: torch.Tensor | None = None,
        key_add: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        fold: tuple[torch.Tensor, torch.Tensor] | None = None,
        relative_embeddings: torch.Tensor | None = None,
        relative_index: torch.Tensor | None = None,
        parts: dict[str, torch.Tensor] | None = None,
        content_free_method: Callable[[PositionalContext], torch.Tensor] | None = None,
        layer_term: Callable[..., torch.Tensor] | None = None,
    ):
        self.logit_scale = logit_scale
        self.input_embedding = input_embedding
        self._content_free = content_free
        self.query_add, self.key_add = query_add, key_add
        self.rotary = rotary
        self.fold = fold
        self.relative_embeddings = relative_embeddings
        self.relative_index = relative_index
        self.parts = {} if parts is None else parts
        self.content_free_method = content_free_method
        self.layer_term = layer_term
        self.layer_logits: torch.Tensor | None = None
        self.positions: Positions | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in PositionalContext.__slots__ and name != "content_free":
            raise AttributeError(
                f"PositionalContext has no field {name!r} (fields: {', '.join(_CONTEXT_FIELDS)}): a scheme's own "
                f"tensors go in `parts`, what it computes from them later in a method (`content_free_method`, "
                f"`layer_term`)"
            )
        if (
            name in ("content_free_method", "layer_term")
            and value is not None
            and not _is_module_method(value)
        ):
            raise TypeError(
                f"PositionalContext.{name} must be a method of the scheme (e.g. `self.{name}`) reading the tensors "
                f"of the context it is given, not {value!r}: a closure hides the tensors it captures from "
                f"gradient checkpointing (put them in `parts`)"
            )
        if name == "parts" and not all(isinstance(t, torch.Tensor) for t in value.values()):
            raise TypeError(f"PositionalContext.parts holds tensors only, got {sorted(value)}")
        object.__setattr__(self, name, value)

    def copy(self) -> PositionalContext:
        """A shallow copy (the tensors are shared, `parts` is a new dict)."""
        new = object.__new__(PositionalContext)
        for name in PositionalContext.__slots__:
            object.__setattr__(new, name, getattr(self, name))
        object.__setattr__(new, "parts", dict(self.parts))
        return new

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor of the context, flattened in field order, `parts` last (what `with_tensors` takes back)."""
        flat: list[torch.Tensor] = []
        for name in self._TENSOR_FIELDS:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                flat.append(value)
            elif value is not None:
                flat.extend(value)
        flat.extend(self.parts.values())
        return tuple(flat)

    def with_tensors(self, tensors: Sequence[torch.Tensor]) -> PositionalContext:
        """A copy holding `tensors` (from `tensors()`, or a checkpoint's copies of them) in place of its own."""
        new, it = self.copy(), iter(tensors)
        for name in self._TENSOR_FIELDS:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                object.__setattr__(new, name, next(it))
            elif value is not None:
                object.__setattr__(new, name, tuple(next(it) for _ in value))
        object.__setattr__(new, "parts", {name: next(it) for name in self.parts})
        return new

    def for_layer(self, layer_logits: torch.Tensor) -> PositionalContext:
        """A shallow copy carrying one layer's `layer_logits` (the shared context is never modified)."""
        ctx = self.copy()
        ctx.layer_logits = layer_logits
        return ctx

    def leading(self, length: int) -> PositionalContext:
        """A shallow copy with the terms of positions 0..length-1 only (positions 0..n-1, not given as data): the
        context of a document of that length in its own row (`DocumentRows`), views of this one's terms, so their
        gradients reach the shared term. Not for `layer_term` (built for one length)."""
        ctx = self.copy()
        term = self.content_free  # built once (then cached on this shared context), sliced per length
        ctx.content_free = None if term is None else term[..., :length, :length]
        if self.query_add is not None:
            ctx.query_add, ctx.key_add = self.query_add[..., :length, :], self.key_add[..., :length, :]
        if self.rotary is not None:
            ctx.rotary = tuple(t[..., :length, :] for t in self.rotary)
        if self.fold is not None:
            ctx.fold = tuple(t[..., :length, :] for t in self.fold)
        return ctx

    @property
    def content_free(self) -> torch.Tensor | None:
        if self._content_free is None and self.content_free_method is not None:
            self._content_free, self.content_free_method = self.content_free_method(self), None
        return self._content_free

    @content_free.setter
    def content_free(self, value: torch.Tensor | None) -> None:
        self._content_free, self.content_free_method = value, None

    @property
    def has_content_free(self) -> bool:
        return self._content_free is not None or self.content_free_method is not None


_CONTEXT_FIELDS = ("content_free", *(name for name in PositionalContext.__slots__ if name != "_content_free"))


def _is_module_method(fn: object) -> bool:
    """A method bound to a module (a scheme), which reads what it is given and the module's parameters."""
    return inspect.ismethod(fn) and isinstance(fn.__self__, nn.Module)


# Logit added to padded keys in the folded path: far below any real logit, so exp() underflows to exactly 0,
# yet finite (and representable in float16/bfloat16) so that 0 * it never produces NaN.
FOLD_PAD_LOGIT = -1.0e4


def keep_scale_mask(shape: torch.Size, p: float, like: torch.Tensor) -> torch.Tensor:
    """Float mask: 1 / (1 - p') where kept, 0 where dropped, each element dropped with probability p'.

    p' is p rounded to a multiple of 2^-16 (|p' - p| <= 2^-17; the rescaling uses p', so the mask stays
    unbiased): every element takes 16 random bits, so one 64-bit draw serves four elements. PyTorch's CPU
    generator is serial, and `torch.rand` spends a 32-bit draw and a float conversion per element, twice the
    time. A float mask because a bool one is converted to a float copy by every multiplication on CPU.
    """
    numel = math.prod(shape)
    words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=like.device)
    bits = words.random_(-(2**63), 2**63 - 1).view(torch.int16)[:numel].view(shape)  # uniform on int16
    dropped = round(p * 65536)  # number of the 65536 values that drop
    if dropped >= 65536:
        return torch.zeros(shape, device=like.device, dtype=like.dtype)
    keep = bits.to(torch.float32).ge_(dropped - 32768)
    return keep.mul_(65536 / (65536 - dropped)).to(like.dtype)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = keep_scale_mask(x.shape, p, x)
        ctx.save_for_backward(keep)
        return x * keep

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad * keep, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout, same distribution as `F.dropout`, with a faster mask draw on CPU."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    if x.device.type != "cpu":
        return nn.functional.dropout(x, p, True)
    return _Dropout.apply(x, p)


class FastDropout(nn.Dropout):
    """`nn.Dropout` (same state dict, same semantics) using `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class _BiasedAttention(torch.autograd.Function):
    """softmax(q k^T * scale + bias + padding) with dropout, times v; see `biased_attention`.

    Every product is an explicit `bmm` on contiguous (b*h, n, d) operands: `matmul` on the strided 4-D views that
    the fused QKV projection gives copies them inside each call, and (measured at the mini shape) ran the q k^T
    products at half speed. The scaled queries are kept for backward, so dk needs no rescaling.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, padding, scale: float, dropout_p: float):
        b, h, n, d = q.shape
        q3 = (q * scale).reshape(b * h, n, d)  # a new, contiguous tensor
        k3 = k.reshape(b * h, n, d).contiguous()
        v3 = v.reshape(b * h, n, d).contiguous()
        s = torch.bmm(q3, k3.transpose(1, 2))  # (b*h, n, n)
        s4 = s.view(b, h, n, n)
        if bias is not None:
            s4.add_(bias)  # (h, n, n) broadcast over the batch, never expanded
        if padding is not None:
            s4.add_(padding)
        torch.softmax(s, dim=-1, out=s)  # in place: the only n x n float buffer kept for backward
        keep = None
        if dropout_p > 0.0:
            keep = keep_scale_mask(s.shape, dropout_p, s)  # 0 or 1 / (1 - p)
            out = torch.bmm(s * keep, v3)
        else:
            out = torch.bmm(s, v3)
        ctx.save_for_backward(q3, k3, v3, s, keep)
        ctx.scale = scale
        ctx.bias_shape = None if bias is None else bias.shape
        return out.view(b, h, n, d)

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, probs, keep = ctx.saved_tensors
        b, h, n, d = dout.shape
        dout = dout.reshape(b * h, n, d)
        if keep is not None:
            buf = probs * keep  # the dropped, rescaled probabilities the forward multiplied v by
            dv = torch.bmm(buf.transpose(1, 2), dout) if ctx.needs_input_grad[2] else None
            torch.bmm(dout, v3.transpose(1, 2), out=buf)
            buf.mul_(keep)
        else:
            dv = torch.bmm(probs.transpose(1, 2), dout) if ctx.needs_input_grad[2] else None
            buf = torch.bmm(dout, v3.transpose(1, 2))
        # P * (dP - rowsum(dP * P)), written over dP (row by row: each row is read before it is written)
        ds = torch.ops.aten._softmax_backward_data.out(buf, probs, -1, probs.dtype, grad_input=buf)
        dq = torch.bmm(ds, k3).mul_(ctx.scale).view(b, h, n, d) if ctx.needs_input_grad[0] else None
        dk = torch.bmm(ds.transpose(1, 2), q3).view(b, h, n, d) if ctx.needs_input_grad[1] else None
        dv = None if dv is None else dv.view(b, h, n, d)
        dbias = None
        if ctx.bias_shape is not None and ctx.needs_input_grad[3]:
            ds4 = ds.view(b, h, n, n)
            if b == 1 and ds4.dim() == len(ctx.bias_shape) + 1:
                dbias = ds4[0]  # batch of one: a view, no reduction pass
            else:
                dbias = ds4.sum_to_size(ctx.bias_shape)
        return dq, dk, dv, dbias, None, None, None


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    padding: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention with an additive content-free term shared by the batch, for training on CPU.

    Args:
        q, k, v: (b, h, n, d). bias: (h, n, n) or None, differentiable (it carries TUPE's positional gradient).
        padding: (b, 1, 1, n) additive key mask (0 / dtype-min) or None. scale: factor on `q k^T`.
    Returns (b, h, n, d). Equal to the eager reference (same dropout distribution, up to p rounded to a
    multiple of 2^-16, see `keep_scale_mask`). Float32/float64 only: under autocast the caller uses SDPA instead.
    """
    return _BiasedAttention.apply(q, k, v, bias, padding, scale, dropout_p)


class _MaskedLMLoss(torch.autograd.Function):
    """Cross-entropy of `hidden @ weight^T + bias` (mean over rows), returning the logits too; see `masked_lm_loss`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets):
        logits = torch.addmm(bias, hidden, weight.t())  # (m, vocab), the bias added inside the GEMM
        picked = logits.gather(1, targets[:, None])
        top = logits.amax(1, keepdim=True)
        probs = torch.sub(logits, top).exp_()
        total = probs.sum(1, keepdim=True)
        count = max(targets.shape[0], 1)
        loss = (total.log() + top - picked).sum() / count
        probs.div_(total)  # softmax, kept for backward: its gradient is probs - one_hot
        ctx.save_for_backward(hidden, weight, probs, targets)
        ctx.count = count
        ctx.set_materialize_grads(False)
        return loss, logits

    @staticmethod
    def backward(ctx, grad_loss, grad_logits):
        # a second backward through the graph (retain_graph) fails here: autograd sees that `probs` was modified
        hidden, weight, probs, targets = ctx.saved_tensors
        grad = probs  # overwritten in place
        if grad_loss is None:
            grad.zero_()
        else:
            grad[torch.arange(grad.shape[0], device=grad.device), targets] -= 1.0
            grad.mul_(grad_loss / ctx.count)
        if grad_logits is not None:
            grad.add_(grad_logits)
        d_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        d_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        d_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
        return d_hidden, d_weight, d_bias, None


def masked_lm_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, logits) of the masked-LM decoder on the predicted rows, in one pass.

    hidden (m, d), weight (vocab, d), bias (vocab,), targets (m,) -> (scalar, (m, vocab)); the loss of no rows
    is 0. Equal to `F.cross_entropy(F.linear(hidden, weight) + bias, targets)`, and both outputs are
    differentiable, but it skips that path's separate bias pass, log-softmax backward and one-hot fill: the
    softmax computed for the loss is kept and becomes the gradient in place (so a second backward through the
    same graph, `retain_graph=True`, is refused by autograd). Float32/64 without autocast.
    """
    return _MaskedLMLoss.apply(hidden, weight, bias, targets)


def fold_queries_keys(
    q: torch.Tensor,
    k: torch.Tensor,
    fold: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    padding: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[q * scale, q_extra (, 1)] and [k, k_extra (, 0 or FOLD_PAD_LOGIT)], zero-padded to a multiple of 8.

    `(q' k'^T)_ij = scale q_i.k_j + positional_ij (+ padding_j)` up to a per-query constant, so SDPA with
    `scale=1` and no mask gives the reference attention. The padding column is per batch element, (b, h, n, 1);
    nothing of size n x n is built. The multiple-of-8 width keeps SDPA's memory-efficient CUDA kernel aligned;
    q/k are wider than v, so the flash kernel (equal widths only) does not apply.
    """
    b, h, n, d = q.shape
    q_extra, k_extra = fold
    q_extra = q_extra.to(q.dtype).expand(b, -1, -1, -1)
    k_extra = k_extra.to(k.dtype).expand(b, -1, -1, -1)
    q_parts, k_parts = [q * scale, q_extra], [k, k_extra]
    width = d + q_extra.shape[-1]
    if padding is not None:
        masked = padding.reshape(b, 1, n, 1) < 0  # (b, 1, n, 1): True for padded keys
        q_parts.append(q.new_ones(b, h, n, 1))
        k_parts.append(torch.where(masked, FOLD_PAD_LOGIT, 0.0).to(k.dtype).expand(b, h, n, 1))
        width += 1
    extra = -width % 8
    if extra:
        q_parts.append(q.new_zeros(b, h, n, extra))
        k_parts.append(k.new_zeros(b, h, n, extra))
    return torch.cat(q_parts, dim=-1), torch.cat(k_parts, dim=-1)


def flex_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    padding: torch.Tensor | None,
    scale: float,
    block_mask: Any = None,
) -> torch.Tensor:
    """`flex_attention` with the (h, n, n) (or, positions given as data, (b, h, n, n)) content-free term added
    inside the kernel; `block_mask`: a `BlockMask` (documents) passed through (no (b, h, n, n) tensor,
    no dropout: flex has none, so the model refuses this kernel when training with attention dropout). Compiled on CUDA; elsewhere PyTorch runs its unfused reference (for tests).

    Under autocast, q/k/v go in as the autocast dtype and flex runs with autocast off (older PyTorch has no
    autocast rule for the compiled flex_attention); the term is read as a contiguous float32 tensor.
    """
    from torch.nn.attention.flex_attention import flex_attention

    keep = None if padding is None else (padding.reshape(padding.shape[0], -1) >= 0)
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    # float32 at least (a term computed under autocast is bf16/fp16: its gradient is then summed in float32) and
    # contiguous (read along keys; a permuted relative-bias gather would be read strided, and compile anew)
    bias = bias.to(torch.promote_types(bias.dtype, torch.float32)).contiguous()

    per_row = bias.dim() == 4

    def score_mod(score, b, h, q_idx, kv_idx):
        score = score + (bias[b, h, q_idx, kv_idx] if per_row else bias[h, q_idx, kv_idx])
        if keep is not None:
            score = torch.where(keep[b, kv_idx], score, -float("inf"))
        return score

    fn = _compiled_flex() if q.is_cuda else flex_attention
    options = flex_kernel_options(q) if q.is_cuda else None
    with torch.autocast(device_type, enabled=False):
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, kernel_options=options)


# PyTorch's own flex configuration for 16-bit q/k/v of head width 64 on sm90 (H100/H200) is 128 x 128 blocks in 3
# stages; with our float32 (h, n, n) term read in the score_mod it needed 240 KiB of shared memory, over the 227 KiB
# limit, and did not compile (an H200, torch 2.11.0+cu130, 2026-11-27). 64 x 64 blocks compiled and ran the base
# shape's forward + backward in 1.16 ms against 1.30 ms for 128 x 64 (benchmarks/gpu/flex_probe.py, docs/benchmarks.md).
SM90_HALF_FLEX_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64}


def flex_kernel_options(q: torch.Tensor) -> dict | None:
    """`kernel_options` for the compiled flex_attention on CUDA: the JSON object in `$TUPE_FLEX_KERNEL_OPTIONS` if set
    (`{}` = PyTorch's own choice; e.g. `{"BLOCK_M": 64, "BLOCK_N": 64}`), else `SM90_HALF_FLEX_OPTIONS` for bf16/fp16
    on an sm90 GPU, else None (PyTorch's choice)."""
    import json
    import os

    text = os.environ.get("TUPE_FLEX_KERNEL_OPTIONS", "").strip()
    if text:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"TUPE_FLEX_KERNEL_OPTIONS is not JSON ({err}): {text!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"TUPE_FLEX_KERNEL_OPTIONS must be a JSON object, got {text!r}")
        return value or None
    if q.dtype in (torch.float16, torch.bfloat16) and torch.cuda.get_device_capability(q.device) == (9, 0):
        return dict(SM90_HALF_FLEX_OPTIONS)
    return None


_COMPILED_FLEX = None


def _compiled_flex():
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


# ----------------------------------------------------------------------------------------------------------------
# The attention kernel registry
# ----------------------------------------------------------------------------------------------------------------

# What a scheme's `PositionalContext` may carry that concerns a kernel (`PositionalScheme.terms` lists a scheme's).
# A kernel refuses a scheme that has a term marked "must take" which the kernel does not list in `handles`; terms
# not marked so are optional representations (the fold is the content-free term again) or are applied before any
# kernel runs.
CONTEXT_TERMS: dict[str, tuple[str, bool]] = {
    # name: (description for messages, must a kernel take it)
    "content_free": ("a content-free logit term (ctx.content_free, (h, n, n), shared by the batch)", True),
    "fold": (
        "a low-rank content-free term (ctx.fold: extra query/key columns equal to ctx.content_free)",
        False,
    ),
    "constant": ("a constant content-free term (nothing learned: ctx.content_free needs no gradient)", False),
    "rotary": ("rotary positions (ctx.rotary, applied to queries and keys)", False),
    "layer": (
        "a per-layer term of the layer's own queries, keys and projections (ctx.layer_logits, (b, h, n, n))",
        True,
    ),
}

KernelFn = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]
"""fn(q, k, v, ctx, mask, dropout_p, probabilities) -> (output (b, h, n, d), probabilities (b, h, n, n) or None)."""


@dataclass(frozen=True)
class KernelSituation:
    """What one forward pass looks like to the kernel choice: the scheme's context terms, device, compute dtype,
    train mode (dropout active), whether gradients are recorded, and whether probabilities are wanted."""

    terms: frozenset[str]
    device_type: str = "cpu"
    dtype: torch.dtype = torch.float32
    training: bool = False
    grad: bool = False
    dropout: bool = False  # attention dropout active: training and attention_probs_dropout_prob > 0
    probabilities: bool = False
    documents: bool = (
        False  # several documents in a row (position_ids restarting at 0): attention kept inside
    )

    @property
    def trains(self) -> bool:
        """A training step: train mode with gradients recorded."""
        return self.training and self.grad


@dataclass(frozen=True)
class AttentionKernel:
    """One registry entry: the function and what it needs; see the module docstring for the signature.

    - needs: context terms the scheme must have (e.g. {"fold"}); handles: "must take" terms it can take.
    - dtypes: compute dtypes it runs in (None: any). train_devices: device types it has a backward on (None: any).
    - dropout: whether it implements attention dropout (else training with dropout is refused).
    - probabilities: whether it returns the attention probabilities (`output_attentions` needs one that does).
    - prepare(ctx, padding, dtype) -> mask: run once per forward pass, its result is every layer's `mask`.
    - auto(situation) -> bool: when "auto" picks it (first match in registration order; else `AUTO_FALLBACK`).
    - documents: how it keeps attention inside the documents of a row: "mask" (the model runs each document as
      a row of its own through it, `DocumentRows`, where their positions allow, else merges them into the
      additive mask it hands `prepare` / the kernel: (b, 1, n, n), 0 inside a document, dtype-min across and for
      padded keys), "context" (the kernel reads `ctx.positions.documents` itself; its mask stays the padding), or
      None: it cannot, and refuses such a pass (then "auto" picks another).
    """

    name: str
    fn: KernelFn
    summary: str
    needs: frozenset[str] = frozenset()
    handles: frozenset[str] = frozenset({"content_free"})
    dtypes: tuple[torch.dtype, ...] | None = None
    train_devices: tuple[str, ...] | None = None
    dropout: bool = True
    probabilities: bool = False
    prepare: Callable[[Any, torch.Tensor | None, torch.dtype], torch.Tensor | None] | None = None
    auto: Callable[[KernelSituation], bool] | None = None
    reads_content_free: bool = (
        True  # reads the materialised content-free term (fold reads its low-rank factors instead)
    )
    documents: str | None = None

    def scheme_refusal(self, terms: frozenset[str]) -> str | None:
        """Why this kernel cannot run a scheme with these context terms, or None."""
        missing = sorted(self.needs - terms)
        if missing:
            return "needs " + " and ".join(CONTEXT_TERMS[t][0] for t in missing)
        untaken = sorted(t for t in terms - self.handles - self.needs if CONTEXT_TERMS.get(t, ("", True))[1])
        if untaken:
            return "cannot take " + " and ".join(CONTEXT_TERMS.get(t, (t,))[0] for t in untaken)
        return None

    def refusal(self, situation: KernelSituation) -> str | None:
        """Why this kernel cannot run this forward pass, or None."""
        why = self.scheme_refusal(situation.terms)
        if why:
            return why
        if self.dtypes is not None and situation.dtype not in self.dtypes:
            names = "/".join(str(t).removeprefix("torch.") for t in self.dtypes)
            return f"runs in {names} only, not {str(situation.dtype).removeprefix('torch.')} (autocast?)"
        if situation.dropout and not self.dropout:
            return "has no attention dropout, so it cannot train with attention_probs_dropout_prob > 0"
        if (
            situation.trains
            and self.train_devices is not None
            and situation.device_type not in self.train_devices
        ):
            return f"has no backward on {situation.device_type} (it trains on {'/'.join(self.train_devices)} only)"
        if situation.documents and self.documents is None:
            return (
                "cannot keep attention inside the documents of a row (position_ids restarting at 0, cu_seq_lens_q "
                "or seq_idx)"
            )
        return None


_REGISTRY: dict[str, AttentionKernel] = {}
AUTO = "auto"  # not a kernel: picks one per forward pass (`AttentionKernel.auto`)
AUTO_FALLBACK = "sdpa"  # what "auto" runs when no kernel's `auto` rule holds
# Other names for kernels, accepted wherever a kernel name is: transformers' and `tupe bench`'s.
KERNEL_ALIASES: dict[str, str] = {"flex_attention": "flex", "sdpa-fold": "fold", "default": AUTO}


_VERSION = [0]  # bumped by every (un)registration: what a model's cache of resolved kernels is valid for


def registry_version() -> int:
    """A number that changes whenever a kernel is registered or unregistered."""
    return _VERSION[0]


class _KernelNames(Sequence[str]):
    """`ATTENTION_KERNELS`: "auto" then every registered kernel, read live from the registry."""

    def _names(self) -> tuple[str, ...]:
        return (AUTO, *_REGISTRY)

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - Sequence protocol
        return self._names()[index]

    def __len__(self) -> int:
        return len(_REGISTRY) + 1

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


ATTENTION_KERNELS: Sequence[str] = _KernelNames()


def register_attention_kernel(kernel: AttentionKernel) -> AttentionKernel:
    """Add a kernel under `kernel.name` (refused if the name is taken); returns it."""
    if kernel.name in _REGISTRY or kernel.name in KERNEL_ALIASES or kernel.name == AUTO:
        raise ValueError(f"attention kernel {kernel.name!r} is already registered")
    unknown = sorted((kernel.needs | kernel.handles) - set(CONTEXT_TERMS))
    if unknown:
        raise ValueError(
            f"attention kernel {kernel.name!r}: unknown context terms {unknown}; known: {list(CONTEXT_TERMS)}"
        )
    _REGISTRY[kernel.name] = kernel
    _VERSION[0] += 1
    return kernel


def unregister_attention_kernel(name: str) -> None:
    """Remove a registered kernel (e.g. a test's toy kernel)."""
    _REGISTRY.pop(name)
    _VERSION[0] += 1


def canonical_kernel_name(name: str, what: str = "attention_kernel") -> str:
    """A registered name or "auto", aliases resolved; anything else is refused in one line listing what exists."""
    name = KERNEL_ALIASES.get(name, name)
    if name != AUTO and name not in _REGISTRY:
        # transformers' own opening words for this refusal (its common model tests match them), then tupe's list
        raise ValueError(
            f'Specified `{what}="{name}"` is not supported; valid: {", ".join(ATTENTION_KERNELS)} '
            f"(aliases: {', '.join(f'{a}={k}' for a, k in KERNEL_ALIASES.items())})"
        )
    return name


def get_attention_kernel(name: str) -> AttentionKernel:
    """The registry entry of a (canonical or alias) kernel name; "auto" is not a kernel."""
    return _REGISTRY[canonical_kernel_name(name)]


def kernels_for_terms(terms: frozenset[str]) -> tuple[str, ...]:
    """The `attention_kernel` values that apply to a scheme with these context terms ("auto" always does)."""
    return (AUTO, *(k.name for k in _REGISTRY.values() if k.scheme_refusal(terms) is None))


def check_kernel_for_scheme(
    name: str, scheme: str, terms: frozenset[str], what: str = "attention_kernel"
) -> str:
    """The canonical name, or a ValueError saying why it cannot run this scheme and what can."""
    name = canonical_kernel_name(name, what)
    why = None if name == AUTO else _REGISTRY[name].scheme_refusal(terms)
    if why:
        raise ValueError(
            f"{what} {name!r} {why}, which position_scheme {scheme!r} does not have or allow; "
            f"kernels for it: {', '.join(kernels_for_terms(terms))}"
        )
    return name


def select_kernel(name: str, situation: KernelSituation) -> AttentionKernel:
    """The kernel that runs one forward pass: `name` (checked against the situation, refused with the reason) or,
    for "auto", the first kernel whose `auto` rule holds. Probabilities wanted from a kernel that has none: the
    first registered kernel that returns them (the eager reference), as `transformers` models do."""
    name = canonical_kernel_name(name)
    if situation.probabilities and (name == AUTO or not _REGISTRY[name].probabilities):
        return next(
            k
            for k in _REGISTRY.values()
            if k.probabilities
            and k.scheme_refusal(situation.terms) is None
            and (k.documents is not None or not situation.documents)
        )
    if name == AUTO:
        for kernel in _REGISTRY.values():
            if kernel.auto is not None and kernel.refusal(situation) is None and kernel.auto(situation):
                return kernel
        name = AUTO_FALLBACK
    kernel = _REGISTRY[name]
    why = kernel.refusal(situation)
    if why:
        raise ValueError(
            f"attention_kernel {name!r} {why}; set attention_kernel (or --attention-kernel) to another"
        )
    return kernel


# ---- the kernels ------------------------------------------------------------------------------------------------


def eager_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """The reference: the logits exactly as written in docs/model.md, materialised; softmax in the model's dtype
    (float32 for float16/bfloat16), so the reference is exact in float64."""
    logits = torch.matmul(q, k.transpose(-1, -2)) * ctx.logit_scale  # (b, h, n, n)
    if ctx.content_free is not None:
        logits = logits + ctx.content_free.to(logits.dtype)
    if ctx.layer_logits is not None:
        logits = logits + ctx.layer_logits.to(logits.dtype)
    if mask is not None:
        logits = logits + mask.to(logits.dtype)
    half = logits.dtype in (torch.float16, torch.bfloat16)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32 if half else None).to(q.dtype)
    dropped = F.dropout(probs, dropout_p, True) if dropout_p > 0.0 else probs
    return torch.matmul(dropped, v), probs


def sdpa_mask(
    ctx: PositionalContext, padding: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """The content-free term plus the padding as one additive (1 or b, h, n, n) mask, once for all layers."""
    if ctx.content_free is None:
        return padding
    mask = ctx.content_free.to(dtype)
    if mask.dim() == 3:
        mask = mask[None]  # (1, h, n, n): broadcast over the batch (positions as data: already (b, h, n, n))
    if padding is not None:
        mask = (mask + padding).clamp(min=torch.finfo(dtype).min)
    return mask


def sdpa_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """`scaled_dot_product_attention` with `sdpa_mask` (plus this layer's `layer_logits`) as its additive mask."""
    mask = None if mask is None else mask.to(q.dtype)
    if ctx.layer_logits is not None:
        extra = ctx.layer_logits.to(q.dtype)
        mask = extra if mask is None else (extra + mask).clamp(min=torch.finfo(q.dtype).min)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=ctx.logit_scale
    ), None


def fold_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """Low-rank term and padding folded into extra query/key columns (`fold_queries_keys`): no n x n tensor at
    all. q/k end up wider than v, so SDPA's flash kernel does not apply; CUDA runs the memory-efficient one."""
    q, k = fold_queries_keys(q, k, ctx.fold, ctx.logit_scale, mask)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=1.0), None


def fused_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """CPU training: one n x n buffer, the shared (h, n, n) term broadcast, the fast dropout mask; a layer's own
    (b, h, n, n) term (`layer_logits`) is added in the same buffer, and its gradient is the buffer's."""
    bias = ctx.content_free
    if ctx.layer_logits is not None:
        bias = ctx.layer_logits if bias is None else ctx.layer_logits + bias
    return biased_attention(q, k, v, bias, mask, ctx.logit_scale, dropout_p), None


def flex_block_mask(ctx: PositionalContext, padding: torch.Tensor | None, dtype: torch.dtype):
    """`flex`'s mask: the padding as it is, or with documents in a row a `BlockMask` whose `mask_mod` compares the
    tokens' document ids (and drops padded keys): no n x n tensor, and blocks of two documents are skipped."""
    positions = ctx.positions
    if positions is None or positions.documents is None:
        return padding
    from torch.nn.attention.flex_attention import create_block_mask

    documents = positions.documents
    keep = None if padding is None else (padding.reshape(padding.shape[0], -1) >= 0)
    b, n = documents.shape

    def mask_mod(batch, head, q_idx, kv_idx):
        same = documents[batch, q_idx] == documents[batch, kv_idx]
        return same if keep is None else same & keep[batch, kv_idx]

    return create_block_mask(mask_mod, b, None, n, n, device=documents.device)


def flex_attention_kernel(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """`flex_attention` with the content-free term read in a score_mod (`flex_bias_attention`); with documents
    its `mask` is the document `BlockMask` of `flex_block_mask`."""
    if mask is not None and not isinstance(mask, torch.Tensor):  # a BlockMask: documents (and padding)
        return flex_bias_attention(q, k, v, ctx.content_free, None, ctx.logit_scale, block_mask=mask), None
    return flex_bias_attention(q, k, v, ctx.content_free, mask, ctx.logit_scale), None


_FLOATS = (torch.float32, torch.float64)

for _kernel in (
    AttentionKernel(
        "eager",
        eager_attention,
        "the reference: logits materialised as written, softmax in the model's dtype; returns probabilities",
        handles=frozenset({"content_free", "layer"}),
        probabilities=True,
        documents="mask",
    ),
    AttentionKernel(
        "sdpa",
        sdpa_attention,
        "scaled_dot_product_attention, content-free term + padding as one additive mask",
        handles=frozenset({"content_free", "layer"}),
        prepare=sdpa_mask,
        documents="mask",
    ),
    AttentionKernel(
        "fold",
        fold_attention,
        "SDPA with the low-rank term and padding folded into extra query/key columns: no n x n tensor",
        needs=frozenset({"fold"}),
        reads_content_free=False,
        auto=lambda s: s.device_type != "cpu",  # GPUs: no n x n tensor at all (long sequences)
    ),
    AttentionKernel(
        "fused",
        fused_attention,
        "kernels.biased_attention: one n x n buffer, the shared term broadcast, fast dropout mask (CPU training)",
        handles=frozenset({"content_free", "layer"}),
        dtypes=_FLOATS,
        documents="mask",
        # CPU training: SDPA runs its unfused math kernel with dropout or with a mask that needs a gradient; a
        # constant term (ALiBi) without dropout is an additive mask without gradient, which SDPA's flash kernel takes
        auto=lambda s: (
            s.device_type == "cpu"
            and s.trains
            and (s.dropout or "layer" in s.terms or ("content_free" in s.terms and "constant" not in s.terms))
        ),
    ),
    AttentionKernel(
        "flex",
        flex_attention_kernel,
        "flex_attention with the content-free term in a score_mod (compiled on CUDA; no dropout)",
        needs=frozenset({"content_free"}),
        dropout=False,
        train_devices=("cuda",),
        prepare=flex_block_mask,
        auto=lambda s: s.device_type == "cuda" and "content_free" in s.terms,
        documents="context",
    ),
):
    register_attention_kernel(_kernel)
