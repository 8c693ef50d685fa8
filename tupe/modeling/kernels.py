"""The attention kernels: one function each with the registry's signature (kernel_registry.py lists them),

    fn(q, k, v, ctx, mask, dropout_p, probabilities) -> (output, probabilities or None)

and the fast exact attention they are built on.

**Why the fast kernels exist** (measured on the project's 2-core CPUs, see `docs/benchmarks.md`):
- with attention dropout, or with a content-free term as a mask that needs a gradient, SDPA on CPU falls back to
  its unfused "math" kernel, which materialises scores, scaled scores, biased scores, probabilities and dropped
  probabilities as separate n x n tensors. `biased_attention` keeps one n x n buffer in the forward pass
  (probabilities, softmax in place) plus the scaled keep mask (`ops.keep_scale_mask`: 16 random bits per element
  instead of `bernoulli_`), takes the content-free term (computed once per forward pass) as a broadcast (h, n, n)
  tensor, never a (b x h, n, n) copy, and returns its gradient summed over the batch.
- `fold_queries_keys` turns a low-rank content-free term (TUPE-A) and the key padding into extra query/key
  columns, padded to a multiple of 8, so SDPA runs without any n x n tensor (long sequences). The query/key
  heads become wider than the value heads, which rules out SDPA's flash kernel; CUDA runs the memory-efficient one.
- `flex_bias_attention` (CUDA): `flex_attention` with the content-free term read inside the kernel (no dropout:
  the registry refuses it when training with attention dropout).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .context import PositionalContext
from .ops import keep_scale_mask


def eager_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """The reference: the logits exactly as written in docs/model.md, materialised; softmax in the model's dtype
    (float32 for float16/bfloat16), so the reference is exact in float64."""
    logits = torch.matmul(q, k.transpose(-1, -2)) * ctx.logit_scale  # (b, h, n, n)
    if ctx.content_free is not None:
        logits = logits + ctx.content_free.to(logits.dtype)
    if ctx.layer_logits is not None:
        logits = logits + ctx.layer_logits.to(logits.dtype)
    if mask is not None:
        logits = logits + mask.to(logits.dtype)
    half = logits.dtype in (torch.float16, torch.bfloat16)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32 if half else None).to(q.dtype)
    dropped = F.dropout(probs, dropout_p, True) if dropout_p > 0.0 else probs
    return torch.matmul(dropped, v), probs


def sdpa_mask(
    ctx: PositionalContext, padding: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """The content-free term plus the padding as one additive (1 or b, h, n, n) mask, once for all layers."""
    if ctx.content_free is None:
        return padding
    mask = ctx.content_free.to(dtype)
    if mask.dim() == 3:
        mask = mask[None]  # (1, h, n, n): broadcast over the batch (positions as data: already (b, h, n, n))
    if padding is not None:
        mask = (mask + padding).clamp(min=torch.finfo(dtype).min)
    return mask


def sdpa_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """`scaled_dot_product_attention` with `sdpa_mask` (plus this layer's `layer_logits`) as its additive mask."""
    mask = None if mask is None else mask.to(q.dtype)
    if ctx.layer_logits is not None:
        extra = ctx.layer_logits.to(q.dtype)
        mask = extra if mask is None else (extra + mask).clamp(min=torch.finfo(q.dtype).min)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=ctx.logit_scale
    ), None


def fold_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """Low-rank term and padding folded into extra query/key columns (`fold_queries_keys`): no n x n tensor at
    all. q/k end up wider than v, so SDPA's flash kernel does not apply; CUDA runs the memory-efficient one."""
    q, k = fold_queries_keys(q, k, ctx.fold, ctx.logit_scale, mask)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=1.0), None


def fused_attention(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """CPU training: one n x n buffer, the shared (h, n, n) term broadcast, the fast dropout mask; a layer's own
    (b, h, n, n) term (`layer_logits`) is added in the same buffer, and its gradient is the buffer's."""
    bias = ctx.content_free
    if ctx.layer_logits is not None:
        bias = ctx.layer_logits if bias is None else ctx.layer_logits + bias
    return biased_attention(q, k, v, bias, mask, ctx.logit_scale, dropout_p), None


def flex_block_mask(ctx: PositionalContext, padding: torch.Tensor | None, dtype: torch.dtype):
    """`flex`'s mask: the padding as it is, or with documents in a row a `BlockMask` whose `mask_mod` compares the
    tokens' document ids (and drops padded keys): no n x n tensor, and blocks of two documents are skipped."""
    positions = ctx.positions
    if positions is None or positions.documents is None:
        return padding
    from torch.nn.attention.flex_attention import create_block_mask

    documents = positions.documents
    keep = None if padding is None else (padding.reshape(padding.shape[0], -1) >= 0)
    b, n = documents.shape

    def mask_mod(batch, head, q_idx, kv_idx):
        same = documents[batch, q_idx] == documents[batch, kv_idx]
        return same if keep is None else same & keep[batch, kv_idx]

    return create_block_mask(mask_mod, b, None, n, n, device=documents.device)


def flex_attention_kernel(q, k, v, ctx: PositionalContext, mask, dropout_p: float, probabilities: bool):
    """`flex_attention` with the content-free term read in a score_mod (`flex_bias_attention`); with documents
    its `mask` is the document `BlockMask` of `flex_block_mask`."""
    if mask is not None and not isinstance(mask, torch.Tensor):  # a BlockMask: documents (and padding)
        return flex_bias_attention(q, k, v, ctx.content_free, None, ctx.logit_scale, block_mask=mask), None
    return flex_bias_attention(q, k, v, ctx.content_free, mask, ctx.logit_scale), None


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


# Logit added to padded keys in the folded path: far below any real logit, so exp() underflows to exactly 0,
# yet finite (and representable in float16/bfloat16) so that 0 * it never produces NaN.
FOLD_PAD_LOGIT = -1.0e4


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
    block_mask: Any = None,
) -> torch.Tensor:
    """`flex_attention` with the (h, n, n) (or, positions given as data, (b, h, n, n)) content-free term added
    inside the kernel; `block_mask`: a `BlockMask` (documents) passed through (no (b, h, n, n) tensor,
    no dropout: flex has none, so the model refuses this kernel when training with attention dropout). Compiled on CUDA; elsewhere PyTorch runs its unfused reference (for tests).

    Under autocast, q/k/v go in as the autocast dtype and flex runs with autocast off (older PyTorch has no
    autocast rule for the compiled flex_attention); the term is read as a contiguous float32 tensor.
    """
    from torch.nn.attention.flex_attention import flex_attention

    keep = None if padding is None else (padding.reshape(padding.shape[0], -1) >= 0)
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    # float32 at least (a term computed under autocast is bf16/fp16: its gradient is then summed in float32) and
    # contiguous (read along keys; a permuted relative-bias gather would be read strided, and compile anew)
    bias = bias.to(torch.promote_types(bias.dtype, torch.float32)).contiguous()

    per_row = bias.dim() == 4

    def score_mod(score, b, h, q_idx, kv_idx):
        score = score + (bias[b, h, q_idx, kv_idx] if per_row else bias[h, q_idx, kv_idx])
        if keep is not None:
            score = torch.where(keep[b, kv_idx], score, -float("inf"))
        return score

    fn = _compiled_flex() if q.is_cuda else flex_attention
    options = flex_kernel_options(q) if q.is_cuda else None
    with torch.autocast(device_type, enabled=False):
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, kernel_options=options)


# PyTorch's own flex configuration for 16-bit q/k/v of head width 64 on sm90 (H100/H200) is 128 x 128 blocks in 3
# stages; with our float32 (h, n, n) term read in the score_mod it needed 240 KiB of shared memory, over the 227 KiB
# limit, and did not compile (an H200, torch 2.11.0+cu130, 2026-11-27). 64 x 64 blocks compiled and ran the base
# shape's forward + backward in 1.16 ms against 1.30 ms for 128 x 64 (benchmarks/gpu/flex_probe.py, docs/benchmarks.md).
SM90_HALF_FLEX_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64}


def flex_kernel_options(q: torch.Tensor) -> dict | None:
    """`kernel_options` for the compiled flex_attention on CUDA: the JSON object in `$TUPE_FLEX_KERNEL_OPTIONS` if set
    (`{}` = PyTorch's own choice; e.g. `{"BLOCK_M": 64, "BLOCK_N": 64}`), else `SM90_HALF_FLEX_OPTIONS` for bf16/fp16
    on an sm90 GPU, else None (PyTorch's choice)."""
    import json
    import os

    text = os.environ.get("TUPE_FLEX_KERNEL_OPTIONS", "").strip()
    if text:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"TUPE_FLEX_KERNEL_OPTIONS is not JSON ({err}): {text!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"TUPE_FLEX_KERNEL_OPTIONS must be a JSON object, got {text!r}")
        return value or None
    if q.dtype in (torch.float16, torch.bfloat16) and torch.cuda.get_device_capability(q.device) == (9, 0):
        return dict(SM90_HALF_FLEX_OPTIONS)
    return None


_COMPILED_FLEX = None


def _compiled_flex():
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX
