"""The paper's Fig. 2: the first layer's attention logits split into four terms.

For a model whose input is `LN(w_i + p_i)` (bert-a, bert-r, a converted `transformers` BERT) the first layer's
logit of head h is `alpha_ij = s * q_i . k_j (+ b_{j-i} for bert-r)` with `q_i = x_i W^Q + b^Q`. LayerNorm is not
linear, but with the statistics of the actual input `w_i + p_i` (mean `mu_i`, deviation `sigma_i`, eps included)
it splits exactly:

    LN(w_i + p_i) = g * (w_i - mean(w_i)) / sigma_i  +  g * (p_i - mean(p_i)) / sigma_i  +  beta
                  =              word_i               +            pos_i               +  beta

We put everything that does not depend on the token, i.e. `beta` and the query/key biases, on the *position*
side: `q^w_i = word_i W^Q`, `q^p_i = pos_i W^Q + beta W^Q + b^Q` (keys alike), so

    word->word = s q^w_i . k^w_j        word->pos = s q^w_i . k^p_j
    pos->word  = s q^p_i . k^w_j        pos->pos  = s q^p_i . k^p_j  (+ b_{j-i} for bert-r)

and the four terms sum exactly (up to float rounding) to the first layer's logits, head by head. The word->word
term is then the only one with no constant part. (`sigma_i` depends on both the word and the position; that is
what "exact" costs: `pos_i` is not a function of the position alone.)

`bert-a-d` (positions untied but with all four terms) splits the same way without the LayerNorm issue:
word = `LN(w) - beta`, position = `p U` plus the constant parts. TUPE models split the same way for comparison:
their input has no positions, so position->position is the constant parts plus the content-free term
`positional_logits(n)`, and the two cross terms contain only the biases (a per-query constant in word->position,
which the softmax ignores, and a key-word prior `c^Q . k^w_j` in position->word). Models without a LayerNorm on
the input embedding split with `sigma_i = 1`, `beta = 0`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tupe.errors import TupeError
from tupe.modeling.positional import SCHEMES, scheme_class

TERMS: tuple[str, ...] = ("word_word", "word_pos", "pos_word", "pos_pos")
TERM_TITLES: dict[str, str] = {
    "word_word": "word → word",
    "word_pos": "word → position",
    "pos_word": "position → word",
    "pos_pos": "position → position",
    "total": "first-layer logits (sum)",
}


@dataclass
class Decomposition:
    """Batch-averaged first-layer logit terms.

    - per_head[term]: (heads, n, n), the mean over the batch of each term, per head.
    - mean[term]: (n, n), the same averaged over heads (what Fig. 2 shows).
    - max_abs_error: largest |sum of the four terms - first-layer logits| seen over the batch (float64 check).
    """

    per_head: dict[str, torch.Tensor]
    mean: dict[str, torch.Tensor]
    num_blocks: int
    seq_len: int
    max_abs_error: float
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    row_std_per_example: dict[str, float] = field(default_factory=dict)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, n, hidden) -> (b, h, n, d)."""
    b, n, hidden = x.shape
    return x.view(b, n, heads, hidden // heads).transpose(1, 2)


def _project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, heads: int) -> torch.Tensor:
    out = torch.matmul(x, weight.t())
    if bias is not None:
        out = out + bias
    return _split_heads(out, heads)


@torch.no_grad()
def first_layer_terms(model, input_ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The four terms of the first layer's logits for one batch, each (b, h, n, n), and the logits themselves
    computed directly (from the model's own input embedding and fused QKV), in float64.

    `model` is a `TupeModel` (or anything with a `.tupe` / `.base_model` that is one) whose scheme adds positions
    to the input or has BERT-A^d's four terms.
    """
    model = _encoder(model)
    config = model.config
    scheme = config.position_scheme
    if not scheme_class(scheme).report.decomposable:
        decomposable = [name for name, cls in SCHEMES.items() if cls.report.decomposable]
        raise TupeError(
            f"position_scheme {scheme!r} has no word/position split of its logits; "
            f"it applies to {', '.join(decomposable)}"
        )
    b, n = input_ids.shape
    model._check_length(n)
    heads = config.num_attention_heads
    dt = torch.float64
    emb = model.embeddings
    ln = emb.LayerNorm
    ctx = model.positional(n, None)
    scale = float(ctx.logit_scale)
    attn = model.layers[0].attention
    hidden = config.hidden_size
    w_qkv = attn.qkv.weight.to(dt)
    b_qkv = attn.qkv.bias.to(dt) if attn.qkv.bias is not None else torch.zeros(3 * hidden, dtype=dt)
    wq, wk = w_qkv[:hidden], w_qkv[hidden : 2 * hidden]
    bq, bk = b_qkv[:hidden], b_qkv[hidden : 2 * hidden]

    w = emb.word_embeddings(input_ids).to(dt)  # (b, n, hidden)
    if scheme_class(scheme).report.absolute_input:
        p = ctx.input_embedding[:n].to(dt).expand(b, n, hidden)  # the learned or fixed table
    else:
        p = torch.zeros_like(w)  # bert-a-d, tupe-*: positions do not enter the input

    # x = LN(w + p) = word + pos + beta, exactly, with the statistics of w + p.
    s = w + p
    if ln is not None:
        sigma = torch.sqrt(s.var(-1, unbiased=False, keepdim=True) + ln.eps)
        gamma = ln.weight.to(dt) if ln.weight is not None else torch.ones(hidden, dtype=dt)
        beta = ln.bias.to(dt) if ln.bias is not None else torch.zeros(hidden, dtype=dt)
        word = gamma * (w - w.mean(-1, keepdim=True)) / sigma
        pos = gamma * (p - p.mean(-1, keepdim=True)) / sigma
        # the layer's real input, by torch's own LayerNorm (in float64), for the direct computation below
        x = torch.nn.functional.layer_norm(s, (hidden,), gamma, beta, ln.eps)
    else:
        beta = torch.zeros(hidden, dtype=dt)
        word, pos, x = w, p, s

    qw, kw = _project(word, wq, None, heads), _project(word, wk, None, heads)
    # position side: pos W + (beta W + b): everything that does not depend on the token
    qp = _project(pos, wq, beta @ wq.t() + bq, heads)
    kp = _project(pos, wk, beta @ wk.t() + bk, heads)
    if ctx.query_add is not None:  # bert-a-d: (h, n, d) untied positional query / key
        qp = qp + ctx.query_add.to(dt)
        kp = kp + ctx.key_add.to(dt)

    terms = {
        "word_word": torch.matmul(qw, kw.transpose(-1, -2)) * scale,
        "word_pos": torch.matmul(qw, kp.transpose(-1, -2)) * scale,
        "pos_word": torch.matmul(qp, kw.transpose(-1, -2)) * scale,
        "pos_pos": torch.matmul(qp, kp.transpose(-1, -2)) * scale,
    }
    if (
        ctx.content_free is not None
    ):  # relative bias (bert-r) and TUPE's content-free term are position-to-position
        terms["pos_pos"] = terms["pos_pos"] + ctx.content_free.to(dt)

    # Direct computation of the logits from the layer's input, as the model's eager attention does it.
    q = _project(x, wq, bq, heads)
    k = _project(x, wk, bk, heads)
    if ctx.query_add is not None:
        q, k = q + ctx.query_add.to(dt), k + ctx.key_add.to(dt)
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    if ctx.content_free is not None:
        logits = logits + ctx.content_free.to(dt)
    return terms, logits


def _encoder(model):
    """The `TupeModel` inside a task model."""
    from tupe.modeling import TupeModel

    if isinstance(model, TupeModel):
        return model
    inner = getattr(model, "tupe", None)
    if isinstance(inner, TupeModel):
        return inner
    raise TypeError(f"expected a TupeModel or a model wrapping one, got {type(model).__name__}")


@torch.no_grad()
def decompose(model, blocks: torch.Tensor, batch_size: int = 8) -> Decomposition:
    """Average the four first-layer terms over `blocks` (num_blocks, n), per head and over heads, and check that
    they sum to the first layer's logits."""
    model = _encoder(model)
    model.eval()
    if blocks.ndim != 2 or blocks.shape[0] == 0:
        raise TupeError(
            f"need a non-empty (num_blocks, length) batch of token ids, got shape {tuple(blocks.shape)}"
        )
    sums: dict[str, torch.Tensor] = {}
    ex_rs: dict[str, float] = {}  # per example and head row std, summed over examples
    max_err = 0.0
    for start in range(0, blocks.shape[0], batch_size):
        ids = blocks[start : start + batch_size]
        terms, logits = first_layer_terms(model, ids)
        total = sum(terms.values())
        max_err = max(max_err, float((total - logits).abs().max()))
        terms["total"] = logits
        for name, t in terms.items():
            sums[name] = sums.get(name, 0) + t.sum(0)
            ex_rs[name] = ex_rs.get(name, 0.0) + float(_row_std(t).mean(-1).sum())
    per_head = {name: (t / blocks.shape[0]).float() for name, t in sums.items()}
    mean = {name: t.mean(0) for name, t in per_head.items()}
    dec = Decomposition(per_head, mean, blocks.shape[0], blocks.shape[1], max_err)
    dec.row_std_per_example = {name: v / blocks.shape[0] for name, v in ex_rs.items()}
    dec.stats = uniformity_stats(dec)
    return dec


def _row_std(m: torch.Tensor) -> torch.Tensor:
    """Mean over query rows of the standard deviation across keys (the part of a logit map the softmax sees)."""
    return m.std(-1, unbiased=False).mean(-1)


def uniformity_stats(dec: Decomposition) -> dict[str, dict[str, float]]:
    """How uniform each term is across positions (logit units).

    - row_std: mean over queries of the std across keys of the head-averaged map. A term that is constant along
      each row does not change the attention at all (softmax ignores per-query constants).
    - row_std_per_head: the same on each head's map, then averaged over heads (heads can cancel in the mean map).
    - row_std_per_example: the row std of each example's own map (per head), averaged over examples and heads:
      how much the term moves attention on a real input, before averaging over the text. A term can be uniform
      on average (word->position: no word prefers a position) yet vary on every single input.
    - col_std: mean over keys of the std across queries.
    - body_row_std: row_std without the first and last position (the special tokens [CLS] and [SEP]).
    - relative_row_std: row_std_per_head divided by that of the total logits: the term's share of the variation
      across keys. The paper's claim is that word->position and position->word are small here.
    - std, mean, min, max: of the head-averaged map.
    """
    out: dict[str, dict[str, float]] = {}
    total_rs = float(_row_std(dec.per_head["total"]).mean())
    for name in (*TERMS, "total"):
        m, ph = dec.mean[name], dec.per_head[name]
        body = m[1:-1, 1:-1] if m.shape[0] > 2 else m
        rs_head = float(_row_std(ph).mean())
        out[name] = {
            "row_std": float(_row_std(m)),
            "row_std_per_head": rs_head,
            "row_std_per_example": dec.row_std_per_example.get(name, float("nan")),
            "col_std": float(m.std(0, unbiased=False).mean()),
            "body_row_std": float(_row_std(body)),
            "relative_row_std": rs_head / total_rs if total_rs > 0 else float("nan"),
            "std": float(m.std(unbiased=False)),
            "mean": float(m.mean()),
            "min": float(m.min()),
            "max": float(m.max()),
        }
    return out
