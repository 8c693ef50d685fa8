from .configuration_tupe import POSITION_SCHEMES, TupeConfig
from .kernel_registry import (
    ATTENTION_KERNELS,
    AttentionKernel,
    register_attention_kernel,
    unregister_attention_kernel,
)
from .modeling_tupe import (
    TupeForMaskedLM,
    TupeForMultipleChoice,
    TupeForQuestionAnswering,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeModel,
    TupePreTrainedModel,
    resolve_attention_kernel,
)

__all__ = [
    "ATTENTION_KERNELS",
    "AttentionKernel",
    "POSITION_SCHEMES",
    "TupeConfig",
    "TupeForMaskedLM",
    "TupeForMultipleChoice",
    "TupeForQuestionAnswering",
    "TupeForSequenceClassification",
    "TupeForTokenClassification",
    "TupeModel",
    "TupePreTrainedModel",
    "register_attention_kernel",
    "resolve_attention_kernel",
    "unregister_attention_kernel",
]

# importing this package registers the model with the `transformers` Auto classes (`import tupe` arranges for
# it to be imported as soon as `transformers` is)
from .auto import register_auto_classes  # noqa: E402

register_auto_classes()
