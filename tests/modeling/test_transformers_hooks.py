"""What the model relies on in the installed `transformers` (docs/architecture.md, "The model's transformers
hooks"): the public hook that sets the one kernel setting, the `AttentionInterface` its kernels are registered
with, and the one private attribute it still touches (`_weight_conversions`). When an upgrade changes one of them,
this fails and names it; and it fails when a tupe model class overrides a private transformers method not listed."""

from __future__ import annotations

import inspect

import pytest
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import tupe
from tupe.modeling import modeling_tupe

# private names of transformers' PreTrainedModel / PretrainedConfig a tupe class defines, and why (the table in
# docs/architecture.md): declarative class attributes transformers documents for model authors, `_init_weights`
# (its documented override point), the config's `_attn_implementation` property (the one setting's normalising
# setter) and the LM head's `_resize_token_embeddings` (the output bias follows the resized embeddings)
ALLOWED = {
    "_supports_sdpa", "_no_split_modules", "_tied_weights_keys", "_auto_class", "_init_weights",
    "_load_from_state_dict", "_resize_token_embeddings", "_attn_implementation",
}  # fmt: skip
CLASSES = [
    tupe.TupeModel, tupe.TupeForMaskedLM, tupe.TupeForSequenceClassification, tupe.TupeForTokenClassification,
    tupe.TupeForQuestionAnswering, tupe.TupeForMultipleChoice, tupe.TupeConfig,
]  # fmt: skip


def test_the_public_attention_hook_is_where_transformers_asks():
    """`get_correct_attn_implementation(requested_attention, is_init_check)` is what `__init__`, `from_pretrained`
    and `set_attn_implementation` reach through `_check_and_adjust_attn_implementation` for a name that is not a
    Hub kernel (tupe's config setter refuses those before)."""
    params = list(inspect.signature(PreTrainedModel.get_correct_attn_implementation).parameters)
    assert params == ["self", "requested_attention", "is_init_check"], params
    source = inspect.getsource(PreTrainedModel._check_and_adjust_attn_implementation)
    assert "self.get_correct_attn_implementation(" in source
    assert "self._check_and_adjust_attn_implementation(" in inspect.getsource(PreTrainedModel.__init__)
    assert "self._check_and_adjust_attn_implementation(" in inspect.getsource(
        PreTrainedModel.set_attn_implementation
    )
    # transformers lets set_attn_implementation change a model whose attention layers read the interface
    assert tupe.TupeForMaskedLM._can_set_attn_implementation()
    assert "ALL_ATTENTION_FUNCTIONS.get_interface(" in inspect.getsource(modeling_tupe)


def test_the_kernels_are_in_transformers_attention_interface():
    assert hasattr(AttentionInterface, "register")
    for kernel in ("eager", "sdpa", "fold", "fused", "flex"):
        assert f"tupe_{kernel}" in ALL_ATTENTION_FUNCTIONS.valid_keys()
        assert ALL_ATTENTION_FUNCTIONS.get_interface(f"tupe_{kernel}", None).__name__ == f"tupe_{kernel}"
    assert "_attn_implementation" in vars(PretrainedConfig)  # the property TupeConfig's own replaces


def test_the_weight_conversions_tupe_filters_are_still_kept_on_the_model():
    """`from_pretrained` drops tupe's legacy-key renamings from `model._weight_conversions` (private: transformers
    would otherwise save a model loaded from an old layout back in that layout); each renaming keeps its
    patterns in `_original_source_patterns`."""
    from transformers import core_model_loading

    assert "model._weight_conversions = " in inspect.getsource(core_model_loading)
    assert "_original_source_patterns" in inspect.getsource(core_model_loading.WeightTransform)
    assert "_weight_conversions" in inspect.getsource(modeling_tupe.TupePreTrainedModel.from_pretrained)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_no_private_transformers_method_is_overridden_beyond_the_list(cls):
    base = PretrainedConfig if issubclass(cls, PretrainedConfig) else PreTrainedModel
    private = {
        name
        for klass in cls.__mro__
        if klass.__module__.startswith("tupe.")
        for name in vars(klass)
        if name.startswith("_") and not name.startswith("__") and hasattr(base, name)
    }
    assert private <= ALLOWED, (
        f"{cls.__name__} overrides {sorted(private - ALLOWED)}: list it in docs/architecture.md"
    )
