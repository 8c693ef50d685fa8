"""The paper's Fig. 6: what each head's content-free attention looks like, in numbers and one word.

TUPE's positional term `reset(v)` (plus `b_{j-i}` for TUPE-R) does not depend on the input, so
`softmax(positional_logits)` is the attention a head would pay if all words looked alike. The paper reads five
patterns off it: global, local, broad, previous-token and next-token. Here each head gets numbers measured on
that attention and a label derived from them by fixed, documented thresholds (`PatternThresholds`).

What is measured (row i = query, column j = key, index 0 = [CLS]):
- to_cls: mean over queries i >= 1 of the attention on [CLS] (column 0; `theta_2` in TUPE-A/R).
- from_cls_entropy: normalised entropy of the [CLS] query's row (1 = uniform; TUPE-A's reset makes the row
  constant, so exactly 1 there), and from_cls_self: the [CLS] query's attention on itself.
- The rest is measured on the *body*: queries and keys 1..n-1, each row renormalised to sum to 1 over keys >= 1,
  so that attention to [CLS] does not blur the positional pattern among ordinary tokens:
  expected_offset (mean of j - i), mean_abs_offset, entropy (normalised by log(n - 1): 1 = uniform),
  local_mass (on |j - i| <= 2), self_mass (j = i), previous_mass (j = i - 1), next_mass (j = i + 1); all averaged
  over the body queries whose +/-2 window lies inside the body (tokens 3..n-3), so that edge rows with truncated
  windows do not bias them (all body rows if n < 9).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

PATTERNS: tuple[str, ...] = ("previous", "next", "local", "global", "broad")
LOCAL_WINDOW = 2  # 'local' means |j - i| <= 2


@dataclass(frozen=True)
class PatternThresholds:
    """Rules, applied in this order, that name a head's pattern:

    1. previous: previous_mass >= `directional_mass` and previous_mass >= `directional_ratio` x next_mass;
    2. next: the mirror image;
    3. local: local_mass (|j - i| <= 2) >= `local_mass`;
    4. global: entropy >= `global_entropy` (close to uniform over all positions);
    5. broad: anything else (spread over a wider window than +/-2 but far from uniform).
    """

    directional_mass: float = 0.4
    directional_ratio: float = 2.0
    local_mass: float = 0.5
    global_entropy: float = 0.9


DEFAULT_THRESHOLDS = PatternThresholds()


@dataclass
class HeadPattern:
    head: int
    label: str
    expected_offset: float
    mean_abs_offset: float
    entropy: float
    local_mass: float
    self_mass: float
    previous_mass: float
    next_mass: float
    to_cls: float
    from_cls_entropy: float
    from_cls_self: float

    def as_dict(self) -> dict:
        return asdict(self)


def _normalised_entropy(p: torch.Tensor, support: int) -> torch.Tensor:
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return ent / math.log(support) if support > 1 else torch.zeros_like(ent)


def label_pattern(stats: dict[str, float], thresholds: PatternThresholds = DEFAULT_THRESHOLDS) -> str:
    """One of `PATTERNS` from a head's numbers (see `PatternThresholds`)."""
    t = thresholds
    prev, nxt = stats["previous_mass"], stats["next_mass"]
    if prev >= t.directional_mass and prev >= t.directional_ratio * nxt:
        return "previous"
    if nxt >= t.directional_mass and nxt >= t.directional_ratio * prev:
        return "next"
    if stats["local_mass"] >= t.local_mass:
        return "local"
    if stats["entropy"] >= t.global_entropy:
        return "global"
    return "broad"


def body_attention(probs: torch.Tensor) -> torch.Tensor:
    """(h, n, n) attention -> (h, n-1, n-1) attention among tokens 1..n-1, rows renormalised."""
    body = probs[:, 1:, 1:]
    return body / body.sum(-1, keepdim=True).clamp_min(1e-30)


@torch.no_grad()
def head_patterns(
    positional_logits: torch.Tensor, thresholds: PatternThresholds = DEFAULT_THRESHOLDS
) -> list[HeadPattern]:
    """Numbers and a label for every head of a (heads, n, n) content-free logit map (n >= 4)."""
    logits = positional_logits.detach().to(torch.float64)
    if logits.ndim != 3 or logits.shape[1] != logits.shape[2] or logits.shape[1] < 4:
        raise ValueError(f"expected (heads, n, n) logits with n >= 4, got shape {tuple(logits.shape)}")
    h, n, _ = logits.shape
    probs = torch.softmax(logits, dim=-1)
    q = body_attention(probs)  # (h, m, m), m = n - 1
    m = n - 1
    idx = torch.arange(m, dtype=torch.float64)
    offset = idx[None, :] - idx[:, None]  # [i, j] = j - i
    # queries whose +/-2 window lies inside the body (edge rows have truncated windows); all rows if too short
    rows = slice(LOCAL_WINDOW, m - LOCAL_WINDOW) if m > 2 * LOCAL_WINDOW + 1 else slice(0, m)
    qr, off = q[:, rows], offset[rows]
    expected = (qr * off).sum(-1).mean(-1)
    mean_abs = (qr * off.abs()).sum(-1).mean(-1)
    entropy = _normalised_entropy(qr, m).mean(-1)
    local = (qr * (off.abs() <= LOCAL_WINDOW)).sum(-1).mean(-1)
    r = torch.arange(m)[rows]
    self_mass = q[:, r, r].mean(-1)
    previous = q[:, r, (r - 1).clamp(min=0)].mean(-1)
    nxt = q[:, r, (r + 1).clamp(max=m - 1)].mean(-1)
    to_cls = probs[:, 1:, 0].mean(-1)
    from_cls_entropy = _normalised_entropy(probs[:, 0], n)
    from_cls_self = probs[:, 0, 0]
    out = []
    for k in range(h):
        stats = {
            "expected_offset": float(expected[k]),
            "mean_abs_offset": float(mean_abs[k]),
            "entropy": float(entropy[k]),
            "local_mass": float(local[k]),
            "self_mass": float(self_mass[k]),
            "previous_mass": float(previous[k]),
            "next_mass": float(nxt[k]),
            "to_cls": float(to_cls[k]),
            "from_cls_entropy": float(from_cls_entropy[k]),
            "from_cls_self": float(from_cls_self[k]),
        }
        out.append(HeadPattern(head=k, label=label_pattern(stats, thresholds), **stats))
    return out


@torch.no_grad()
def offset_profile(positional_logits: torch.Tensor, max_offset: int = 16) -> tuple[list[int], torch.Tensor]:
    """Mean body attention at each offset j - i in [-max_offset, max_offset]: (offsets, (heads, 2K+1))."""
    q = body_attention(torch.softmax(positional_logits.detach().to(torch.float64), dim=-1))
    m = q.shape[-1]
    k_max = min(max_offset, m - 1)
    offsets = list(range(-k_max, k_max + 1))
    prof = torch.stack([torch.diagonal(q, k, -2, -1).mean(-1) for k in offsets], dim=-1)
    return offsets, prof.float()
