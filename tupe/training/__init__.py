"""Pre-training (one scheme), comparisons of several schemes on identical data, and the CPU demo."""

from tupe.training.presets import PRESETS, get_preset
from tupe.training.pretrain import PretrainConfig, pretrain

__all__ = ["PRESETS", "PretrainConfig", "get_preset", "pretrain"]
