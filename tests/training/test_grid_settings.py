"""The recipe `tupe glue` and `tupe finetune` share (tupe/finetuning/pipeline/settings.py `GridSettings`): the
fingerprints of finished runs stay as they were written, and the shared flags reach the Trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tupe.cli import build_parser
from tupe.errors import TupeError

# The fingerprints of default settings, as result.json files written before the commands shared one settings
# class hold them (byte for byte): a finished run is reused only if they stay the same.
GLUE_RTE = (
    '{"task": "RTE", "epochs": 3.0, "batch_size": 32, "max_seq_len": 512, "warmup_ratio": 0.06, "weight_decay": '
    '0.01, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-06, "max_grad_norm": 1.0, "lr_scheduler": '
    '"linear", "dropout": 0.1, "max_train_samples": null, "max_eval_samples": null, "fp16": false, "bf16": false}'
)
FINETUNE_QA = (
    '{"task": "qa", "epochs": 3.0, "batch_size": 32, "max_seq_len": 384, "warmup_ratio": 0.06, "weight_decay": '
    '0.01, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-06, "max_grad_norm": 1.0, "lr_scheduler": '
    '"linear", "dropout": 0.1, "early_stopping": null, "doc_stride": 96, "max_answer_length": 30, "n_best": 20, '
    '"version_2_with_negative": false, "max_train_samples": null, "max_eval_samples": null, "fp16": false, '
    '"bf16": false}'
)


def _glue(*argv: str):  # noqa: ANN202
    from tupe.finetuning.glue.finetune import settings_from_args
    from tupe.finetuning.glue.tasks import get_task

    args = build_parser("glue").parse_args(["glue", "--model", "m", "--task", "RTE", "--out", "o", *argv])
    return settings_from_args(args).resolved(get_task("RTE"), 512, hidden_size=128)


def _finetune(*argv: str):  # noqa: ANN202
    from tupe.finetuning.arguments import settings_from

    args = build_parser("finetune").parse_args(
        ["finetune", "--task", "qa", "--model", "m", "--train", "t", "--validation", "v", "--out", "o", *argv]
    )
    return settings_from(args).resolved(512, 768)


def test_fingerprints_of_finished_runs_are_unchanged() -> None:
    assert json.dumps(_glue().fingerprint_fields()) == GLUE_RTE
    assert json.dumps(_finetune().fingerprint_fields()) == FINETUNE_QA
    # how a run computes is not what it learns: the same fingerprint
    assert json.dumps(_glue("--gradient-checkpointing", "--torch-compile").fingerprint_fields()) == GLUE_RTE
    # a warm-up in steps is another recipe: another fingerprint
    steps = _glue("--warmup-steps", "7").fingerprint_fields()
    assert (steps["warmup_steps"], steps["warmup_ratio"]) == (7, None)
    # issue 38's step flags: accumulation and logging change how, not what (same fingerprint, finetune too)
    how = ("--grad-accum", "2", "--logging-steps", "3", "--eval-steps", "5", "--report-to", "none")
    assert json.dumps(_glue(*how).fingerprint_fields()) == GLUE_RTE
    assert json.dumps(_finetune(*how).fingerprint_fields()) == FINETUNE_QA
    # ... while --max-steps and --label-all-tokens change what a run learns
    assert _glue("--max-steps", "9").fingerprint_fields()["max_steps"] == 9
    assert _finetune("--label-all-tokens").fingerprint_fields()["label_all_tokens"] is True


def test_a_finished_run_of_the_old_layout_is_reused(tmp_path: Path) -> None:
    from tupe.finetuning.pipeline.grid import plan_grid
    from tupe.io.outputs import OutputFolder

    settings = _finetune()
    run = tmp_path / "runs" / "lr2e-05_seed1"
    run.mkdir(parents=True)
    fingerprint = f'{{"settings": {FINETUNE_QA}, "model_weights_sha256": "w", "data_sha256": "d"}}'
    (run / "result.json").write_text(f'{{"lr": 2e-05, "seed": 1, "fingerprint": {fingerprint}}}')
    grid = plan_grid(tmp_path, settings, 64, "w", "d", False, OutputFolder(tmp_path, "tupe finetune"))
    assert list(grid.done) == [(2e-05, 1)] and len(grid.runs) == 12  # 4 learning rates x 3 seeds
    assert "1 already done" in grid.describe(settings, 64)


@pytest.mark.parametrize("build", [_glue, _finetune])
def test_both_warmups_are_refused(build) -> None:  # noqa: ANN001
    with pytest.raises(TupeError, match="--warmup-ratio and --warmup-steps say the same thing: give one"):
        build("--warmup-ratio", "0.1", "--warmup-steps", "7")


@pytest.mark.parametrize("build", [_glue, _finetune])
def test_warmup_steps_reach_the_trainers_scheduler(build, tmp_path: Path) -> None:  # noqa: ANN001
    import torch
    from transformers import Trainer

    from tupe.finetuning.pipeline.trainer import finetune_training_arguments

    def warmup_factors(settings) -> list[float]:  # noqa: ANN001
        targs = finetune_training_arguments(settings, 1e-3, 1, tmp_path / "w", 64)
        trainer = Trainer(model=torch.nn.Linear(2, 2), args=targs)
        trainer.create_optimizer_and_scheduler(num_training_steps=100)
        return [trainer.lr_scheduler.lr_lambdas[0](step) for step in (6, 7)]

    # 7 steps up, then the decay
    assert warmup_factors(build("--warmup-steps", "7")) == [pytest.approx(6 / 7), 1.0]
    assert warmup_factors(build()) == [1.0, pytest.approx(93 / 94)]  # the default ratio: 0.06 x 100 = 6 steps


@pytest.mark.parametrize("build", [_glue, _finetune])
def test_gradient_checkpointing_and_torch_compile_reach_the_training_arguments(build, tmp_path: Path) -> None:  # noqa: ANN001
    from tupe.finetuning.pipeline.trainer import finetune_training_arguments

    on = finetune_training_arguments(
        build("--gradient-checkpointing", "--torch-compile"), 1e-3, 1, tmp_path / "w", 64
    )
    assert on.gradient_checkpointing is True and on.torch_compile is True
    off = finetune_training_arguments(build(), 1e-3, 1, tmp_path / "w", 64)
    assert off.gradient_checkpointing is False and off.torch_compile is False


def test_a_warmup_in_steps_is_named_as_a_protocol_difference() -> None:
    from dataclasses import asdict

    from tupe.finetuning.glue.report import protocol_differences

    settings = asdict(_glue("--warmup-steps", "7", "--epochs", "3"))
    differences = protocol_differences({"task": "RTE", "settings": settings})
    assert "warm-up 7 steps (paper 6% of the steps)" in differences
    assert not any(d.startswith("warmup_ratio") for d in differences)
    assert not any("warm-up" in d for d in protocol_differences({"task": "RTE", "settings": asdict(_glue())}))
