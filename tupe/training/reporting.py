"""Trainer-style reporting shared by `tupe pretrain`, `tupe compare` and `tupe glue`: `--report-to` (TensorBoard,
W&B, MLflow... as the Trainer's `report_to`), `--push-to-hub` / `--hub-model-id`, and where TensorBoard writes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def default_report_to() -> str:
    """ "tensorboard" where it is installed, else "none" (the Trainer's own choice of integrations otherwise)."""
    from transformers.integrations import is_tensorboard_available

    return "tensorboard" if is_tensorboard_available() else "none"


def parse_report_to(text: str | list[str] | None) -> list[str]:
    """`--report-to` as the Trainer's list: "tensorboard,wandb" -> ["tensorboard", "wandb"]; "none" -> [].

    Checked when the command starts, before any data, model or run record (one line naming the name): an
    integration transformers does not know, or one whose package is not installed (`wandb` without wandb), would
    otherwise fail inside the Trainer after the data and the model were loaded."""
    from tupe.errors import TupeError

    if text is None:
        text = default_report_to()
    items = text if isinstance(text, list) else [t.strip() for t in str(text).split(",")]
    items = [t for t in items if t]
    if not items or items == ["none"]:
        return []
    if "none" in items:
        raise TupeError(f"--report-to: 'none' cannot be combined with other integrations, got {text!r}")
    check_integrations(items)
    return items


def check_integrations(names: list[str]) -> None:
    """Every name is one of transformers' reporting integrations (or "all"), and installed."""
    from transformers.integrations import integration_utils as iu

    from tupe.errors import TupeError

    known = sorted(iu.INTEGRATION_TO_CALLBACK)
    checked = {  # the integrations whose package transformers can look for (the others it cannot tell)
        "azure_ml": iu.is_azureml_available, "comet_ml": iu.is_comet_available,
        "dagshub": iu.is_dagshub_available, "dvclive": iu.is_dvclive_available, "mlflow": iu.is_mlflow_available,
        "neptune": iu.is_neptune_available, "tensorboard": iu.is_tensorboard_available,
        "wandb": iu.is_wandb_available, "codecarbon": iu.is_codecarbon_available,
        "clearml": iu.is_clearml_available, "swanlab": iu.is_swanlab_available, "trackio": iu.is_trackio_available,
    }  # fmt: skip
    for name in names:
        if name == "all":
            continue
        if name not in known:
            raise TupeError(
                f"--report-to: unknown integration {name!r}; choose from {', '.join(known)}, all or none"
            )
        available = checked.get(name)
        if available is not None and not available():
            package = {"azure_ml": "azureml-core", "comet_ml": "comet-ml", "tensorboard": "tensorboard"}.get(
                name, name
            )
            raise TupeError(
                f"--report-to {name}: {package} is not installed (pip install {package}), or drop it"
            )


def add_report_arguments(p: argparse.ArgumentParser | Any) -> None:
    """--report-to, worded alike in `pretrain`, `compare`, `glue` and `finetune` (the Hub flags: `add_hub_arguments`)."""
    p.add_argument(
        "--report-to",
        metavar="NAME[,NAME]",
        help="where the Trainer sends metrics, as its report_to: tensorboard, wandb, mlflow, all, none... "
        "(default: tensorboard where installed, else none)",
    )


def add_hub_arguments(p: argparse.ArgumentParser, push_help: str, id_help: str) -> None:
    """The "Hugging Face Hub" group of `pretrain` and `glue`: the same two flags, read by `trainer_reporting`;
    each command words what it pushes and where."""
    h = p.add_argument_group("Hugging Face Hub")
    h.add_argument("--push-to-hub", action="store_true", help=push_help)
    h.add_argument("--hub-model-id", help=id_help)


def trainer_reporting(
    report_to: list[str], push_to_hub: bool = False, hub_model_id: str | None = None
) -> dict:
    """The `TrainingArguments` keyword arguments for reporting and the Hub."""
    kw: dict[str, Any] = {"report_to": list(report_to) if report_to else "none"}
    if push_to_hub or hub_model_id:
        kw.update(push_to_hub=bool(push_to_hub), hub_model_id=hub_model_id)
    return kw


def point_tensorboard(trainer: Any, logging_dir: str | Path, kept: Callable[[], str] | None = None) -> bool:
    """Make the Trainer's own `TensorBoardCallback` (added by report_to) write to `logging_dir`; False if none.

    A failed TensorBoard write (disk full, I/O error; the event writer raises it on the next event) ends the
    command with one line naming `logging_dir` and `kept()`, what was kept, instead of a bare OSError."""
    from transformers.integrations import TensorBoardCallback

    found = False
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, TensorBoardCallback):
            cb.logging_dir = str(logging_dir)
            _guard_writes(cb, Path(logging_dir), kept or (lambda: "the files written before are kept"))
            found = True
    return found


def _guard_writes(callback: Any, folder: Path, kept: Callable[[], str]) -> None:
    """Wrap the callback's event methods (the CallbackHandler looks them up on the instance) so that a write
    failure becomes a `WriteError` naming the file (or `folder`) and what was kept."""
    from tupe.io.files import failed_writes_reported

    def guarded(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with failed_writes_reported(folder, lambda: f"TensorBoard logging failed; {kept()}"):
                return method(*args, **kwargs)

        return call

    for event in ("on_train_begin", "on_log", "on_train_end"):
        setattr(callback, event, guarded(getattr(callback, event)))


def align_special_tokens(model: Any, tokenizer: Any) -> None:
    """Give the model's config the tokenizer's PAD/BOS/EOS ids before a Trainer is built, which otherwise does it
    itself with a warning on every run."""
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            setattr(model.config, name, value)
            if getattr(model, "generation_config", None) is not None:
                setattr(model.generation_config, name, value)
