"""Optimizers by name, shared by `tupe pretrain` and `tupe bench`: `OPTIMIZERS` maps `--optimizer NAME` to a
factory, and `build_optimizer` gives every factory the same parameter groups.

Groups: a parameter is decayed when it is a matrix or a table (2-d or more); biases and LayerNorm weights are not
(the Trainer's rule, which matches this one on every model here: tests/training/test_optimizer_groups.py). The
positional parameters, which the model names itself (`TupePreTrainedModel.positional_parameter_names`), get
`lr x positional_lr_scale` and `positional_weight_decay` (default: the weight decay; the released code decays every
parameter, the relative bias table included, although its name contains "bias").

Adding an optimizer is one entry in `OPTIMIZERS`: a function of (parameter groups, `OptimizerSettings`) returning
a `torch.optim.Optimizer`. `--optimizer` takes its choices from the table and the run records the name, so
`--resume` refuses a run whose optimizer changed. This module imports torch only inside the factories: the
command-line parsers read `OPTIMIZERS` and stay fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_OPTIMIZER = "adamw"


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer's settings: what every factory receives besides the groups (each group carries its own `lr`
    and `weight_decay`, from these and the positional scale and decay)."""

    lr: float
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    positional_lr_scale: float = 1.0
    positional_weight_decay: float | None = None  # None: weight_decay


def _adamw(groups: list[dict[str, Any]], s: OptimizerSettings) -> Any:
    """torch's AdamW (decoupled weight decay; the paper's optimizer), fused where the device has that kernel, as
    the Trainer's default `adamw_torch_fused`."""
    import torch

    try:
        return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, eps=s.eps, fused=True)
    except (RuntimeError, TypeError):  # pragma: no cover - a device without the fused kernel
        return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, eps=s.eps)


def _adafactor(groups: list[dict[str, Any]], s: OptimizerSettings) -> Any:
    """transformers' Adafactor with an external learning rate (the schedule of the run), factored second moments:
    less optimizer memory than AdamW at the `base` shape and up. `betas[0]` > 0 keeps a first moment."""
    from transformers.optimization import Adafactor

    return Adafactor(
        groups,
        lr=s.lr,
        beta1=s.betas[0] or None,
        scale_parameter=False,
        relative_step=False,
        warmup_init=False,
    )


# name -> factory(parameter groups, settings) -> optimizer
OPTIMIZERS: dict[str, Callable[[list[dict[str, Any]], OptimizerSettings], Any]] = {
    "adamw": _adamw,
    "adafactor": _adafactor,
}


def positional_parameter_names(model: Any) -> set[str]:
    """The positional parameters of a tupe model (its own `positional_parameter_names`) or of a transformers model
    (`--scheme hf-bert`: BERT's learned position table; `tupe bench`'s hf-deberta: DeBERTa's relative embeddings)."""
    if hasattr(model, "positional_parameter_names"):
        return set(model.positional_parameter_names())
    base = model.base_model
    tables = (
        getattr(base.embeddings, "position_embeddings", None),
        getattr(base.encoder, "rel_embeddings", None),
    )
    ids = {id(t.weight) for t in tables if t is not None}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def parameter_groups(model: Any, settings: OptimizerSettings) -> list[dict[str, Any]]:
    """The model's trainable parameters in groups of equal (lr, weight decay), in the order of
    `named_parameters()` (see the module docstring)."""
    positional = positional_parameter_names(model)
    lr, wd = settings.lr, settings.weight_decay
    pos_lr = lr * settings.positional_lr_scale
    pos_wd = wd if settings.positional_weight_decay is None else settings.positional_weight_decay
    groups: dict[tuple[float, float], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decayed = param.ndim >= 2
        key = (pos_lr, pos_wd if decayed else 0.0) if name in positional else (lr, wd if decayed else 0.0)
        groups.setdefault(key, []).append(param)
    return [{"params": ps, "lr": g_lr, "weight_decay": g_wd} for (g_lr, g_wd), ps in groups.items()]


def build_optimizer(name: str, model: Any, settings: OptimizerSettings) -> Any:
    """The optimizer `name` of `OPTIMIZERS` over the model's parameter groups."""
    if name not in OPTIMIZERS:
        from tupe.errors import TupeError

        raise TupeError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](parameter_groups(model, settings), settings)
