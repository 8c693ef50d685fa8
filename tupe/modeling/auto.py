"""Registration with the `transformers` Auto classes; `tupe.modeling` calls it once its classes exist."""

from __future__ import annotations


def register_auto_classes() -> None:
    """`AutoConfig`/`AutoModel*` learn the "tupe" model type, and saved checkpoints carry an `auto_map` (with the
    modeling code) so users without `tupe` installed can load them with `trust_remote_code=True`."""
    import transformers

    from tupe.modeling.tokenization_fairseq import FairseqMosesBPETokenizer

    from . import modeling_tupe
    from .configuration_tupe import TupeConfig

    transformers.AutoConfig.register("tupe", TupeConfig, exist_ok=True)
    TupeConfig.register_for_auto_class()
    for auto_name, class_name in modeling_tupe.AUTO_CLASSES.items():
        model_class = getattr(modeling_tupe, class_name)
        getattr(transformers, auto_name).register(TupeConfig, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_name)

    # The released TUPE pipeline's tokenizer (`tupe convert fairseq`), a slow tokenizer: `AutoTokenizer` finds it by
    # the class name in tokenizer_config.json; saved folders carry its code for users without tupe.
    transformers.AutoTokenizer.register(TupeConfig, tokenizer_class=FairseqMosesBPETokenizer, exist_ok=True)
    FairseqMosesBPETokenizer.register_for_auto_class("AutoTokenizer")
