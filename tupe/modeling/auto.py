"""Registration with the `transformers` Auto classes; `tupe.modeling` calls it once its classes exist."""

from __future__ import annotations


def register_auto_classes() -> None:
    """`AutoConfig`/`AutoModel*` learn the "tupe" model type, and saved checkpoints carry an `auto_map` (with the
    modeling code) so users without `tupe` installed can load them with `trust_remote_code=True`."""
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    from tupe.data.fairseq_tokenizer import FairseqMosesBPETokenizer

    from .configuration_tupe import TupeConfig
    from .modeling_tupe import TupeForMaskedLM, TupeForSequenceClassification, TupeModel

    AutoConfig.register("tupe", TupeConfig, exist_ok=True)
    AutoModel.register(TupeConfig, TupeModel, exist_ok=True)
    AutoModelForMaskedLM.register(TupeConfig, TupeForMaskedLM, exist_ok=True)
    AutoModelForSequenceClassification.register(TupeConfig, TupeForSequenceClassification, exist_ok=True)

    TupeConfig.register_for_auto_class()
    TupeModel.register_for_auto_class("AutoModel")
    TupeForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")
    TupeForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

    # The released TUPE pipeline's tokenizer (`tupe convert fairseq`), a slow tokenizer: `AutoTokenizer` finds it by
    # the class name in tokenizer_config.json; saved folders carry its code for users without tupe.
    AutoTokenizer.register(TupeConfig, tokenizer_class=FairseqMosesBPETokenizer, exist_ok=True)
    FairseqMosesBPETokenizer.register_for_auto_class("AutoTokenizer")
