"""One small module per positional scheme, behind one interface.

Every scheme turns a sequence length into a `PositionalContext`: what it adds to the input, to the queries and
keys, or to the attention logits. The context is computed once per forward pass and shared by every layer, so
adding a scheme touches this file only: a `PositionalScheme` subclass (its class attributes are what bench,
analysis and reports read) listed in `SCHEMES`.

Notation (see `docs/model.md`, which carries every equation): `d` head dimension, `p` the learned absolute position table,
`U^Q, U^K` the untied positional projections shared by all layers, `b_{j-i}` a per-head relative bias.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from .kernels import kernels_for_terms

if TYPE_CHECKING:
    from .configuration_tupe import TupeConfig


class PositionalContext:
    """What a scheme contributes to one forward pass; shapes use n = sequence length, h = heads, d = head dim.

    - logit_scale: factor on the content logits `q k^T` (1/sqrt(d), 1/sqrt(2d) or 1/sqrt(4d)).
    - input_embedding (n, hidden): added to the word embeddings (BERT-style absolute positions).
    - bias (h, n, n): the content-free logits added to every layer (after the [CLS] reset where there is one).
    - query_add / key_add (h, n, d): added to every layer's queries / keys (BERT-A^d: `p U^Q`, `p U^K`).
    - rotary (cos, sin), each (n, d): rotation of queries and keys (RoPE).
    - fold (h, n, r) x 2: extra query / key columns whose products equal `bias` up to a per-query constant
      (which cancels in the softmax), so attention can run without an n x n tensor. Already scaled.
    - bias_fn: builds `bias` on first access (then cached), so a pass that folds never materialises it
      (long sequences on GPU); `has_bias` tells whether there is one without building it.
    """

    def __init__(
        self,
        logit_scale: float,
        input_embedding: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        query_add: torch.Tensor | None = None,
        key_add: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        fold: tuple[torch.Tensor, torch.Tensor] | None = None,
        bias_fn: Callable[[], torch.Tensor] | None = None,
    ):
        self.logit_scale = logit_scale
        self.input_embedding = input_embedding
        self._bias = bias
        self.query_add, self.key_add = query_add, key_add
        self.rotary = rotary
        self.fold = fold
        self.bias_fn = bias_fn

    @property
    def bias(self) -> torch.Tensor | None:
        if self._bias is None and self.bias_fn is not None:
            self._bias, self.bias_fn = self.bias_fn(), None
        return self._bias

    @bias.setter
    def bias(self, value: torch.Tensor | None) -> None:
        self._bias, self.bias_fn = value, None

    @property
    def has_bias(self) -> bool:
        return self._bias is not None or self.bias_fn is not None


# ----------------------------------------------------------------------------------------------------------------
# Building blocks shared by several schemes
# ----------------------------------------------------------------------------------------------------------------


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128):
    """T5's bidirectional bucketing of `j - i` (key minus query).

    Half the buckets per sign; offsets below `num_buckets // 4` in magnitude get a bucket each, larger ones are
    log-spaced up to `max_distance` and saturate beyond it.
    """
    half = num_buckets // 2
    bucket = (relative_position > 0).long() * half
    distance = relative_position.abs()
    max_exact = half // 2
    # clamp(min=1) keeps log() finite for the small offsets, which take the exact branch anyway.
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (half - max_exact)).long()
    large = large.clamp(max=half - 1)
    return bucket + torch.where(distance < max_exact, distance, large)


def toeplitz(values: torch.Tensor, n: int) -> torch.Tensor:
    """(h, 2n-1) per-offset values, offset k - (n-1) at index k  ->  (h, n, n) with [i, j] = values[j - i + n - 1]."""
    # unfold gives windows w[s, t] = values[s + t]; row s = n-1-i puts offset j - i at column j. A view, no copy;
    # traced (torch.export), where unfold fixes n to the traced length, the same values by indexing.
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        i = torch.arange(n, device=values.device)
        return values[:, i[None, :] - i[:, None] + n - 1]
    return values.unfold(-1, n, 1).flip(-2)


class RelativeBias(nn.Module):
    """`b_{j-i}`: one scalar per head and bucket, shared by all layers (T5 buckets).

    With `cls_bucket`, one extra bucket (index `num_buckets`, 32 by default: a 33-row table) holds the relative
    part of the [CLS] reset, for the [CLS] row and column. The released TUPE-R code has the same 33-row table
    (`rel_pos_bins + 1`) and uses row 32 for column 0 (others -> [CLS]), exactly as here; for row 0 ([CLS] ->
    others) it uses row 16, the one bucket T5's bucketing never produces ("positive offset 0"), where this module
    uses row 32 again. Row 0 of the logits is one constant per head across all keys, so it cancels in the softmax:
    the released table loads here row for row and gives the same outputs (`tupe.modeling.fairseq`); row 16 gets
    no gradient in either.
    """

    def __init__(self, config: TupeConfig, cls_bucket: bool = False):
        super().__init__()
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.cls_bucket = cls_bucket
        self.bias = nn.Embedding(self.num_buckets + int(cls_bucket), config.num_attention_heads)

    def forward(self, n: int) -> torch.Tensor:
        offsets = torch.arange(-(n - 1), n, device=self.bias.weight.device)
        buckets = relative_position_bucket(offsets, self.num_buckets, self.max_distance)
        bias = toeplitz(self.bias(buckets).t(), n)  # (h, n, n)
        if self.cls_bucket:
            cls = self.bias.weight[self.num_buckets][:, None]  # (h, 1)
            bias = cls_reset(bias, torch.cat([cls, cls], dim=1))
        return bias


class UntiedPositions(nn.Module):
    """TUPE's positional side: one table `p`, its own LayerNorm, and `U^Q`, `U^K` shared by all layers.

    With `theta`, two extra learned position vectors `p_theta_1`, `p_theta_2` (`theta_positions`) go through the
    same LayerNorm and projections to give the [CLS] reset values. The released code keeps them in its table,
    which has `max_positions + 1` rows: row 0 is `p_theta_1`, row 1 `p_theta_2`, and token `t` reads row `t + 1`.
    Here token `t` reads row `t` of `embeddings`. Under the reset (tupe-a, tupe-r) row 0 (token 0, [CLS]) is never
    used: its row and column of the logits are always overwritten, so it gets no gradient. It stays because the
    table has one layout for every scheme (the tie-cls ablations and bert-a-d do use it) and checkpoints keep
    loading unchanged; it costs one row. A converted released checkpoint holds the released row 1 there.

    The projections are named `pos_query` / `pos_key`, not `query` / `key`: PEFT matches module names by suffix,
    and BERT's habit `LoraConfig(target_modules=["query", "value"])` must not silently adapt the positional side
    (the attention projection is the fused `qkv`). Checkpoints with the old names load through
    `modeling_tupe.LEGACY_KEYS`.
    """

    def __init__(self, config: TupeConfig, theta: bool = False):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pos_query = nn.Linear(config.hidden_size, config.hidden_size)  # U^Q
        self.pos_key = nn.Linear(config.hidden_size, config.hidden_size)  # U^K
        self.theta_positions = nn.Parameter(torch.empty(2, config.hidden_size)) if theta else None

    def _project(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, hidden) positions -> (h, m, d) positional queries and keys."""
        p = self.LayerNorm(p)
        q = self.pos_query(p).view(-1, self.heads, self.head_dim).transpose(0, 1)
        k = self.pos_key(p).view(-1, self.heads, self.head_dim).transpose(0, 1)
        return q, k

    def forward(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._project(self.embeddings.weight[:n])

    def theta(self, scale: float) -> torch.Tensor:
        """(h, 2): `theta_k = (p_theta_k U^Q)(p_theta_k U^K)^T * scale` for k = 1, 2."""
        q, k = self._project(self.theta_positions)
        return (q * k).sum(-1) * scale


def cls_reset(v: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """`reset_theta(v)`: row 0 ([CLS] as query) -> theta_1, column 0 below it (others -> [CLS]) -> theta_2.

    (h, n, n), (h, 2) -> (h, n, n). Traced (torch.export), the same values by selection: writing into a slice of
    length n - 1 makes export assume n >= 3."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        first = torch.arange(v.shape[-1], device=v.device) == 0
        v = torch.where(first[None, None, :], theta[:, 1, None, None], v)
        return torch.where(first[None, :, None], theta[:, 0, None, None], v)
    v = v.clone()
    v[:, 0, :] = theta[:, 0:1]
    v[:, 1:, 0] = theta[:, 1:2]
    return v


# ----------------------------------------------------------------------------------------------------------------
# The schemes
# ----------------------------------------------------------------------------------------------------------------


class PositionalScheme(nn.Module):
    """Interface: `forward(n)` returns the `PositionalContext` of a length-n input.

    The class attributes describe the scheme to the rest of the package (bench, analysis, reports), which asks
    them rather than comparing names: adding a scheme means adding a subclass here and listing it in `SCHEMES`.
    """

    name: ClassVar[str]
    display_name: ClassVar[str]  # as in the paper's tables
    score_dims: ClassVar[int] = 1  # content logits are scaled by (score_dims * d) ** -0.5
    absolute_input: ClassVar[bool] = False  # p_i added to the word embedding (BERT-style)
    untied_projections: ClassVar[bool] = False  # positions enter through their own projections U^Q, U^K
    relative_bias: ClassVar[bool] = False  # b_{j-i} on the logits
    resets_cls: ClassVar[bool] = False  # [CLS] row/column of the content-free term replaced by theta
    content_free: ClassVar[bool] = False  # an (h, n, n) term added to every layer's logits
    low_rank: ClassVar[bool] = False  # ... that folds exactly into extra query/key columns (kernel "fold")
    rotary: ClassVar[bool] = False  # queries and keys rotated by position (RoPE)
    decomposable: ClassVar[bool] = False  # first-layer logits split into Fig. 2's word/position terms
    position_table: ClassVar[str | None] = None  # submodule path of a learned table, one row per position
    uses_position: ClassVar[bool] = True  # False only for the position-blind control (nope)
    directional: ClassVar[bool] = True  # tells j - i from i - j (symmetric ALiBi cannot: reversal-equivariant)

    def __init__(self, config: TupeConfig):
        super().__init__()
        self.logit_scale = (self.score_dims * config.head_dim) ** -0.5

    @classmethod
    def terms(cls) -> frozenset[str]:
        """What this scheme's contexts carry that an attention kernel may need or must take
        (`kernels.CONTEXT_TERMS`); a scheme with another kind of term overrides this."""
        flags = (("bias", cls.content_free), ("fold", cls.low_rank), ("rotary", cls.rotary))
        return frozenset(term for term, present in flags if present)

    @classmethod
    def kernels(cls) -> tuple[str, ...]:
        """The `TupeConfig.attention_kernel` values that apply to this scheme, from the kernel registry."""
        return kernels_for_terms(cls.terms())

    @classmethod
    def extra_forward_flops(cls, hidden: int, seq_len: int) -> float:
        """Matmul FLOPs of the positional side, once per forward pass (shared by the batch and the layers)."""
        flops = 0.0
        if cls.untied_projections:
            flops += 2 * 2 * seq_len * hidden * hidden  # p U^Q and p U^K
        if cls.untied_projections and cls.content_free:
            flops += 2 * seq_len * seq_len * hidden  # (p U^Q)(p U^K)^T for all heads
        if cls.resets_cls:
            flops += 2 * 2 * 2 * hidden * hidden  # theta: the two [CLS]-reset vectors through U^Q and U^K
        return flops

    def forward(self, n: int) -> PositionalContext:
        raise NotImplementedError


class BertA(PositionalScheme):
    """BERT-A: `p_i` added to the word embedding at the input; plain scaled dot-product logits."""

    name = "bert-a"
    display_name = "BERT-A"
    absolute_input = True
    decomposable = True
    position_table = "embeddings"

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)

    def forward(self, n: int) -> PositionalContext:
        return PositionalContext(self.logit_scale, input_embedding=self.embeddings.weight[:n])


class BertR(BertA):
    """BERT-R: BERT-A plus the relative bias `b_{j-i}` on every layer's logits."""

    name = "bert-r"
    display_name = "BERT-R"
    relative_bias = True
    content_free = True

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.relative = RelativeBias(config)

    def forward(self, n: int) -> PositionalContext:
        ctx = super().forward(n)
        ctx.bias = self.relative(n)
        return ctx


class BertAd(PositionalScheme):
    """BERT-A^d: the four terms of `(x W^Q + p U^Q)(x W^K + p U^K)^T / sqrt(4d)`, i.e. `p U` added to q and k."""

    name = "bert-a-d"
    display_name = "BERT-A^d"
    score_dims = 4
    untied_projections = True
    decomposable = True
    position_table = "untied.embeddings"

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.untied = UntiedPositions(config)

    def forward(self, n: int) -> PositionalContext:
        q, k = self.untied(n)
        return PositionalContext(self.logit_scale, query_add=q, key_add=k)


class TupeA(PositionalScheme):
    """TUPE-A: content logits / sqrt(2d) plus `reset_theta((p_i U^Q)(p_j U^K)^T / sqrt(2d))`."""

    name = "tupe-a"
    display_name = "TUPE-A"
    score_dims = 2
    untied_projections = True
    resets_cls = True
    content_free = True
    low_rank = True
    decomposable = True
    position_table = "untied.embeddings"

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.untied = UntiedPositions(config, theta=self.resets_cls)

    def forward(self, n: int) -> PositionalContext:
        q, k = self.untied(n)  # (h, n, d)
        scale = self.logit_scale
        ctx = PositionalContext(scale)
        if self.resets_cls:
            theta = self.untied.theta(scale)
            ctx.bias_fn = lambda: cls_reset(torch.matmul(q, k.transpose(-1, -2)) * scale, theta)
            ctx.fold = self._fold_with_reset(q, k, theta)
        else:
            ctx.bias_fn = lambda: torch.matmul(q, k.transpose(-1, -2)) * scale
            ctx.fold = (q * scale, k)
        return ctx

    def _fold_with_reset(self, q, k, theta):
        """Query `[s p U^Q, 1]` (zero for [CLS]), key `[p U^K, 0]` with `[0, theta_2]` for [CLS]: exact because the
        [CLS] query row is a constant (`theta_1`) that cancels in the softmax."""
        h, n, _ = q.shape
        first = (torch.arange(n, device=q.device) == 0)[
            :, None
        ]  # (n, 1): the [CLS] row, selected, not sliced
        q_extra = torch.cat([q * self.logit_scale, q.new_ones(h, n, 1)], dim=-1).masked_fill(first, 0.0)
        k_extra = torch.cat([k, k.new_zeros(h, n, 1)], dim=-1)
        k_cls = torch.cat([k.new_zeros(h, 1, k.shape[-1]), theta[:, 1].reshape(h, 1, 1)], dim=-1)
        return q_extra, torch.where(first, k_cls, k_extra)


class TupeATieCls(TupeA):
    """TUPE-A without the [CLS] reset (ablation)."""

    name = "tupe-a-tie-cls"
    display_name = "TUPE-A tie-cls"
    resets_cls = False


class TupeR(TupeA):
    """TUPE-R: TUPE-A's term plus `b_{j-i}`, reset for [CLS] (the relative part via the code's extra bucket)."""

    name = "tupe-r"
    display_name = "TUPE-R"
    relative_bias = True
    low_rank = False  # a relative bias is not low-rank

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.relative = RelativeBias(config, cls_bucket=self.resets_cls)

    def forward(self, n: int) -> PositionalContext:
        ctx = super().forward(n)
        ctx.bias = ctx.bias + self.relative(n)
        ctx.fold = None
        return ctx


class TupeRTieCls(TupeR):
    """TUPE-R without the [CLS] reset (ablation)."""

    name = "tupe-r-tie-cls"
    display_name = "TUPE-R tie-cls"
    resets_cls = False


class Rope(PositionalScheme):
    """Rotary positions on queries and keys (no absolute table): the comparator modern encoders use."""

    name = "rope"
    display_name = "RoPE"
    rotary = True

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.head_dim = config.head_dim
        self.base = config.rope_theta

    def forward(self, n: int) -> PositionalContext:
        # Recomputed every pass (d/2 values) rather than kept in a buffer that a checkpoint load could leave stale.
        d = self.head_dim
        inv_freq = 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # (n, d), GPT-NeoX "rotate half" layout
        return PositionalContext(self.logit_scale, rotary=(angles.cos(), angles.sin()))


class Nope(PositionalScheme):
    """No positional information at all (Kazemnejad et al., NeurIPS 2023): the bag-of-words control.

    Without positions a bidirectional encoder is permutation-equivariant, so this scheme gives word-order
    checks their zero and tells how much of a task needs order at all.
    """

    name = "nope"
    display_name = "NoPE"
    uses_position = False

    def forward(self, n: int) -> PositionalContext:
        return PositionalContext(self.logit_scale)


def sinusoid_table(n: int, hidden: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(n, hidden) table of Vaswani et al. (2017): `PE[t, 2k] = sin(t / 10000^(2k/hidden))`, `PE[t, 2k+1] = cos(..)`."""
    position = torch.arange(n, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, hidden, 2, dtype=torch.float64) / hidden)
    angles = position * inv_freq  # (n, ceil(hidden / 2))
    table = torch.empty(n, hidden, dtype=torch.float64)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()[:, : hidden // 2]
    return table.to(dtype)


class Sinusoidal(PositionalScheme):
    """BERT-A with the fixed sine/cosine table of Vaswani et al. (NeurIPS 2017) instead of a learned one.

    The input is `w_i + sigma PE_i` with `sigma = initializer_range`: Vaswani et al. scale the word embeddings
    (init std d^-0.5) by sqrt(d) instead; both put words (std 1 vs sigma) and the table (rms 0.71 vs 0.71 sigma)
    in the same ratio, which is all the input LayerNorm sees. Unscaled, the table would drown BERT's
    std-0.02 word embeddings (at d = 768 it is 35 times their norm).
    """

    name = "sinusoidal"
    display_name = "Sinusoidal"
    absolute_input = True
    decomposable = True

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.hidden_size = config.hidden_size
        self.scale = config.initializer_range
        self._table: torch.Tensor | None = None  # cache of the largest table built so far (not a parameter)

    def forward(self, n: int) -> PositionalContext:
        # Built on demand (not a buffer a checkpoint load could leave stale), in float64, cast where it is added.
        if self._table is None or self._table.shape[0] < n:
            self._table = sinusoid_table(n, self.hidden_size) * self.scale
        return PositionalContext(self.logit_scale, input_embedding=self._table[:n])


class T5Bias(PositionalScheme):
    """T5's relative bias alone (Raffel et al., JMLR 2020): `b_{j-i}` per head and bucket, shared by all layers,
    no absolute positions. Unlike T5 the content logits keep BERT's 1/sqrt(d) (T5 folds it into its init)."""

    name = "t5"
    display_name = "T5 bias"
    relative_bias = True
    content_free = True
    decomposable = True

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.relative = RelativeBias(config)

    def forward(self, n: int) -> PositionalContext:
        ctx = PositionalContext(self.logit_scale)
        ctx.bias_fn = lambda: self.relative(n)
        return ctx


def alibi_slopes(heads: int) -> torch.Tensor:
    """Press et al. (ICLR 2022): the geometric sequence `2^(-8k/h)`, k = 1..h, for a power-of-two `h`; otherwise
    the slopes of the nearest smaller power of two `c`, then every other slope of `2c` heads for the rest."""

    def power_of_two(h: int) -> list[float]:
        start = 2.0 ** (-8.0 / h)
        return [start ** (k + 1) for k in range(h)]

    closest = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(closest)
    if closest != heads:
        slopes += power_of_two(2 * closest)[0::2][: heads - closest]
    return torch.tensor(slopes, dtype=torch.float64)


class Alibi(PositionalScheme):
    """Symmetric ALiBi for encoders (Press et al., ICLR 2022; MosaicBERT's form): `-m_h |j - i|` on every layer's
    logits, fixed geometric slopes `m_h`, nothing learned, no absolute positions. It knows distance, not
    direction: the whole encoder is equivariant under reversing the input (left and right differ only through
    the sequence's ends)."""

    name = "alibi"
    display_name = "ALiBi"
    directional = False  # the bias depends on |j - i| only: reversing the input reverses the output
    relative_bias = True
    content_free = True
    decomposable = True

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.heads = config.num_attention_heads
        # Nothing is learned; this empty buffer only follows the model's device (`.to`, `from_pretrained`).
        self.register_buffer("device_anchor", torch.empty(0), persistent=False)

    def forward(self, n: int) -> PositionalContext:
        def bias() -> torch.Tensor:
            distance = torch.arange(n, dtype=torch.float64)
            distance = (distance[None, :] - distance[:, None]).abs()  # |j - i|
            bias = -alibi_slopes(self.heads)[:, None, None] * distance  # (h, n, n), exact in float64
            return bias.to(self.device_anchor.device, torch.float32)

        ctx = PositionalContext(self.logit_scale)
        ctx.bias_fn = bias
        return ctx


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (..., n, d) by position: pairs (x_k, x_{k + d/2}) turn by angle t * inv_freq_k."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.device, x.dtype), sin.to(x.device, x.dtype)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


SCHEMES: dict[str, type[PositionalScheme]] = {
    cls.name: cls
    for cls in (
        BertA,
        BertR,
        BertAd,
        TupeA,
        TupeATieCls,
        TupeR,
        TupeRTieCls,
        Rope,
        Nope,
        Sinusoidal,
        T5Bias,
        Alibi,
    )
}


def scheme_class(name: str) -> type[PositionalScheme]:
    """The class (and so the metadata) of a scheme name, with an error listing the valid names."""
    if name not in SCHEMES:
        raise ValueError(f"unknown position_scheme {name!r}; valid schemes: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def build_scheme(config: TupeConfig) -> PositionalScheme:
    return SCHEMES[config.position_scheme](config)
