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

# `import tupe` registers the Auto classes; when this package is imported first, it does so here, once its
# classes exist (see tupe._register)
from tupe import _register  # noqa: E402

_register(from_modeling=True)
