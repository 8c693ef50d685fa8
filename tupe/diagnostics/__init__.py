"""Positional diagnostics (`tupe diagnose`): synthetic tasks only positions can answer, trained and tested per
scheme (tasks.py: the tasks; run.py: one job, trained, scored and probed; report.py: over seeds; command.py)."""
