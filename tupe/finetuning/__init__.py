"""`tupe finetune`: fine-tuning on users' own files (named entities, question answering, multiple choice, sentence
classification) on the fine-tuning pipeline `tupe glue` runs on (tupe/training/finetuning.py)."""
