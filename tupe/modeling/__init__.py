from .configuration_tupe import POSITION_SCHEMES, TupeConfig
from .modeling_tupe import (
    TupeForMaskedLM,
    TupeForMultipleChoice,
    TupeForQuestionAnswering,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeModel,
    TupePreTrainedModel,
)

__all__ = [
    "POSITION_SCHEMES",
    "TupeConfig",
    "TupeForMaskedLM",
    "TupeForMultipleChoice",
    "TupeForQuestionAnswering",
    "TupeForSequenceClassification",
    "TupeForTokenClassification",
    "TupeModel",
    "TupePreTrainedModel",
]

# importing this package registers the model with the `transformers` Auto classes (`import tupe` arranges for
# it to be imported as soon as `transformers` is)
from .auto import register_auto_classes  # noqa: E402

register_auto_classes()
