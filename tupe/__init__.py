"""tupe: TUPE (Transformer with Untied Positional Encoding) and the positional encodings it replaces, as one
`transformers`-compatible model family.

`import tupe` registers the model with the `transformers` Auto classes, so `AutoModelForMaskedLM.from_pretrained`
loads a saved TUPE checkpoint without `trust_remote_code`, and `pipeline("question-answering")` (which
transformers 5 removed) for extractive QA checkpoints.

The package itself is light: the model classes (and torch, transformers) are imported on first use, so the
`tupe` command line starts fast. The registration happens as soon as `transformers` is imported in the process
(at once if it already is, else when it gets imported) or a model class is first used, whichever comes first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

# The public API, listed once: name -> the module that defines it (imported on first use).
_PUBLIC = {
    "FlattenedBatches": "tupe.finetuning.pipeline.batches",
    "POSITION_SCHEMES": "tupe.modeling",
    "TupeConfig": "tupe.modeling",
    "TupeForMaskedLM": "tupe.modeling",
    "TupeForMultipleChoice": "tupe.modeling",
    "TupeForQuestionAnswering": "tupe.modeling",
    "TupeForSequenceClassification": "tupe.modeling",
    "TupeForTokenClassification": "tupe.modeling",
    "TupeModel": "tupe.modeling",
    "TupePreTrainedModel": "tupe.modeling",
    "keep_large_blocks": "tupe.runtime",
    "tune_cpu_allocator": "tupe.runtime",
}

__all__ = sorted([*_PUBLIC, "__version__"])


def _register() -> None:
    """Register the model with the `transformers` Auto classes: importing `tupe.modeling` does it (once; it
    imports torch and transformers). While `tupe.modeling` is being imported (its configuration imports
    transformers, which fires the import hook) there is nothing to do: it registers when its classes exist."""
    modeling = sys.modules.get(f"{__name__}.modeling")
    if getattr(getattr(modeling, "__spec__", None), "_initializing", False):
        return
    importlib.import_module(f"{__name__}.modeling")


def _register_pipelines() -> None:
    """tupe's pipelines (tupe/pipelines.py registers them where it defines them), once transformers' pipelines
    module exists: registering needs it, and importing it for every `import tupe` would slow start-up. While
    `tupe.pipelines` is being imported (it imports transformers' pipelines, which fires the hook) there is
    nothing to do: it registers at its end."""
    pipelines = sys.modules.get(f"{__name__}.pipelines")
    if getattr(getattr(pipelines, "__spec__", None), "_initializing", False):
        return
    importlib.import_module(f"{__name__}.pipelines").register_pipelines()


class _AfterImport(importlib.abc.MetaPathFinder):
    """One-shot import hook: once the module `fullname` has been executed, call `then`.

    Python has no public "after this module is imported" event, and `transformers` has no plugin entry point; this
    finder is the only way to register when `transformers` is imported after `import tupe` without importing torch
    and transformers at `import tupe` (docs/architecture.md, "Registration with transformers", has the measured
    cost). It wraps the `exec_module` of the spec made for that one import and takes the wrapper off as soon as it
    has run: nothing of transformers stays changed, and the finder leaves `sys.meta_path` on its first match."""

    def __init__(self, fullname: str, then: Any) -> None:
        self.fullname, self.then = fullname, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.fullname:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the remaining finders
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        then = self.then

        def exec_then(module: Any) -> None:
            del spec.loader.exec_module  # the loader's own method again
            exec_module(module)
            then()

        spec.loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from .runtime import tupe_version

        value = tupe_version()
    elif name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


for _module, _then in (("transformers", _register), ("transformers.pipelines", _register_pipelines)):
    if _module in sys.modules:
        _then()
    elif not any(isinstance(f, _AfterImport) and f.fullname == _module for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_module, _then))
