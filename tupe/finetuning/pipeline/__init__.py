"""The one fine-tuning pipeline of `tupe glue` and `tupe finetune` (no command of its own): a task family
(`family.py` `TaskFamily`: GLUE's tasks, or a `tupe finetune` family) brings its data, head and metrics; everything
else is here, once, one job per module, bottom up:

- `settings.py`: the recipe (`GridSettings`) and the flags both commands share;
- `family.py`: what a task family provides (`TaskFamily`);
- `results.py`: the summary over seeds (`summarize_grid`: mean or median) and the records (`RunResult`,
  `GridResults`: results.json, read by `tupe report`);
- `batches.py`: how examples become a batch (`data_collator`: padding-free `FlattenedBatches` or padded);
- `trainer.py`: one run's Trainer, its arguments and what it keeps;
- `grid.py`: the lr x seed grid in its folder, its fingerprint and resume (`plan_grid`, `train_grid`);
- `run.py`: one run (`train_run`) and the whole pipeline (`run_finetuning`);
- `folder.py`: the grid's folder under the command's lock, and SIGTERM (`grid_folder`, `stop_on_sigterm`).

A grid lives in one folder: each finished run writes `runs/lr<LR>_seed<S>/result.json` atomically and last, with
the fingerprint of everything that determines its score (settings, model weights, data), so the same command
started again skips the runs that finished and refuses a folder made with other settings.
"""
