"""`tupe evaluate`: masked-LM loss, perplexity and pseudo-perplexity of checkpoints on text (docs/evaluation.md)."""

# `--extend-positions` (tupe.evaluation.lengths does the work; here so `tupe evaluate --help` needs no torch)
TABLE_METHODS = ("interpolate", "repeat")  # a learned absolute table
ROTARY_METHODS = ("pi", "ntk", "yarn")  # rotary positions (rope)
EXTEND_METHODS = ("none", *TABLE_METHODS, *ROTARY_METHODS)
