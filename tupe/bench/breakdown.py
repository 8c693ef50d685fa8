"""Where one training step's time goes: embeddings and positional term, attention, feed-forward, LM head and loss,
optimizer, from the PyTorch profiler.

Forward: module hooks open a `record_function` range per labelled module (the innermost labelled module wins), and
every operator (with the Python time between operators, as the range's self time) is counted in its range's
category. Backward: each autograd node runs as `autograd::engine::evaluate_function: ...` with the sequence number
of the forward operator that created it, so its time goes to that operator's category. The clipping, AdamW step
and `zero_grad` run inside an `optimizer` range. What is left (residual additions, dropout between sub-layers,
gradient accumulation into `.grad`) is `other`. Categories are sums of the operators' self CPU times, so they add
up to the profiled step's time (the profiler's own overhead is in it: compare `profiled_total_ms` with
`step_ms_unprofiled`).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch.autograd.profiler import record_function

EMBEDDINGS = "embeddings + positional"
ATTENTION = "attention"
FEED_FORWARD = "feed-forward"
HEAD = "LM head + loss"
OPTIMIZER = "optimizer (clip + AdamW)"
OTHER = "other"
CATEGORIES = (EMBEDDINGS, ATTENTION, FEED_FORWARD, HEAD, OPTIMIZER, OTHER)
_PREFIX = "tupe.bench::"
_BACKWARD = "autograd::engine::evaluate_function:"


def module_categories(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(module, category) for a `TupeForMaskedLM` or a transformers `BertForMaskedLM`; the outer model is the
    LM head's (the loss is computed there), the encoder's own forward (position inputs) is the embeddings'."""
    labels: list[tuple[torch.nn.Module, str]] = [(model, HEAD)]
    if hasattr(model, "tupe"):
        enc = model.tupe
        labels += [(enc, EMBEDDINGS), (enc.embeddings, EMBEDDINGS)]
        if isinstance(getattr(enc, "positional", None), torch.nn.Module):
            labels.append((enc.positional, EMBEDDINGS))
        for layer in enc.layers:
            labels.append((layer, OTHER))
            labels += [
                (m, ATTENTION) for m in (layer.attention, layer.attention_output, layer.attention_norm)
            ]
            labels += [(m, FEED_FORWARD) for m in (layer.intermediate, layer.output, layer.output_norm)]
        labels.append((model.lm_head, HEAD))
    elif hasattr(model, "bert"):
        labels += [(model.bert, EMBEDDINGS), (model.bert.embeddings, EMBEDDINGS)]
        for layer in model.bert.encoder.layer:
            labels += [(layer, OTHER), (layer.attention, ATTENTION)]
            labels += [(layer.intermediate, FEED_FORWARD), (layer.output, FEED_FORWARD)]
        labels.append((model.cls, HEAD))
    else:
        raise ValueError(f"no breakdown labels for {type(model).__name__}")
    return labels


def _install_hooks(model: torch.nn.Module) -> list:
    handles = []
    for module, category in module_categories(model):
        stack: list = []

        def pre(_m, _args, _stack=stack, _name=_PREFIX + category):  # noqa: ANN001, ANN202
            rf = record_function(_name)
            rf.__enter__()
            _stack.append(rf)

        def post(_m, _args, _out, _stack=stack):  # noqa: ANN001, ANN202
            _stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    return handles


def _labelled_ancestor(event) -> str | None:  # noqa: ANN001
    e = event
    while e is not None:
        if e.name.startswith(_PREFIX):
            return e.name[len(_PREFIX) :]
        if e.name.startswith(_BACKWARD):
            return None
        e = e.cpu_parent
    return None


def _backward_root(event):  # noqa: ANN001, ANN202
    e = event
    while e is not None:
        if e.name.startswith(_BACKWARD):
            return e
        e = e.cpu_parent
    return None


def categorize(events) -> dict[str, float]:  # noqa: ANN001
    """Self CPU time (microseconds) per category over a profiler's `events()`."""
    by_seq: dict[int, str] = {}
    for e in events:
        if getattr(e, "sequence_nr", -1) >= 0 and _backward_root(e) is None:
            cat = _labelled_ancestor(e)
            if cat is not None:
                by_seq.setdefault(e.sequence_nr, cat)
    totals: dict[str, float] = defaultdict(float)
    for e in events:
        root = _backward_root(e)
        if root is not None:
            cat = by_seq.get(root.sequence_nr, OTHER)
        else:
            cat = _labelled_ancestor(e) or OTHER
        totals[cat] += e.self_cpu_time_total
    return {c: totals.get(c, 0.0) for c in CATEGORIES}


def breakdown(candidate, steps: int = 3, warmup: int = 1) -> dict:  # noqa: ANN001
    """Profile `steps` training steps of a bench `Candidate`; returns per-step milliseconds per category."""
    from torch.profiler import ProfilerActivity

    from .profiling import quiet_profile

    model, optimizer, batch = candidate.model, candidate.optimizer, candidate.batch

    def step() -> None:
        loss = model(**batch).loss
        loss.backward()
        with record_function(_PREFIX + OPTIMIZER):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    unprofiled = (time.perf_counter() - t0) / steps
    handles = _install_hooks(model)
    try:
        with quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            profiled_wall = (time.perf_counter() - t0) / steps
    finally:
        for h in handles:
            h.remove()
    per_step_ms = {c: v / 1e3 / steps for c, v in categorize(prof.events()).items()}
    total = sum(per_step_ms.values())
    return {
        "label": candidate.label,
        "steps": steps,
        "ms_per_step": per_step_ms,
        "fraction": {c: (v / total if total else 0.0) for c, v in per_step_ms.items()},
        "profiled_total_ms": total,
        "profiled_wall_ms": profiled_wall * 1e3,
        "step_ms_unprofiled": unprofiled * 1e3,
    }
