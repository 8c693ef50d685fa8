from .configuration_tupe import POSITION_SCHEMES, TupeConfig
from .kernels import ATTENTION_KERNELS, AttentionKernel, register_attention_kernel, unregister_attention_kernel
from .modeling_tupe import (
    TupeForMaskedLM,
    TupeForSequenceClassification,
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
    "TupeForSequenceClassification",
    "TupeModel",
    "TupePreTrainedModel",
    "register_attention_kernel",
    "resolve_attention_kernel",
    "unregister_attention_kernel",
]

# `import tupe` registers the Auto classes; when this package is imported first, it does so here, once its
# classes exist (see tupe._register)
from tupe import _register  # noqa: E402

_register(from_modeling=True)
