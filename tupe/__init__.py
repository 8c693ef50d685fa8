"""tupe: TUPE (Transformer with Untied Positional Encoding) and the positional encodings it replaces, as one
`transformers`-compatible model family.

`import tupe` registers the model with the `transformers` Auto classes, so `AutoModelForMaskedLM.from_pretrained`
loads a saved TUPE checkpoint without `trust_remote_code`.

The package itself is light: the model classes (and torch, transformers) are imported on first use, so the
`tupe` command line starts fast. The registration happens as soon as `transformers` is imported in the process
(at once if it already is, else when it gets imported) or a model class is first used, whichever comes first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

# name -> submodule of tupe.modeling that defines it
_MODEL_ATTRIBUTES = {
    "POSITION_SCHEMES": "configuration_tupe",
    "TupeConfig": "configuration_tupe",
    "TupeForMaskedLM": "modeling_tupe",
    "TupeForSequenceClassification": "modeling_tupe",
    "TupeModel": "modeling_tupe",
    "TupePreTrainedModel": "modeling_tupe",
}

__all__ = [
    "POSITION_SCHEMES",
    "TupeConfig",
    "TupeForMaskedLM",
    "TupeForSequenceClassification",
    "TupeModel",
    "TupePreTrainedModel",
    "__version__",
    "tune_cpu_allocator",
]

_registered = False


def _version() -> str:
    """The installed distribution's version (package metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tupe")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that was never installed
        return "0+unknown"


def _register(from_modeling: bool = False) -> None:
    """Register the model with the `transformers` Auto classes (once; imports torch and transformers).

    While `tupe.modeling` is being imported (its configuration imports transformers, which fires the import
    hook) registration waits: `tupe.modeling` calls this with `from_modeling=True` once its classes exist."""
    global _registered
    if _registered:
        return
    modeling = sys.modules.get(f"{__name__}.modeling")
    if not from_modeling and getattr(getattr(modeling, "__spec__", None), "_initializing", False):
        return
    _registered = True  # first: importing transformers below must not re-enter through the import hook
    try:
        _register_auto_classes()
    except BaseException:
        _registered = False
        raise


def _register_auto_classes() -> None:
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
    )

    from .modeling import TupeConfig, TupeForMaskedLM, TupeForSequenceClassification, TupeModel

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

    # The released TUPE pipeline's tokenizer (`tupe convert fairseq`): a slow tokenizer found by its class name.
    from transformers import AutoTokenizer

    from .data.fairseq_tokenizer import FairseqMosesBPETokenizer

    AutoTokenizer.register(TupeConfig, tokenizer_class=FairseqMosesBPETokenizer, exist_ok=True)
    FairseqMosesBPETokenizer.register_for_auto_class("AutoTokenizer")


class _RegisterWhenTransformersLoads(importlib.abc.MetaPathFinder):
    """One-shot import hook: once the `transformers` package has been executed, register the Auto classes."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "transformers":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the remaining finders
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module: Any) -> None:
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = _version()
    elif name == "tune_cpu_allocator":
        from .runtime import tune_cpu_allocator as value
    elif name in _MODEL_ATTRIBUTES:
        _register()
        module = importlib.import_module(f".modeling.{_MODEL_ATTRIBUTES[name]}", __name__)
        value = getattr(module, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if "transformers" in sys.modules:
    _register()
elif not any(isinstance(f, _RegisterWhenTransformersLoads) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenTransformersLoads())
