"""Fast attention, dropout and masked-LM loss kernels behind the model, each exact against the plain formula.

Why these exist (measured on the project's 2-core CPUs, see `docs/benchmarks.md`):
- `torch.nn.functional.dropout` on CPU draws its mask with `bernoulli_`, several times slower than 16 random
  bits per element and a comparison (`keep_scale_mask`); with attention dropout, or with a content-free term as
  a mask that needs a gradient, SDPA on CPU falls back to its unfused "math" kernel, which materialises scores,
  scaled scores, biased scores, probabilities and dropped probabilities as separate n x n tensors.
  `biased_attention` keeps one n x n buffer in the forward pass (probabilities, softmax in place) plus the
  scaled keep mask, takes the content-free term (computed once per forward pass) as a broadcast (h, n, n)
  tensor, never a (b x h, n, n) copy, and returns its gradient summed over the batch.
- `masked_lm_loss`: the decoder, its bias and the cross-entropy in one function whose softmax becomes the gradient.
- `fold_queries_keys` turns a low-rank content-free term (TUPE-A) and the key padding into extra query/key
  columns, padded to a multiple of 8, so SDPA runs without any n x n tensor (long sequences). The query/key
  heads become wider than the value heads, which rules out SDPA's flash kernel; CUDA runs the memory-efficient one.
- `flex_bias_attention` (CUDA): `flex_attention` with the content-free term read inside the kernel (no dropout:
  `TupeModel` refuses it when training with attention dropout).
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Logit added to padded keys in the folded path: far below any real logit, so exp() underflows to exactly 0,
# yet finite (and representable in float16/bfloat16) so that 0 * it never produces NaN.
FOLD_PAD_LOGIT = -1.0e4


def keep_scale_mask(shape: torch.Size, p: float, like: torch.Tensor) -> torch.Tensor:
    """Float mask: 1 / (1 - p') where kept, 0 where dropped, each element dropped with probability p'.

    p' is p rounded to a multiple of 2^-16 (|p' - p| <= 2^-17; the rescaling uses p', so the mask stays
    unbiased): every element takes 16 random bits, so one 64-bit draw serves four elements. PyTorch's CPU
    generator is serial, and `torch.rand` spends a 32-bit draw and a float conversion per element, twice the
    time. A float mask because a bool one is converted to a float copy by every multiplication on CPU.
    """
    numel = math.prod(shape)
    words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=like.device)
    bits = words.random_(-(2**63), 2**63 - 1).view(torch.int16)[:numel].view(shape)  # uniform on int16
    dropped = round(p * 65536)  # number of the 65536 values that drop
    if dropped >= 65536:
        return torch.zeros(shape, device=like.device, dtype=like.dtype)
    keep = bits.to(torch.float32).ge_(dropped - 32768)
    return keep.mul_(65536 / (65536 - dropped)).to(like.dtype)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = keep_scale_mask(x.shape, p, x)
        ctx.save_for_backward(keep)
        return x * keep

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad * keep, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout, same distribution as `F.dropout`, with a faster mask draw on CPU."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    if x.device.type != "cpu":
        return nn.functional.dropout(x, p, True)
    return _Dropout.apply(x, p)


class FastDropout(nn.Dropout):
    """`nn.Dropout` (same state dict, same semantics) using `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class _BiasedAttention(torch.autograd.Function):
    """softmax(q k^T * scale + bias + padding) with dropout, times v; see `biased_attention`.

    Every product is an explicit `bmm` on contiguous (b*h, n, d) operands: `matmul` on the strided 4-D views that
    the fused QKV projection gives copies them inside each call, and (measured at the mini shape) ran the q k^T
    products at half speed. The scaled queries are kept for backward, so dk needs no rescaling.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, padding, scale: float, dropout_p: float):
        b, h, n, d = q.shape
        q3 = (q * scale).reshape(b * h, n, d)  # a new, contiguous tensor
        k3 = k.reshape(b * h, n, d).contiguous()
        v3 = v.reshape(b * h, n, d).contiguous()
        s = torch.bmm(q3, k3.transpose(1, 2))  # (b*h, n, n)
        s4 = s.view(b, h, n, n)
        if bias is not None:
            s4.add_(bias)  # (h, n, n) broadcast over the batch, never expanded
        if padding is not None:
            s4.add_(padding)
        torch.softmax(s, dim=-1, out=s)  # in place: the only n x n float buffer kept for backward
        keep = None
        if dropout_p > 0.0:
            keep = keep_scale_mask(s.shape, dropout_p, s)  # 0 or 1 / (1 - p)
            out = torch.bmm(s * keep, v3)
        else:
            out = torch.bmm(s, v3)
        ctx.save_for_backward(q3, k3, v3, s, keep)
        ctx.scale = scale
        ctx.bias_shape = None if bias is None else bias.shape
        return out.view(b, h, n, d)

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, probs, keep = ctx.saved_tensors
        b, h, n, d = dout.shape
        dout = dout.reshape(b * h, n, d)
        if keep is not None:
            buf = probs * keep  # the dropped, rescaled probabilities the forward multiplied v by
            dv = torch.bmm(buf.transpose(1, 2), dout) if ctx.needs_input_grad[2] else None
            torch.bmm(dout, v3.transpose(1, 2), out=buf)
            buf.mul_(keep)
        else:
            dv = torch.bmm(probs.transpose(1, 2), dout) if ctx.needs_input_grad[2] else None
            buf = torch.bmm(dout, v3.transpose(1, 2))
        # P * (dP - rowsum(dP * P)), written over dP (row by row: each row is read before it is written)
        ds = torch.ops.aten._softmax_backward_data.out(buf, probs, -1, probs.dtype, grad_input=buf)
        dq = torch.bmm(ds, k3).mul_(ctx.scale).view(b, h, n, d) if ctx.needs_input_grad[0] else None
        dk = torch.bmm(ds.transpose(1, 2), q3).view(b, h, n, d) if ctx.needs_input_grad[1] else None
        dv = None if dv is None else dv.view(b, h, n, d)
        dbias = None
        if ctx.bias_shape is not None and ctx.needs_input_grad[3]:
            ds4 = ds.view(b, h, n, n)
            if b == 1 and ds4.dim() == len(ctx.bias_shape) + 1:
                dbias = ds4[0]  # batch of one: a view, no reduction pass
            else:
                dbias = ds4.sum_to_size(ctx.bias_shape)
        return dq, dk, dv, dbias, None, None, None


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    padding: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention with an additive content-free term shared by the batch, for training on CPU.

    Args:
        q, k, v: (b, h, n, d). bias: (h, n, n) or None, differentiable (it carries TUPE's positional gradient).
        padding: (b, 1, 1, n) additive key mask (0 / dtype-min) or None. scale: factor on `q k^T`.
    Returns (b, h, n, d). Equal to the eager reference (same dropout distribution, up to p rounded to a
    multiple of 2^-16, see `keep_scale_mask`). Float32/float64 only: under autocast the caller uses SDPA instead.
    """
    return _BiasedAttention.apply(q, k, v, bias, padding, scale, dropout_p)


class _MaskedLMLoss(torch.autograd.Function):
    """Cross-entropy of `hidden @ weight^T + bias` (mean over rows), returning the logits too; see `masked_lm_loss`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets):
        logits = torch.addmm(bias, hidden, weight.t())  # (m, vocab), the bias added inside the GEMM
        picked = logits.gather(1, targets[:, None])
        top = logits.amax(1, keepdim=True)
        probs = torch.sub(logits, top).exp_()
        total = probs.sum(1, keepdim=True)
        count = max(targets.shape[0], 1)
        loss = (total.log() + top - picked).sum() / count
        probs.div_(total)  # softmax, kept for backward: its gradient is probs - one_hot
        ctx.save_for_backward(hidden, weight, probs, targets)
        ctx.count = count
        ctx.set_materialize_grads(False)
        return loss, logits

    @staticmethod
    def backward(ctx, grad_loss, grad_logits):
        # a second backward through the graph (retain_graph) fails here: autograd sees that `probs` was modified
        hidden, weight, probs, targets = ctx.saved_tensors
        grad = probs  # overwritten in place
        if grad_loss is None:
            grad.zero_()
        else:
            grad[torch.arange(grad.shape[0], device=grad.device), targets] -= 1.0
            grad.mul_(grad_loss / ctx.count)
        if grad_logits is not None:
            grad.add_(grad_logits)
        d_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        d_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        d_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
        return d_hidden, d_weight, d_bias, None


def masked_lm_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, logits) of the masked-LM decoder on the predicted rows, in one pass.

    hidden (m, d), weight (vocab, d), bias (vocab,), targets (m,) -> (scalar, (m, vocab)); the loss of no rows
    is 0. Equal to `F.cross_entropy(F.linear(hidden, weight) + bias, targets)`, and both outputs are
    differentiable, but it skips that path's separate bias pass, log-softmax backward and one-hot fill: the
    softmax computed for the loss is kept and becomes the gradient in place (so a second backward through the
    same graph, `retain_graph=True`, is refused by autograd). Float32/64 without autocast.
    """
    return _MaskedLMLoss.apply(hidden, weight, bias, targets)


def fold_queries_keys(
    q: torch.Tensor,
    k: torch.Tensor,
    fold: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    padding: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[q * scale, q_extra (, 1)] and [k, k_extra (, 0 or FOLD_PAD_LOGIT)], zero-padded to a multiple of 8.

    `(q' k'^T)_ij = scale q_i.k_j + positional_ij (+ padding_j)` up to a per-query constant, so SDPA with
    `scale=1` and no mask gives the reference attention. The padding column is per batch element, (b, h, n, 1);
    nothing of size n x n is built. The multiple-of-8 width keeps SDPA's memory-efficient CUDA kernel aligned;
    q/k are wider than v, so the flash kernel (equal widths only) does not apply.
    """
    b, h, n, d = q.shape
    q_extra, k_extra = fold
    q_extra = q_extra.to(q.dtype).expand(b, -1, -1, -1)
    k_extra = k_extra.to(k.dtype).expand(b, -1, -1, -1)
    q_parts, k_parts = [q * scale, q_extra], [k, k_extra]
    width = d + q_extra.shape[-1]
    if padding is not None:
        masked = padding.reshape(b, 1, n, 1) < 0  # (b, 1, n, 1): True for padded keys
        q_parts.append(q.new_ones(b, h, n, 1))
        k_parts.append(torch.where(masked, FOLD_PAD_LOGIT, 0.0).to(k.dtype).expand(b, h, n, 1))
        width += 1
    extra = -width % 8
    if extra:
        q_parts.append(q.new_zeros(b, h, n, extra))
        k_parts.append(k.new_zeros(b, h, n, extra))
    return torch.cat(q_parts, dim=-1), torch.cat(k_parts, dim=-1)


def flex_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    padding: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """`flex_attention` with the (h, n, n) content-free term added inside the kernel (no (b, h, n, n) tensor,
    no dropout: flex has none, so the model refuses this kernel when training with attention dropout). Compiled on CUDA; elsewhere PyTorch runs its unfused reference (for tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    keep = None if padding is None else (padding.reshape(padding.shape[0], -1) >= 0)

    def score_mod(score, b, h, q_idx, kv_idx):
        score = score + bias[h, q_idx, kv_idx]
        if keep is not None:
            score = torch.where(keep[b, kv_idx], score, -float("inf"))
        return score

    fn = _compiled_flex() if q.is_cuda else flex_attention
    return fn(q, k, v, score_mod=score_mod, scale=scale)


_COMPILED_FLEX = None


def _compiled_flex():
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX
