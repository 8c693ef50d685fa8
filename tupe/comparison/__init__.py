"""Several pre-training runs compared on identical data: `tupe compare` (`compare.py`), the paired bootstrap of
their final models (`paired.py`) and `tupe demo` (`demo.py`). Above `tupe.analysis` and `tupe.evaluation`, whose
curves, baselines and bootstrap it uses.

Python API: `from tupe.comparison.compare import compare`.
"""
