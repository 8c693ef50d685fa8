"""Analysis of positional encodings: the paper's Fig. 2 (four-term split of the first layer's logits) and
Fig. 6 (content-free attention patterns per head). `tupe analyze` is the command; see docs/analysis.md."""

from .decomposition import TERMS, Decomposition, decompose, first_layer_terms
from .patterns import PATTERNS, HeadPattern, PatternThresholds, head_patterns, label_pattern, offset_profile

__all__ = [
    "PATTERNS",
    "TERMS",
    "Decomposition",
    "HeadPattern",
    "PatternThresholds",
    "decompose",
    "first_layer_terms",
    "head_patterns",
    "label_pattern",
    "offset_profile",
]
