"""Configuration of the TUPE model family: every positional scheme of the paper is one value of `position_scheme`."""

from __future__ import annotations

from transformers import PretrainedConfig
from transformers.utils import logging

from .attention_interface import AUTO, checked_request, requested_kernel, setting, setting_kernel
from .kernel_registry import ATTENTION_KERNELS
from .positional import POSITION_SCHEMES, SCHEMES, PositionalScheme, scheme_class, scheme_fields

# The one attention switch is transformers' `config._attn_implementation` (saved in config.json as
# `attn_implementation`): "auto" or a kernel of the registry (kernels.py, `ATTENTION_KERNELS`) by its
# `AttentionInterface` name, `tupe_<name>` (attention_interface.py). See docs/model.md "Attention kernels".
__all__ = ["ATTENTION_KERNELS", "POSITION_SCHEMES", "TupeConfig"]

logger = logging.get_logger(__name__)


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
        attn_implementation: the attention kernel, transformers' one setting (`config._attn_implementation`, saved in
            config.json): "auto" (default) or a kernel of the registry (`ATTENTION_KERNELS`), by its
            `AttentionInterface` name (`tupe_eager`, `tupe_sdpa`, `tupe_fold`, `tupe_fused`, `tupe_flex`) or its
            registry name, transformers' "eager" / "sdpa" / "flex_attention" naming tupe's kernel of that kind; a
            kernel that cannot run the scheme is refused with the reason (`PositionalScheme.kernels()` lists what
            applies). All are exact against the eager reference. A model built or loaded from this config resolves
            "auto" to the kernel that runs, which the setting then names: "eager" or "sdpa" (transformers' words for
            tupe's kernels of that kind), else the `tupe_` name (docs/model.md "Attention kernels").
        attention_kernel: the same setting under its older name (config.json files saved before
            `attn_implementation` carry it, older ones `fold_positional`, which is ignored: "auto" folds where it
            can); `attn_implementation` wins where both are given. `config.attention_kernel` reads the setting's
            registry name ("auto" where "auto" chose it) and sets the setting.
        rope_parameters: transformers' RoPE scaling (`{"rope_type": "yarn", "factor": 4.0, ...}`; the legacy
            `rope_scaling` is mapped onto it), for the `rope` scheme only (any other refuses it by name), applied
            through transformers' `ROPE_INIT_FUNCTIONS` (tupe/modeling/rope_scaling.py; docs/model.md "RoPE
            scaling"). Unset by default, and then not saved.
        **kwargs: the positional scheme's own fields, as it declares them (`PositionalScheme.config_fields`; a
            config holds its own scheme's fields only, with their defaults where not given; another registered
            scheme's field is dropped, so that config.json files that carry every scheme's fields, as they were
            once saved, load unchanged; one given a value other than its default is dropped with a warning naming
            the schemes that read it), then `PretrainedConfig`'s arguments. The built-in schemes':
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
        attention_kernel: str | None = None,
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
        request, what = kwargs.pop("attn_implementation", None), "attn_implementation"
        if request is None and attention_kernel is not None:
            request, what = attention_kernel, "attention_kernel"
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
        kwargs["attn_implementation"] = setting(checked_request(request, position_scheme, what))
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
        # the scheme's own fields are taken above: what is left in kwargs is another scheme's
        for name, field in scheme_fields().items():
            if name not in kwargs:
                continue
            value = kwargs.pop(name)
            if self._resolved(field, value) != self._resolved(field, field.default):
                # a setting this scheme never reads, given a value (not the default old config.json files carry)
                readers = ", ".join(s for s, c in SCHEMES.items() if field in c.config_fields)
                logger.warning(
                    f"{name}={value!r} is a setting of {readers}; position_scheme {self.position_scheme!r} does "
                    "not read it, so it is dropped"
                )
        scheme.check_config(self)

    def _resolved(self, field, value):  # noqa: ANN001, ANN202
        """`value` of a scheme's field as that scheme would hold it in this config (deberta's -1 -> the length)."""
        try:
            return value if field.resolve is None else field.resolve(value, self)
        except (TypeError, ValueError):  # a value the scheme could not hold: not its default either
            return value

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

    @property
    def _attn_implementation(self) -> str | None:
        """The one attention setting (transformers'): "auto" until a model resolves it, then `tupe_<kernel>`."""
        return self.__dict__.get("_attn_implementation_internal")

    @_attn_implementation.setter
    def _attn_implementation(self, value: str | dict | None) -> None:
        """Any request (attention_interface.py) as the setting's value, checked against the scheme at once; None
        (nothing asked) keeps the setting. Clears "auto"'s mark: a named kernel is kept as named."""
        if isinstance(value, dict):
            value = value.get("", None)
        if value is None:
            value = self._attn_implementation or AUTO
        scheme = self.__dict__.get("position_scheme")
        kernel = requested_kernel(value) if scheme is None else checked_request(value, scheme)
        self._attn_implementation_internal = setting(kernel)
        self._attn_auto = None

    @property
    def attention_kernel(self) -> str:
        """The setting by its older name: the registry name of its kernel, or "auto" where "auto" chose it (what
        `save_pretrained` writes). Setting it sets `_attn_implementation`."""
        if self.__dict__.get("_attn_auto") is not None:
            return AUTO
        return setting_kernel(self)

    @attention_kernel.setter
    def attention_kernel(self, value: str) -> None:
        self._attn_implementation = value

    @property
    def output_attentions(self) -> bool:
        return self._output_attentions

    @output_attentions.setter
    def output_attentions(self, value: bool) -> None:
        """Any kernel: a pass that asks for the probabilities runs the kernel that returns them, and says so once
        (transformers' own setter asks for "eager")."""
        self._output_attentions = value

    def validate_output_attentions(self) -> None:
        """Nothing to refuse: see `output_attentions`."""

    def to_dict(self) -> dict:
        """transformers' `to_dict`, with the setting as config.json keeps it: `attn_implementation`, "auto" where
        "auto" chose the kernel (it is chosen again where the model is loaded), else the kernel's `tupe_` name."""
        output = super().to_dict()
        output.pop("_attn_auto", None)
        auto = self.__dict__.get("_attn_auto") is not None
        output["attn_implementation"] = AUTO if auto else self._attn_implementation
        return output

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> TupeConfig | tuple[TupeConfig, dict]:
        """transformers' `from_dict` (what `from_pretrained` builds the config with), where a positional scheme's
        field given as a keyword (`from_pretrained(path, rope_theta=1e5)`) goes through the constructor as the
        file's own fields do: resolved and checked for the checkpoint's scheme, and dropped with a warning where
        that scheme does not read it. transformers would set it as a plain attribute, or hand one the config lacks
        to the model's `__init__`, which fails on it."""
        fields = scheme_fields()
        given = {name: kwargs.pop(name) for name in list(kwargs) if name in fields}
        return super().from_dict({**config_dict, **given}, **kwargs)

    def convert_rope_params_to_dict(self, **kwargs):
        """transformers' RoPE standardisation, which would give every config a default `rope_parameters`: tupe
        standardises them itself, for the rope scheme only (`_take_rope_parameters`)."""
        return kwargs

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
