"""The terminal table of `tupe evaluate`: losses, perplexities, word-order deltas and paired differences."""

from __future__ import annotations

from typing import Any


def _fmt(d: dict[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    if d is None:
        return "-"
    spec = f"{'+' if signed else ''}.{digits}f"

    def f(x: float) -> str:
        return format(0.0 if round(x, digits) == 0 else x, spec)  # no "-0.000"

    if d.get("low") is None:
        return f(d["value"])
    return f"{f(d['value'])} [{f(d['low'])}, {f(d['high'])}]"


def _fmt_ppl(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    v = d["value"]
    return f"{v:,.2f}" if v < 1e6 else f"{v:.3g}"


def _fmt_tpw(value: float | None) -> str:
    """Tokens per word of the text under a tokenizer (how finely it cuts the text)."""
    return "-" if value is None else f"{value:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return [line(header), "  ".join("-" * w for w in widths), *map(line, rows)]


def format_report(result: dict[str, Any]) -> str:
    """The terminal table: one block per tokenizer group, then its paired differences."""
    s = result["settings"]
    ci = f"{int(s['ci_level'] * 100)}% CI" if s["bootstrap_resamples"] else "no CI"
    out = [
        f"text: {result['text']['description']} ({result['text']['bytes']:,} bytes)",
        f"loss: mean nats per masked token (seed {s['seed']}, {s['mlm_probability']:.0%} masked, 80/10/10); "
        f"[{ci}: bootstrap over blocks, {s['bootstrap_resamples']} resamples]",
    ]
    models = {m["name"]: m for m in result["models"]}
    for g in result["tokenizer_groups"]:
        out += [
            "",
            f"{g['id']}: {g['tokens']:,} tokens -> {g['blocks']:,} of {g['full_blocks']:,} blocks of "
            f"{g['block_length']}, {g['masked_tokens']:,} masked targets; pseudo-perplexity on a sample of "
            f"{g['pppl_tokens']:,} tokens; {_fmt_tpw(g.get('tokens_per_word'))} tokens per word (the text's "
            f"{g.get('words') or 0:,} whitespace-separated words)",
        ]
        header = ["model", "loss", "ppl", "pppl", "word order (shuffled - loss)", "tokens/word"]
        rows = []
        tpw = _fmt_tpw(g.get("tokens_per_word"))
        for name in g["models"]:
            m = models[name]
            rows.append(
                [
                    name,
                    _fmt(m["loss"]),
                    _fmt_ppl(m["perplexity"]),
                    _fmt_ppl(m["pseudo_perplexity"]),
                    _fmt(m["word_order_delta"], signed=True),
                    tpw,
                ]
            )
        u = g["unigram"]
        rows.append(
            [
                "unigram (text's own frequencies)",
                _fmt(u["loss"]),
                _fmt_ppl(u["perplexity"]),
                _fmt_ppl(u["pseudo_perplexity"]),
                "0",
                tpw,
            ]
        )
        out += _table(header, rows)
        diff_rows = [[f"{d['a']} - {d['b']}", _fmt(d["loss"], signed=True)] for d in g["differences"]]
        diff_rows += [
            [f"{name} - unigram", _fmt(models[name]["minus_unigram"], signed=True)] for name in g["models"]
        ]
        out += ["", *_table(["paired difference (same blocks and masks)", "loss difference"], diff_rows)]
    if len(result["tokenizer_groups"]) > 1:
        out += ["", "models with different tokenizers see different tokens: compare them within a group only"]
    return "\n".join(out)


def format_lengths_report(result: dict[str, Any]) -> str:
    """`tupe evaluate --lengths`: one row per model and length (loss, word order, paired difference from the
    first model, a note when a table was extended, never trained, or has no row there)."""
    s = result["settings"]
    ci = f"{int(s['ci_level'] * 100)}% CI" if s["bootstrap_resamples"] else "no CI"
    ref = result["reference"]
    ext = result["extend_positions"]
    out = [
        f"text: {result['text']['description']} ({result['text']['bytes']:,} bytes)",
        f"loss: mean nats per masked token (seed {s['seed']}, {s['mlm_probability']:.0%} masked, 80/10/10) at "
        f"each block length; [{ci}: bootstrap over blocks, {s['bootstrap_resamples']} resamples]; learned "
        f"position tables beyond their trained rows: {ext if ext != 'none' else 'not extended (--extend-positions)'}",
        "",
    ]
    header = ["model", "length", "blocks", "loss", "word order", f"{ref} - model", "tokens/word", "note"]
    rows = []
    for e in result["by_length"]:
        if not e["evaluated"]:
            rows.append([e["model"], str(e["length"]), "-", "-", "-", "-", "-", e["note"] or ""])
            continue
        diff = "-" if e["model"] == ref else _fmt(e["first_minus_model"], signed=True)
        rows.append(
            [
                e["model"],
                str(e["length"]),
                f"{e['blocks']:,}",
                _fmt(e["loss"]),
                _fmt(e["word_order_delta"], signed=True),
                diff,
                _fmt_tpw(e.get("tokens_per_word")),
                e["note"] or "",
            ]
        )
    out += _table(header, rows)
    out += [
        "",
        f"paired differences ({ref} - model) use the same blocks and masks at each length; lengths differ in "
        "their blocks, so compare a model across lengths by its loss, not by pairs",
    ]
    return "\n".join(out)


def format_passkey_report(result: dict[str, Any]) -> str:
    """`tupe evaluate --probe passkey`: one row per model and distance (accuracy with the key, with a decoy key and
    with the key's digits deranged; token use and copying, the paired differences; a note where a model runs beyond
    its training length or cannot run)."""
    s = result["settings"]
    ci = f"{int(s['ci_level'] * 100)}% CI" if s["bootstrap_resamples"] else "no CI"
    out = [
        f"passkey probe: filler from {result['text']['description']}; a key of {s['key_digits']} distinct digits "
        f"in {s['template']!r}, then d filler tokens, then the same sentence with the key's digits masked; "
        f"{s['blocks']} blocks per distance, seed {s['seed']}",
        "accuracy: share of masked key digits recovered (the most likely of the key's digit tokens); guess: the "
        "same blocks with every digit of the first key changed; permuted: the first key's own digits deranged (none "
        "in its place); token use = accuracy - guess (the key's digits were used); copying = accuracy - permuted "
        "(the key was copied in order: 0 for a model that knows only which digits occur, 1 for an exact copier); "
        f"chance: 1 / the digits the tokenizer writes as one token each [{ci}: paired bootstrap over blocks, "
        f"{s['bootstrap_resamples']} resamples]",
        "",
    ]
    header = [
        "model",
        "distance",
        "block",
        "accuracy",
        "guess",
        "permuted",
        "token use",
        "copying",
        "chance",
        "note",
    ]
    rows = []
    for e in result["by_distance"]:
        cells = ["-"] * 5
        if e["evaluated"]:
            cells = [_fmt(e["accuracy"]), _fmt(e["guess_accuracy"]), _fmt(e["permuted_accuracy"])]
            cells += [_fmt(e["accuracy_minus_guess"], signed=True), _fmt(e["copying"], signed=True)]
        chance = f"{e['chance']:.3f}" if e["evaluated"] else "-"
        rows.append([e["model"], str(e["distance"]), str(e["block_length"]), *cells, chance, e["note"] or ""])
    out += _table(header, rows)
    return "\n".join(out)
