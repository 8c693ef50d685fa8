"""`tupe evaluate`: masked-LM loss, perplexity and pseudo-perplexity of checkpoints on text (docs/evaluation.md)."""

# `--extend-positions` (tupe.evaluation.lengths does the work; here so `tupe evaluate --help` needs no torch)
EXTEND_METHODS = ("none", "interpolate", "repeat")
