"""Build the benchmarked models and time them, interleaved, in one process.

Every candidate (a scheme x backend of `tupe`, plus transformers' `BertForMaskedLM` with SDPA as `hf-bert`) trains
on the same batch shape with the same optimizer; one round runs one step of every candidate in turn (rotating the
order each round), so that load from other processes on a shared machine hits every candidate alike and the
ratios stay meaningful even when absolute times move.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tupe.training.model import HF_BERT

from .flops import HF_DEBERTA, Shape, synchronize, train_step_flops


def backend_kernel(backend: str, scheme: str) -> str:
    """The attention kernel a backend (a kernel name of the registry, or an alias such as `sdpa-fold`, `default`)
    runs for a scheme; a kernel that cannot run the scheme is refused with the reason, never replaced."""
    from tupe.modeling.kernel_registry import check_kernel_for_scheme
    from tupe.modeling.positional import scheme_class

    return check_kernel_for_scheme(backend, scheme, scheme_class(scheme).terms, "backend")


def tupe_config(scheme: str, backend: str, shape: Shape, seq_len: int, **overrides):
    """The benchmarked `TupeConfig` of a scheme x backend (`overrides`: e.g. a tiny vocabulary)."""
    from tupe.modeling import TupeConfig

    values = dict(
        shape_config(shape, seq_len),
        position_scheme=scheme,
        attention_kernel=backend_kernel(backend, scheme),
        sparse_prediction=True,  # as `tupe pretrain` trains (tupe/training/model.py)
    )
    return TupeConfig(**{**values, **overrides})


def shape_config(shape: Shape, seq_len: int) -> dict:
    """Config values every benchmarked model shares (TUPE and transformers' BERT alike)."""
    return dict(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=max(seq_len, 512),
        hidden_dropout_prob=shape.dropout,
        attention_probs_dropout_prob=shape.dropout,
    )


@dataclass
class Candidate:
    """One model + optimizer + batch, and its timings."""

    label: str
    scheme: str
    backend: str
    kernel: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch: dict[str, torch.Tensor]
    flops: float
    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)
    peak_memory: int | None = None
    memory_method: str = ""
    # wraps every step of this candidate (e.g. SDPA restricted to its flash backend); None: nothing
    context: Callable[[], contextlib.AbstractContextManager] | None = None

    def step(self) -> None:
        with self.context() if self.context is not None else contextlib.nullcontext():
            self._step()

    def _step(self) -> None:
        loss = self.model(**self.batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def summary(self, tokens: int, peak_flops: float, peak_flops_cpu: float | None = None) -> dict:
        times = sorted(self.times)
        median = statistics.median(times)
        q1, q3 = (
            (statistics.quantiles(times, n=4, method="inclusive")[i] for i in (0, 2))
            if len(times) > 1
            else (median, median)
        )
        return {
            "label": self.label,
            "scheme": self.scheme,
            "backend": self.backend,
            "kernel": self.kernel,
            "step_s_median": median,
            "step_s_q1": q1,
            "step_s_q3": q3,
            "step_s_min": times[0],
            "step_s_max": times[-1],
            "steps_timed": len(times),
            "cpu_s_median": statistics.median(self.cpu_times) if self.cpu_times else None,
            "tokens_per_s": tokens / median,
            "model_tflops_per_step": self.flops / 1e12,
            "mfu": self.flops / median / peak_flops,
            "mfu_cpu_time": (
                self.flops / statistics.median(self.cpu_times) / peak_flops_cpu
                if peak_flops_cpu and self.cpu_times
                else None
            ),
            "peak_memory_bytes": self.peak_memory,
            "memory_method": self.memory_method,
        }


def make_batch(
    batch_size: int, seq_len: int, vocab_size: int, device: torch.device, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Packed full-length blocks (no padding, as RoBERTa full-sentences packing gives), 15% masked (at least 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=g)
    ids[:, 0] = 1  # [CLS]
    masked = torch.rand(batch_size, seq_len, generator=g) < 0.15
    masked[:, 0] = False
    masked[:, 1] = True
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    ids = torch.where(masked, torch.full_like(ids, 3), ids)  # [MASK]
    attention_mask = torch.ones_like(ids)
    return {
        k: t.to(device) for k, t in dict(input_ids=ids, attention_mask=attention_mask, labels=labels).items()
    }


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The recipe's optimizer, as `tupe pretrain` builds it (`tupe.training.optimizers`: AdamW, fused where PyTorch
    has the kernel for the model's device, the same parameter groups)."""
    from tupe.training.optimizers import DEFAULT_OPTIMIZER, OptimizerSettings, build_optimizer

    return build_optimizer(DEFAULT_OPTIMIZER, model, OptimizerSettings(lr=1e-4))


def build_tupe(
    scheme: str,
    backend: str,
    shape: Shape,
    seq_len: int,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
    compute_dtype: torch.dtype | None = None,
) -> Candidate:
    """A TupeForMaskedLM candidate; `compute_dtype` (the autocast dtype, if any) decides the kernel label."""
    from tupe.modeling import TupeForMaskedLM, resolve_attention_kernel

    config = tupe_config(scheme, backend, shape, seq_len)
    torch.manual_seed(0)
    model = TupeForMaskedLM(config).to(device=device, dtype=dtype).train()
    # the kernel a training step runs (refused here, before any timing, if it cannot run this step)
    resolved = resolve_attention_kernel(model, device, compute_dtype or dtype, training=True, grad=True)
    rows = int((batch["labels"] != -100).sum())
    flops = train_step_flops(shape, scheme, batch["input_ids"].shape[0], seq_len, rows)
    label = f"{scheme} [{backend}]"
    return Candidate(label, scheme, backend, resolved, model, _optimizer(model), batch, flops)


FLASH_BASELINE = (
    "sdpa-flash"  # the label of bert-a with SDPA restricted to its flash backend (--flash-baseline)
)


def flash_context(device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """SDPA restricted to its flash backend: a step it cannot serve (a mask, unequal head widths) fails instead of
    silently running another backend. The CPU has no flash kernel with dropout: there (the suite's dry run) the
    math backend is allowed as a fallback, and the label says `sdpa-flash` all the same."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION]
    if device.type != "cuda":
        backends.append(SDPBackend.MATH)
    return lambda: sdpa_kernel(backends)


def build_flash_baseline(
    shape: Shape,
    seq_len: int,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
    compute_dtype: torch.dtype | None = None,
) -> Candidate:
    """`bert-a` with the `sdpa` kernel and SDPA held to its flash backend (full blocks: no mask reaches SDPA)."""
    from tupe.modeling.positional import comparator_scheme

    scheme = comparator_scheme(HF_BERT)
    cand = build_tupe(scheme, "sdpa", shape, seq_len, batch, device, dtype, compute_dtype)
    cand.backend, cand.kernel, cand.label = FLASH_BASELINE, FLASH_BASELINE, f"{scheme} [{FLASH_BASELINE}]"
    cand.context = flash_context(device)
    return cand


def build_hf_bert(
    shape: Shape, seq_len: int, batch: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
) -> Candidate:
    """transformers' BertForMaskedLM, SDPA attention, same shape/vocabulary/dropout; its head predicts every row."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(**shape_config(shape, seq_len), pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = BertForMaskedLM(config).to(device=device, dtype=dtype).train()
    b = batch["input_ids"].shape[0]
    flops = train_step_flops(shape, HF_BERT, b, seq_len, b * seq_len)
    return Candidate(HF_BERT, HF_BERT, "sdpa", "sdpa", model, _optimizer(model), batch, flops)


def build_hf_deberta(
    shape: Shape, seq_len: int, batch: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
) -> Candidate:
    """transformers' DebertaV2ForMaskedLM with the `deberta` scheme's (DeBERTa-v3's) choices, same shape,
    vocabulary and dropout; its own attention (no SDPA path exists for it); its head predicts every row."""
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    config = DebertaV2Config(
        **shape_config(shape, seq_len),
        pad_token_id=0,
        **DEBERTA_V3_CHOICES,
    )
    torch.manual_seed(0)
    model = DebertaV2ForMaskedLM(config).to(device=device, dtype=dtype).train()
    b = batch["input_ids"].shape[0]
    flops = train_step_flops(shape, HF_DEBERTA, b, seq_len, b * seq_len)
    return Candidate(HF_DEBERTA, HF_DEBERTA, "eager", "eager", model, _optimizer(model), batch, flops)


# DebertaV2Config values of the released DeBERTa-v3 checkpoints, which the `deberta` scheme implements
DEBERTA_V3_CHOICES = dict(
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    share_att_key=True,
    position_buckets=256,
    max_relative_positions=-1,
    position_biased_input=False,
    norm_rel_ebd="layer_norm",
    type_vocab_size=0,
    layer_norm_eps=1e-7,
)


def time_interleaved(
    candidates: list[Candidate],
    device: torch.device,
    rounds: int,
    warmup: int,
    autocast_dtype: torch.dtype | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """`warmup` untimed rounds then `rounds` timed rounds; the order rotates every round.

    Wall time is what the targets use; the process's CPU time (all its threads) is recorded too: on a CPU shared
    with other jobs it moves less with their load (with `--threads 1` it is close to the work done).
    """
    ctx = (
        (lambda: torch.autocast(device.type, dtype=autocast_dtype))
        if autocast_dtype is not None
        else (lambda: torch.autocast(device.type, enabled=False))
    )
    order = list(range(len(candidates)))
    for r in range(warmup + rounds):
        for i in order:
            cand = candidates[i]
            synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
            with ctx():
                cand.step()
            synchronize(device)
            elapsed = time.perf_counter() - t0
            if r >= warmup:
                cand.times.append(elapsed)
                cand.cpu_times.append(time.process_time() - c0)
            if progress is not None:
                tag = "warm-up" if r < warmup else f"round {r - warmup + 1}/{rounds}"
                progress(f"{tag}: {cand.label} {elapsed:.3f} s")
        order = order[1:] + order[:1]


def state_bytes(candidate: Candidate) -> int:
    """Parameters + optimizer state held between steps (gradients are freed by zero_grad(set_to_none=True))."""
    total = sum(p.numel() * p.element_size() for p in candidate.model.parameters())
    for state in candidate.optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total


def measure_peak_memory(
    candidate: Candidate, device: torch.device, autocast_dtype: torch.dtype | None
) -> None:
    """Peak memory of one (untimed) training step: parameters + optimizer state + the step's transient peak.

    CUDA: the caching allocator's `max_memory_allocated`. CPU: PyTorch's profiler memory records, summed in
    time order at operator granularity (allocations freed inside a single operator are not seen).
    """
    ctx = (
        torch.autocast(device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else torch.autocast(device.type, enabled=False)
    )
    if device.type == "cuda":
        # every candidate is resident at once: the step's own rise above what was allocated before it, plus this
        # candidate's parameters and optimizer state (not the other models')
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        with ctx:
            candidate.step()
        torch.cuda.synchronize(device)
        rise = torch.cuda.max_memory_allocated(device) - before
        candidate.peak_memory = int(state_bytes(candidate) + rise)
        candidate.memory_method = "params+optimizer state + cuda max_memory_allocated rise during the step"
        return
    from torch.profiler import ProfilerActivity

    from .profiling import quiet_profile

    base = state_bytes(candidate)
    with quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, ctx:
        candidate.step()
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    candidate.peak_memory = base + peak
    candidate.memory_method = "params+optimizer state + profiler peak (op granularity)"
