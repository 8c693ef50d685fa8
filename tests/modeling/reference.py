"""A naive, readable implementation of the equations in docs/model.md ("The schemes"), written independently of the
package.

It reads the model's weights by name and recomputes every layer in float64 with explicit per-head, per-position
formulas (each scheme's equation as its paper and docs/model.md write it), so it shares no code with `tupe.modeling`.
"""

from __future__ import annotations

import math

import torch


def t5_bucket(rel: int, num_buckets: int = 32, max_distance: int = 128) -> int:
    """T5 bidirectional bucket of one relative position `j - i`, in plain Python."""
    half = num_buckets // 2
    base = half if rel > 0 else 0
    dist = abs(rel)
    max_exact = half // 2
    if dist < max_exact:
        return base + dist
    value = max_exact + int(
        math.log(dist / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
    )
    return base + min(value, half - 1)


def alibi_slopes(heads: int) -> list[float]:
    """Press et al.'s `get_slopes` (ALiBi, ICLR 2022), as in their released code."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: heads - closest]


def sinusoid(pos: int, k: int, hidden: int) -> float:
    """Vaswani et al. (2017): PE(pos, 2i) = sin(pos / 10000^(2i / hidden)), PE(pos, 2i + 1) = cos(same angle)."""
    angle = pos / 10000 ** (2 * (k // 2) / hidden)
    return math.sin(angle) if k % 2 == 0 else math.cos(angle)


def deberta_bucket(rel: int, buckets: int, max_position: int) -> int:
    """DeBERTa-v2's log bucket of one relative position `i - j` (README of microsoft/DeBERTa, "log bucket"):
    offsets up to half the buckets in magnitude keep their value, larger ones are log-spaced, sign kept."""
    mid = buckets // 2
    if abs(rel) <= mid:
        return rel
    logged = math.ceil(math.log(abs(rel) / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return logged if rel > 0 else -logged


KERPLE_EPS = 1e-2  # chijames/KERPLE, megatron/mpu/layers.py: `self.eps = 1e-2` in both ParallelKerple classes


def kerple_bias(scheme: str, p: float, a: float, i: int, j: int) -> float:
    """One head's KERPLE bias for the pair (i, j), from the reference's equations (chijames/KERPLE at 73f1ee2,
    megatron/mpu/layers.py): `ParallelKerpleLog.forward` clamps `bias_p` and `bias_a` at `eps` and returns
    `-bias_p * log(1 + bias_a * diff)`; `ParallelKerplePower.forward` clamps `bias_p` to [eps, 2], `bias_a` at
    eps, and returns `-bias_a * diff ** bias_p`. `diff` is the reference's causal `i - j`; an encoder's `|i - j|`."""
    distance = abs(i - j)
    if scheme == "kerple-log":
        p, a = max(p, KERPLE_EPS), max(a, KERPLE_EPS)
        return -p * math.log(1 + a * distance)
    p, a = min(max(p, KERPLE_EPS), 2.0), max(a, KERPLE_EPS)
    return -a * distance**p


def fire_bias(params: dict, threshold: float, heads: int, i: int, j: int, normalizer: int) -> list[float]:
    """FIRE's bias of the pair (i, j) for every head (Li et al., ICLR 2024, eq. for `b(i, j)`; the FIRE class of
    mcleish7/arithmetic, cramming/architectures/embeddings.py): `psi(x) = log(|c x| + 1)`,
    `L = |multiplier * threshold|`, `x = sign(i - j) psi(|i - j|) / (psi(max(normalizer, L)) + 1e-6)`, then the
    MLP 1 -> width -> heads with ReLU. `normalizer`: the length N (the encoder's form) or the query position i."""
    c = float(params["distance_scale"])
    L = abs(float(params["threshold_multiplier"]) * threshold)
    psi = lambda v: math.log(abs(c * v) + 1)  # noqa: E731
    sign = (i > j) - (i < j)
    x = sign * psi(abs(i - j)) / (psi(max(normalizer, L)) + 1e-6)
    w1, b1 = params["mlp_in_weight"][:, 0].tolist(), params["mlp_in_bias"].tolist()
    hidden = [max(0.0, w * x + b) for w, b in zip(w1, b1)]
    w2, b2 = params["mlp_out_weight"].tolist(), params["mlp_out_bias"].tolist()
    return [sum(w * u for w, u in zip(w2[h], hidden)) + b2[h] for h in range(heads)]


def length_scheme_bias(
    scheme: str, cfg, sd: dict, prefix: str, pos: int | list[int], length: list[int] | None = None
) -> list:
    """[h][i][j] content-free term of fire / kerple-*, one pair at a time, in Python floats. `pos[i]`: token i's
    position (an int n: positions 0..n-1); `length[i]`: the length N of its document (FIRE's normaliser: 1 + the
    document's largest position; default: the number of positions)."""
    if isinstance(pos, int):
        pos = list(range(pos))
    n = len(pos)
    length = [n] * n if length is None else length
    heads = cfg.num_attention_heads
    params = {
        k[len(prefix + "positional.") :]: v for k, v in sd.items() if k.startswith(prefix + "positional.")
    }
    if scheme.startswith("kerple"):
        P, A = params["bias_p"].tolist(), params["bias_a"].tolist()
        return [
            [[kerple_bias(scheme, P[h], A[h], pos[i], pos[j]) for j in range(n)] for i in range(n)]
            for h in range(heads)
        ]
    out = [[[0.0] * n for _ in range(n)] for _ in range(heads)]
    for i in range(n):
        for j in range(n):
            normalizer = length[i] if cfg.fire_normalizer == "length" else pos[i]
            for h, value in enumerate(
                fire_bias(params, cfg.fire_threshold, heads, pos[i], pos[j], normalizer)
            ):
                out[h][i][j] = value
    return out


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def naive_forward(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: list[list[int]] | None = None,
    documents: list[list[int]] | None = None,
):
    """Returns (hidden states after every layer, attention probabilities of every layer, MLM logits or None).

    `position_ids[b][i]`: token i's position in row b (default i); `documents[b][i]`: its document (default one
    per row). Every formula reads positions, never column indices; a pair of two documents gets probability 0;
    [CLS] is a token at position 0."""
    cfg = model.config
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    prefix = "tupe." if any(k.startswith("tupe.") for k in sd) else ""
    g = lambda name: sd[prefix + name]  # noqa: E731
    scheme = cfg.position_scheme
    eps = cfg.layer_norm_eps
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    b, n = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones(b, n, dtype=torch.long)
    POS = position_ids if position_ids is not None else [list(range(n)) for _ in range(b)]
    DOC = documents if documents is not None else [[0] * n for _ in range(b)]
    # FIRE's N: 1 + the largest position of the token's document
    LENGTH = [
        [1 + max(POS[r][t] for t in range(n) if DOC[r][t] == DOC[r][i]) for i in range(n)] for r in range(b)
    ]

    # --- input: w_i (+ p_i for BERT-A / BERT-R) --------------------------------------------------------------
    x = g("embeddings.word_embeddings.weight")[input_ids]
    if scheme in ("bert-a", "bert-r"):
        x = x + g("positional.embeddings.weight")[torch.tensor(POS)]
    if scheme == "sinusoidal":
        H = cfg.hidden_size
        table = torch.tensor(
            [[[sinusoid(t, k, H) for k in range(H)] for t in row] for row in POS], dtype=torch.float64
        )
        x = (
            x + cfg.initializer_range * table
        )  # scaled as Vaswani et al.'s sqrt(d) on the words (docs/model.md)
    if cfg.embedding_layer_norm:
        x = layer_norm(x, g("embeddings.LayerNorm.weight"), g("embeddings.LayerNorm.bias"), eps)

    # --- untied positions: LN(p) U^Q, LN(p) U^K, per head -----------------------------------------------------
    untied = scheme.startswith("tupe") or scheme == "bert-a-d"
    if untied:

        def project(p):
            p = layer_norm(
                p, g("positional.untied.LayerNorm.weight"), g("positional.untied.LayerNorm.bias"), eps
            )
            pq = p @ g("positional.untied.pos_query.weight").T + g("positional.untied.pos_query.bias")
            pk = p @ g("positional.untied.pos_key.weight").T + g("positional.untied.pos_key.bias")
            return pq.view(-1, heads, d), pk.view(-1, heads, d)  # (m, h, d)

        PQ, PK = project(g("positional.untied.embeddings.weight")[torch.tensor(POS).reshape(-1)])
        PQ, PK = PQ.view(b, n, heads, d), PK.view(b, n, heads, d)  # row bi, token i: position POS[bi][i]
        if scheme in ("tupe-a", "tupe-r"):
            TQ, TK = project(g("positional.untied.theta_positions"))
            theta1 = (TQ[0] * TK[0]).sum(-1) / math.sqrt(2 * d)  # (h,)
            theta2 = (TQ[1] * TK[1]).sum(-1) / math.sqrt(2 * d)

    slopes = alibi_slopes(heads)

    def relative(h, i, j):  # i, j: positions
        table = g("positional.relative.bias.weight")  # (buckets [+1], h)
        if scheme == "tupe-r" and (i == 0 or j == 0):
            return table[cfg.relative_attention_num_buckets, h]  # the code's extra [CLS] bucket
        return table[
            t5_bucket(j - i, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance), h
        ]

    def rotate(v, positions):  # (n, d): pair (k, k + d/2) turned by angle pos * theta^(-2k/d)
        out = v.clone()
        for t, pos in enumerate(positions):
            for k in range(d // 2):
                angle = pos * cfg.rope_theta ** (-2 * k / d)
                a, c = v[t, k], v[t, k + d // 2]
                out[t, k] = a * math.cos(angle) - c * math.sin(angle)
                out[t, k + d // 2] = c * math.cos(angle) + a * math.sin(angle)
        return out

    if scheme == "deberta":  # the relative embeddings, LayerNorm-ed, and the row each offset i - j reads
        P = layer_norm(
            g("positional.relative.rel_embeddings.weight"),
            g("positional.relative.LayerNorm.weight"),
            g("positional.relative.LayerNorm.bias"),
            eps,
        )
        max_rel = (
            cfg.max_relative_positions if cfg.max_relative_positions >= 1 else cfg.max_position_embeddings
        )
        span = cfg.position_buckets if cfg.position_buckets > 0 else max_rel

        def rel_row(i, j):
            delta = (
                deberta_bucket(i - j, cfg.position_buckets, max_rel) if cfg.position_buckets > 0 else i - j
            )
            return min(max(delta + span, 0), 2 * span - 1)

    if scheme in ("kerple-log", "kerple-power", "fire"):
        length_bias = [length_scheme_bias(scheme, cfg, sd, prefix, POS[r], LENGTH[r]) for r in range(b)]

    hiddens, attentions = [], []
    for layer in range(cfg.num_hidden_layers):
        L = f"layers.{layer}."
        w_qkv, b_qkv = g(L + "attention.qkv.weight"), g(L + "attention.qkv.bias")
        H = cfg.hidden_size
        Q = (x @ w_qkv[:H].T + b_qkv[:H]).view(b, n, heads, d)
        K = (x @ w_qkv[H : 2 * H].T + b_qkv[H : 2 * H]).view(b, n, heads, d)
        V = (x @ w_qkv[2 * H :].T + b_qkv[2 * H :]).view(b, n, heads, d)
        if scheme == "deberta":  # this layer's own W^Q, W^K applied to the shared relative embeddings
            QR = (P @ w_qkv[:H].T + b_qkv[:H]).view(-1, heads, d)
            KR = (P @ w_qkv[H : 2 * H].T + b_qkv[H : 2 * H]).view(-1, heads, d)
        probs = torch.zeros(b, heads, n, n, dtype=torch.float64)
        context = torch.zeros(b, n, heads, d, dtype=torch.float64)
        for bi in range(b):
            for h in range(heads):
                q, k = Q[bi, :, h], K[bi, :, h]
                if scheme == "rope":
                    q, k = rotate(q, POS[bi]), rotate(k, POS[bi])
                logits = torch.zeros(n, n, dtype=torch.float64)
                for i in range(n):
                    for j in range(n):
                        word = q[i] @ k[j]
                        pi, pj = POS[bi][i], POS[bi][j]
                        if scheme in ("bert-a", "rope", "nope", "sinusoidal"):
                            a = word / math.sqrt(d)
                        elif scheme in ("bert-r", "t5"):
                            a = word / math.sqrt(d) + relative(h, pi, pj)
                        elif scheme == "deberta":  # content-to-content, -to-position, position-to-content
                            r = rel_row(pi, pj)
                            a = (word + q[i] @ KR[r, h] + k[j] @ QR[r, h]) / math.sqrt(3 * d)
                        elif scheme == "alibi":
                            a = word / math.sqrt(d) - slopes[h] * abs(pj - pi)
                        elif scheme in ("kerple-log", "kerple-power", "fire"):
                            a = word / math.sqrt(d) + length_bias[bi][h][i][j]
                        elif scheme == "bert-a-d":
                            pq, pk = PQ[bi, i, h], PK[bi, j, h]
                            a = (word + q[i] @ pk + pq @ k[j] + pq @ pk) / math.sqrt(4 * d)
                        else:  # tupe-*
                            v = PQ[bi, i, h] @ PK[bi, j, h] / math.sqrt(2 * d)
                            if scheme in ("tupe-a", "tupe-r"):
                                if pi == 0:
                                    v = theta1[h]
                                elif pj == 0:
                                    v = theta2[h]
                            if scheme in ("tupe-r", "tupe-r-tie-cls"):
                                v = v + relative(h, pi, pj)
                            a = word / math.sqrt(2 * d) + v
                        if attention_mask[bi, j] == 0 or DOC[bi][i] != DOC[bi][j]:
                            a = -math.inf
                        logits[i, j] = a
                p = torch.softmax(logits, dim=-1)
                probs[bi, h] = p
                context[bi, :, h] = p @ V[bi, :, h]
        attn = context.reshape(b, n, H) @ g(L + "attention_output.weight").T + g(L + "attention_output.bias")
        x = layer_norm(x + attn, g(L + "attention_norm.weight"), g(L + "attention_norm.bias"), eps)
        ffn = gelu(x @ g(L + "intermediate.weight").T + g(L + "intermediate.bias"))
        ffn = ffn @ g(L + "output.weight").T + g(L + "output.bias")
        x = layer_norm(x + ffn, g(L + "output_norm.weight"), g(L + "output_norm.bias"), eps)
        hiddens.append(x)
        attentions.append(probs)

    mlm = None
    if "lm_head.dense.weight" in sd:
        t = gelu(x @ sd["lm_head.dense.weight"].T + sd["lm_head.dense.bias"])
        t = layer_norm(t, sd["lm_head.LayerNorm.weight"], sd["lm_head.LayerNorm.bias"], eps)
        mlm = t @ g("embeddings.word_embeddings.weight").T + sd["lm_head.bias"]
    return hiddens, attentions, mlm
