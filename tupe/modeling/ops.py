"""Fast exact ops of the model outside attention: dropout with a faster mask, and the one-pass masked-LM loss.

Why (measured on the project's 2-core CPUs, see `docs/benchmarks.md`):
- `torch.nn.functional.dropout` on CPU draws its mask with `bernoulli_`, several times slower than 16 random bits
  per element and a comparison (`keep_scale_mask`, which the fused attention kernel's dropout uses too).
- `masked_lm_loss`: the decoder, its bias and the cross-entropy in one function whose softmax becomes the gradient.
"""

from __future__ import annotations

import math

import torch
from torch import nn


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
