"""GLUE as a task family of the fine-tuning pipeline (tupe/finetuning/pipeline/): the tasks as data, one reader
for TSV/CSV/JSON/parquet (`tasks.py`), the metrics, the paper's protocol, the encoding, the family, the `tupe glue`
command (`finetune.py`) and the Table-1 report (`report.py`, `tupe report`)."""
