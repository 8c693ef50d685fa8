"""Matplotlib figures of the analysis (headless, Agg backend): PNG bytes, so they can be written to disk and
inlined in the HTML page."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from .decomposition import TERM_TITLES, TERMS, Decomposition  # noqa: E402
from .patterns import HeadPattern  # noqa: E402


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def decomposition_figure(dec: Decomposition, title: str) -> bytes:
    """Fig. 2: the four terms side by side (head- and batch-averaged), each with its own colour scale."""
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.6), constrained_layout=True)
    for ax, name in zip(axes, TERMS):
        m = dec.mean[name].numpy()
        im = ax.imshow(m, cmap="viridis", aspect="equal", interpolation="nearest")
        rs = dec.stats[name]["row_std_per_head"]
        ax.set_title(f"{TERM_TITLES[name]}\nrow std {rs:.3f} (per head)", fontsize=11)
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
        cb = fig.colorbar(im, ax=ax, shrink=0.8)
        cb.set_label("logit")
    fig.suptitle(
        f"{title}: first-layer logits split into four terms (mean over {dec.num_blocks} blocks and all heads)",
        fontsize=12,
    )
    return _png(fig)


def pattern_grid_figure(
    probs: torch.Tensor, patterns: list[HeadPattern], title: str, zoom: int | None = None
) -> bytes:
    """Fig. 6: each head's content-free attention softmax(positional_logits), one heat map per head.

    `zoom` shows only the first `zoom` positions (the pattern is easier to see on a small window)."""
    h, n, _ = probs.shape
    k = n if zoom is None else min(zoom, n)
    cols = min(h, 6 if h > 8 else 4)
    rows = math.ceil(h / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.0 * cols, 3.1 * rows), squeeze=False, constrained_layout=True
    )
    for idx in range(rows * cols):
        ax = axes[idx // cols][idx % cols]
        if idx >= h:
            ax.axis("off")
            continue
        p = probs[idx, :k, :k].numpy()
        # colour scale from the ordinary tokens (row 0 and column 0 are [CLS], often much larger or smaller)
        vmax = float(probs[idx, 1:k, 1:k].max()) if k > 1 else float(p.max())
        im = ax.imshow(p, cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"head {idx}: {patterns[idx].label}", fontsize=10)
        ax.set_xlabel("key position j", fontsize=8)
        ax.set_ylabel("query position i", fontsize=8)
        ax.tick_params(labelsize=7)
        cb = fig.colorbar(im, ax=ax, shrink=0.75)
        cb.ax.tick_params(labelsize=7)
    fig.suptitle(
        f"{title}: content-free attention softmax(positional logits), positions 0..{k - 1}", fontsize=12
    )
    return _png(fig)


def offset_profile_figure(
    offsets: list[int], profile: torch.Tensor, patterns: list[HeadPattern], title: str
) -> bytes:
    """Mean content-free attention against the offset j - i, one small bar chart per head (ordinary tokens)."""
    h = profile.shape[0]
    cols = min(h, 6 if h > 8 else 4)
    rows = math.ceil(h / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.0 * cols, 2.4 * rows), squeeze=False, sharex=True, constrained_layout=True
    )
    colours = {
        "previous": "tab:blue",
        "next": "tab:orange",
        "local": "tab:green",
        "global": "tab:grey",
        "broad": "tab:purple",
    }
    for idx in range(rows * cols):
        ax = axes[idx // cols][idx % cols]
        if idx >= h:
            ax.axis("off")
            continue
        label = patterns[idx].label
        ax.bar(offsets, profile[idx].numpy(), width=0.85, color=colours.get(label, "tab:red"))
        ax.set_title(f"head {idx}: {label}", fontsize=10)
        ax.axvline(0, color="black", lw=0.4)
        ax.tick_params(labelsize=7)
        if idx % cols == 0:
            ax.set_ylabel("mean attention", fontsize=8)
        if idx // cols == rows - 1 or idx + cols >= h:
            ax.set_xlabel("offset j - i", fontsize=8)
    fig.suptitle(
        f"{title}: content-free attention by offset (key minus query; tokens other than [CLS])", fontsize=12
    )
    return _png(fig)
