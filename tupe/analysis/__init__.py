"""Analysis of positional encodings: the paper's Fig. 2 (four-term split of the first layer's logits) and
Fig. 6 (content-free attention patterns per head). `tupe analyze` is the command; see docs/analysis.md.

The names below are imported on first use (they need torch), so `tupe plot` and `tupe analyze --help` start fast."""

from __future__ import annotations

import importlib
from typing import Any

_ATTRIBUTES = {
    "TERMS": "decomposition",
    "Decomposition": "decomposition",
    "decompose": "decomposition",
    "first_layer_terms": "decomposition",
    "PATTERNS": "patterns",
    "HeadPattern": "patterns",
    "PatternThresholds": "patterns",
    "head_patterns": "patterns",
    "label_pattern": "patterns",
    "offset_profile": "patterns",
}

__all__ = sorted(_ATTRIBUTES)


def __getattr__(name: str) -> Any:
    if name not in _ATTRIBUTES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_ATTRIBUTES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
