from .configuration_tupe import POSITION_SCHEMES, TupeConfig
from .modeling_tupe import TupeForMaskedLM, TupeForSequenceClassification, TupeModel, TupePreTrainedModel

__all__ = [
    "POSITION_SCHEMES",
    "TupeConfig",
    "TupeForMaskedLM",
    "TupeForSequenceClassification",
    "TupeModel",
    "TupePreTrainedModel",
]
