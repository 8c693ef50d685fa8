"""Fine-tuning, in one package: the pipeline `tupe glue` and `tupe finetune` share (`pipeline/`: the recipe, one
run on the Trainer, the lr x seed grid, the summary over seeds, results.json), GLUE as a task family of it with the
`tupe glue` and `tupe report` commands (`glue/`), and `tupe finetune` on users' own files with its task families
(named entities, question answering, multiple choice, sentence classification: the modules here). Imports go down
that list's reverse: the families use GLUE's and the pipeline's, GLUE uses the pipeline's, the pipeline neither."""
