"""Benchmarks: `tupe bench` (training step per scheme and backend vs transformers' BERT, attention-only mode)."""
