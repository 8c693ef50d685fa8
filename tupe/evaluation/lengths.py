"""Evaluation at several block lengths (`tupe evaluate --lengths`): length generalisation of every model.

At each length the text is packed into blocks of that length and every model that can run there is evaluated by
`evaluate()` unchanged (same seeded masks for the models sharing a tokenizer, word-order check, paired intervals).
Whether a model can run beyond its own length is asked of its scheme class (`SchemeReport.position_table`):
schemes without a learned table run at any length; a learned table has no row beyond its last, so the model is
reported as "no positions beyond N" unless `--extend-positions` builds the longer table:

- `interpolate`: the trained stream rows `1..T-1` resampled linearly onto `1..L-1` (as ViT/timm resample position
  embeddings, and "position interpolation" does for rotary models); row 0 ([CLS]) kept.
- `repeat`: the trained stream rows `1..T-1` copied end to end (Longformer's initialisation of its 4,096-row table
  from RoBERTa's 512 rows); row 0 kept.

Only the table changes (the rest of the state dict is loaded unchanged). Rotary schemes (`rope`) have no table
and run at any length as they are; `--extend-positions pi|ntk|yarn` instead rescales their rotation speeds by
`s = L / T` (target length over training length): the evaluated copy gets the `rope_parameters` of transformers'
linear, dynamic and yarn types (`extension_rope_parameters`), which the rope scheme computes with
`ROPE_INIT_FUNCTIONS` as it does for any model loaded with them. What this does to each scheme is in docs/evaluation.md.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tupe.errors import TupeError

from . import EXTEND_METHODS, ROTARY_METHODS, TABLE_METHODS
from .evaluate import EvalModel, Settings, evaluate

_PAST = {"interpolate": "interpolated", "repeat": "repeated"}  # for the table's notes


def table_key(m: EvalModel) -> str | None:
    """State-dict key of the model's learned row-per-position table, or None when it has none (any length)."""
    if m.kind == "bert":  # transformers' BertForMaskedLM: learned absolute positions
        return "bert.embeddings.position_embeddings.weight"
    if m.kind != "tupe":  # a module of its own: its positions are its own business
        return None
    from tupe.modeling.positional import scheme_class

    path = scheme_class(m.model.config.position_scheme).report.position_table
    return None if path is None else f"tupe.positional.{path}.weight"


def extend_table(table: torch.Tensor, rows: int, method: str) -> torch.Tensor:
    """A (rows, hidden) table from a trained (T, hidden) one: row 0 ([CLS]'s) kept, the stream rows 1..T-1 resampled
    (`interpolate`: linear, first and last stream rows kept) or copied end to end (`repeat`)."""
    if method not in TABLE_METHODS:
        raise TupeError(f"--extend-positions must be one of {', '.join(EXTEND_METHODS)}, got {method!r}")
    if table.shape[0] < 2 or rows < 2:
        raise TupeError("a position table needs a [CLS] row and at least one stream row to be extended")
    stream = table[1:]
    if method == "interpolate":
        if stream.shape[0] == 1:
            new = stream.expand(rows - 1, -1)
        else:
            new = torch.nn.functional.interpolate(
                stream.t().unsqueeze(0).double(), size=rows - 1, mode="linear", align_corners=True
            )[0].t()
    else:
        new = stream[torch.arange(rows - 1) % stream.shape[0]]
    return torch.cat([table[:1], new.to(table.dtype)]).contiguous()


def rotary(m: EvalModel) -> bool:
    """Whether the model's scheme rotates queries and keys by position (`PositionalScheme.rotary`: `rope`)."""
    if m.kind != "tupe":
        return False
    from tupe.modeling.positional import scheme_class

    return bool(scheme_class(m.model.config.position_scheme).rotary)


def extension_rope_parameters(method: str, scale: float, train_length: int) -> dict[str, Any] | None:
    """The transformers `rope_parameters` of `--extend-positions method` at `scale` s = L / T over the training
    length T (`train_length`); None at `scale <= 1` (the rotation as trained). The evaluated copy of a rope model
    applies them as any rope model does (tupe/modeling/rope_scaling.py): one path for both.

    - `pi` (position interpolation, Chen et al. 2023): `linear` with factor s, every frequency / s.
    - `ntk` (NTK-aware, bloc97 2023): `dynamic` with factor 1 over T, i.e. at length L the base raised to
      `base * s^(d/(d-2))`.
    - `yarn` (Peng et al., ICLR 2024): `yarn` with factor s over T: per frequency a ramp between interpolation and
      extrapolation (beta_fast 32, beta_slow 1), attention factor `0.1 ln s + 1` on cos and sin."""
    if method not in ROTARY_METHODS:
        raise TupeError(
            f"--extend-positions for rotary positions must be one of {', '.join(ROTARY_METHODS)}, got {method!r}"
        )
    if scale <= 1.0:
        return None
    if method == "pi":
        return {"rope_type": "linear", "factor": float(scale)}
    if method == "ntk":
        return {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": int(train_length)}
    return {
        "rope_type": "yarn",
        "factor": float(scale),
        "original_max_position_embeddings": int(train_length),
    }


def rope_frequencies(
    method: str, head_dim: int, base: float, scale: float, train_length: int
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (head_dim/2,) float32, attention factor) that `--extend-positions method` gives a rope
    model of `head_dim` and `base` at `scale` times `train_length` (`extension_rope_parameters`, computed by the
    rope scheme from transformers' `ROPE_INIT_FUNCTIONS`); `scale <= 1` gives the trained ones and factor 1."""
    from tupe.modeling import TupeConfig
    from tupe.modeling.positional import build_scheme

    length = max(round(scale * train_length), train_length)
    config = TupeConfig(
        position_scheme="rope",
        hidden_size=head_dim,
        num_attention_heads=1,
        max_position_embeddings=length,
        rope_theta=base,
        rope_parameters=extension_rope_parameters(method, scale, train_length),
    )
    return build_scheme(config).frequencies(length)


def applies(m: EvalModel, method: str) -> bool:
    """Whether `--extend-positions method` is one of this model's own methods: `none` for every model, a table
    method for a learned table, a rotary method for rope."""
    if method in TABLE_METHODS:
        return table_key(m) is not None
    if method in ROTARY_METHODS:
        return rotary(m)
    return True


def trained_rows(m: EvalModel) -> int:
    """Rows of the table that training reached: the training length when the run recorded it, else all rows."""
    return min(m.max_length, m.train_length) if m.train_length else m.max_length


def at_length(m: EvalModel, length: int, method: str) -> tuple[EvalModel | None, str | None]:
    """The model to evaluate at `length` (itself, or a copy with a longer table/limit) and a note for the table;
    (None, why) when it cannot run there."""
    key = table_key(m)
    train = m.train_length
    beyond = train is not None and length > train
    if key is None:
        note = f"{length / train:g}x its training length {train}" if beyond else None
        if _extends(m, length, method):
            rows = trained_rows(m)
            scale = length / rows
            params = extension_rope_parameters(method, scale, rows)
            return _rebuilt(
                m, length, None, params
            ), f"rotary {method}, scale {scale:g} over {rows} positions"
        if method in ROTARY_METHODS and length > trained_rows(m):
            why = f"--extend-positions {method} applies to rotary schemes only: run unextended"
            note = why if note is None else f"{note}; {why}"
        if length <= m.max_length:
            return m, note
        return _rebuilt(m, length, None), note
    rows = trained_rows(m)
    if method not in TABLE_METHODS or length <= rows:
        # a rotary method on a table: refused by name, the table used as it is
        why = (
            f": {method} applies to rotary schemes only" if method in ROTARY_METHODS and length > rows else ""
        )
        if length > m.max_length:
            return None, f"no positions beyond {m.max_length} (--extend-positions extends the table{why})"
        if length > rows:
            return m, f"table rows {rows}-{length - 1} never trained (training length {rows}){why}"
        return m, None
    table = m.model.state_dict()[key][:rows]
    return _rebuilt(
        m, length, (key, extend_table(table, length, method))
    ), f"table {_PAST[method]} from {rows} rows"


def _extends(m: EvalModel, length: int, method: str) -> bool:
    """Whether `method` changes the model's positions at `length` (a table method on a table, a rotary one on rope,
    beyond the trained length)."""
    if length <= trained_rows(m):
        return False
    if method in TABLE_METHODS:
        return table_key(m) is not None
    return method in ROTARY_METHODS and rotary(m)


def _rebuilt(
    m: EvalModel,
    length: int,
    table: tuple[str, torch.Tensor] | None,
    rope_parameters: dict[str, Any] | None = None,
) -> EvalModel:
    """The same model with `max_position_embeddings = length` and, where it has one, the extended table or the
    rotary scaling (`rope_parameters`, in place of any the model has): a fresh instance of its class loads the
    original state dict (strict), so nothing else can change."""
    config = copy.deepcopy(m.model.config)
    config.max_position_embeddings = length
    if rope_parameters is not None:
        config.rope_parameters = rope_parameters
    state = dict(m.model.state_dict())
    if table is not None:
        state[table[0]] = table[1]
    model = type(m.model)(config)
    model.load_state_dict(state, strict=True)
    model.eval().to(next(m.model.parameters()).device)
    return dataclasses.replace(m, model=model, max_length=length)


def evaluate_lengths(
    models: Sequence[EvalModel],
    corpus: Any,
    lengths: Sequence[int],
    settings: Settings | None = None,
    extend: str = "none",
    log: Callable[[str], None] = print,
    kept: dict[int, dict[str, Any]] | None = None,
    on_length: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`evaluate()` at every length; `by_length` has one entry per model and length (a skipped one says why).

    Resuming: each finished length's share of the result (`{"run", "entries", "text", "settings"}`) is handed to
    `on_length(length, share)`, and a length found in `kept` (such shares, from an interrupted call with the same
    models and settings) is taken from there instead of evaluated again."""
    settings = settings or Settings()
    lengths = _checked_lengths(models, lengths, extend)
    first = models[0].name
    runs, entries = [], []
    text: dict[str, Any] | None = None
    used: dict[str, Any] = {}
    for length in lengths:
        share = (kept or {}).get(length)
        if share is None:
            result, notes = _evaluate_at(models, corpus, length, settings, extend, log)
            share = {
                "run": None
                if result is None
                else {"length": length, **{k: result[k] for k in ("tokenizer_groups", "models", "seconds")}},
                "entries": _length_entries(models, length, extend, result, notes, first),
                "text": None if result is None else result["text"],
                "settings": None if result is None else result["settings"],
            }
            if on_length is not None:
                on_length(length, share)
        if share["run"] is not None:
            text, used = share["text"], share["settings"]
            runs.append(share["run"])
        entries += share["entries"]
    if text is None:
        raise TupeError(
            f"nothing to evaluate at --lengths {','.join(map(str, lengths))}: "
            + "; ".join(f"{e['model']}: {e['note']}" for e in entries[: len(models)])
        )
    return {
        "text": text,
        "settings": used | {"max_length": None, "lengths": lengths, "extend_positions": extend},
        "lengths": lengths,
        "extend_positions": extend,
        "reference": first,
        "models": [
            {
                "name": m.name,
                "path": str(m.path),
                "description": m.description,
                "max_position_embeddings": m.max_length,
                "train_length": m.train_length,
                "position_table": table_key(m),
            }
            for m in models
        ],
        "by_length": entries,
        "runs": runs,
    }


def _checked_lengths(models: Sequence[EvalModel], lengths: Sequence[int], extend: str) -> list[int]:
    """The lengths sorted without repeats; an unknown method, a length under 2, or a rotary method without a
    rotary model refused in one line."""
    if extend not in EXTEND_METHODS:
        raise TupeError(f"--extend-positions must be one of {', '.join(EXTEND_METHODS)}, got {extend!r}")
    lengths = sorted(dict.fromkeys(int(n) for n in lengths))
    if not lengths or lengths[0] < 2:
        raise TupeError(f"--lengths must be integers >= 2, got {lengths}")
    if extend in ROTARY_METHODS and not any(rotary(m) for m in models):
        raise TupeError(
            f"--extend-positions {extend} applies to rotary schemes (rope) only, and no --model is one: "
            + ", ".join(f"{m.name} ({m.description})" for m in models)
        )
    return lengths


def _evaluate_at(
    models: Sequence[EvalModel],
    corpus: Any,
    length: int,
    settings: Settings,
    extend: str,
    log: Callable[[str], None],
) -> tuple[dict[str, Any] | None, dict[str, str | None]]:
    """`evaluate()` of the models that reach `length` (None when none does, or the text has no block of it) and
    a note per model saying why it was or was not evaluated."""
    chosen, notes = [], {}
    for m in models:
        ready, notes[m.name] = at_length(m, length, extend)
        if ready is not None:
            chosen.append(ready)
    log(
        f"length {length}: " + ", ".join(f"{m.name}" for m in chosen)
        if chosen
        else f"length {length}: no model"
    )
    if not chosen:
        return None, notes
    try:
        how = f" with --extend-positions {extend}" if any(_extends(m, length, extend) for m in models) else ""
        at = dataclasses.replace(settings, max_length=length, length_note=f"--lengths {length}{how}")
        return evaluate(chosen, corpus, at, log=log), notes
    except TupeError as err:
        if "make no block of" not in str(err):
            raise
        log(f"length {length}: {err}")  # a short text: no full block at this length, the others go on
        for m in chosen:
            notes[m.name] = f"the text has no full block of {length} tokens"
        return None, notes


def _length_entries(
    models: Sequence[EvalModel],
    length: int,
    extend: str,
    result: dict[str, Any] | None,
    notes: dict[str, str | None],
    first: str,
) -> list[dict[str, Any]]:
    """`by_length`'s entries of one length, one per model (in the given order)."""
    by_name = {r["name"]: r for r in result["models"]} if result else {}
    groups = {g["id"]: g for g in result["tokenizer_groups"]} if result else {}
    entries = []
    for m in models:
        r = by_name.get(m.name)
        entry: dict[str, Any] = {
            "model": m.name,
            "length": length,
            "train_length": m.train_length,
            "max_position_embeddings": m.max_length,
            "evaluated": r is not None,
            "note": notes[m.name],
            "extended": extend if r is not None and _extends(m, length, extend) else None,
        }
        if r is not None:
            g = groups[r["tokenizer_group"]]
            diff = next((d for d in g["differences"] if d["a"] == first and d["b"] == m.name), None)
            entry |= {
                "blocks": g["blocks"],
                "masked_tokens": g["masked_tokens"],
                "tokens_per_word": g["tokens_per_word"],
                "loss": r["loss"],
                "word_order_delta": r["word_order_delta"],
                "minus_unigram": r["minus_unigram"],
                "first_minus_model": None if diff is None else diff["loss"],
            }
        entries.append(entry)
    return entries


def _label(name: str) -> str:
    """A model's legend entry: a run folder's name; `NAME/seed-K` (several seeds of one scheme) -> NAME."""
    if "/seed-" in name and not Path(name).exists():
        return name.split("/seed-")[0]
    path = Path(name)
    if path.name.startswith(("seed-", "checkpoint-")) and path.parent.name:
        return f"{path.parent.name}/{path.name}"
    return path.name or name


def plot_lengths(result: dict[str, Any], out_png: str | Path) -> Path:
    """Loss against block length, one line per model (95% CI as a band), each model's training length marked."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tupe.io.files import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=130)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", "-.", (0, (1, 1))]  # beyond the colour cycle, the line style tells groups apart
    groups: dict[str, int] = {}  # seeds of one scheme (NAME/seed-K) share a colour and a legend entry
    trained = {m["train_length"] for m in result["models"] if m["train_length"]}
    for m in result["models"]:
        label = _label(m["name"])
        first = label not in groups
        k = groups.setdefault(label, len(groups))
        color, style = colors[k % len(colors)], styles[(k // len(colors)) % len(styles)]
        points = [e for e in result["by_length"] if e["model"] == m["name"] and e["evaluated"]]
        xs = [e["length"] for e in points]
        ys = [e["loss"]["value"] for e in points]
        ax.plot(xs, ys, marker="o", color=color, linestyle=style, label=label if first else None)
        if points and all(e["loss"]["low"] is not None for e in points):
            lo = [e["loss"]["low"] for e in points]
            hi = [e["loss"]["high"] for e in points]
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
        if m["train_length"] and len(trained) > 1:
            ax.axvline(m["train_length"], color=color, linestyle=":", linewidth=1.2)
    if len(trained) == 1:
        ax.axvline(
            next(iter(trained)),
            color="0.3",
            linestyle=":",
            linewidth=1.2,
            label=f"training length {next(iter(trained))}",
        )
    elif trained:
        ax.plot([], [], linestyle=":", color="0.3", label="training length (dotted, same colour)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(result["lengths"], [str(n) for n in result["lengths"]])
    ax.minorticks_off()
    ax.set_xlabel("block length (tokens)")
    ax.set_ylabel("masked-LM loss (nats / masked token)")
    ext = result["extend_positions"]
    ax.set_title("Loss against length" + ("" if ext == "none" else f" (learned tables: {ext})"))
    ax.grid(True, alpha=0.3)
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    out_png = Path(out_png)
    atomic_write_bytes(out_png, buf.getvalue())
    return out_png
