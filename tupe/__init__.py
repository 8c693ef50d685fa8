"""tupe: TUPE (Transformer with Untied Positional Encoding) and the positional encodings it replaces, as one
`transformers`-compatible model family.

`import tupe` registers the model with the `transformers` Auto classes, so `AutoModelForMaskedLM.from_pretrained`
loads a saved TUPE checkpoint without `trust_remote_code`.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

from .modeling import (
    POSITION_SCHEMES,
    TupeConfig,
    TupeForMaskedLM,
    TupeForSequenceClassification,
    TupeModel,
    TupePreTrainedModel,
)

__version__ = "0.1.0"

AutoConfig.register("tupe", TupeConfig, exist_ok=True)
AutoModel.register(TupeConfig, TupeModel, exist_ok=True)
AutoModelForMaskedLM.register(TupeConfig, TupeForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(TupeConfig, TupeForSequenceClassification, exist_ok=True)

# Saved checkpoints carry the modeling code and an `auto_map`, so users without `tupe` installed can load them
# with `trust_remote_code=True`.
TupeConfig.register_for_auto_class()
TupeModel.register_for_auto_class("AutoModel")
TupeForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")
TupeForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = [
    "POSITION_SCHEMES",
    "TupeConfig",
    "TupeForMaskedLM",
    "TupeForSequenceClassification",
    "TupeModel",
    "TupePreTrainedModel",
    "__version__",
]
