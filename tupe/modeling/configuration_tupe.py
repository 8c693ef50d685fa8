"""Configuration of the TUPE model family: every positional scheme of the paper is one value of `position_scheme`."""

from __future__ import annotations

from transformers import PretrainedConfig

from .kernel_registry import ATTENTION_KERNELS, KERNEL_ALIASES, check_kernel_for_scheme
from .positional import POSITION_SCHEMES, SCHEMES, PositionalScheme, scheme_class, scheme_fields

# The one attention switch (saved in config.json) takes "auto" or a name of the kernel registry
# (kernel_registry.py), read live: `ATTENTION_KERNELS`. See docs/model.md "Attention kernels".
__all__ = ["ATTENTION_KERNELS", "POSITION_SCHEMES", "TupeConfig"]


class TupeConfig(PretrainedConfig):
    """BERT-style encoder configuration plus the positional scheme.

    Defaults are the released code's BERT-Base (12 x 768, 12 heads, FFN 3072, post-LayerNorm, no token types,
    LayerNorm on the input embedding) with TUPE-A positions.

    Args:
        position_scheme: one of `POSITION_SCHEMES` (see `docs/model.md` for the logits of each).
        embedding_layer_norm: LayerNorm on the (word [+ position]) input embedding, as in the released commands.
        sparse_prediction: with labels, run the masked-LM head on the masked positions only (logits then
            (num_masked, vocab)); off by default, so logits are (batch, seq, vocab) as in every transformers masked
            LM. `tupe pretrain` turns it on for its own training (same loss, much less head work).
        attention_kernel: the saved attention kernel, "auto" or a name of the kernel registry
            (`ATTENTION_KERNELS`), so that a reloaded model runs the kernel it was trained and benchmarked with; a
            kernel that cannot run the scheme is refused with the reason (`PositionalScheme.kernels()` lists what
            applies). All are exact against "eager", the reference. A model built or loaded from this config
            copies it into transformers' `config._attn_implementation`, unless `attn_implementation` names
            another kernel (`from_pretrained(..., attn_implementation=K)`, `set_attn_implementation(K)`; "sdpa"
            is the SDPA kernel): from then on `_attn_implementation` is the one runtime setting and names the
            kernel that runs ("auto" picks one per device, dtype and train mode, once per model:
            `model.resolve_attention_kernel()` says which).
        rope_parameters: transformers' RoPE scaling (`{"rope_type": "yarn", "factor": 4.0, ...}`; the legacy
            `rope_scaling` is mapped onto it), for the `rope` scheme only (any other refuses it by name), applied
            through transformers' `ROPE_INIT_FUNCTIONS` (tupe/modeling/rope_scaling.py; docs/model.md "RoPE
            scaling"). Unset by default, and then not saved.
        **kwargs: the positional scheme's own fields, as it declares them (`PositionalScheme.config_fields`; a
            config holds its own scheme's fields only, with their defaults where not given; another registered
            scheme's field is dropped, so that config.json files that carry every scheme's fields, as they were
            once saved, load unchanged), then `PretrainedConfig`'s arguments. The built-in schemes':
    """

    model_type = "tupe"
    # transformers' RoPE scaling (`{"rope_type": "yarn", "factor": 4.0, ...}`), the rope scheme's only
    # (tupe/modeling/rope_scaling.py): unset (this class default, never saved) unless given. A class attribute so
    # that `from_pretrained(path, rope_parameters=...)` / `rope_scaling=...` set it as transformers' RoPE models do.
    rope_parameters = None

    def __init__(
        self,
        vocab_size: int = 32768,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        position_scheme: str = "tupe-a",
        embedding_layer_norm: bool = True,
        layer_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        classifier_dropout: float | None = None,
        sparse_prediction: bool = False,
        attention_kernel: str = "auto",
        pad_token_id: int = 0,
        cls_token_id: int = 1,
        sep_token_id: int = 2,
        mask_token_id: int = 3,
        tie_word_embeddings: bool = True,
        **kwargs,
    ):
        scheme = scheme_class(position_scheme)  # unknown names: a ValueError listing the valid ones
        # Configs saved before `attention_kernel` existed carry `fold_positional` (default True): "auto" folded
        # where it could, which is still what "auto" does.
        kwargs.pop("fold_positional", None)
        if hidden_size % num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads ({num_attention_heads})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.position_scheme = position_scheme
        self.embedding_layer_norm = embedding_layer_norm
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.classifier_dropout = classifier_dropout
        self.sparse_prediction = sparse_prediction
        self._take_scheme_fields(scheme, kwargs)
        self._take_rope_parameters(scheme, kwargs)
        self.attention_kernel = check_kernel_for_scheme(attention_kernel, position_scheme, scheme.terms)
        self.cls_token_id = cls_token_id
        self.sep_token_id = sep_token_id
        self.mask_token_id = mask_token_id
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)

    def _take_scheme_fields(self, scheme: type[PositionalScheme], kwargs: dict) -> None:
        """The scheme's own fields, resolved now (e.g. deberta's max_relative_positions -1 ->
        max_position_embeddings, so that a copy built for longer inputs keeps the bucket boundaries it was trained
        with), then its checks. Other registered schemes' fields are dropped: a config holds its own scheme's only
        (config.json files written when every config carried every scheme's fields load unchanged)."""
        for field in scheme.config_fields:
            value = kwargs.pop(field.name, field.default)
            setattr(self, field.name, value if field.resolve is None else field.resolve(value, self))
        for name in scheme_fields():
            kwargs.pop(name, None)
        scheme.check_config(self)

    def _take_rope_parameters(self, scheme, kwargs: dict) -> None:
        """`rope_parameters` (or the legacy `rope_scaling`, mapped onto it as transformers 5 does) in standard
        form for a scheme that applies them (rope), refused by name by any other; unset: nothing stored."""
        from .rope_scaling import refuse_rope_parameters, standard_rope_parameters

        legacy = kwargs.pop("rope_scaling", None)
        given = legacy or kwargs.pop("rope_parameters", None)
        kwargs.pop("rope_parameters", None)
        if not given:
            return
        self.rope_parameters = given
        if not scheme.takes_rope_parameters:
            refuse_rope_parameters(self)
        self.rope_parameters = standard_rope_parameters(self)

    def __setattr__(self, key: str, value) -> None:
        # A kernel's alias names the kernel itself, however it is set: `config._attn_implementation =
        # "flex_attention"` (or `attention_kernel = ...`) reads back "flex", as from_pretrained(attn_implementation=)
        # and set_attn_implementation give it. Unknown names are kept, for the model to refuse by name.
        if key in ("_attn_implementation", "attention_kernel") and isinstance(value, str):
            value = KERNEL_ALIASES.get(value, value)
        super().__setattr__(key, value)

    def convert_rope_params_to_dict(self, **kwargs):
        """transformers' RoPE standardisation, which would give every config a default `rope_parameters`: tupe
        standardises them itself, for the rope scheme only (`_take_rope_parameters`)."""
        return kwargs

    def validate_attention_kernel(self) -> str:
        """`attention_kernel` as its canonical registry name (aliases resolved), checked against the registry
        and the scheme; the config is not changed."""
        terms = scheme_class(self.position_scheme).terms
        return check_kernel_for_scheme(self.attention_kernel, self.position_scheme, terms)

    def requested_attention_kernel(self) -> str:
        """The kernel that runs ("auto" or a registry name), checked against the registry and the scheme:
        `_attn_implementation`, the one runtime setting (a model sets it when it is built or loaded, to the saved
        `attention_kernel` unless `attn_implementation` asked for another), or `attention_kernel` for a config no
        model holds. The config is not changed."""
        name = getattr(self, "_attn_implementation", None)
        if name is None:
            return self.validate_attention_kernel()
        terms = scheme_class(self.position_scheme).terms
        return check_kernel_for_scheme(name, self.position_scheme, terms, "attn_implementation")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


TupeConfig.__doc__ += (
    "".join(
        f"\n        {field.name} ({', '.join(s for s, c in SCHEMES.items() if field in c.config_fields)}; default "
        f"{field.default!r}): {field.doc}."
        for field in scheme_fields().values()
    )
    + "\n"
)


def _serve_token_classification() -> None:
    """In a model folder's copy of this module (loaded with `trust_remote_code=True`, tupe perhaps not installed):
    where transformers' pipelines are loaded, serve "token-classification" with the folder's copy of tupe's
    word-reading pipeline (token_classification.py) as `import tupe` does, so that `pipeline("token-classification",
    model=FOLDER, trust_remote_code=True)` gives the entities it gives with tupe (the pipeline's class is chosen
    once the config is read, before the model). tupe's own module does nothing here: tupe registers it when
    transformers' pipelines are imported (tupe/__init__.py)."""
    import sys

    if __name__.partition(".")[0] != "tupe" and "transformers.pipelines" in sys.modules:
        from .token_classification import register_token_classification

        register_token_classification()


_serve_token_classification()
