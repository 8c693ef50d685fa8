"""One small module per positional scheme, behind one interface.

Every scheme turns a sequence length into a `PositionalContext`: what it adds to the input, to the queries and
keys, or to the attention logits. The context is computed once per forward pass and shared by every layer.

A scheme is one `PositionalScheme` subclass. Its modelling contract is declared there: what its contexts carry
(`terms`, which decides the attention kernels that apply), its `TupeConfig` fields with their defaults and checks
(`config_fields`, `check_config`; a config holds its own scheme's fields only), the initialisation of parameters
the generic one does not cover (`init_positional_weights`) and `forward(n, positions)`, which always receives the
positions (a scheme that cannot take arbitrary ones says so, `takes_positions = False`, and the model refuses
position_ids and documents for it by name). What bench, analysis, evaluation and reports say about it (names,
FLOPs, comparators, `--init-from`'s parameter groups) is one record apart, `report` (`SchemeReport`). It joins
the registry with `register_scheme` (the built-in ones at the end of this file; another distribution's through
the `tupe.schemes` entry-point group, loaded by name in any process); adding a scheme touches this file only,
and nothing outside it compares scheme names (tests/test_layers.py checks).

Notation (see `docs/model.md`, which carries every equation): `d` head dimension, `p` the learned absolute position table,
`U^Q, U^K` the untied positional projections shared by all layers, `b_{j-i}` a per-head relative bias.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from .context import PositionalContext
from .documents import Positions
from .kernel_registry import CONTEXT_TERMS, kernels_for_terms
from .ops import dropout

try:  # transformers >= 5 initialises through these (they leave already-loaded weights alone)
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    init = nn.init

__all__ = [
    "POSITION_SCHEMES",
    "SCHEMES",
    "PositionalContext",
    "PositionalScheme",
    "Positions",
    "SchemeField",
    "SchemeReport",
    "build_scheme",
    "find_scheme",
    "register_scheme",
    "scheme_class",
    "scheme_fields",
    "unregister_scheme",
]


@dataclass(frozen=True)
class SchemeField:
    """A `TupeConfig` field that a scheme reads, declared on the scheme (`PositionalScheme.config_fields`).

    Every config carries every registered scheme's fields, with `default` where not given, so that a config
    saved by one scheme loads under another (`--init-from`). `kind`, `low`, `high`, `low_open`: what a saved
    `config.json` value must be (`tupe.io.model_folder` checks it before any model is built; no bounds: not
    checked there). `resolve(value, config)`: the value stored (e.g. -1 -> max_position_embeddings).
    `with_weights`: the value comes with trained weights (`--init-from` copies it from the source's config).
    """

    name: str
    default: Any
    doc: str
    kind: type = int
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    resolve: Callable[[Any, PretrainedConfig], Any] | None = None
    with_weights: bool = True


class PositionalModule(nn.Module):
    """A module of a positional scheme. `init_positional_weights` initialises what the model's generic
    initialisation (`nn.Linear`, `nn.Embedding`, `nn.LayerNorm`) does not: the model calls it once per module,
    in module order (`TupePreTrainedModel._init_weights`); loaded weights are left alone by `init`'s functions."""

    def init_positional_weights(self, std: float) -> None:
        """Initialise this module's own parameters (not its submodules'); `std` is `initializer_range`."""


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


class RelativeBias(PositionalModule):
    """`b_{j-i}`: one scalar per head and bucket, shared by all layers (T5 buckets).

    With `cls_bucket`, one extra bucket (index `num_buckets`, 32 by default: a 33-row table) holds the relative
    part of the [CLS] reset, for the [CLS] row and column. The released TUPE-R code has the same 33-row table
    (`rel_pos_bins + 1`) and uses row 32 for column 0 (others -> [CLS]), exactly as here; for row 0 ([CLS] ->
    others) it uses row 16, the one bucket T5's bucketing never produces ("positive offset 0"), where this module
    uses row 32 again. Row 0 of the logits is one constant per head across all keys, so it cancels in the softmax:
    the released table loads here row for row and gives the same outputs (`tupe.modeling.fairseq`); row 16 gets
    no gradient in either.
    """

    def __init__(self, config: PretrainedConfig, cls_bucket: bool = False):
        super().__init__()
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.cls_bucket = cls_bucket
        self.bias = nn.Embedding(self.num_buckets + int(cls_bucket), config.num_attention_heads)

    def init_positional_weights(self, std: float) -> None:
        init.normal_(self.bias.weight, mean=0.0, std=std)

    def forward(self, n: int, positions: Positions | None = None) -> torch.Tensor:
        """(h, n, n) for positions 0..n-1; (b, h, n, n) from the pairwise offsets of given `positions`."""
        if positions is not None:
            buckets = relative_position_bucket(positions.offsets(), self.num_buckets, self.max_distance)
            bias = self.bias(buckets).permute(0, 3, 1, 2)  # (b, h, n, n)
            if self.cls_bucket:  # a document's first token (position 0) as query or key: the extra bucket
                first = positions.first()
                reset = (first[:, :, None] | first[:, None, :])[:, None]  # (b, 1, n, n)
                bias = torch.where(reset, self.bias.weight[self.num_buckets][None, :, None, None], bias)
            return bias
        offsets = torch.arange(-(n - 1), n, device=self.bias.weight.device)
        buckets = relative_position_bucket(offsets, self.num_buckets, self.max_distance)
        bias = toeplitz(self.bias(buckets).t(), n)  # (h, n, n)
        if self.cls_bucket:
            cls = self.bias.weight[self.num_buckets][:, None]  # (h, 1)
            bias = cls_reset(bias, torch.cat([cls, cls], dim=1))
        return bias


class UntiedPositions(PositionalModule):
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

    def __init__(self, config: PretrainedConfig, theta: bool = False):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pos_query = nn.Linear(config.hidden_size, config.hidden_size)  # U^Q
        self.pos_key = nn.Linear(config.hidden_size, config.hidden_size)  # U^K
        self.theta_positions = nn.Parameter(torch.empty(2, config.hidden_size)) if theta else None

    def init_positional_weights(self, std: float) -> None:
        if self.theta_positions is not None:
            init.normal_(self.theta_positions, mean=0.0, std=std)

    def _project(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, hidden) positions -> (h, m, d) positional queries and keys."""
        p = self.LayerNorm(p)
        q = self.pos_query(p).view(-1, self.heads, self.head_dim).transpose(0, 1)
        k = self.pos_key(p).view(-1, self.heads, self.head_dim).transpose(0, 1)
        return q, k

    def forward(self, n: int, positions: Positions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, n, d) positional queries and keys of positions 0..n-1, or (b, h, n, d) of given `positions` (the
        rows the positions read are projected once, then looked up)."""
        if positions is None:
            return self._project(self.embeddings.weight[:n])
        q, k = self._project(self.embeddings.weight[: _rows_read(positions, self.embeddings.num_embeddings)])
        ids = positions.ids
        return q[:, ids].transpose(0, 1), k[:, ids].transpose(0, 1)  # (h, b, n, d) -> (b, h, n, d)

    def theta(self, scale: float) -> torch.Tensor:
        """(h, 2): `theta_k = (p_theta_k U^Q)(p_theta_k U^K)^T * scale` for k = 1, 2."""
        q, k = self._project(self.theta_positions)
        return (q * k).sum(-1) * scale


def _rows_read(positions: Positions, table_rows: int) -> int:
    """How many leading rows of a position table the given positions read (1 + the largest; the whole table when
    traced or compiled, where the largest position is not known)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return table_rows
    return int(positions.ids.max()) + 1


def cls_reset(v: torch.Tensor, theta: torch.Tensor, first: torch.Tensor | None = None) -> torch.Tensor:
    """`reset_theta(v)`: row 0 ([CLS] as query) -> theta_1, column 0 below it (others -> [CLS]) -> theta_2.

    (h, n, n), (h, 2) -> (h, n, n). Traced (torch.export), the same values by selection: writing into a slice of
    length n - 1 makes export assume n >= 3. With `first` (b, n) bool (positions given as data: the tokens at
    position 0, each document's [CLS]) v is (b, h, n, n) and the rows and columns of those tokens are reset."""
    if first is not None:
        v = torch.where(first[:, None, None, :], theta[None, :, 1, None, None], v)
        return torch.where(first[:, None, :, None], theta[None, :, 0, None, None], v)
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


@dataclass(frozen=True)
class SchemeReport:
    """What bench, analysis, evaluation, reports and `--init-from` say about a scheme (`PositionalScheme.report`).

    The model never reads it: the modelling contract is the scheme class itself (`terms`, `config_fields`,
    `forward`). `display_name`: as in the paper's tables; `summary`: one line for `--scheme`'s help;
    `parameter_groups`: (parameter name inside the scheme module, group name), how `--init-from`'s report names
    its parameters; `absolute_input`: `p_i` added to the word embedding (BERT-style); `untied_projections`:
    positions enter through their own projections `U^Q, U^K`; `relative_bias`: `b_{j-i}` on the logits;
    `decomposable`: first-layer logits split into Fig. 2's word/position terms (`tupe analyze`); `position_table`:
    submodule path of a learned table, one row per position (`tupe evaluate --lengths`); `transformers_comparator`:
    `tupe bench`'s transformers model of this scheme; `forward_flops(hidden, seq_len, heads)`: matmul FLOPs of the
    positional side once per forward pass (shared by the batch and the layers), `layer_flops(hidden, seq_len,
    batch)`: those of its terms inside each layer, both at the scheme's default config fields.
    """

    display_name: str
    summary: str
    parameter_groups: tuple[tuple[str, str], ...] = ()
    absolute_input: bool = False
    untied_projections: bool = False
    relative_bias: bool = False
    decomposable: bool = False
    position_table: str | None = None
    transformers_comparator: str | None = None
    forward_flops: Callable[[int, int, int], float] = lambda hidden, seq_len, heads: 0.0
    layer_flops: Callable[[int, int, int], float] = lambda hidden, seq_len, batch: 0.0


class PositionalScheme(PositionalModule):
    """Interface: `forward(n, positions)` returns the `PositionalContext` of a length-n input.

    The modelling contract is these class attributes and methods: `terms` (what the contexts carry for the
    kernels), `config_fields` and `check_config` (its `TupeConfig` fields), the parameters it builds in
    `__init__`, `init_positional_weights`, and `forward`, which always receives the positions (None: 0..n-1 in
    every row). What a scheme computes after its forward pass (a content-free term built only when a kernel reads
    it, a term of each layer's queries and keys) is one of its methods, named by the context
    (`content_free_method`, `layer_term`) and reading the context's tensors (its fields, `parts`).

    What bench, analysis, evaluation and reports say about it is one record apart, `report` (`SchemeReport`).
    The rest of the package asks these rather than comparing names: adding a scheme means adding a subclass and
    registering it (`register_scheme`, from inside the package or outside it: the `tupe.schemes` entry points).
    """

    name: ClassVar[str]
    report: ClassVar[SchemeReport]  # names, FLOPs, comparators: what the model never reads
    # What its contexts carry that concerns an attention kernel (`kernel_registry.CONTEXT_TERMS`): "content_free" a
    # (h, n, n) term, "fold" its low-rank form, "constant" nothing learned in it, "rotary", "layer" a per-layer
    # content x position term. The one declaration: the booleans below are read from it, and so is `kernels()`.
    terms: ClassVar[frozenset[str]] = frozenset()
    score_dims: ClassVar[int] = 1  # content logits are scaled by (score_dims * d) ** -0.5
    resets_cls: ClassVar[bool] = False  # [CLS] row/column of the content-free term replaced by theta
    # `forward` computes its terms from any given positions (position_ids, packed documents); False: positions
    # 0..n-1 only (`forward` then always receives None), and the model refuses position_ids and documents by name
    takes_positions: ClassVar[bool] = True
    # A document at positions 0..m-1 gets the terms of positions 0..m-1 of any longer input (the leading m x m
    # block of its content-free term): packed documents then run as rows of their own (`documents.DocumentRows`,
    # one shared term). Not fire (its normaliser is the length), nor deberta (its layer term is built per length).
    document_rows: ClassVar[bool] = False
    # `TupeConfig` fields this scheme reads (a config holds its own scheme's fields only)
    config_fields: ClassVar[tuple[SchemeField, ...]] = ()
    # applies transformers' RoPE scaling, `config.rope_parameters` (tupe/modeling/rope_scaling.py); any other
    # scheme refuses a config that carries one, by name
    takes_rope_parameters: ClassVar[bool] = False

    # read from `terms`, set on each subclass (`__init_subclass__`)
    content_free: ClassVar[bool] = False  # an (h, n, n) term added to every layer's logits ("content_free")
    low_rank: ClassVar[bool] = False  # ... that folds exactly into extra query/key columns ("fold")
    rotary: ClassVar[bool] = False  # queries and keys rotated by position ("rotary")
    content_position: ClassVar[bool] = False  # a per-layer content x position term ("layer", DeBERTa)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.terms = frozenset(cls.terms)
        cls.content_free = "content_free" in cls.terms
        cls.low_rank = "fold" in cls.terms
        cls.rotary = "rotary" in cls.terms
        cls.content_position = "layer" in cls.terms

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.logit_scale = (self.score_dims * config.head_dim) ** -0.5

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """Refuse (ValueError, one line naming the values) a config this scheme cannot run; `TupeConfig` calls it
        once its fields are set."""

    @classmethod
    def kernels(cls) -> tuple[str, ...]:
        """The `TupeConfig.attention_kernel` values that apply to this scheme, from the kernel registry."""
        return kernels_for_terms(cls.terms)

    def forward(self, n: int, positions: Positions | None) -> PositionalContext:
        """The context of a length-n input: positions 0..n-1 in every row (`positions` None, the fast path), or
        the given `positions` (`Positions`: (b, n) ids, documents), from which every term is computed (tables
        looked up by position, relative terms from pairwise differences, per row). The model always passes
        `positions`; a scheme declaring `takes_positions = False` only ever receives None."""
        raise NotImplementedError


# Fields and parameter groups several schemes share
RELATIVE_BIAS_FIELDS = (
    SchemeField(
        "relative_attention_num_buckets", 32, "T5 bucketing of `j - i` (the paper's 32)", int, 1, 1 << 16
    ),
    SchemeField(
        "relative_attention_max_distance",
        128,
        "offsets beyond it share a bucket (the paper's 128)",
        int,
        1,
        1 << 20,
    ),
)
RELATIVE_BIAS_GROUPS = (("relative.bias", "relative-position bias"),)
UNTIED_GROUPS = (
    ("untied.pos_query", "positional projections pos_query/pos_key"),
    ("untied.pos_key", "positional projections pos_query/pos_key"),
    ("untied.theta_positions", "[CLS] position parameters"),
    ("untied.embeddings", "untied position table"),
    ("untied.LayerNorm", "untied position LayerNorm"),
)


KERPLE_GROUPS = (("bias_p", "KERPLE bias_p"), ("bias_a", "KERPLE bias_a"))


def _untied_flops(content_free: bool, resets_cls: bool, hidden: int, seq_len: int, heads: int) -> float:
    flops = 2 * 2 * seq_len * hidden * hidden  # p U^Q and p U^K
    if content_free:
        flops += 2 * seq_len * seq_len * hidden  # (p U^Q)(p U^K)^T for all heads
    if resets_cls:
        flops += 2 * 2 * 2 * hidden * hidden  # theta: the two [CLS]-reset vectors through U^Q and U^K
    return float(flops)


def untied_report(
    display_name: str, summary: str, content_free: bool, resets_cls: bool, relative_bias: bool = False
) -> SchemeReport:
    """The report of a scheme built on `UntiedPositions` (bert-a-d and the TUPE family)."""
    return SchemeReport(
        display_name,
        summary,
        parameter_groups=UNTIED_GROUPS + (RELATIVE_BIAS_GROUPS if relative_bias else ()),
        untied_projections=True,
        relative_bias=relative_bias,
        decomposable=True,
        position_table="untied.embeddings",
        forward_flops=partial(_untied_flops, content_free, resets_cls),
    )


def kerple_report(display_name: str, summary: str) -> SchemeReport:
    """KERPLE's: elementwise work on n distances per head, no matrix multiplication (nothing in model FLOPs)."""
    return SchemeReport(
        display_name, summary, parameter_groups=KERPLE_GROUPS, relative_bias=True, decomposable=True
    )


def _fire_forward_flops(width: int, hidden: int, seq_len: int, heads: int) -> float:
    return 2.0 * (2 * seq_len - 1) * width * (1 + heads)


def _deberta_layer_flops(hidden: int, seq_len: int, batch: int) -> float:
    # the layer's W^Q, W^K on the 2n - 1 relative rows; q . kr and k . qr for every (i, j) pair, all heads
    return 2 * (2 * seq_len - 1) * hidden * 2 * hidden + 2 * 2 * batch * seq_len * seq_len * hidden


class BertA(PositionalScheme):
    """BERT-A: `p_i` added to the word embedding at the input; plain scaled dot-product logits."""

    name = "bert-a"
    document_rows = True
    report = SchemeReport(
        "BERT-A",
        "learned absolute positions added to the input (BERT)",
        parameter_groups=(("embeddings", "position table"),),
        absolute_input=True,
        decomposable=True,
        position_table="embeddings",
        transformers_comparator="hf-bert",  # BertForMaskedLM
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        table = self.embeddings.weight[:n] if positions is None else self.embeddings(positions.ids)
        return PositionalContext(self.logit_scale, input_embedding=table)


class BertR(BertA):
    """BERT-R: BERT-A plus the relative bias `b_{j-i}` on every layer's logits."""

    name = "bert-r"
    terms = frozenset({"content_free"})
    config_fields = RELATIVE_BIAS_FIELDS
    report = SchemeReport(
        "BERT-R",
        "bert-a plus a T5 relative bias on every layer",
        parameter_groups=(("embeddings", "position table"), *RELATIVE_BIAS_GROUPS),
        absolute_input=True,
        relative_bias=True,
        decomposable=True,
        position_table="embeddings",
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.relative = RelativeBias(config)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        ctx = super().forward(n, positions)
        ctx.content_free = self.relative(n, positions)
        return ctx


class BertAd(PositionalScheme):
    """BERT-A^d: the four terms of `(x W^Q + p U^Q)(x W^K + p U^K)^T / sqrt(4d)`, i.e. `p U` added to q and k."""

    name = "bert-a-d"
    document_rows = True
    score_dims = 4
    report = untied_report(
        "BERT-A^d", "absolute positions added to queries and keys through their own projections", False, False
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.untied = UntiedPositions(config)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        q, k = self.untied(n, positions)
        return PositionalContext(self.logit_scale, query_add=q, key_add=k)


class TupeA(PositionalScheme):
    """TUPE-A: content logits / sqrt(2d) plus `reset_theta((p_i U^Q)(p_j U^K)^T / sqrt(2d))`."""

    name = "tupe-a"
    document_rows = True
    terms = frozenset({"content_free", "fold"})
    score_dims = 2
    resets_cls = True
    report = untied_report(
        "TUPE-A", "untied absolute positions with the [CLS] reset (the paper's TUPE-A)", True, True
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.untied = UntiedPositions(config, theta=self.resets_cls)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        q, k = self.untied(n, positions)  # (h, n, d); positions given: (b, h, n, d)
        scale = self.logit_scale
        # the (h, n, n) term is built from `parts` only when a kernel reads it (`content_free_term`)
        ctx = PositionalContext(
            scale, parts={"query": q, "key": k}, content_free_method=self.content_free_term
        )
        ctx.positions = positions
        if self.resets_cls:
            theta = self.untied.theta(scale)
            first = None if positions is None else positions.first()  # each document's [CLS]
            ctx.parts["theta"] = theta
            ctx.fold = self._fold_with_reset(q, k, theta, first)
        else:
            ctx.fold = (q * scale, k)
        return ctx

    def content_free_term(self, ctx: PositionalContext) -> torch.Tensor:
        """`(p U^Q)(p U^K)^T * scale`, [CLS]-reset: (h, n, n), or (b, h, n, n) with positions given as data."""
        q, k = ctx.parts["query"], ctx.parts["key"]
        term = torch.matmul(q, k.transpose(-1, -2)) * self.logit_scale
        if not self.resets_cls:
            return term
        first = None if ctx.positions is None else ctx.positions.first()  # each document's [CLS]
        return cls_reset(term, ctx.parts["theta"], first)

    def _fold_with_reset(self, q, k, theta, first=None):
        """Query `[s p U^Q, 1]` (zero for [CLS]), key `[p U^K, 0]` with `[0, theta_2]` for [CLS]: exact because the
        [CLS] query row is a constant (`theta_1`) that cancels in the softmax. `first` (b, n): positions given as
        data, q and k (b, h, n, d), [CLS] the tokens at position 0."""
        h, n = q.shape[-3], q.shape[-2]
        if first is None:
            first = (torch.arange(n, device=q.device) == 0)[
                :, None
            ]  # (n, 1): the [CLS] row, selected, not sliced
        else:
            first = first[:, None, :, None]  # (b, 1, n, 1)
        ones = q.new_ones(*q.shape[:-1], 1)
        q_extra = torch.cat([q * self.logit_scale, ones], dim=-1).masked_fill(first, 0.0)
        k_extra = torch.cat([k, torch.zeros_like(ones)], dim=-1)
        k_cls = torch.cat([k.new_zeros(h, 1, k.shape[-1]), theta[:, 1].reshape(h, 1, 1)], dim=-1)
        return q_extra, torch.where(first, k_cls, k_extra)


class TupeATieCls(TupeA):
    """TUPE-A without the [CLS] reset (ablation)."""

    name = "tupe-a-tie-cls"
    resets_cls = False
    report = untied_report("TUPE-A tie-cls", "tupe-a without the [CLS] reset (ablation)", True, False)


class TupeR(TupeA):
    """TUPE-R: TUPE-A's term plus `b_{j-i}`, reset for [CLS] (the relative part via the code's extra bucket)."""

    name = "tupe-r"
    terms = frozenset({"content_free"})  # a relative bias is not low-rank: no fold
    config_fields = RELATIVE_BIAS_FIELDS
    report = untied_report(
        "TUPE-R", "tupe-a plus a T5 relative bias (the paper's TUPE-R)", True, True, relative_bias=True
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.relative = RelativeBias(config, cls_bucket=self.resets_cls)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        ctx = super().forward(n, positions)
        ctx.content_free = ctx.content_free + self.relative(n, positions)
        ctx.fold = None
        return ctx


class TupeRTieCls(TupeR):
    """TUPE-R without the [CLS] reset (ablation)."""

    name = "tupe-r-tie-cls"
    resets_cls = False
    report = untied_report(
        "TUPE-R tie-cls", "tupe-r without the [CLS] reset (ablation)", True, False, relative_bias=True
    )


class Rope(PositionalScheme):
    """Rotary positions on queries and keys (no absolute table): the comparator modern encoders use."""

    name = "rope"
    document_rows = True
    terms = frozenset({"rotary"})
    takes_rope_parameters = True
    config_fields = (
        SchemeField("rope_theta", 10000.0, "base of the rotary frequencies", float, 0, 1e12, low_open=True),
    )
    report = SchemeReport("RoPE", "rotary positions on queries and keys")

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        if config.head_dim % 2 != 0:
            raise ValueError(f"rope needs an even head dimension, got {config.head_dim}")

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        from .rope_scaling import LENGTH_DEPENDENT, rope_frequencies, standard_rope_parameters

        # RoPE scaling the transformers way (tupe/modeling/rope_scaling.py): `config.rope_parameters`, written back
        # in its standard form, is what this module applies (a `rope_theta` in it is the base)
        self.rope_parameters = standard_rope_parameters(config)
        if self.rope_parameters is None:
            config.__dict__.pop(
                "rope_parameters", None
            )  # unset: nothing saved (`TupeConfig.rope_parameters`)
        else:
            config.rope_parameters = self.rope_parameters
        self.head_dim = config.head_dim
        self.base = config.rope_theta
        self.config = config
        rope_type = (self.rope_parameters or {}).get("rope_type", "default")
        self.length_dependent = rope_type in LENGTH_DEPENDENT
        self._by_length: tuple[int, tuple[torch.Tensor, float]] | None = (
            None  # the last length-dependent result
        )
        # (inverse frequencies (d/2,), attention factor) in place of the trained ones: those of a static
        # `rope_parameters` type, from transformers' `ROPE_INIT_FUNCTIONS`; None: as trained.
        self.scaled_frequencies: tuple[torch.Tensor, float] | None = None
        if rope_type != "default" and not self.length_dependent:
            self.scaled_frequencies = rope_frequencies(config, self.rope_parameters)

    def inverse_frequencies(self) -> torch.Tensor:
        """(d/2,) float32 `base^(-2k/d)`, k = 0 .. d/2 - 1: the trained rotation speeds (transformers' default)."""
        d = self.head_dim
        return 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))

    def frequencies(self, length: int) -> tuple[torch.Tensor, float]:
        """(inverse frequencies, attention factor) for an input of `length` tokens (its largest position + 1)."""
        if self.length_dependent:
            from .rope_scaling import rescales_at, rope_frequencies

            if not rescales_at(self.rope_parameters, self.config, length):
                length = None  # transformers' own at or below the reference length
            if self._by_length is None or self._by_length[0] != length:
                self._by_length = (length, rope_frequencies(self.config, self.rope_parameters, length))
            return self._by_length[1]
        return self.scaled_frequencies or (self.inverse_frequencies(), 1.0)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        # Recomputed every pass (d/2 values) rather than kept in a buffer that a checkpoint load could leave stale.
        length = n
        if self.length_dependent and positions is not None:
            length = int(positions.ids.max()) + 1  # as transformers: the largest position + 1
        inv_freq, factor = self.frequencies(length)
        if positions is None:
            angles = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
        else:  # (b, 1, n, d/2): each row's own positions, broadcast over the heads
            angles = positions.ids[:, None, :, None].float() * inv_freq.to(positions.ids.device)
        angles = torch.cat([angles, angles], dim=-1)  # (n, d), GPT-NeoX "rotate half" layout
        cos, sin = angles.cos(), angles.sin()
        if factor != 1.0:  # transformers' `attention_scaling` (YaRN's temperature): cos and sin scaled
            cos, sin = cos * factor, sin * factor
        return PositionalContext(self.logit_scale, rotary=(cos, sin))


class Nope(PositionalScheme):
    """No positional information at all (Kazemnejad et al., NeurIPS 2023): the bag-of-words control.

    Without positions a bidirectional encoder is permutation-equivariant, so this scheme gives word-order
    checks their zero and tells how much of a task needs order at all.
    """

    name = "nope"
    document_rows = True
    report = SchemeReport("NoPE", "no positions at all (the bag-of-words control)")

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
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
    document_rows = True
    report = SchemeReport(
        "Sinusoidal", "bert-a with the fixed sine/cosine table", absolute_input=True, decomposable=True
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.hidden_size = config.hidden_size
        self.max_positions = config.max_position_embeddings
        self.scale = config.initializer_range
        self._table: torch.Tensor | None = None  # cache of the largest table built so far (not a parameter)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        # Built on demand (not a buffer a checkpoint load could leave stale), in float64, cast where it is added.
        if positions is not None:  # rows looked up by position: (b, n, hidden)
            rows = _rows_read(positions, self.max_positions)
            if torch.compiler.is_compiling() or torch.jit.is_tracing():
                table = sinusoid_table(rows, self.hidden_size) * self.scale
            else:
                if self._table is None or self._table.shape[0] < rows:
                    self._table = sinusoid_table(rows, self.hidden_size) * self.scale
                table = self._table
            return PositionalContext(
                self.logit_scale, input_embedding=table.to(positions.ids.device)[positions.ids]
            )
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            # no cache while compiling or exporting: its size check would pin the length (a recompile per length)
            return PositionalContext(
                self.logit_scale, input_embedding=sinusoid_table(n, self.hidden_size) * self.scale
            )
        if self._table is None or self._table.shape[0] < n:
            self._table = sinusoid_table(n, self.hidden_size) * self.scale
        return PositionalContext(self.logit_scale, input_embedding=self._table[:n])


class T5Bias(PositionalScheme):
    """T5's relative bias alone (Raffel et al., JMLR 2020): `b_{j-i}` per head and bucket, shared by all layers,
    no absolute positions. Unlike T5 the content logits keep BERT's 1/sqrt(d) (T5 folds it into its init)."""

    name = "t5"
    document_rows = True
    terms = frozenset({"content_free"})
    config_fields = RELATIVE_BIAS_FIELDS
    report = SchemeReport(
        "T5 bias",
        "T5's relative bias alone",
        parameter_groups=RELATIVE_BIAS_GROUPS,
        relative_bias=True,
        decomposable=True,
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.relative = RelativeBias(config)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        return PositionalContext(self.logit_scale, content_free=self.relative(n, positions))


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
    document_rows = True
    # nothing learned ("constant"): without attention dropout SDPA's flash kernel takes the term as a mask
    terms = frozenset({"content_free", "constant"})
    report = SchemeReport(
        "ALiBi", "symmetric ALiBi: fixed per-head slopes times |j - i|", relative_bias=True, decomposable=True
    )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.heads = config.num_attention_heads
        # Nothing is learned; this empty buffer only follows the model's device (`.to`, `from_pretrained`).
        self.register_buffer("device_anchor", torch.empty(0), persistent=False)

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        if positions is not None:  # (b, h, n, n) from each row's |p_j - p_i|
            distance = positions.offsets().abs().to(torch.float64)[:, None]
            slopes = alibi_slopes(self.heads).to(distance.device)[None, :, None, None]
            bias = (-slopes * distance).to(self.device_anchor.device, torch.float32)
        else:
            distance = torch.arange(n, dtype=torch.float64)
            distance = (distance[None, :] - distance[:, None]).abs()  # |j - i|
            bias = -alibi_slopes(self.heads)[:, None, None] * distance  # (h, n, n), exact in float64
            bias = bias.to(self.device_anchor.device, torch.float32)
        return PositionalContext(self.logit_scale, content_free=bias)


# ----------------------------------------------------------------------------------------------------------------
# Schemes built for length: KERPLE and FIRE (a learned content-free term of the offset, no table, any length)
# ----------------------------------------------------------------------------------------------------------------


class Kerple(PositionalScheme):
    """KERPLE (Chi et al., NeurIPS 2022): a conditionally positive definite kernel of the distance `|i - j|` on
    every layer's logits, two learned positive parameters per head, shared by all layers; no table.

    Reference: `ParallelKerpleLog` / `ParallelKerplePower` in chijames/KERPLE, `megatron/mpu/layers.py`. As there,
    both parameters start uniform (`bias_p` in (0, 2), `bias_a` in (0, 1)) and are clamped at each forward pass
    by writing the clamped value into the parameter itself (the reference assigns `param.data`; here `param.data`
    is clamped in place, the same values without a new tensor), then used as they are: the gradient flows as if
    there were no clamp, and the optimizer's next step starts from the clamped value. Traced or compiled, where a
    forward pass must not write its parameters, the same values with the same identity gradient
    (`p + (clamp(p) - p).detach()`), the parameter left unclamped. The reference is causal (it takes the lower
    triangle of `i - j`); an encoder takes `|i - j|`, symmetric: the kernel knows distance, not direction.
    """

    document_rows = True
    terms = frozenset({"content_free"})
    eps: ClassVar[float] = 1e-2  # the reference's `self.eps`, the lower clamp of both parameters
    p_max: ClassVar[float | None] = None  # upper clamp of `bias_p` (the power form's exponent: 2)

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.bias_p = nn.Parameter(torch.empty(config.num_attention_heads))
        self.bias_a = nn.Parameter(torch.empty(config.num_attention_heads))

    def init_positional_weights(self, std: float) -> None:
        init.uniform_(self.bias_p, 0.0, 2.0)  # the reference's get_parameter(2, "uniform")
        init.uniform_(self.bias_a, 0.0, 1.0)  # get_parameter(1, "uniform")

    def _clamped(self, param: torch.Tensor, high: float | None) -> torch.Tensor:
        """`param` clamped to [eps, high] as the reference does it (module docstring)."""
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return param + (param.clamp(min=self.eps, max=high) - param).detach()
        param.data.clamp_(min=self.eps, max=high)  # `.data`: no autograd version bump, as the reference's
        return param

    def kernel(self, p: torch.Tensor, a: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        """(h, 1) parameters, (m,) distances -> (h, m) bias values."""
        raise NotImplementedError

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        p, a = self._clamped(self.bias_p, self.p_max), self._clamped(self.bias_a, None)
        if positions is not None:  # (b, h, n, n) from each row's |p_j - p_i|
            distance = positions.offsets().abs().to(p.dtype)
            values = self.kernel(p[:, None], a[:, None], distance.reshape(-1))  # (h, b * n * n)
            bias = values.view(-1, *distance.shape).transpose(0, 1)
        else:
            # |j - i| of the 2n - 1 offsets j - i, in `toeplitz`'s slot order (twice the n distances' elementwise
            # work, no slicing that a traced length would have to satisfy)
            distance = torch.arange(-(n - 1), n, device=p.device, dtype=p.dtype).abs()
            bias = toeplitz(self.kernel(p[:, None], a[:, None], distance), n)
        return PositionalContext(self.logit_scale, content_free=bias)


class KerpleLog(Kerple):
    """KERPLE's logarithmic variant: `-p_h log(1 + a_h |i - j|)` on every layer's logits (`bias_p` = p, `bias_a`
    = a, both clamped at 0.01 as in `ParallelKerpleLog`)."""

    name = "kerple-log"
    report = kerple_report(
        "KERPLE-log", "KERPLE's log kernel: -p_h log(1 + a_h |j - i|), two learned values per head"
    )

    def kernel(self, p: torch.Tensor, a: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        return -p * torch.log1p(a * distance)


class KerplePower(Kerple):
    """KERPLE's power variant: `-a_h |i - j|^{p_h}` on every layer's logits, in the reference's naming
    (`ParallelKerplePower`: coefficient `bias_a`, clamped at 0.01; exponent `bias_p`, clamped to [0.01, 2])."""

    name = "kerple-power"
    p_max = 2.0
    report = kerple_report(
        "KERPLE-power",
        "KERPLE's power kernel: -a_h |j - i|^p_h, p_h in [0.01, 2], two learned values per head",
    )

    def kernel(self, p: torch.Tensor, a: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        return -a * distance.pow(p)


class Fire(PositionalScheme):
    """FIRE (Li et al., ICLR 2024): `b_h(i, j) = f_theta(psi(i - j) / psi(max(N, L)))_h` on every layer's
    logits, `psi(x) = log(|c x| + 1)`, `f_theta` an MLP 1 -> `fire_mlp_width` -> heads with ReLU; `c` (init 0.1)
    and the multiplier `m` of the threshold `L = |m| * fire_threshold` (init 1) are learned. One term shared by
    all layers, computed once per forward pass, at any length (no table).

    Reference: the `FIRE` class of mcleish7/arithmetic (`cramming/architectures/embeddings.py`; the paper has no
    official code), the same widths and initial values; its MLP starts as `torch.nn.Linear`'s own initialisation,
    as there. That form is causal: it drops the sign of `i - j` (a decoder masks `j > i`) and normalises by the
    query's own position `i`. **For an encoder** this scheme keeps direction and gives every query the same
    normaliser: `f_theta(sign(i - j) psi(|i - j|) / (psi(max(N, L)) + eps))`, `N` the input length (the padded
    length of a batch), `eps = 1e-6`. Then the term depends on `i - j` alone (the MLP runs on the 2n - 1 offsets,
    not on n^2 pairs) and a token's bias to its neighbours does not change with where it sits in the sequence.
    `fire_normalizer="query"` normalises by the query position instead (`psi(max(i, L))`, i from 0), which for
    `i >= j` is the reference's bias exactly (a check against the reference, not a recommended setting).
    """

    name = "fire"
    terms = frozenset({"content_free"})
    config_fields = (
        SchemeField("fire_mlp_width", 32, "hidden width of FIRE's MLP (the reference's 32)", int, 1, 1 << 16),
        SchemeField(
            "fire_threshold",
            512.0,
            "FIRE's initial threshold L of the normaliser psi(max(N, L)) (the reference's init_L), times a "
            "learned multiplier",
            float,
            0,
            1e9,
            low_open=True,
        ),
        SchemeField(
            "fire_normalizer",
            "length",
            'what FIRE normalises by: "length" (the input length N, every query alike) or "query" (the query '
            "position i, the causal reference's choice; a check, not a recommended setting)",
            str,
        ),
    )
    initial_c: ClassVar[float] = 0.1  # the reference's init_c
    eps: ClassVar[float] = 1e-6  # the reference's eps
    report = SchemeReport(
        "FIRE",
        "FIRE: a learned MLP of the log-scaled signed offset, normalised by the length",
        parameter_groups=(
            ("mlp_", "FIRE MLP"),
            ("distance_scale", "FIRE c and threshold multiplier"),
            ("threshold_multiplier", "FIRE c and threshold multiplier"),
        ),
        relative_bias=True,
        decomposable=True,
        # the MLP on the 2n - 1 offsets (the default normaliser; "query" runs it on n^2 pairs), at the default
        # width: 1 -> width, width -> heads
        forward_flops=partial(_fire_forward_flops, config_fields[0].default),
    )

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        if config.fire_normalizer not in ("length", "query"):
            raise ValueError(f'fire_normalizer must be "length" or "query", got {config.fire_normalizer!r}')

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        width, heads = config.fire_mlp_width, config.num_attention_heads
        self.threshold = float(config.fire_threshold)
        self.per_query = config.fire_normalizer == "query"
        self.mlp_in_weight = nn.Parameter(torch.empty(width, 1))
        self.mlp_in_bias = nn.Parameter(torch.empty(width))
        self.mlp_out_weight = nn.Parameter(torch.empty(heads, width))
        self.mlp_out_bias = nn.Parameter(torch.empty(heads))
        self.distance_scale = nn.Parameter(torch.empty(()))  # c
        self.threshold_multiplier = nn.Parameter(torch.empty(()))  # L = |multiplier| * fire_threshold

    def init_positional_weights(self, std: float) -> None:
        # the reference's MLP is two torch.nn.Linear as constructed: their default (Kaiming-uniform) initialisation
        for weight, bias in (
            (self.mlp_in_weight, self.mlp_in_bias),
            (self.mlp_out_weight, self.mlp_out_bias),
        ):
            bound = 1.0 / math.sqrt(weight.shape[1])
            init.uniform_(weight, -bound, bound)  # = kaiming_uniform_(a=sqrt(5)) for a Linear
            init.uniform_(bias, -bound, bound)
        init.constant_(self.distance_scale, self.initial_c)
        init.constant_(self.threshold_multiplier, 1.0)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """(...,) normalised offsets -> (..., heads)."""
        hidden = torch.relu(nn.functional.linear(x[..., None], self.mlp_in_weight, self.mlp_in_bias))
        return nn.functional.linear(hidden, self.mlp_out_weight, self.mlp_out_bias)

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        """`log(|c x| + 1)`."""
        return torch.log1p((self.distance_scale * x).abs())

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        return PositionalContext(self.logit_scale, content_free=self.offset_bias(n, positions))

    def offset_bias(self, n: int, positions: Positions | None = None) -> torch.Tensor:
        """The term of every pair: (h, n, n) for positions 0..n-1, (b, h, n, n) for given `positions`."""
        weight = self.mlp_in_weight
        threshold = (self.threshold_multiplier * self.threshold).abs()  # L
        if positions is not None:  # (b, h, n, n) from each row's p_i - p_j; N: the query's document length
            ids = positions.ids
            offset = (-positions.offsets()).to(weight.dtype)  # i - j
            normalizer = ids if self.per_query else positions.document_lengths()  # (b, n): per query
            norm = self.psi(torch.maximum(normalizer.to(weight.dtype), threshold))[:, :, None]
            x = offset.sign() * self.psi(offset.abs()) / (norm + self.eps)
            return self.mlp(x).permute(0, 3, 1, 2)
        if self.per_query:  # psi(max(i, L)) per query row i: an (n, n) input
            i = torch.arange(n, device=weight.device, dtype=weight.dtype)
            offset = i[:, None] - i[None, :]  # i - j
            norm = self.psi(torch.maximum(i, threshold))[:, None]
            x = offset.sign() * self.psi(offset.abs()) / (norm + self.eps)
            return self.mlp(x).permute(2, 0, 1)  # (h, n, n)
        # slot k holds the offset i - j = n - 1 - k, which `toeplitz` puts at [i, j] with j - i = k - (n - 1)
        offset = torch.arange(n - 1, -n, -1, device=weight.device, dtype=weight.dtype)
        length = torch.full((), n, device=weight.device, dtype=weight.dtype)
        norm = self.psi(torch.maximum(length, threshold))
        x = offset.sign() * self.psi(offset.abs()) / (norm + self.eps)
        return toeplitz(self.mlp(x).t(), n)  # (h, 2n - 1) -> (h, n, n)


def log_bucket_position(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's log buckets of a relative position `i - j` (query minus key; sign kept).

    Offsets with `|i - j| < buckets / 2` keep their value; larger ones become
    `sign * (mid + ceil(log(|i - j| / mid) / log((max_position - 1) / mid) * (mid - 1)))`, `mid = buckets / 2`, so
    `max_position - 1` maps to `buckets - 1`. In float32, as DeBERTa computes it (the released checkpoints were
    trained with float32 bucket boundaries).
    """
    mid = buckets // 2
    distance = relative.abs()
    # below mid the exact branch applies; mid - 1 keeps log() finite there
    safe = torch.where(distance < mid, torch.full_like(distance, mid - 1), distance).float()
    ratio = torch.log(safe / mid) / torch.log(torch.tensor((max_position - 1) / mid, dtype=torch.float32))
    logged = (torch.ceil(ratio * (mid - 1)) + mid).long()
    return torch.where(distance <= mid, relative, logged * relative.sign())


def skew(scores: torch.Tensor, cols: int | None = None) -> torch.Tensor:
    """(..., m, w) scores of m rows against w offset slots  ->  (..., m, cols) with `[a, c] = scores[a, m - 1 - a + c]`
    (`cols` defaults to m; needs `w >= m + cols - 1` and `cols < w`): the relative shift of Transformer-XL, by
    slicing the flat rows. A view: writing through it is how `_RelativeScores` scatters gradients back."""
    m, width = scores.shape[-2:]
    cols = m if cols is None else cols
    if m == 1:
        return scores[..., :cols]
    lead = scores.shape[:-2]
    flat = scores.reshape(*lead, m * width)
    return flat[..., m - 1 : m - 1 + m * (width - 1)].view(*lead, m, width - 1)[..., :cols]


def _row_blocks(n: int) -> list[tuple[int, int]]:
    """Query-row blocks for `_RelativeScores`: a block of B rows needs B + n - 1 offset slots, so 4 blocks do
    62% of the work of one product against all 2n - 1 slots (fewer, larger products below 64 rows)."""
    count = 4 if n >= 64 else 1
    bounds = [round(i * n / count) for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _slot_width(rows: int, n: int) -> int:
    """Offset slots a block of `rows` query rows reads, rounded up to a multiple of 8 (even GEMM widths ran at
    twice the speed of 2n - 1 in MKL at the mini shape), with one spare so `skew` never runs off a row."""
    return -(-(rows + n) // 8) * 8


class _RelativeScores(torch.autograd.Function):
    """`c2p + p2c` of `Deberta`: `[b, h, i, j] = s q_i . kr_u + s k_j . qr_u`, `u` the slot of offset `i - j`.

    Per block of query rows, one product against the offset slots that block reads, shifted into place by `skew`
    and written into one contiguous (b, h, n, n) tensor; backward scatters the gradient into a zeroed buffer
    through the same view (the entries outside it stay zero, so one buffer serves both terms). Plain autograd on
    DeBERTa's formula (a product against all 2n - 1 slots and a gather) does about twice the multiplications and
    builds several more n x n intermediates.
    """

    @staticmethod
    def forward(ctx, q, k, qr, kr, scale: float):
        b, h, n, d = q.shape
        pad = q.new_zeros(h, 8, d)  # slots beyond 2n - 1: zero, never read
        kr_pad = torch.cat([kr, pad], 1)
        qr_rev = torch.cat(
            [qr.flip(1), pad], 1
        )  # slot u' for offset u' - (n - 1): the same shift per key row
        qs, ks = (q * scale).transpose(0, 1), (k * scale).transpose(0, 1)  # (h, b, n, d)
        out = torch.empty(b, h, n, n, dtype=q.dtype, device=q.device)
        view = out.transpose(0, 1)  # (h, b, n, n)
        queries, keys = [], []
        # position-to-content first, as copies (a transposed copy runs at several times the speed of a transposed
        # add on CPU): blocks of key rows, written to column blocks
        for i0, i1 in _row_blocks(n):
            rows, start, width = i1 - i0, n - i1, _slot_width(i1 - i0, n)
            kb = ks[:, :, i0:i1].reshape(h, b * rows, d)  # contiguous copies of the block's rows
            p2c = torch.bmm(kb, qr_rev[:, start : start + width].transpose(1, 2)).view(h, b, rows, width)
            view[:, :, :, i0:i1].copy_(skew(p2c, n).transpose(-1, -2))
            keys.append(kb)
        for i0, i1 in _row_blocks(n):  # content-to-position: blocks of query rows, added to row blocks
            rows, start, width = i1 - i0, n - i1, _slot_width(i1 - i0, n)
            qb = qs[:, :, i0:i1].reshape(h, b * rows, d)
            c2p = torch.bmm(qb, kr_pad[:, start : start + width].transpose(1, 2)).view(h, b, rows, width)
            view[:, :, i0:i1].add_(skew(c2p, n))
            queries.append(qb)
        blocks = queries + keys
        ctx.save_for_backward(kr_pad, qr_rev, *blocks)
        ctx.scale, ctx.shape = scale, (b, h, n, d)
        return out

    @staticmethod
    def backward(ctx, grad):
        kr_pad, qr_rev, *saved = ctx.saved_tensors
        b, h, n, d = ctx.shape
        g = grad.transpose(0, 1)  # (h, b, n, n)
        dq = grad.new_empty(h, b, n, d)
        dk = grad.new_empty(h, b, n, d)
        dkr, dqr = torch.zeros_like(kr_pad), torch.zeros_like(qr_rev)
        spans = _row_blocks(n)
        for index, (i0, i1) in enumerate(spans):
            qb, kb = saved[index], saved[len(spans) + index]
            rows, start, width = i1 - i0, n - i1, _slot_width(i1 - i0, n)
            full = grad.new_zeros(h, b, rows, width)
            slots = skew(full, n)
            full3 = full.view(h, b * rows, width)
            slots.copy_(g[:, :, i0:i1])
            dq[:, :, i0:i1] = torch.bmm(full3, kr_pad[:, start : start + width]).view(h, b, rows, d)
            dkr[:, start : start + width] += torch.bmm(full3.transpose(1, 2), qb)
            slots.copy_(g[:, :, :, i0:i1].transpose(-1, -2))  # same slots: the rest of `full` is still zero
            dk[:, :, i0:i1] = torch.bmm(full3, qr_rev[:, start : start + width]).view(h, b, rows, d)
            dqr[:, start : start + width] += torch.bmm(full3.transpose(1, 2), kb)
        scale = ctx.scale
        dq = dq.mul_(scale).transpose(0, 1) if ctx.needs_input_grad[0] else None
        dk = dk.mul_(scale).transpose(0, 1) if ctx.needs_input_grad[1] else None
        dqr = dqr[:, : 2 * n - 1].flip(1) if ctx.needs_input_grad[2] else None
        dkr = dkr[:, : 2 * n - 1] if ctx.needs_input_grad[3] else None
        return dq, dk, dqr, dkr, None


def relative_scores(
    q: torch.Tensor, k: torch.Tensor, qr: torch.Tensor, kr: torch.Tensor, scale: float
) -> torch.Tensor:
    """DeBERTa's content-to-position plus position-to-content logits, (b, h, n, n).

    q, k: (b, h, n, d) a layer's queries and keys; qr, kr: (h, 2n - 1, d) its projections of the relative
    embeddings, slot u for the offset `i - j = n - 1 - u`. `[i, j] = scale * (q_i . kr(i - j) + k_j . qr(i - j))`.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        # export / compile / ONNX: the row blocks of `_RelativeScores` are Python arithmetic on the length, which
        # would pin it; a gather of the full products (DeBERTa's own way) has no length-dependent Python
        return _relative_scores_gather(q, k, qr, kr, scale)
    return _RelativeScores.apply(q, k, qr, kr, scale)


def _relative_scores_gather(
    q: torch.Tensor, k: torch.Tensor, qr: torch.Tensor, kr: torch.Tensor, scale: float
) -> torch.Tensor:
    """`relative_scores` by full (b, h, n, 2n - 1) products and a gather: the same values, more work."""
    n = q.shape[-2]
    idx = torch.arange(n, device=q.device)
    slot = (n - 1) - idx[:, None] + idx[None, :]  # (n, n): slot u of the offset i - j
    c2p = torch.matmul(q, kr.transpose(-1, -2))  # (b, h, n, 2n - 1): [i, u] = q_i . kr_u
    c2p = torch.gather(c2p, -1, slot.expand(*c2p.shape[:-1], n))
    p2c = torch.matmul(k, qr.transpose(-1, -2))  # (b, h, n, 2n - 1): [j, u] = k_j . qr_u
    p2c = torch.gather(p2c, -1, slot.t().expand(*p2c.shape[:-1], n)).transpose(-1, -2)
    return (c2p + p2c) * scale


class DisentangledPositions(nn.Module):
    """DeBERTa's relative embeddings `P` (2k rows, shared by all layers, LayerNorm-ed) and their offsets.

    `k` is `position_buckets` (log-bucketed offsets) or, with `position_buckets <= 0`, `max_relative_positions`
    (itself `max_position_embeddings` when < 1). Offset `i - j` reads row `clamp(delta(i - j) + k, 0, 2k - 1)`.
    """

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.buckets = config.position_buckets
        self.max_relative = (
            config.max_relative_positions
            if config.max_relative_positions >= 1
            else config.max_position_embeddings
        )
        self.span = self.buckets if self.buckets > 0 else self.max_relative
        self.rel_embeddings = nn.Embedding(2 * self.span, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self._layouts: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None]] = {}  # see `_layout`

    def rows(self, offsets: torch.Tensor) -> torch.Tensor:
        """Row of `rel_embeddings` that each query-minus-key offset reads."""
        delta = log_bucket_position(offsets, self.buckets, self.max_relative) if self.buckets > 0 else offsets
        return (delta + self.span).clamp(0, 2 * self.span - 1)

    def forward(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(table, index)`: `LN(P)` of the rows of `rel_embeddings` that a length-n input reads, one vector per
        row, and the (2n - 1,) position in `table` of the row each offset `i - j = n - 1, ..., -(n - 1)` (slot u
        for offset `n - 1 - u`) reads; `index` is None where it is the identity (every offset has a row of its
        own, in slot order: short inputs).

        One vector per row, not per offset, so that each layer projects each row once (log buckets and the clamp
        give many offsets the same row: at n = 512 with 256 buckets, 511 rows for 1023 offsets) and a layer's
        dropout drops a row for every offset that reads it, as DeBERTa's `pos_dropout` drops rows of its table.
        Traced or compiled, the whole table (its row count does not depend on the input) and `rows` as index.
        """
        weight = self.rel_embeddings.weight
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            offsets = torch.arange(n - 1, -n, -1, device=weight.device)
            return self.LayerNorm(weight), self.rows(offsets)
        used, index = self._layout(n, weight.device)
        table = self.LayerNorm(self.rel_embeddings(used))  # row-wise: LN of the rows read
        return table, index

    def _layout(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rows a length-n input reads and each offset's slot among them, on `device`: worked out on the CPU
        (2n - 1 integers, no device sync for the Python decisions) once per length and device, then kept (they
        depend on nothing else), so a forward copies nothing to the device."""
        key = (n, str(device))
        if key not in self._layouts:
            rows = self.rows(torch.arange(n - 1, -n, -1))
            used, inverse = torch.unique(rows, sorted=True, return_inverse=True)
            used, index = used.flip(0), (used.numel() - 1) - inverse  # rows in slot order (offsets decrease)
            identity = bool((index == torch.arange(index.numel())).all())
            if len(self._layouts) >= 64:  # many lengths (padding-free batches): keep the latest ones only
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[key] = (used.to(device), None if identity else index.to(device))
        return self._layouts[key]


class Deberta(PositionalScheme):
    """DeBERTa-v2/v3 disentangled attention (He et al., ICLR 2021; the `transformers` `DebertaV2Model`).

    `alpha_ij = (q_i k_j + q_i kr_{d(i,j)} + k_j qr_{d(i,j)}) / sqrt(3d)` with `qr, kr = LN(P) W^Q, LN(P) W^K` the
    layer's own query/key projections of the shared relative embeddings (`share_att_key`), `d(i, j)` the
    log-bucketed `i - j`; no absolute positions (`position_biased_input=False`). Content-to-position and
    position-to-content depend on the layer's queries and keys, so they are a `layer_term`, one (b, h, n, n) term
    per layer: two products against the `2n - 1` offsets that occur, shifted into place (`relative_scores`).
    The relative embeddings take dropout (hidden_dropout_prob) in every layer, as in DeBERTa.
    """

    name = "deberta"
    terms = frozenset({"layer"})
    score_dims = 3
    config_fields = (
        SchemeField("position_buckets", 256, "log buckets of `i - j` (<= 0: not bucketed, only clipped)"),
        SchemeField(
            "max_relative_positions",
            -1,
            "clip of `i - j`; -1 (below 1): max_position_embeddings, stored resolved",
            resolve=lambda value, config: config.max_position_embeddings if value < 1 else value,
        ),
    )
    report = SchemeReport(
        "DeBERTa",
        "DeBERTa-v2/v3 disentangled attention (log-bucketed relative positions)",
        parameter_groups=(
            ("relative.rel_embeddings", "relative-position embeddings"),
            ("relative.LayerNorm", "relative-position LayerNorm"),
        ),
        transformers_comparator="hf-deberta",  # DebertaV2ForMaskedLM with the same choices
        layer_flops=_deberta_layer_flops,
    )

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        buckets, max_relative, max_positions = (
            config.position_buckets,
            config.max_relative_positions,
            config.max_position_embeddings,
        )
        if buckets > 0 and max_positions - 1 > buckets // 2 and max_relative - 1 <= buckets // 2:
            raise ValueError(
                f"deberta's log buckets need max_relative_positions - 1 > position_buckets / 2 when inputs can "
                f"be longer than that; got max_relative_positions {max_relative}, position_buckets {buckets}, "
                f"max_position_embeddings {max_positions}"
            )

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.relative = DisentangledPositions(config)
        self.dropout_p = config.hidden_dropout_prob
        self.max_positions = config.max_position_embeddings

    def forward(self, n: int, positions: Positions | None = None) -> PositionalContext:
        if positions is None:
            rel, index = self.relative(n)  # (rows read, hidden); each offset's row (None: one row per offset)
        else:
            # the rows of the offsets R .. -R that the positions' pairs can have, then each pair's row (b, n, n)
            if torch.compiler.is_compiling() or torch.jit.is_tracing():
                reach = self.max_positions - 1
            else:
                reach = int(positions.ids.max() - positions.ids.min())
            rel, index = self.relative(reach + 1)
            slots = positions.offsets() + reach  # slot u of the offset i - j = reach - u
            index = slots if index is None else index[slots]
        ctx = PositionalContext(
            self.logit_scale, relative_embeddings=rel, relative_index=index, layer_term=self.layer_term
        )
        ctx.positions = positions
        return ctx

    def layer_term(self, ctx: PositionalContext, q: torch.Tensor, k: torch.Tensor, project) -> torch.Tensor:
        """`c2p + p2c` of one layer, (b, h, n, n): its queries and keys against its own projections `project` of
        the context's relative embeddings (dropped out in every layer, as in DeBERTa)."""
        qr, kr = project(dropout(ctx.relative_embeddings, self.dropout_p, self.training))  # (h, rows, d) each
        index = ctx.relative_index
        if ctx.positions is None:
            if index is not None:  # (h, 2n - 1, d): offsets n - 1 .. -(n - 1)
                qr, kr = qr.index_select(1, index), kr.index_select(1, index)
            return relative_scores(q, k, qr, kr, self.logit_scale)
        # positions given as data: `index` (b, n, n) the row each pair reads
        b, n = index.shape[:2]
        h = q.shape[1]
        c2p = torch.matmul(q, kr.transpose(-1, -2))  # (b, h, n, rows): [i, r] = q_i . kr_r
        c2p = torch.gather(c2p, -1, index[:, None].expand(b, h, n, n))
        p2c = torch.matmul(k, qr.transpose(-1, -2))  # (b, h, n, rows): [j, r] = k_j . qr_r
        p2c = torch.gather(p2c, -1, index.transpose(1, 2)[:, None].expand(b, h, n, n)).transpose(-1, -2)
        return (c2p + p2c) * self.logit_scale


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (..., n, d) by position: pairs (x_k, x_{k + d/2}) turn by angle t * inv_freq_k."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.device, x.dtype), sin.to(x.device, x.dtype)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# ----------------------------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------------------------

SCHEMES: dict[str, type[PositionalScheme]] = {}  # name -> class, in registration order: `register_scheme`


class _SchemeNames(Sequence[str]):
    """`POSITION_SCHEMES`: the registered scheme names, read live from `SCHEMES`."""

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - Sequence protocol
        return tuple(SCHEMES)[index]

    def __len__(self) -> int:
        return len(SCHEMES)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(SCHEMES))

    def __contains__(self, name: object) -> bool:
        return name in SCHEMES

    def __repr__(self) -> str:
        return repr(tuple(SCHEMES))


POSITION_SCHEMES: Sequence[str] = _SchemeNames()


def register_scheme(cls: type[PositionalScheme]) -> type[PositionalScheme]:
    """Add a scheme under `cls.name` (refused if the name is taken, a term is unknown, it has no `report`, or a
    config field it declares clashes with another scheme's or with a `TupeConfig` argument); returns it, so it
    can decorate. Registering changes no config: a `TupeConfig` holds its own scheme's fields only."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"positional scheme {cls.__name__} has no name")
    if name in SCHEMES:
        raise ValueError(f"positional scheme {name!r} is already registered")
    unknown = sorted(cls.terms - set(CONTEXT_TERMS))
    if unknown:
        raise ValueError(
            f"positional scheme {name!r}: unknown context terms {unknown}; known: {list(CONTEXT_TERMS)}"
        )
    known = scheme_fields()
    for field in cls.config_fields:
        if field.name in known and known[field.name] != field:
            raise ValueError(
                f"positional scheme {name!r}: config field {field.name!r} is declared differently by another scheme"
            )
        if field.name in RESERVED_FIELDS:
            raise ValueError(
                f"positional scheme {name!r}: config field {field.name!r} is a TupeConfig argument"
            )
    if not isinstance(getattr(cls, "report", None), SchemeReport):
        raise ValueError(
            f"positional scheme {name!r} has no report (a SchemeReport: display name, summary, ...)"
        )
    SCHEMES[name] = cls
    return cls


def unregister_scheme(name: str) -> None:
    """Remove a registered scheme (e.g. a test's toy scheme)."""
    SCHEMES.pop(name)


# `TupeConfig`'s own arguments, which no scheme field may take (tests/modeling/test_positions.py holds it to them)
RESERVED_FIELDS = frozenset(
    {
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
        "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "position_scheme",
        "embedding_layer_norm", "layer_norm_eps", "initializer_range", "classifier_dropout", "sparse_prediction",
        "attention_kernel", "pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id", "tie_word_embeddings",
    }
)  # fmt: skip


def scheme_fields() -> dict[str, SchemeField]:
    """Every registered scheme's config fields by name (one declaration per name), in registration order."""
    return {field.name: field for cls in SCHEMES.values() for field in cls.config_fields}


# Schemes of other distributions: `[project.entry-points."tupe.schemes"] toy-distance = "toy_scheme:DistanceBias"`,
# loaded by name the first time a config, a model folder or a command asks for one this process has not registered
ENTRY_POINT_GROUP = "tupe.schemes"


def _load_entry_point(name: str) -> None:
    """Register the scheme an installed distribution declares under `name` in the `tupe.schemes` entry-point
    group (its module may register it on import, or leave that to this function); nothing if none does."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP, name=name):
        loaded = entry.load()
        if name not in SCHEMES:
            if getattr(loaded, "name", None) != name:
                raise ValueError(
                    f"entry point {entry.value!r} of group {ENTRY_POINT_GROUP!r} is named {name!r} but does not "
                    f"give a positional scheme of that name"
                )
            register_scheme(loaded)
        return


def find_scheme(name: str) -> type[PositionalScheme] | None:
    """The registered scheme class of a name, loading it from the `tupe.schemes` entry points where this process
    has not registered it yet; None where no one gives it."""
    if name not in SCHEMES:
        _load_entry_point(name)
    return SCHEMES.get(name)


def scheme_class(name: str) -> type[PositionalScheme]:
    """The class (and so the metadata) of a scheme name (`find_scheme`), with an error listing the valid names."""
    cls = find_scheme(name)
    if cls is None:
        raise ValueError(f"unknown position_scheme {name!r}; valid schemes: {', '.join(SCHEMES)}")
    return cls


def comparator_scheme(comparator: str) -> str | None:
    """The scheme whose `transformers_comparator` is `comparator` (`tupe bench`'s "hf-bert" -> "bert-a"), or None:
    what a transformers model of the bench implements, and so the baseline its ratios are stated against."""
    return next(
        (name for name, cls in SCHEMES.items() if cls.report.transformers_comparator == comparator), None
    )


def parameter_group(name: str) -> str | None:
    """How `--init-from`'s report names a state-dict name of a positional scheme's parameter (the first
    registered scheme's `parameter_groups` entry found in it), "positional parameters" for one no scheme names,
    None outside the positional scheme."""
    for cls in SCHEMES.values():
        for key, group in cls.report.parameter_groups:
            if f"positional.{key}" in name:
                return group
    return "positional parameters" if "positional." in name else None


def schemes_help() -> str:
    """`name: summary` of every registered scheme, for `--scheme`'s help."""
    return "; ".join(f"{name}: {cls.report.summary}" for name, cls in SCHEMES.items())


def build_scheme(config: PretrainedConfig) -> PositionalScheme:
    """The scheme module a config asks for; RoPE scaling (`rope_parameters`, set on the config after it was made,
    as `from_pretrained(path, rope_parameters=...)` does) is refused by name where the scheme has no rotation."""
    cls = scheme_class(config.position_scheme)
    if not cls.takes_rope_parameters:
        from .rope_scaling import refuse_rope_parameters

        refuse_rope_parameters(config)
    return cls(config)


for _scheme in (
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
    Deberta,
    Fire,
    KerpleLog,
    KerplePower,
):
    register_scheme(_scheme)
