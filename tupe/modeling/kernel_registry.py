"""The attention kernel registry: one table of `AttentionKernel` entries, and the choice of a pass's kernel.

An attention kernel is one function with one signature (kernels.py holds the built-in ones),

    fn(q, k, v, ctx, mask, dropout_p, probabilities) -> (output, probabilities or None)

on projected (b, h, n, d) queries, keys and values (rotary positions and added positional queries/keys already
applied), the scheme's `PositionalContext`, the additive key mask (the (b, 1, 1, n) padding, or what the kernel's
`prepare` made of it once per forward pass), the attention-dropout probability (0 outside training) and whether
the attention probabilities are wanted; registered once as an `AttentionKernel` entry that says what it needs
(`needs`: context terms such as a low-rank fold), what it can take (`handles`), the dtypes and devices it runs on,
whether it has dropout, and when "auto" picks it. `TupeConfig.attention_kernel`, `PositionalScheme.kernels()`,
`from_pretrained(attn_implementation=...)`, `--attention-kernel` and `tupe bench` all read this one table: adding a
kernel is one function plus one `register_attention_kernel(AttentionKernel(...))` (docs/model.md "Attention
kernels"); the built-in ones are the table at the end of this module. Kernel names are compared here only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .kernels import (
    eager_attention,
    flex_attention_kernel,
    flex_block_mask,
    fold_attention,
    fused_attention,
    sdpa_attention,
    sdpa_mask,
)

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
    return kernel


def unregister_attention_kernel(name: str) -> None:
    """Remove a registered kernel (e.g. a test's toy kernel)."""
    _REGISTRY.pop(name)


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


# ---- the built-in kernels -------------------------------------------------------------------------------------

_FLOATS = (torch.float32, torch.float64)

# The built-in kernels, in the order "auto" tries them (kernels.py)
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
