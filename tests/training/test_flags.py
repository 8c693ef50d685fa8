"""One flag vocabulary (tupe/training/flags.py): the same names in every command, old spellings as hidden aliases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tupe.cli import build_parser, main
from tupe.training.flags import FLAGS, LR_SCHEDULERS


def _parse(command: str, *argv: str):  # noqa: ANN202
    return build_parser(command).parse_args([command, *argv])


def test_scheduler_names_are_the_trainers() -> None:
    from transformers.trainer_utils import SchedulerType

    assert set(LR_SCHEDULERS) <= {s.value for s in SchedulerType}


@pytest.mark.parametrize("command", ["pretrain", "compare", "glue", "finetune"])
def test_every_command_spells_a_setting_the_same_way(command: str) -> None:
    """Each shared flag a command has is the vocabulary's spelling; no command offers another name for it."""
    help_text = build_parser(command)._subparsers._group_actions[0].choices[command].format_help()
    for flag in FLAGS.values():
        for alias in flag.aliases:
            assert f" {alias} " not in help_text and f"{alias}," not in help_text  # hidden
    spellings = (
        "--max-grad-norm",
        "--adam-epsilon",
        "--adam-beta1",
        "--precision",
        "--max-seq-len",
        "--epochs",
    )
    spellings += (
        "--warmup-ratio",
        "--warmup-steps",
        "--lr-scheduler",
        "--gradient-checkpointing",
        "--torch-compile",
    )
    for spelled in spellings:
        assert spelled in help_text, (command, spelled)


def test_old_spellings_still_work_in_pretrain() -> None:
    new = _parse("pretrain", "--out", "o", "--max-seq-len", "64", "--max-grad-norm", "0.5", "--adam-epsilon",
                 "1e-8", "--adam-beta1", "0.8", "--adam-beta2", "0.98", "--precision", "bf16")  # fmt: skip
    old = _parse("pretrain", "--out", "o", "--max-length", "64", "--clip", "0.5", "--adam-eps", "1e-8",
                 "--adam-betas", "0.8,0.98", "--bf16")  # fmt: skip
    for key in ("max_length", "max_grad_norm", "adam_epsilon", "adam_beta1", "adam_beta2", "precision"):
        assert getattr(new, key) == getattr(old, key), key
    assert (new.max_length, new.adam_beta2, new.precision) == (64, 0.98, "bf16")


def test_glue_reads_the_shared_flags_into_its_settings() -> None:
    import torch

    from tupe.errors import TupeError
    from tupe.finetuning.glue.finetune import settings_from_args

    a = _parse("glue", "--model", "m", "--task", "RTE", "--out", "o", "--max-grad-norm", "0.5", "--adam-epsilon",
               "1e-8", "--adam-beta1", "0.8", "--adam-beta2", "0.98", "--lr-scheduler", "cosine", "--max-length",
               "64")  # fmt: skip
    s = settings_from_args(a)
    assert (s.max_grad_norm, s.adam_epsilon, s.adam_beta1, s.adam_beta2) == (0.5, 1e-8, 0.8, 0.98)
    assert (s.fp16, s.bf16, s.lr_scheduler, s.max_seq_len) == (False, False, "cosine", 64)  # fp32 by default
    old = _parse("glue", "--model", "m", "--task", "RTE", "--out", "o", "--clip", "0.5", "--adam-eps", "1e-8",
                 "--adam-betas", "0.8,0.98", "--fp16")  # fmt: skip
    assert (old.max_grad_norm, old.adam_epsilon, old.adam_beta2, old.precision) == (0.5, 1e-8, 0.98, "fp16")
    if not torch.cuda.is_available():
        with pytest.raises(TupeError, match="--precision fp16 needs a GPU here"):
            settings_from_args(old)


def test_batch_size_is_the_global_batch_everywhere() -> None:
    for command in ("pretrain", "compare", "glue", "finetune"):
        help_text = build_parser(command)._subparsers._group_actions[0].choices[command].format_help()
        assert "global batch: sequences per optimizer step" in " ".join(help_text.split()), command


def test_unknown_flag_names_the_subcommands_help(capsys) -> None:  # noqa: ANN001
    assert main(["pretrain", "--out", "o", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert "--no-such-flag" in err and "see `tupe pretrain --help`" in err


def test_epochs_and_steps_or_both_warmups_are_refused() -> None:
    from tupe.errors import TupeError
    from tupe.training.arguments import PretrainConfig

    with pytest.raises(TupeError, match="--epochs and --max-steps say the same thing: give one"):
        PretrainConfig(out="o", epochs=2, max_steps=10).resolve()
    with pytest.raises(TupeError, match="--warmup-ratio and --warmup-steps say the same thing: give one"):
        PretrainConfig(out="o", warmup_ratio=0.1, warmup_steps=10).resolve()
    run = PretrainConfig(out="o", epochs=2, warmup_ratio=0.25, batch_size=8).resolve().for_data(40)
    # 2 x 40 blocks / 8 per step; 0.25 x 10 rounded
    assert (run.optim.max_steps, run.optim.warmup_steps) == (10, 2)


def test_pretrain_in_epochs_with_a_cosine_schedule_and_gradient_checkpointing(
    tiny_run, tmp_path: Path
) -> None:  # noqa: ANN001
    from tupe.training.pretrain import pretrain

    cfg = tiny_run(tmp_path / "r", max_steps=None, epochs=0.5, warmup_steps=None, warmup_ratio=0.5,
                   lr_scheduler="cosine", eval_steps=100, save_steps=100, gradient_checkpointing=True)  # fmt: skip
    summary = pretrain(cfg)
    blocks = summary["train_blocks"]
    assert summary["steps"] == math.ceil(0.5 * blocks / 8)
    recs = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines() if "loss" in x]
    lrs = [r["lr"] for r in recs if "loss" in r]
    assert max(lrs) <= 2e-3 and lrs[-1] < max(lrs)  # warmed up, then decayed
    assert json.loads((tmp_path / "r" / "tupe_run.json").read_text())["optim"]["lr_scheduler"] == "cosine"
    assert not list((tmp_path / "r").glob(".lock*"))  # a finished run leaves no lock files


@pytest.mark.parametrize(
    ("command", "argv"),
    [("evaluate", ["--model", "m", "--text", "t"]), ("analyze", ["--model", "m", "--out", "o"])],
)
def test_evaluate_and_analyze_say_max_seq_len_and_keep_max_length_hidden(
    command: str, argv: list[str]
) -> None:
    help_text = build_parser(command)._subparsers._group_actions[0].choices[command].format_help()
    assert "--max-seq-len" in help_text and "--max-length" not in help_text
    assert _parse(command, *argv, "--max-seq-len", "48").max_length == 48
    assert _parse(command, *argv, "--max-length", "48").max_length == 48


def test_compare_reads_epochs_as_the_steps_pretrain_would_train(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    from tupe.comparison.compare import _epochs_as_steps
    from tupe.training.arguments import config_from_args

    args = _parse("compare", "--schemes", "bert-a,tupe-a", "--out", "o", "--epochs", "0.3")
    assert config_from_args(args).epochs == 0.3
    lines: list[str] = []
    base = _epochs_as_steps(tiny_run(tmp_path / "c", max_steps=None, epochs=0.3), lines.append)
    blocks = int(lines[0].split("(")[1].split()[0])
    assert (base.epochs, base.max_steps) == (None, math.ceil(0.3 * blocks / 8)) and blocks > 0
    assert base.resolve().optim.max_steps == base.max_steps


@pytest.mark.slow
def test_compare_in_epochs_trains_every_run_the_steps_pretrain_would(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    from tupe.comparison.compare import compare

    base = tiny_run(tmp_path / "c", max_steps=None, epochs=0.3, eval_steps=100, save_steps=100)
    lines: list[str] = []
    compare(base, ["bert-a", "nope"], log=lines.append)
    blocks = json.loads((tmp_path / "c" / "bert-a" / "pretrain_summary.json").read_text())["train_blocks"]
    steps = math.ceil(0.3 * blocks / 8)  # as `tupe pretrain --epochs 0.3` counts them
    for scheme in ("bert-a", "nope"):
        assert json.loads((tmp_path / "c" / scheme / "pretrain_summary.json").read_text())["steps"] == steps
    assert json.loads((tmp_path / "c" / "compare_run.json").read_text())["max_steps"] == steps
    assert f"--epochs 0.3: {steps} steps per run ({blocks} training blocks)" in lines


@pytest.mark.parametrize(
    ("flag", "key"),
    [("--valid-every", "valid_every"), ("--vocab-size", "vocab_size"), ("--max-seq-len", "max_length"),
     ("--batch-size", "batch_size"), ("--warmup-steps", "warmup_steps")],
)  # fmt: skip
def test_per_preset_help_gives_each_presets_default(flag: str, key: str) -> None:
    """Issue 38: the help said "default 200" where the mini preset holds out 1 block in 50. Each per-preset default
    in `tupe pretrain --help` reads "preset: VALUE NAME/NAME, ...", and every preset's value is the one it holds."""
    import argparse
    import re

    from tupe.training.arguments import add_pretrain_arguments
    from tupe.training.presets import PRESETS, get_preset

    p = argparse.ArgumentParser()
    add_pretrain_arguments(p)
    (action,) = [a for a in p._actions if flag in a.option_strings]
    listed = re.search(r"preset: ([^)]*)\)", action.help)
    assert listed, action.help
    shown = {}
    for group in listed[1].split(", "):
        value, names = group.split(" ")
        shown.update({name: int(value.replace(",", "")) for name in names.split("/")})
    assert shown == {name: get_preset(name)[key] for name in PRESETS}
    if key == "valid_every":
        assert shown["mini"] == 50
