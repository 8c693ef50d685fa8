"""RoPE scaling the transformers way: `config.rope_parameters` (and the legacy `rope_scaling` key, mapped onto it as
transformers 5 does) for the `rope` scheme, computed by transformers' own `ROPE_INIT_FUNCTIONS`.

`rope_parameters = {"rope_type": "yarn", "factor": 4.0, ...}` is read as transformers' RoPE models read it: the
inverse frequencies and the attention factor (on cos and sin, as transformers' `attention_scaling`) are those the
function of its `rope_type` returns. Static types (`linear`, `yarn`, `llama3`) are computed once per model;
length-dependent ones (`dynamic`, `longrope`) per input, from its length (the largest position + 1), as
transformers' `dynamic_rope_update` does for one call. A scheme other than `rope` has no rotation to scale: a
`rope_parameters` given to it is refused by name, so a config never carries one that is not applied.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

# The `rope_type`s the rope scheme applies (transformers' names); "default" is the unscaled rotation
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
LENGTH_DEPENDENT = ("dynamic", "longrope")
# the keys each type needs besides `rope_type` (transformers' validation: `original_max_position_embeddings`
# defaults to max_position_embeddings, `rope_theta` to the config's)
_NEEDS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}
_ORIGINAL = "original_max_position_embeddings"
# the types scaled over a training length, `original_max_position_embeddings` (default: max_position_embeddings,
# as transformers; `dynamic` reads it in tupe, where transformers takes max_position_embeddings itself)
_EXTENDING = ("dynamic", "yarn", "longrope", "llama3")
_EXAMPLE = "{'rope_type': 'yarn', 'factor': 4.0}"


def refuse_rope_parameters(config: Any) -> None:
    """A ValueError naming the scheme if `config` (of a scheme with no rotation) carries RoPE scaling."""
    given = getattr(config, "rope_parameters", None)
    if given:
        raise ValueError(
            f"rope_parameters {given!r} applies to the rope scheme only (rotary positions); position_scheme "
            f"{config.position_scheme!r} has no rotation to scale: leave rope_parameters (and rope_scaling) unset"
        )


def standard_rope_parameters(config: Any) -> dict[str, Any] | None:
    """`config.rope_parameters` checked and in transformers' standard form (`rope_type`, `rope_theta`, and
    `original_max_position_embeddings` where the type reads it), or None where unset. A `rope_theta` in it is the
    base (and becomes `config.rope_theta`); one line (ValueError) for anything transformers would not compute."""
    given = getattr(config, "rope_parameters", None)
    if not given:
        return None
    if not isinstance(given, dict):
        raise ValueError(f"rope_parameters must be a dict such as {_EXAMPLE}, got {given!r}")
    params = dict(given)
    rope_type = params.pop("type", None) or params.get("rope_type") or "default"  # "type": the legacy key
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"rope_parameters rope_type {rope_type!r} is not one the rope scheme applies ({', '.join(ROPE_TYPES)})"
        )
    params["rope_type"] = rope_type
    missing = [k for k in _NEEDS.get(rope_type, ()) if params.get(k) is None]
    if missing:
        raise ValueError(
            f"rope_parameters of rope_type {rope_type!r} need {', '.join(missing)}, got {given!r}"
        )
    factor = params.get("factor")
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1
    ):
        raise ValueError(f"rope_parameters factor must be a number >= 1, got {factor!r}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            "rope_parameters partial_rotary_factor: the rope scheme rotates the whole head (1.0 only)"
        )
    theta = params.setdefault("rope_theta", config.rope_theta)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ValueError(f"rope_parameters rope_theta must be a number > 0, got {theta!r}")
    if rope_type in _EXTENDING:
        params.setdefault(_ORIGINAL, config.max_position_embeddings)
    original = params.get(_ORIGINAL)
    if original is not None and (isinstance(original, bool) or not isinstance(original, int) or original < 1):
        raise ValueError(f"rope_parameters {_ORIGINAL} must be an integer >= 1, got {original!r}")
    config.rope_theta = float(theta)
    if rope_type in _EXTENDING and params.get("factor"):
        # what the factor means (transformers: "a factor of x will enable the model to handle sequences of length
        # x * original maximum pre-trained length"): the model's length limit follows it
        config.max_position_embeddings = max(
            config.max_position_embeddings, math.ceil(params["factor"] * original)
        )
    return params


def rope_frequencies(
    config: Any, params: dict[str, Any], length: int | None = None
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (head_dim/2,) float32 on the CPU, attention factor) of `params` (standard form) for an
    input of `length` tokens, from transformers' `ROPE_INIT_FUNCTIONS[rope_type]`. `dynamic` is rescaled beyond
    `original_max_position_embeddings` when given (else `max_position_embeddings`), as transformers' is beyond
    `max_position_embeddings`; `longrope` takes its long factors beyond `original_max_position_embeddings`."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    view = copy.copy(config)  # what the function reads, without touching the model's config
    view.rope_parameters = copy.deepcopy(params)
    if params["rope_type"] == "dynamic":
        view.max_position_embeddings = params.get(_ORIGINAL) or config.max_position_embeddings
        view.rope_parameters.pop(_ORIGINAL, None)
    with torch.device("cpu"):  # also when the model is built on the meta device (from_pretrained)
        inv_freq, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](view, torch.device("cpu"), seq_len=length)
    return inv_freq.float(), float(factor)


def rescales_at(params: dict[str, Any], config: Any, length: int) -> bool:
    """Whether a length-dependent type changes the rotation at an input of `length` tokens (beyond its reference)."""
    reference = params.get(_ORIGINAL) or config.max_position_embeddings
    return length > reference
