"""The TUPE model family: a post-LayerNorm BERT encoder whose positional scheme is one config value.

Read top to bottom: embeddings, attention (calling the registry's kernel), layer, encoder, heads. The positional
scheme (positional.py) is evaluated once per forward pass; its content-free term is shared by every layer. The
kernels and their registry are in kernels.py, registered with transformers' `AttentionInterface` as `tupe_<name>`
(attention_interface.py). The kernel that runs is `config._attn_implementation`, the one setting, resolved when the
model is built, loaded or `set_attn_implementation` is called (attention_interface.py says when "auto" is resolved
again).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

try:  # transformers >= 5 initialises through these (they respect already-loaded weights)
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    init = nn.init

from .attention_interface import checked_request, interface_name, kernel_for_pass, refresh, settle
from .configuration_tupe import TupeConfig
from .context import PositionalContext
from .documents import DocumentRows, Positions, build_positions, document_attention
from .kernel_registry import AttentionKernel
from .ops import FastDropout, masked_lm_loss
from .positional import (
    PositionalModule,
    PositionalScheme,
    apply_rotary,
    build_scheme,
)

logger = logging.get_logger(__name__)


def resolve_attention_kernel(
    model_or_config: PreTrainedModel | TupeConfig,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    training: bool | None = None,
    *,
    grad: bool | None = None,
    probabilities: bool = False,
    documents: bool = False,
) -> str:
    """The registry name of the kernel a forward pass in this situation runs under the setting
    (`config._attn_implementation`; "auto" resolved for the situation), or a ValueError saying why the named kernel
    cannot run it; nothing is changed or logged. Defaults from a model: its device, dtype and train mode; from a
    config: CPU, float32, eval. `grad` (default: `torch.is_grad_enabled()`) tells a training step from a no-grad
    pass; `probabilities`: `output_attentions` is asked for; `documents`: rows hold several documents."""
    config = model_or_config.config if isinstance(model_or_config, PreTrainedModel) else model_or_config
    if isinstance(model_or_config, PreTrainedModel):
        weight = next(model_or_config.parameters())
        device = weight.device if device is None else device
        dtype = weight.dtype if dtype is None else dtype
        training = model_or_config.training if training is None else training
    device = torch.device("cpu" if device is None else device)
    dtype = torch.float32 if dtype is None else dtype
    grad = torch.is_grad_enabled() if grad is None else grad
    kernel = kernel_for_pass(
        config, device, dtype, bool(training), grad, probabilities, documents, update=False
    )
    return kernel.name


def _tracing() -> bool:
    """Being traced or compiled (torch.export, torch.compile, TorchScript): no Python branch on tensor values."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _check_integer_ids(**tensors: torch.Tensor | None) -> None:
    """`position_ids`, `cu_seq_lens_q` and `seq_idx` are integers: a float or bool tensor would be truncated to
    other positions (0.5 -> 0, True -> 1, NaN -> a huge negative), so it is refused, as BERT's embedding refuses
    float position ids."""
    for name, t in tensors.items():
        if t is not None and (
            not torch.is_tensor(t) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool
        ):
            got = t.dtype if torch.is_tensor(t) else type(t).__name__
            raise ValueError(f"{name} must be an integer tensor (torch.long), got {got}")


@dataclass
class AttentionInputs:
    """Per-forward tensors shared by all layers: the positional context, the masks built from it once, the kernel."""

    ctx: PositionalContext
    # (b, 1, 1, n) additive: 0 for tokens, dtype-min for padding; None: no padding. Documents in a row and a kernel
    # that takes them in its mask (`AttentionKernel.documents == "mask"`): (b, 1, n, n), 0 inside a document for
    # real keys, dtype-min elsewhere
    padding: torch.Tensor | None
    # what every layer's kernel gets: `kernel.prepare(ctx, padding, dtype)`, else padding
    mask: torch.Tensor | None
    kernel: AttentionKernel  # the registry entry this pass runs (`kernel_for_pass`: the setting's, as a rule)
    probabilities: bool = False  # output_attentions
    # documents run as rows of their own (`DocumentRows`): `ctx` is then that of positions 0..rows.length-1 (its
    # input embedding looked up per token), `padding` and `mask` are None, each group carries its own key padding
    rows: DocumentRows | None = None


class TupeEmbeddings(nn.Module):
    """Word embeddings, plus absolute positions for the schemes that add them to the input."""

    def __init__(self, config: TupeConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.LayerNorm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            if config.embedding_layer_norm
            else None
        )
        self.dropout = FastDropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        ctx: PositionalContext,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (b, n, hidden)
        if ctx.input_embedding is not None:
            x = x + ctx.input_embedding.to(x.device, x.dtype)  # a no-op for learned tables
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
        return self.dropout(x)


def _positioned(
    q: torch.Tensor, k: torch.Tensor, ctx: PositionalContext
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys with the context's rotary positions and added positional queries / keys applied."""
    if ctx.rotary is not None:
        q, k = apply_rotary(q, *ctx.rotary), apply_rotary(k, *ctx.rotary)
    if ctx.query_add is not None:
        q, k = q + ctx.query_add.to(q.dtype), k + ctx.key_add.to(k.dtype)
    return q, k


class TupeSelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and the scheme's positional context."""

    def __init__(self, config: TupeConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, n, _ = x.shape
        q, k, v = (
            self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )  # 3 x (b, h, n, d)
        out, probs = self.attend(q, k, v, inputs)  # (b, n, h, d)
        if _tracing():
            # A real copy: the ONNX exporter swaps SDPA for a decomposition whose output strides differ from the
            # traced ones, so a reshape recorded as a view (or an elided contiguous()) would no longer be valid.
            out = out.clone(memory_format=torch.contiguous_format)
        return out.reshape(b, n, -1), probs

    def project_positions(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, hidden) position vectors -> (h, m, d) queries and keys by this layer's own W^Q, W^K (with biases):
        what a scheme's `layer_term` projects its shared relative embeddings with (DeBERTa's `share_att_key`)."""
        width = 2 * self.heads * self.head_dim
        bias = None if self.qkv.bias is None else self.qkv.bias[:width]
        qk = F.linear(r, self.qkv.weight[:width], bias)  # (m, 2 * hidden)
        q, k = qk.view(r.shape[0], 2, self.heads, self.head_dim).permute(1, 2, 0, 3).unbind(0)
        return q, k

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention core on projected (b, h, n, d) queries, keys, values: the scheme's rotary / added
        positions, then the pass's kernel, the function transformers' `AttentionInterface` holds under its name
        (`tupe bench --attention-only` times this). Returns the (b, n, h, d) output and the probabilities."""
        # this layer's own shallow copy: a term a kernel builds lazily here stays with this layer (and its checkpoint)
        ctx, kernel = inputs.ctx.copy(), inputs.kernel
        dropout_p = self.dropout_p if self.training else 0.0
        if inputs.rows is not None:  # each document in a row of its own: the terms of its positions 0..L-1

            def attend_rows(q, k, v, length: int, padding: torch.Tensor | None) -> torch.Tensor:
                rows_ctx = ctx.leading(length)
                q, k = _positioned(q, k, rows_ctx)
                mask = padding if kernel.prepare is None else kernel.prepare(rows_ctx, padding, q.dtype)
                return kernel.fn(q, k, v, rows_ctx, mask, dropout_p, False)[0]

            return document_attention(q, k, v, inputs.rows, attend_rows).transpose(1, 2), None
        q, k = _positioned(q, k, ctx)
        if ctx.layer_term is not None:  # a term of this layer's own queries, keys and projections (DeBERTa)
            ctx = ctx.for_layer(ctx.layer_term(ctx, q, k, self.project_positions))
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(interface_name(kernel.name), None)
        return attention(
            self,
            q,
            k,
            v,
            inputs.mask,
            scaling=ctx.logit_scale,
            dropout=dropout_p,
            context=ctx,
            output_attentions=inputs.probabilities,
        )


def _check_non_reentrant(layers: nn.ModuleList) -> None:
    """Refuse a reentrant checkpoint function set on the layers other than through `activation_checkpointing_enable`
    (which runs every request non-reentrant): a reentrant backward would not reach the positional terms every
    layer shares. A function other than a `functools.partial` of `checkpoint` is not inspected."""
    layer = next((layer for layer in layers if layer.gradient_checkpointing), None)
    func = getattr(layer, "_gradient_checkpointing_func", None)
    # only a partial's own keywords (a wrapper or a mock of the function, as transformers' tests put there, is not)
    keywords = func.keywords if isinstance(func, functools.partial) else None
    if keywords is not None and keywords.get("use_reentrant", True) is not False:
        raise ValueError(
            "tupe models checkpoint non-reentrantly only: enable gradient checkpointing with "
            'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})'
        )


class TupeLayer(GradientCheckpointingLayer):
    """Post-LayerNorm transformer block (BERT / the released code)."""

    def __init__(self, config: TupeConfig):
        super().__init__()
        self.attention = TupeSelfAttention(config)
        self.attention_output = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = FastDropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs):
        """With gradient checkpointing (non-reentrant only, `TupePreTrainedModel.activation_checkpointing_enable`)
        the recomputation reads the same `inputs`, and the gradient of the terms every layer shares flows back to
        them through each layer's use."""
        attn, probs = self.attention(x, inputs)
        x = self.attention_norm(x + self.dropout(self.attention_output(attn)))
        x = self.output_norm(x + self.dropout(self.output(self.act(self.intermediate(x)))))
        return x, probs


# Checkpoint keys of earlier layouts -> today's: regex -> replacement, applied to keys relative to the model
# (`from_pretrained` through transformers' `key_mapping`, `load_state_dict` through a pre-hook). Classes add theirs
# in `_legacy_keys`.
LEGACY_KEYS: dict[str, str] = {
    # the positional projections were `query` / `key`, names PEFT users target for attention (positional.py)
    r"positional\.untied\.query\.": "positional.untied.pos_query.",
    r"positional\.untied\.key\.": "positional.untied.pos_key.",
}


def upgrade_legacy_key(key: str, mapping: dict[str, str] = LEGACY_KEYS) -> str:
    """`key` in today's layout (keys of today's layout are returned unchanged)."""
    for pattern, replacement in mapping.items():
        key = re.sub(pattern, replacement, key)
    return key


class TupePreTrainedModel(PreTrainedModel):
    config_class = TupeConfig
    config: TupeConfig
    base_model_prefix = "tupe"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["TupeLayer"]
    # The heads' losses are batch means and ignore `num_items_in_batch`; without this the Trainer, seeing
    # `**kwargs` in `forward`, would pass it and skip its division by the gradient-accumulation steps (a summed
    # loss: twice the loss and the step at 2 accumulated batches). tupe's pre-training Trainer counts the masked
    # tokens itself (`training/trainer.py`).
    accepts_loss_kwargs = False
    _legacy_keys: dict[str, str] = LEGACY_KEYS
    # `from_bert`: the transformers BERT class whose weights this class takes, and its head's keys (tupe <- BERT)
    _bert_class: str = "BertModel"
    _bert_head_keys: dict[str, str] = {}
    # `from_deberta`: (tupe name, ...) pairs of the head this class takes from DeBERTa; None: no DeBERTa head
    _deberta_head_keys: tuple[tuple[str, str], ...] | None = ()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """`load_state_dict` of a checkpoint of an earlier layout too (e.g. the Trainer resuming an old run)."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            new = prefix + upgrade_legacy_key(key[len(prefix) :], self._legacy_keys)
            if new != key and new not in state_dict:
                state_dict[new] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' `from_pretrained`; checkpoints of earlier layouts (`LEGACY_KEYS`) load too, and a model
        loaded from one saves in today's layout."""
        if kwargs.get("key_mapping") is not None:
            return super().from_pretrained(*args, **kwargs)
        kwargs["key_mapping"] = dict(cls._legacy_keys)
        result = super().from_pretrained(*args, **kwargs)
        model = result[0] if isinstance(result, tuple) else result
        legacy = set(cls._legacy_keys)
        conversions = getattr(model, "_weight_conversions", None)
        if conversions:  # not reverted on save: the model is in today's layout once loaded
            model._weight_conversions = [
                c for c in conversions if not set(getattr(c, "_original_source_patterns", ())) & legacy
            ]
        return result

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, PositionalModule):  # what a positional scheme's modules initialise themselves
            module.init_positional_weights(self.config.initializer_range)
        elif isinstance(module, TupeLMHead):
            init.zeros_(module.bias)

    def save_pretrained(self, save_directory, *args, **kwargs):
        self._check_rope_parameters_applied()
        # Map every Auto class, not only the saved one, so a checkpoint loaded with trust_remote_code works with
        # each of them alike.
        self.config.auto_map = {"AutoConfig": "configuration_tupe.TupeConfig"} | {
            auto: f"modeling_tupe.{name}" for auto, name in AUTO_CLASSES.items()
        }
        return super().save_pretrained(save_directory, *args, **kwargs)

    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, *args, **kwargs
    ):
        """transformers' gradient checkpointing (`gradient_checkpointing_enable` and the Trainer's
        `gradient_checkpointing` reach it too), always non-reentrant: `use_reentrant=True` (or left to torch's
        default) runs as `use_reentrant=False`, which gives the same gradients; a request for `use_reentrant=True`
        is answered by one warning line."""
        settings = dict(activation_checkpointing_kwargs or {})
        if settings.get("use_reentrant", False):
            logger.warning(
                "gradient checkpointing: use_reentrant=True runs as use_reentrant=False, the only mode tupe models "
                "checkpoint in (the gradients of plain training)"
            )
        settings["use_reentrant"] = False
        return super().activation_checkpointing_enable(settings, *args, **kwargs)

    def resolve_attention_kernel(
        self, dtype: torch.dtype | None = None, *, probabilities: bool = False
    ) -> str:
        """The kernel this model's next forward pass runs (see the module-level `resolve_attention_kernel`): the
        encoder's and every head's alike (a head and its encoder share one config)."""
        return resolve_attention_kernel(self, dtype=dtype, probabilities=probabilities)

    def _check_rope_parameters_applied(self) -> None:
        """A config.json never claims RoPE scaling the model does not apply: `config.rope_parameters` changed after
        the model was built (on a scheme with no rotation, or other than those its rope module applies) is
        refused by name before anything is written."""
        from .rope_scaling import refuse_rope_parameters

        given = getattr(self.config, "rope_parameters", None) or None
        positional = getattr(self.base_model, "positional", None)
        if not getattr(positional, "takes_rope_parameters", False):
            refuse_rope_parameters(self.config)
        elif given != positional.rope_parameters:
            raise ValueError(
                f"config.rope_parameters {given!r} is not what this model applies "
                f"({positional.rope_parameters!r}): it was changed after the model was built; load the model with "
                "from_pretrained(path, rope_parameters=...) (or config=) to apply it"
            )

    @classmethod
    def from_bert(cls, model_or_path, tokenizer=None, **config_overrides):
        """A `bert-a` model with the weights of a `transformers` BERT model of the matching class (an instance
        or a local path): `BertForMaskedLM` for `TupeForMaskedLM`, `BertForTokenClassification` for
        `TupeForTokenClassification`, and so on; `BertModel` (or any BERT class) for `TupeModel`.

        The special-token ids (`pad_token_id`, `cls_token_id`, `sep_token_id`, `mask_token_id`, `unk_token_id`)
        are those of `tokenizer`, or of the tokenizer saved in the folder: Google's vocabulary (`[CLS]` 101,
        `[SEP]` 102, `[MASK]` 103, as bert-base-uncased) as well as tupe's own (1, 2, 3). An instance given
        without a tokenizer keeps BERT's padding id and TupeConfig's defaults for the others.

        BERT adds a token-type embedding to every token; with all-zero token types that is a constant vector,
        folded exactly into the position table (`p_i + t_0`). Pair inputs lose the segment-B embedding. The head's
        config (num_labels, id2label, problem_type, classifier_dropout) is BERT's.
        """
        from .conversion import bert_to_tupe

        return bert_to_tupe(cls, model_or_path, tokenizer, **config_overrides)

    @classmethod
    def from_deberta(cls, model_or_path, **config_overrides):
        """A `deberta` model with the weights of a `transformers` DeBERTa-v2/v3 model (an instance or a local
        folder): `DebertaV2ForMaskedLM` for `TupeForMaskedLM` (either head layout, `legacy` or not),
        `DebertaV2Model` for `TupeModel`. A configuration the scheme cannot represent (docs/model.md lists them:
        no relative attention, unshared positional projections, absolute input positions, token types, the
        convolution layer, ...) is refused with the reasons. Padded positions' own hidden states differ:
        DeBERTa also masks padded queries (docs/model.md)."""
        from .conversion import deberta_to_tupe

        if cls._deberta_head_keys is None:
            raise ValueError(
                f"{cls.__name__}.from_deberta: only TupeModel (from DebertaV2Model) and TupeForMaskedLM "
                "(from DebertaV2ForMaskedLM) take DeBERTa weights"
            )
        return deberta_to_tupe(cls, model_or_path, **config_overrides)

    def positional_parameter_names(self) -> list[str]:
        """Names (as `named_parameters()` gives them) of the positional scheme's parameters: position tables,
        U^Q/U^K, theta, the relative bias table. Optimizers give them groups of their own (`--positional-lr-scale`,
        `--positional-weight-decay`)."""
        return [
            f"{prefix}.{name}"
            for prefix, module in self.named_modules()
            if isinstance(module, PositionalScheme)
            for name, _ in module.named_parameters()
        ]

    def _head_output(
        self,
        output_cls,
        loss,
        logits,
        encoder_outputs: BaseModelOutput,
        return_dict: bool | None,
        **fields: torch.Tensor,
    ):
        """A head's result: `output_cls(...)`, or with `return_dict=False` the transformers-style tuple (loss first
        when there is one, then the logits, or the `fields` in order, then hidden states and attentions; absent
        entries left out)."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        hidden_states, attentions = encoder_outputs.hidden_states, encoder_outputs.attentions
        fields = fields or {"logits": logits}
        if not return_dict:
            return tuple(t for t in (loss, *fields.values(), hidden_states, attentions) if t is not None)
        return output_cls(loss=loss, **fields, hidden_states=hidden_states, attentions=attentions)

    def get_correct_attn_implementation(
        self, requested_attention: str | None, is_init_check: bool = False
    ) -> str:
        """transformers' public hook (from `__init__`, `from_pretrained` and `set_attn_implementation`) for the value
        of the one setting `config._attn_implementation`: the `tupe_` name of the kernel that runs, "auto" resolved
        for the weights' device and dtype and the train mode (attention_interface.py `settle`). None (nothing asked)
        keeps the config's setting. A name the registry does not have, or a kernel that cannot run the scheme, is
        refused in one line."""
        return settle(self, requested_attention)

    def set_attn_implementation(
        self, attn_implementation: str | dict, allow_all_kernels: bool = False
    ) -> None:
        """transformers' `set_attn_implementation`: any request (`attn_implementation`, attention_interface.py),
        refused in one line before transformers looks for a Hub kernel of that name; a named kernel is kept as
        named from then on, "auto" is resolved now for the model's weights and mode."""
        if attn_implementation is not None and not isinstance(attn_implementation, dict):
            checked_request(attn_implementation, self.config.position_scheme)
            self.config._attn_auto = None
        super().set_attn_implementation(attn_implementation, allow_all_kernels)

    def train(self, mode: bool = True):
        """`nn.Module.train`; "auto", where it chose the setting, is resolved again for the new mode."""
        super().train(mode)
        refresh(self)
        return self


class TupeModel(TupePreTrainedModel):
    """The encoder: embeddings, one positional scheme, `num_hidden_layers` blocks.

    `config._attn_implementation` names the attention kernel that runs (`tupe_<name>`, a kernel of the registry in
    kernels.py registered with transformers' `AttentionInterface`); attention_interface.py says when "auto" is
    resolved. Every kernel is exact against the eager reference (tests/modeling/test_fast_paths.py).
    `output_attentions` runs the eager reference, the kernel that returns probabilities, and says so once.
    docs/model.md "Attention kernels" lists them.
    """

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.embeddings = TupeEmbeddings(config)
        self.positional = build_scheme(config)
        self.layers = nn.ModuleList(TupeLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def positional_logits(self, seq_len: int) -> torch.Tensor | None:
        """The content-free term added to every layer's logits, (heads, seq_len, seq_len), after the [CLS] reset
        where the scheme has one; None for schemes without such a term (bert-a, bert-a-d, rope)."""
        self._check_length(seq_len)
        return self.positional(seq_len, None).content_free

    def positions(
        self,
        shape: tuple[int, int],
        position_ids: torch.Tensor | None = None,
        cu_seq_lens_q: torch.Tensor | None = None,
        seq_idx: torch.Tensor | None = None,
        device: torch.device | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> Positions | None:
        """The `Positions` a forward pass of input `shape` (b, n) runs with, or None for the fast path (no
        `position_ids` nor boundaries, or `position_ids` equal to 0..n-1 in every row of a batch without padding:
        today's computation).

        Positions are `position_ids` (b, n), else 0..m-1 in each document. Documents: see
        `documents.document_starts` (`seq_idx`, `cu_seq_lens_q`, or `position_ids` restarting at 0); `documents`
        is None when every row holds one. The one document object of the pass (`documents.build_positions`): the
        encoder and the heads read it. Refused: positions outside the model's range, a shape that does not
        match. The length limit applies to positions, not to the row (a flattened row longer than
        max_position_embeddings whose positions all fit is fine)."""
        b, n = shape
        device = self.embeddings.word_embeddings.weight.device if device is None else device
        _check_integer_ids(position_ids=position_ids, cu_seq_lens_q=cu_seq_lens_q, seq_idx=seq_idx)
        if position_ids is not None:
            if tuple(position_ids.shape) != (b, n):
                if position_ids.dim() == 1 and position_ids.shape[0] == n:
                    position_ids = position_ids[None].expand(b, n)
                else:
                    raise ValueError(
                        f"position_ids has shape {tuple(position_ids.shape)}; expected (batch, length) = {(b, n)}"
                    )
            position_ids = position_ids.to(device=device, dtype=torch.long)
        limit, scheme = self.config.max_position_embeddings, self.config.position_scheme
        return build_positions(
            shape, device, position_ids, cu_seq_lens_q, seq_idx, attention_mask, limit, scheme, _tracing()
        )

    def head_positions(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        kwargs: dict,
    ) -> Positions | None:
        """The document object of a head's forward pass (`positions`), built once for the head and its encoder;
        takes `cu_seq_lens_q` and `seq_idx` out of the head's `kwargs`."""
        cu_seq_lens_q, seq_idx = kwargs.pop("cu_seq_lens_q", None), kwargs.pop("seq_idx", None)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if position_ids is None and cu_seq_lens_q is None and seq_idx is None:
            return None
        source = input_ids if input_ids is not None else inputs_embeds
        return self.positions(
            tuple(source.shape[:2]), position_ids, cu_seq_lens_q, seq_idx, attention_mask=attention_mask
        )

    def _check_length(self, n: int) -> None:
        if n > self.config.max_position_embeddings:
            limit = self.config.max_position_embeddings
            raise ValueError(
                f"input length {n} exceeds max_position_embeddings {limit} (the model's maximum length); "
                f"truncate the input: tokenizer(..., truncation=True) or pipeline(..., truncation=True), "
                f"which cut at the tokenizer's model_max_length"
            )

    def _document_rows(
        self, kernel: AttentionKernel, positions: Positions | None, dtype: torch.dtype, probabilities: bool
    ) -> DocumentRows | None:
        """The one place where the documents' path is decided, from the kernel's and the scheme's capabilities:
        each document attended in a row of its own (the length groups, returned) where the kernel takes documents
        in its mask (`AttentionKernel.documents == "mask"`), the scheme's terms of positions 0..L-1 serve every
        document (`document_rows`), no probabilities are wanted and every document's positions are 0..m-1 (known
        on the host: never while tracing); else None: a kernel that takes documents in its mask gets the
        block-diagonal mask, one that reads them itself ("context": flex's `BlockMask`) the context's positions,
        and one that cannot was refused when it was chosen (`select_kernel`)."""
        if positions is None or positions.documents is None or probabilities:
            return None
        if kernel.documents != "mask" or not type(self.positional).document_rows:
            return None
        return positions.rows(dtype)

    def _attention_inputs(
        self,
        n: int,
        attention_mask: torch.Tensor | None,
        dtype: torch.dtype,
        probabilities: bool = False,
        positions: Positions | None = None,
    ) -> AttentionInputs:
        if positions is not None and not type(self.positional).takes_positions:
            raise ValueError(
                f"position_scheme {self.config.position_scheme!r} takes no position_ids (it declares "
                f"takes_positions = False: positions 0..n-1 only); call it without position_ids, cu_seq_lens_q or "
                f"seq_idx, and without packed documents"
            )
        documents = positions is not None and positions.documents is not None
        device = self.embeddings.word_embeddings.weight.device
        kernel = kernel_for_pass(  # export / compile: no state changed while tracing
            self.config,
            device,
            dtype,
            self.training,
            torch.is_grad_enabled(),
            probabilities,
            documents,
            update=not _tracing(),
        )
        rows = self._document_rows(kernel, positions, dtype, probabilities)
        # documents at positions 0..m-1: each attended in a row of its own, one shared term
        if rows is not None:
            ctx = self.positional(rows.length, None)
            if ctx.input_embedding is not None:  # absolute positions, added to the flattened tokens
                ctx.input_embedding = ctx.input_embedding[positions.ids]
            if kernel.reads_content_free:
                ctx.content_free  # noqa: B018 - built once here for every layer, as below
            return AttentionInputs(ctx, None, None, kernel, probabilities, rows)
        ctx = self.positional(n, positions)
        if positions is not None:
            ctx.positions = positions
        padding = None
        # Without padding no mask at all (faster kernels); traced or compiled, the padding term is always built:
        # whether a mask has zeros is a tensor's value, and export/compile need one graph for every mask.
        if positions is not None:  # the document object knows whether there is padding
            padded = positions.real is not None
        else:
            padded = attention_mask is not None and (_tracing() or not bool(attention_mask.all()))
        if padded:
            keep = attention_mask[:, None, None, :].to(torch.bool)
            padding = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(
                ~keep, torch.finfo(dtype).min
            )
        if documents and kernel.documents == "mask":  # block-diagonal: keys of the query's own document only
            ids = positions.documents
            keep = ids[:, None, :, None] == ids[:, None, None, :]  # (b, 1, n, n)
            if padding is not None:
                keep = keep & (padding >= 0)
            padding = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(
                ~keep, torch.finfo(dtype).min
            )
        if kernel.reads_content_free:
            ctx.content_free  # noqa: B018 - a deferred term, built once here for every layer (not when folded)
        mask = padding if kernel.prepare is None else kernel.prepare(ctx, padding, dtype)
        return AttentionInputs(ctx, padding, mask, kernel, probabilities)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor
        | None = None,  # accepted for tokenizer compatibility; TUPE has no segments
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        cu_seq_lens_q: torch.Tensor | None = None,
        seq_idx: torch.Tensor | None = None,
        positions: Positions | None = None,
        **kwargs,
    ) -> BaseModelOutput | tuple:
        """`input_ids` (b, n), or `inputs_embeds` (b, n, hidden) in place of the word embeddings (prompt tuning,
        adversarial training): positions are still added and the embedding LayerNorm still applies.

        `position_ids` (b, n): each token's position (default 0..n-1 in every row), as `BertModel` takes them;
        every scheme computes its terms from them. Where they restart at 0 inside a row a new document starts
        (transformers' `DataCollatorWithFlattening`), and no token attends outside its document. Explicit
        boundaries instead: `seq_idx` (b, n) segment ids, or `cu_seq_lens_q` (cumulative lengths of the documents
        of one flattened row); positions are then 0..m-1 in each document unless `position_ids` are given.
        `positions`: the document object `positions(...)` built from these (a head that reads the documents too
        builds it once and passes it instead of them).
        Other keyword arguments transformers passes (`cu_seq_lens_k`, `max_length_q`, ...) are ignored."""
        output_attentions = (
            output_attentions if output_attentions is not None else self.config.output_attentions
        )
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        source = input_ids if input_ids is not None else inputs_embeds
        n = source.shape[1]
        if positions is None and (
            position_ids is not None or cu_seq_lens_q is not None or seq_idx is not None
        ):
            positions = self.positions(
                tuple(source.shape[:2]), position_ids, cu_seq_lens_q, seq_idx, attention_mask=attention_mask
            )
        if positions is None:
            self._check_length(n)

        compute_dtype = (
            torch.get_autocast_dtype(source.device.type)
            if torch.is_autocast_enabled(source.device.type)
            else self.embeddings.word_embeddings.weight.dtype
        )
        inputs = self._attention_inputs(
            n, attention_mask, compute_dtype, probabilities=bool(output_attentions), positions=positions
        )

        x = self.embeddings(input_ids, inputs.ctx, inputs_embeds)
        all_hidden = (x,) if output_hidden_states else None
        all_attn = () if output_attentions else None
        if self.training and torch.is_grad_enabled():
            _check_non_reentrant(self.layers)
        for layer in self.layers:
            x, probs = layer(x, inputs)
            if output_hidden_states:
                all_hidden += (x,)
            if output_attentions:
                all_attn += (probs,)
        if not return_dict:
            return tuple(t for t in (x, all_hidden, all_attn) if t is not None)
        return BaseModelOutput(last_hidden_state=x, hidden_states=all_hidden, attentions=all_attn)


class TupeLMHead(nn.Module):
    """dense -> activation -> LayerNorm -> projection tied to the word embeddings, plus a bias."""

    def __init__(self, config: TupeConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """The head before the vocabulary projection: dense -> activation -> LayerNorm."""
        return self.LayerNorm(self.act(self.dense(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x)) + self.bias


class TupeForMaskedLM(TupePreTrainedModel):
    """Encoder + masked-LM head. `logits` is (batch, seq, vocab), as in every masked LM of transformers.

    `config.sparse_prediction=True` (opt-in, as in ModernBERT; `tupe pretrain` turns it on) runs the head, the
    most expensive matmul at small sizes (hidden x vocab), on the positions with `labels != -100` only when labels
    are given: `logits` is then (num_masked, vocab) and the loss is the same."""

    _tied_weights_keys = {"lm_head.decoder.weight": "tupe.embeddings.word_embeddings.weight"}
    _bert_class = "BertForMaskedLM"
    _deberta_head_keys = (
        ("lm_head.dense", "dense"),
        ("lm_head.LayerNorm", "LayerNorm"),
        ("lm_head.bias", "bias"),
    )
    _bert_head_keys = {
        "lm_head.dense": "cls.predictions.transform.dense",
        "lm_head.LayerNorm": "cls.predictions.transform.LayerNorm",
        "lm_head.bias": "cls.predictions.bias",
    }

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.tupe = TupeModel(config)
        self.lm_head = TupeLMHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """transformers resizes the embeddings and the decoder; the output bias (a parameter of its own) follows:
        kept rows copied, new rows the old mean (`mean_resizing`, as transformers does for a decoder bias) or 0."""
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        old = self.lm_head.bias
        size = embeddings.weight.shape[0]
        if old.shape[0] != size:
            with torch.no_grad():
                fill = old.float().mean().to(old.dtype) if mean_resizing else 0.0
                new = torch.full((size,), fill, dtype=old.dtype, device=old.device)
                keep = min(size, old.shape[0])
                new[:keep] = old[:keep]
            self.lm_head.bias = nn.Parameter(new, requires_grad=old.requires_grad)
        return embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        outputs = self.tupe(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        loss = None
        if labels is not None and self.config.sparse_prediction:
            selected = labels != -100
            targets = labels[selected]
            transformed = self.lm_head.transform(hidden[selected])  # (num_masked, hidden)
            if transformed.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(
                transformed.device.type
            ):
                # one pass for the projection, its bias and the loss (ops.masked_lm_loss); exact
                loss, logits = masked_lm_loss(
                    transformed, self.lm_head.decoder.weight, self.lm_head.bias, targets
                )
            else:
                logits = self.lm_head.decoder(transformed) + self.lm_head.bias  # (num_masked, vocab)
                # sum / count rather than mean, so a batch without masked tokens gives 0 instead of NaN
                loss = F.cross_entropy(logits.float(), targets, reduction="sum") / selected.sum().clamp(min=1)
        else:
            logits = self.lm_head(hidden)  # (b, n, vocab)
            if labels is not None:
                loss = F.cross_entropy(
                    logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100
                )
        return self._head_output(MaskedLMOutput, loss, logits, outputs, return_dict)

    @classmethod
    def from_fairseq(cls, checkpoint, dictionary=None, dtype: torch.dtype | None = None) -> TupeForMaskedLM:
        """The authors' released TUPE checkpoint (fairseq format, `guolinke/TUPE`): `tupe-r` or `tupe-a`, its
        masked-LM head tied to the embeddings, fairseq's ids (`<s>` 0, `<pad>` 1, `</s>` 2, `<mask>` last); in
        `dtype` (default float32, float64 for a float64 checkpoint).
        `dictionary`: its `dict.txt`, checked against the vocabulary. Loaded without running pickled code; see
        `tupe.modeling.fairseq` and docs/released-checkpoint.md."""
        try:  # absolute and in a try: the converter is not part of the modeling code saved with a model
            from tupe.modeling.fairseq import masked_lm_from_fairseq
        except ImportError as err:  # pragma: no cover - remote-code copies without the tupe package
            raise ImportError("from_fairseq needs the tupe package (pip install tupe)") from err
        return masked_lm_from_fairseq(checkpoint, dictionary, dtype)


def _classifier_dropout(config: TupeConfig) -> float:
    """The heads' dropout: `classifier_dropout`, or `hidden_dropout_prob` when unset (as BERT's heads)."""
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class TupeClassificationHead(nn.Module):
    """The released code's sentence head on token 0 ([CLS]): dense -> tanh -> dropout -> out_proj (BERT's pooler,
    dropout and classifier in one module, so PEFT's default `modules_to_save=["classifier"]` keeps all of it)."""

    def __init__(self, config: TupeConfig, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.out_proj = nn.Linear(config.hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(torch.tanh(self.dense(hidden[:, 0]))))


def sequence_classification_loss(
    config: TupeConfig, logits: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """`BertForSequenceClassification`'s loss: `config.problem_type` (inferred and set on first use as there)."""
    num_labels = config.num_labels
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif num_labels > 1 and labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze().float(), labels.squeeze().float())
        return F.mse_loss(logits.float(), labels.float())
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.float().view(-1, num_labels), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class TupeForSequenceClassification(TupePreTrainedModel):
    """Encoder + the released code's sentence head (`TupeClassificationHead`) under `classifier`. Losses as
    `BertForSequenceClassification`: `config.problem_type` regression (MSE), single-label (cross-entropy) or
    multi-label (BCE with logits), inferred from `num_labels` and the labels' dtype when unset.

    Checkpoints of the earlier layout (`dense.*` and `classifier.*` at the top, with a dropout before `dense`
    that the released head does not have) load into `classifier.dense` / `classifier.out_proj`."""

    _legacy_keys = LEGACY_KEYS | {
        r"^dense\.weight$": "classifier.dense.weight",
        r"^dense\.bias$": "classifier.dense.bias",
        r"^classifier\.weight$": "classifier.out_proj.weight",
        r"^classifier\.bias$": "classifier.out_proj.bias",
    }
    _bert_class = "BertForSequenceClassification"
    _deberta_head_keys = None
    _bert_head_keys = {"classifier.dense": "bert.pooler.dense", "classifier.out_proj": "classifier"}

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.tupe = TupeModel(config)
        self.classifier = TupeClassificationHead(config, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        positions = self.tupe.head_positions(input_ids, inputs_embeds, attention_mask, position_ids, kwargs)
        outputs = self.tupe(
            input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            positions=positions,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        if positions is not None and positions.documents is not None:
            starts = positions.starts
            if attention_mask is not None:  # padding given position 0 starts no document
                starts = starts & attention_mask.to(starts.device).bool()
            if bool(starts[:, 1:].any()):
                # documents in a row: one row of logits per document, from its first token ([CLS]), in reading order
                hidden = hidden[starts][:, None]  # (documents, 1, hidden)
                if labels is not None and labels.shape[0] != hidden.shape[0]:
                    raise ValueError(
                        f"{labels.shape[0]} labels for {hidden.shape[0]} documents: with several documents in a "
                        f"row (position_ids restarting at 0) give one label per document, in order"
                    )
        logits = self.classifier(hidden)
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return self._head_output(SequenceClassifierOutput, loss, logits, outputs, return_dict)


class TupeForTokenClassification(TupePreTrainedModel):
    """Encoder + a linear layer on every token (`BertForTokenClassification`): dropout -> `classifier`; loss
    cross-entropy over the labels that are not -100 (a word's later sub-tokens, padding)."""

    _bert_class = "BertForTokenClassification"
    _bert_head_keys = {"classifier": "classifier"}

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.tupe = TupeModel(config)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        outputs = self.tupe(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (b, n, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1))
        return self._head_output(TokenClassifierOutput, loss, logits, outputs, return_dict)


class TupeForQuestionAnswering(TupePreTrainedModel):
    """Encoder + a span head (`BertForQuestionAnswering`): `qa_outputs` gives each token a start and an end logit;
    the loss is the mean of the start and end cross-entropies, positions outside the input ignored."""

    _bert_class = "BertForQuestionAnswering"
    _bert_head_keys = {"qa_outputs": "qa_outputs"}

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.tupe = TupeModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        outputs = self.tupe(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            # as BERT: positions beyond the input (a truncated answer) are clamped to n and ignored
            ignored = start_logits.shape[1]
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=ignored)
                + F.cross_entropy(end_logits.float(), end, ignore_index=ignored)
            ) / 2
        return self._head_output(
            QuestionAnsweringModelOutput,
            loss,
            None,
            outputs,
            return_dict,
            start_logits=start_logits,
            end_logits=end_logits,
        )


class TupeForMultipleChoice(TupePreTrainedModel):
    """Encoder + one score per choice (`BertForMultipleChoice`): inputs are (batch, choices, n); each choice is
    encoded on its own and scored by the sentence head (`TupeClassificationHead` with one output, BERT's pooler,
    dropout and classifier); the loss is cross-entropy over the choices."""

    _bert_class = "BertForMultipleChoice"
    _bert_head_keys = {"classifier.dense": "bert.pooler.dense", "classifier.out_proj": "classifier"}

    def __init__(self, config: TupeConfig):
        super().__init__(config)
        self.tupe = TupeModel(config)
        self.classifier = TupeClassificationHead(config, 1)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MultipleChoiceModelOutput | tuple:
        source = input_ids if input_ids is not None else inputs_embeds
        if source is None:
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        choices = source.shape[1]
        flat = lambda t: None if t is None else t.reshape(-1, *t.shape[2:])  # noqa: E731 - (b * choices, ...)
        if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("seq_idx") is not None:
            raise ValueError(
                "TupeForMultipleChoice scores each choice from its own row: flattened input (cu_seq_lens_q, "
                "seq_idx) is not supported; pass (batch, choices, n) rows"
            )
        if position_ids is not None:
            _check_integer_ids(position_ids=position_ids)
            b, n = source.shape[0], source.shape[2]
            if (
                position_ids.dim() == 1 and position_ids.shape[0] == n
            ):  # one row for every choice, as BERT reads it
                position_ids = position_ids.expand(b, choices, n)
            if tuple(position_ids.shape) != (b, choices, n):
                raise ValueError(
                    f"position_ids has shape {tuple(position_ids.shape)}; TupeForMultipleChoice takes (batch, "
                    f"choices, length) = {(b, choices, n)} or (length,) = ({n},)"
                )
            position_ids = flat(position_ids)
        positions = None
        if position_ids is not None:  # built once: refused here if it holds documents, read by the encoder
            shape, mask = tuple(position_ids.shape), flat(attention_mask)
            positions = self.tupe.positions(shape, position_ids, attention_mask=mask)
            if positions is not None and positions.documents is not None:
                raise ValueError(
                    "TupeForMultipleChoice scores each choice from its own row: position_ids restarting at 0 "
                    "inside a row (several documents) are not supported; pass (batch, choices, n) rows"
                )
        outputs = self.tupe(
            flat(input_ids),
            attention_mask=flat(attention_mask),
            inputs_embeds=flat(inputs_embeds),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            positions=positions,
            **kwargs,
        )
        logits = self.classifier(outputs.last_hidden_state).view(-1, choices)  # (b, choices)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels.view(-1))
        return self._head_output(MultipleChoiceModelOutput, loss, logits, outputs, return_dict)


# Auto class -> tupe class: registered by `tupe` (tupe/__init__.py) and written into saved configs' `auto_map`
AUTO_CLASSES: dict[str, str] = {
    "AutoModel": "TupeModel",
    "AutoModelForMaskedLM": "TupeForMaskedLM",
    "AutoModelForSequenceClassification": "TupeForSequenceClassification",
    "AutoModelForTokenClassification": "TupeForTokenClassification",
    "AutoModelForQuestionAnswering": "TupeForQuestionAnswering",
    "AutoModelForMultipleChoice": "TupeForMultipleChoice",
}

if __name__.partition(".")[0] != "tupe":
    # a model folder's copy (trust_remote_code): a model loaded before transformers' pipelines were imported, then
    # handed to `pipeline("token-classification", model=model)`, reads words as with tupe (configuration_tupe.py)
    from .token_classification import register_token_classification

    register_token_classification()
