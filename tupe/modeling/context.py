"""The positional context: what a positional scheme contributes to one forward pass, and what the kernels read.

positional.py builds it (`PositionalScheme.terms` names the parts a scheme's contexts carry); the model shares it
with every layer; each kernel reads the fields it takes (`kernel_registry.CONTEXT_TERMS`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .documents import Positions


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

    What a scheme computes later (`content_free_method`, `layer_term`) reads the context it is given (a method of
    the scheme, as the built-in schemes do, or any callable): gradient checkpointing is non-reentrant, so a layer may
    read any tensor of the forward pass, and the gradients of the terms every layer shares flow back to them.
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

    def copy(self) -> PositionalContext:
        """A shallow copy (the tensors are shared, `parts` is a new dict)."""
        new = object.__new__(PositionalContext)
        for name in PositionalContext.__slots__:
            setattr(new, name, getattr(self, name))
        new.parts = dict(self.parts)
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
