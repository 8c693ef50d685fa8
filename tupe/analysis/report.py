"""One self-contained HTML page (figures inlined as base64 PNG) for `tupe analyze`."""

from __future__ import annotations

import base64
import html

from .decomposition import TERM_TITLES, TERMS
from .patterns import PatternThresholds


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}" style="max-width:100%">'


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
code { background: #f3f3f3; padding: 1px 3px; } .note { color: #555; font-size: 0.92em; }
"""


def render_html(result: dict, figures: dict[str, bytes]) -> str:
    """The page: model summary, Fig. 2 split with its uniformity table, Fig. 6 grid with per-head numbers."""
    title = html.escape(result["title"])
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>tupe analyze: {title}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>tupe analyze: {title}</h1>",
    ]
    info = [
        ["model", html.escape(result["model"])],
        ["what it is", html.escape(result["description"])],
        ["position scheme", html.escape(result["position_scheme"])],
        [
            "layers x hidden, heads",
            f"{result['num_layers']} x {result['hidden_size']}, {result['num_heads']}",
        ],
        ["sequence length analysed", str(result["seq_len"])],
    ]
    if result.get("text"):
        info.append(["text", html.escape(f"{result['text']} ({result.get('num_blocks', 0)} blocks)")])
    parts.append(_table(["", ""], info))

    dec = result.get("decomposition")
    if dec is not None:
        parts += _decomposition_section(result, dec, figures)
    pat = result.get("patterns")
    if pat is not None:
        parts += _patterns_section(pat, figures)
    parts.append(
        "<p class='note'>Raw numbers: <code>analysis.json</code> next to this page. Pre-training loss curves of "
        "several runs: <code>tupe plot RUN_DIR...</code> (see docs/analysis.md).</p></body></html>"
    )
    return "\n".join(parts)


def _decomposition_section(result: dict, dec: dict, figures: dict[str, bytes]) -> list[str]:
    """Fig. 2: the first layer's logits split into word and position terms, and their uniformity table."""
    from tupe.modeling.positional import scheme_class

    parts: list[str] = []
    scheme = scheme_class(result["position_scheme"])
    report = scheme.report
    parts.append("<h2>First-layer logits: word and position terms (paper Fig. 2)</h2>")
    parts.append(_img(figures["decomposition"], "four terms of the first-layer logits"))
    parts.append(
        "<p class='note'>Each map is the mean over the text blocks and over all heads. The input "
        "LayerNorm is split exactly with each token's own statistics; the LayerNorm bias and the query/key "
        "biases are counted on the position side (they do not depend on the word)"
        + (", and so is the relative bias b<sub>j-i</sub>" if report.relative_bias else "")
        + (
            f", and so is {report.display_name}'s content-free term (its input has no positions, so the two "
            "cross terms contain only the biases)"
            if scheme.content_free and not report.absolute_input
            else ""
        )
        + f". The four terms sum to the first layer's logits: largest deviation "
        f"{dec['max_abs_error']:.2e} (float64).</p>"
    )
    rows = []
    for name in (*TERMS, "total"):
        s = dec["stats"][name]
        rows.append(
            [html.escape(TERM_TITLES[name])]
            + [
                f"{s[k]:.4f}"
                for k in (
                    "row_std_per_head",
                    "relative_row_std",
                    "row_std",
                    "body_row_std",
                    "col_std",
                    "mean",
                    "row_std_per_example",
                )
            ]
        )
    parts.append(
        _table(
            [
                "term",
                "row std (per head)",
                "share of total",
                "row std (mean map)",
                "row std w/o [CLS],[SEP]",
                "column std",
                "mean",
                "row std (single inputs)",
            ],
            rows,
        )
    )
    parts.append(
        "<p class='note'><b>row std</b>: mean over query positions of the standard deviation across key "
        "positions, in logit units. The softmax ignores anything constant along a row, so a term whose row std "
        "is near 0 is uniform as far as attention is concerned. <b>share of total</b>: per-head row std of the "
        "term / that of the full logits. <b>row std (single inputs)</b>: the same on each input's own map before "
        "averaging over the text (a term can be uniform on average yet vary on every input).</p>"
    )
    return parts


def _patterns_section(pat: dict, figures: dict[str, bytes]) -> list[str]:
    """Fig. 6: the content-free attention of every head, its numbers and labels."""
    parts: list[str] = []
    parts.append("<h2>Content-free attention per head (paper Fig. 6)</h2>")
    parts.append(_img(figures["patterns_zoom"], "content-free attention per head, first positions"))
    parts.append(_img(figures["offset_profile"], "content-free attention by offset"))
    parts.append(_img(figures["patterns"], "content-free attention per head, all positions"))
    keys = [
        "label",
        "expected_offset",
        "mean_abs_offset",
        "entropy",
        "local_mass",
        "self_mass",
        "previous_mass",
        "next_mass",
        "to_cls",
        "from_cls_entropy",
        "from_cls_self",
    ]
    rows = []
    for h in pat["heads"]:
        rows.append([str(h["head"]), h["label"]] + [f"{h[k]:.3f}" for k in keys[1:]])
    parts.append(_table(["head", *keys], rows))
    th = PatternThresholds(**pat["thresholds"])
    parts.append(
        "<p class='note'>Measured on softmax(positional logits) among tokens 1..n-1 (rows renormalised after "
        "dropping the [CLS] column); to_cls / from_cls use the full map. Labels, first rule that holds: "
        f"<b>previous</b> if previous_mass &ge; {th.directional_mass} and &ge; {th.directional_ratio} x "
        f"next_mass; <b>next</b> likewise; <b>local</b> if mass within &plusmn;2 &ge; {th.local_mass}; "
        f"<b>global</b> if normalised entropy &ge; {th.global_entropy}; otherwise <b>broad</b>.</p>"
    )
    counts = ", ".join(f"{k}: {v}" for k, v in pat["label_counts"].items())
    parts.append(f"<p>Patterns: {html.escape(counts)}.</p>")
    return parts
