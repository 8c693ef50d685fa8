"""`tupe evaluate`: masked-LM loss, perplexity and pseudo-perplexity of checkpoints on text (docs/evaluation.md)."""
