"""`tupe finetune`: fine-tuning on users' own files (named entities, question answering, multiple choice, sentence
classification) with the grid machinery `tupe glue` uses (tupe/training/finetuning.py)."""
