"""Pre-training of one scheme: its configuration and presets, the run folder, the Trainer and checkpoints.

Python API: `from tupe.training.pretrain import PretrainConfig, pretrain`; several schemes on identical data are
`tupe.comparison`.
"""

from tupe.training.presets import PRESETS, get_preset

__all__ = ["PRESETS", "get_preset"]
