"""Trainer-style reporting shared by `tupe pretrain`, `tupe compare` and `tupe glue`: `--report-to` (TensorBoard,
W&B, MLflow... as the Trainer's `report_to`), `--push-to-hub` / `--hub-model-id`, and where TensorBoard writes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def default_report_to() -> str:
    """ "tensorboard" where it is installed, else "none" (the Trainer's own choice of integrations otherwise)."""
    from transformers.integrations import is_tensorboard_available

    return "tensorboard" if is_tensorboard_available() else "none"


def parse_report_to(text: str | list[str] | None) -> list[str]:
    """`--report-to` as the Trainer's list: "tensorboard,wandb" -> ["tensorboard", "wandb"]; "none" -> []."""
    if text is None:
        text = default_report_to()
    items = text if isinstance(text, list) else [t.strip() for t in str(text).split(",")]
    items = [t for t in items if t]
    if not items or items == ["none"]:
        return []
    if "none" in items:
        raise ValueError(f"--report-to: 'none' cannot be combined with other integrations, got {text!r}")
    return items


def add_report_arguments(p: argparse.ArgumentParser | Any, hub: bool = True) -> None:
    """--report-to (and, for commands that save one model, --push-to-hub and --hub-model-id)."""
    p.add_argument(
        "--report-to",
        metavar="NAME[,NAME]",
        help="where the Trainer sends metrics, as its report_to: tensorboard, wandb, mlflow, all, none... "
        "(default: tensorboard where installed, else none)",
    )
    if hub:
        p.add_argument(
            "--push-to-hub",
            action="store_true",
            help="push the saved model to the Hugging Face Hub (the Trainer's push_to_hub; needs a login)",
        )
        p.add_argument(
            "--hub-model-id", help="Hub repository name for --push-to-hub (the Trainer's hub_model_id)"
        )


def trainer_reporting(
    report_to: list[str], push_to_hub: bool = False, hub_model_id: str | None = None
) -> dict:
    """The `TrainingArguments` keyword arguments for reporting and the Hub."""
    kw: dict[str, Any] = {"report_to": list(report_to) if report_to else "none"}
    if push_to_hub or hub_model_id:
        kw.update(push_to_hub=bool(push_to_hub), hub_model_id=hub_model_id)
    return kw


def point_tensorboard(trainer: Any, logging_dir: str | Path) -> bool:
    """Make the Trainer's own `TensorBoardCallback` (added by report_to) write to `logging_dir`; False if none."""
    from transformers.integrations import TensorBoardCallback

    found = False
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, TensorBoardCallback):
            cb.logging_dir = str(logging_dir)
            found = True
    return found
