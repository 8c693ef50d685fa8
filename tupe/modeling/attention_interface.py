"""tupe's attention kernels under transformers' `AttentionInterface`, and the one setting that names what runs.

**Names.** Every kernel of tupe's registry (kernels.py) is registered with transformers' `AttentionInterface` as
`tupe_<name>`: `tupe_eager`, `tupe_sdpa`, `tupe_fold`, `tupe_fused`, `tupe_flex` (and `tupe_<name>` for a kernel
registered later); the attention layers call the function registered there. `config._attn_implementation` is the
one setting and names what runs, in transformers' words where transformers has them: `"eager"` (the model's own
reference formula, as in every transformers model) and `"sdpa"` (PyTorch's SDPA, with the content-free term as
its mask) for tupe's kernels of that kind, `tupe_fold`, `tupe_fused` and `tupe_flex` for the kernels transformers
has no name for (`setting`). transformers' `"flex_attention"` is taken as a request for `tupe_flex`.

**Requests** (`from_pretrained(attn_implementation=...)`, `set_attn_implementation(...)`, `TupeConfig(
attn_implementation=...)`, `config._attn_implementation = ...`, `--attention-kernel`; `requested_kernel`): None
(nothing asked: the config's own setting), `"auto"`, a `tupe_` name, a registry name (`"fold"`, `"fused"`,
`"flex"`, ...), transformers' `"eager"` / `"sdpa"` / `"flex_attention"`, and the old aliases `"sdpa-fold"` (fold)
and `"default"` (auto). Old config.json files name it `attention_kernel` (or, older, `fold_positional`), which
`TupeConfig` reads as the same request. An unknown name, or a kernel the scheme cannot run, is refused in one
line with the reason.

**"auto"** is resolved by the registry's rule (`kernels.select_kernel`) for the device and dtype of the model's
weights and its train mode, when the model is built, loaded or `set_attn_implementation` is called, and again
by `model.train()` / `model.eval()`; a forward pass that finds the model on another device or in another compute
dtype (after `.to(...)`, under autocast) resolves it again and updates the setting, so that reading
`config._attn_implementation` after a pass names what ran. A named kernel is never replaced: a pass it cannot
run is refused with the reason. Where one pass needs another kernel (`output_attentions=True` with a kernel that
returns no probabilities; a pass "auto"'s kernel cannot run, such as documents in a row for `tupe_fold`), that
pass runs the other one and says so once (a warning naming both).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

from .kernel_registry import (
    ATTENTION_KERNELS,
    AUTO,
    KERNEL_ALIASES,
    AttentionKernel,
    KernelSituation,
    canonical_kernel_name,
    check_kernel_for_scheme,
    get_attention_kernel,
    select_kernel,
)
from .positional import scheme_class

logger = logging.get_logger(__name__)

PREFIX = "tupe_"
# transformers' own names, taken as requests for tupe's kernel of that kind
TRANSFORMERS_NAMES: dict[str, str] = {"eager": "eager", "sdpa": "sdpa", "flex_attention": "flex"}


def interface_name(kernel: str) -> str:
    """The `AttentionInterface` key (and `config._attn_implementation` value) of registry kernel `kernel`."""
    return PREFIX + kernel


def valid_names() -> str:
    """What a request may name, for messages."""
    kernels = [k for k in ATTENTION_KERNELS if k != AUTO]
    aliases = {**TRANSFORMERS_NAMES, **KERNEL_ALIASES}
    return (
        f"{AUTO}, {', '.join(interface_name(k) for k in kernels)} (or without the prefix: {', '.join(kernels)}; "
        f"aliases: {', '.join(f'{a}={k}' for a, k in aliases.items() if a != k)})"
    )


def accepted_names() -> tuple[str, ...]:
    """Every name a request may give: "auto", the `tupe_` names, the registry names, transformers' and the old
    aliases."""
    kernels = [k for k in ATTENTION_KERNELS if k != AUTO]
    return tuple(
        dict.fromkeys((AUTO, *map(interface_name, kernels), *kernels, *TRANSFORMERS_NAMES, *KERNEL_ALIASES))
    )


def requested_kernel(value: str | None, what: str = "attn_implementation") -> str:
    """ "auto" or the registry name a request names (see the module docstring); None is "auto". Anything else is
    refused in one line, in transformers' opening words, listing what exists."""
    if value is None:
        return AUTO
    if isinstance(value, str):
        name = (
            value.removeprefix(PREFIX) if value.startswith(PREFIX) else TRANSFORMERS_NAMES.get(value, value)
        )
        if value.startswith(PREFIX) and (name == AUTO or name in KERNEL_ALIASES):
            name = value  # only a registry name follows the prefix
        try:
            return canonical_kernel_name(name, what)
        except ValueError:
            pass
    raise ValueError(f'Specified `{what}="{value}"` is not supported; valid: {valid_names()}')


def checked_request(value: str | None, scheme: str, what: str = "attn_implementation") -> str:
    """`requested_kernel`, then refused (with the reason and what applies) where the scheme cannot run it."""
    return check_kernel_for_scheme(requested_kernel(value, what), scheme, scheme_class(scheme).terms, what)


# tupe's kernels that transformers' own setting names: a tupe model's "eager" and "sdpa" are these
TRANSFORMERS_SETTINGS = ("eager", "sdpa")


def setting(kernel: str) -> str:
    """The value `config._attn_implementation` holds for a request resolved to `kernel` ("auto": still "auto"):
    transformers' name for "eager" and "sdpa", the `tupe_` name of every other kernel."""
    if kernel == AUTO:
        return AUTO
    register_interface(kernel)
    return kernel if kernel in TRANSFORMERS_SETTINGS else interface_name(kernel)


def setting_kernel(config) -> str:
    """The registry name `config._attn_implementation` holds ("auto" while no model has resolved it); not checked
    (a kernel unregistered since reads as its name)."""
    return (config._attn_implementation or AUTO).removeprefix(PREFIX)


# ---- the functions registered with transformers ------------------------------------------------------------------


def _interface_function(kernel: str) -> Callable:
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        *,
        context=None,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """transformers' attention signature on (b, h, n, d) queries, keys and values; returns the (b, n, h, d)
        output and the probabilities (or None). `context` is the scheme's `PositionalContext` (its logit scale
        is the scaling); `attention_mask` what the kernel's `prepare` made of the padding."""
        if context is None:
            raise ValueError(
                f"{interface_name(kernel)} is tupe's attention: it needs the scheme's PositionalContext (context=)"
            )
        out, probabilities = get_attention_kernel(kernel).fn(
            query, key, value, context, attention_mask, dropout, output_attentions
        )
        return out.transpose(1, 2), probabilities

    attention.__name__ = attention.__qualname__ = interface_name(kernel)
    return attention


def register_interface(kernel: str) -> None:
    """Register registry kernel `kernel` with transformers' `AttentionInterface` (once). A kernel unregistered
    later keeps its key there (transformers has no public way to remove one): its function then refuses to run,
    and tupe refuses the name."""
    if interface_name(kernel) not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(interface_name(kernel), _interface_function(kernel))


def attention_function(kernel: AttentionKernel) -> Callable:
    """The function the attention layers call for `kernel`: the one registered under its `tupe_` name."""
    return ALL_ATTENTION_FUNCTIONS.get_interface(interface_name(kernel.name), None)


for _name in ATTENTION_KERNELS:
    if _name != AUTO:
        register_interface(_name)


# ---- resolution -------------------------------------------------------------------------------------------------


def _situation(
    config,
    device_type: str,
    dtype: torch.dtype,
    training: bool,
    grad: bool | None = None,
    probabilities: bool = False,
    documents: bool = False,
) -> KernelSituation:
    grad = training if grad is None else grad
    dropout = training and config.attention_probs_dropout_prob > 0
    terms = scheme_class(config.position_scheme).terms
    return KernelSituation(terms, device_type, dtype, training, grad, dropout, probabilities, documents)


def auto_kernel(config, device_type: str, dtype: torch.dtype, training: bool) -> str:
    """The registry kernel "auto" takes for a model on this device, in this dtype and mode (training: with
    gradients): the registry's rule (`select_kernel`)."""
    return select_kernel(AUTO, _situation(config, device_type, dtype, training)).name


def _weights(model: torch.nn.Module) -> tuple[str, torch.dtype]:
    """The device type and dtype of the model's weights (CPU and the default dtype while it has none: a model
    being built)."""
    weight = next(model.parameters(), None)
    if weight is None or weight.device.type == "meta":
        return "cpu", torch.get_default_dtype() if weight is None else weight.dtype
    return weight.device.type, weight.dtype


def settle(model: torch.nn.Module, requested: str | None = None) -> str:
    """The value of `config._attn_implementation` for `requested` (None: the config's own setting): the named
    kernel's `tupe_` name, checked against the scheme, or for "auto" the kernel it takes for the model's weights
    and mode (`auto_kernel`), remembered as chosen by "auto" (`config._attn_auto`). Returns it; what
    `get_correct_attn_implementation` gives transformers to store."""
    config = model.config
    # the setting as it is (transformers passes it at __init__): "auto" where "auto" chose it
    if requested is None or requested == config._attn_implementation:
        requested = AUTO if getattr(config, "_attn_auto", None) is not None else config._attn_implementation
    kernel = checked_request(requested, config.position_scheme)
    config._attn_auto = None
    if kernel == AUTO:
        situation = (*_weights(model), model.training)
        kernel = auto_kernel(config, *situation)
        config._attn_auto = situation
    return setting(kernel)


def refresh(model: torch.nn.Module) -> None:
    """Resolve "auto" again for the model's weights and mode, where it chose the setting (`model.train()`)."""
    config = model.config
    if getattr(config, "_attn_auto", None) is not None:
        config._attn_implementation_internal = settle(model, AUTO)


def kernel_for_pass(
    config,
    device: torch.device,
    dtype: torch.dtype,
    training: bool,
    grad: bool,
    probabilities: bool = False,
    documents: bool = False,
    *,
    update: bool = True,
) -> AttentionKernel:
    """The registry kernel one forward pass runs: the setting's. "auto" (unresolved, or chosen for another
    device, dtype or mode) is resolved for this pass and, with `update`, the setting updated. A pass the setting's
    kernel cannot run is refused with the reason, or where "auto" chose it or `output_attentions` asks for
    probabilities, runs the kernel that can and says so once."""
    key = (device.type, dtype, training)
    auto = getattr(config, "_attn_auto", None)
    if config._attn_implementation in (None, AUTO) or (auto is not None and auto != key):
        name = auto_kernel(config, *key)
        auto = key
        if update:
            config._attn_implementation_internal, config._attn_auto = setting(name), key
    else:
        name = checked_request(config._attn_implementation, config.position_scheme)
    kernel = get_attention_kernel(name)
    situation = _situation(config, device.type, dtype, training, grad, probabilities, documents)
    why = kernel.refusal(situation)
    if why is None and not (probabilities and not kernel.probabilities):
        return kernel
    if (
        why is not None
        and auto is None
        and not (probabilities and kernel.scheme_refusal(situation.terms) is None)
    ):
        raise ValueError(
            f"attn_implementation {setting(name)!r} {why}; set another (model.set_attn_implementation(...), "
            f"from_pretrained(..., attn_implementation=...) or --attention-kernel)"
        )
    other = select_kernel(AUTO, situation)
    if update:
        reason = "returns no attention probabilities" if why is None else why
        logger.warning_once(
            f"attention kernel {setting(name)!r} {reason}; the passes that "
            f"{'ask for output_attentions' if probabilities else 'need another'} run {setting(other.name)!r}"
        )
    return other
