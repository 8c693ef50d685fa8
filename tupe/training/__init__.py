"""Pre-training (one scheme), comparisons of several schemes on identical data, and the CPU demo.

Python API: `from tupe.training.pretrain import PretrainConfig, pretrain` and
`from tupe.training.compare import compare`.
"""

from tupe.training.presets import PRESETS, get_preset

__all__ = ["PRESETS", "get_preset"]
