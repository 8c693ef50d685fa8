"""The CUDA paths, checked on a GPU: every kernel against the eager reference, mixed precision, what "auto" picks,
and `tupe pretrain` (the Trainer) on the device.

On a GPU machine, from the repository root (no network needed; most of the time is compiling flex_attention:
one graph per logit scale, dtype and whether the term has a gradient, about 9 in all; `-k "not fp16"` saves a third
of them when time is short):

    python -m pytest tests/cuda -q -x -p no:cacheprovider -ra

For a one-shot run on a lent GPU, every result in a log, stopped cleanly (summary printed) before the limit:

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout -s INT 480 python -m pytest tests/cuda -v -p no:cacheprovider \
        -ra --maxfail=10 --durations=15 2>&1 | tee "$OUT/cuda_tests.log"

The cheap checks run first (the "auto" rule, refusals, the masked-LM loss, three `tupe pretrain` steps in fp32,
bf16 and fp16), then every kernel against eager in float32, then bf16 and fp16 autocast with "auto". Runtime
imports: torch (+ triton, for flex_attention), transformers, tokenizers, safetensors, accelerate, numpy, tqdm,
tensorboard, pytest; not `datasets`, `seqeval`, `sacremoses` or `hypothesis`.

Without CUDA (`torch.cuda.is_available()` false, as in CI) every test here is skipped with the reason.

Development aid: `TUPE_TEST_DEVICE=cpu python -m pytest tests/cuda -q -ra` runs the same file on the CPU, where
what the CPU has is checked the same way (flex_attention has no CPU backward: its forward only; bf16/fp16
pre-training needs a GPU: skipped), to catch bugs before a GPU is lent.

Tolerances (stated once here): float32 with TF32 off, every kernel's logits and every parameter's gradient within
1e-4 absolute + 1e-4 relative of the eager kernel's; bf16/fp16 autocast against the float32 eager reference: the
loss within `HALF_LOSS_RTOL` relative, every logit within `HALF_LOGITS_RTOL` of the largest |logit|, every
gradient finite, and the gradient (all parameters as one vector) at cosine similarity >= `HALF_GRAD_COSINE`.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tupe import POSITION_SCHEMES, TupeForMaskedLM
from tupe.modeling import resolve_attention_kernel
from tupe.modeling.kernel_registry import KernelSituation, get_attention_kernel, kernels_for_terms
from tupe.modeling.ops import masked_lm_loss
from tupe.modeling.positional import scheme_class

from ..helpers import tiny_config

DEVICE_NAME = os.environ.get("TUPE_TEST_DEVICE", "cuda")
DEVICE = torch.device(DEVICE_NAME)
ON_CUDA = DEVICE.type == "cuda"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        ON_CUDA and not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); TUPE_TEST_DEVICE=cpu runs it on the CPU",
    ),
]

ATOL = RTOL = 1e-4  # float32, TF32 off: kernel against eager
# measured on the CPU (sdpa/fused, 2026-11-26): loss <= 0.0017 / 0.0002, logits <= 0.032 / 0.0031, cosine >= 0.9994 /
# 0.99999 (bf16 / fp16) over every scheme
HALF_LOSS_RTOL = {torch.bfloat16: 0.02, torch.float16: 0.005}
HALF_LOGITS_RTOL = {torch.bfloat16: 0.08, torch.float16: 0.01}  # of the largest |logit|
HALF_GRAD_COSINE = {torch.bfloat16: 0.995, torch.float16: 0.999}
HALF = (torch.bfloat16, torch.float16)
BATCH, LENGTH, PADDED_FROM = 3, 37, 25  # row 1 is padding from position 25 on
MODEL = dict(vocab_size=100, hidden_size=64, num_attention_heads=4, intermediate_size=128)
MODEL.update(max_position_embeddings=64, num_hidden_layers=2)
FLOAT32_TRAIN = dict(dtype=torch.float32, training=True, grad=True, dropout=False)
UNCOMPILED_FLEX = "flex_attention called without torch.compile"


@pytest.fixture(scope="module")
def device() -> torch.device:
    """The device every test runs on: CUDA, or what TUPE_TEST_DEVICE names (development: `cpu`)."""
    return DEVICE


@pytest.fixture(scope="module", autouse=True)
def _exact_float32():
    """TF32 off (cuBLAS, cuDNN and so flex_attention's float32 Triton matmuls): float32 is float32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module", autouse=True)
def _every_flex_graph_compiled():
    """This file compiles flex_attention for many (scale, bias layout, dtype) combinations, each its own dynamo
    graph (a model has one or two): room for all of them, and an error instead of the silent unfused fallback
    past the limit."""
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    patch = {limit: 64}
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        patch["fail_on_recompile_limit_hit"] = True
    with cfg.patch(**patch):
        yield


def _config(scheme: str, **overrides):
    return tiny_config(scheme, **{**MODEL, **overrides})


def _batch(device: torch.device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, MODEL["vocab_size"], (BATCH, LENGTH), generator=g)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, PADDED_FROM:] = 0
    labels = torch.where(torch.rand(BATCH, LENGTH, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 1] = ids[:, 1]  # at least one predicted token per row
    labels[1, PADDED_FROM:] = -100
    return ids.to(device), mask.to(device), labels.to(device)


def _model(scheme: str, device: torch.device, kernel: str, **overrides) -> TupeForMaskedLM:
    """The same weights every time (seeded, moved off the init so every positional term matters), on `device`."""
    torch.manual_seed(0)
    model = TupeForMaskedLM(_config(scheme, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    _use(model, kernel)
    return model.to(device).train()  # dropout 0: train mode only changes what a kernel may do


def _use(model: TupeForMaskedLM, kernel: str) -> None:
    # the one runtime setting, as users set it on a built model
    model.set_attn_implementation(kernel)


@contextmanager
def _compiled_flex_only():
    """On CUDA flex_attention must run compiled: its unfused fallback would pass the comparisons while checking
    nothing of what users run (PyTorch warns once per process; `_every_flex_graph_compiled` makes dynamo's
    recompile limit an error)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    unfused = [str(w.message) for w in caught if UNCOMPILED_FLEX in str(w.message)]
    assert not (ON_CUDA and unfused), unfused[:1]


def _step(model, ids, mask, labels, dtype=None):
    """Forward (under autocast for a half dtype) and backward: (loss, logits, {name: grad})."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=dtype, enabled=dtype is not None):
        out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {
        name: p.grad.detach().float().clone() for name, p in model.named_parameters() if p.grad is not None
    }
    return out.loss.detach().float(), out.logits.detach().float(), grads


_REFERENCE: dict[tuple[str, str], tuple] = {}


def _eager_reference(scheme: str, device: torch.device):
    """The eager kernel's float32 loss, logits and gradients (computed once per scheme)."""
    key = (scheme, str(device))
    if key not in _REFERENCE:
        model = _model(scheme, device, "eager")
        assert resolve_attention_kernel(model) == "eager"
        _REFERENCE[key] = _step(model, *_batch(device))
    return _REFERENCE[key]


def _kernel_cases() -> list[tuple[str, str]]:
    """(scheme, kernel) for every registered kernel the registry lets run the scheme on this device in float32
    (read from the registry, so a new kernel or scheme is covered without editing this list)."""
    cases = []
    for scheme in POSITION_SCHEMES:
        terms = scheme_class(scheme).terms
        for name in kernels_for_terms(terms):
            if name in ("auto", "eager"):
                continue
            eval_ok = get_attention_kernel(name).refusal(KernelSituation(terms, DEVICE.type)) is None
            if eval_ok:
                cases.append((scheme, name))
    return cases


def _trains_here(scheme: str, kernel: str) -> bool:
    situation = KernelSituation(scheme_class(scheme).terms, DEVICE.type, **FLOAT32_TRAIN)
    return get_attention_kernel(kernel).refusal(situation) is None


def documented_auto(
    terms: frozenset[str], device: str, dtype: torch.dtype, trains: bool, dropout: bool
) -> str:
    """The rule of docs/model.md ("Attention kernels"), written out independently of the registry's `auto`
    entries: "fold" on GPUs where the term is low-rank; "fused" when training in float32/float64 on CPU with
    attention dropout or a content-free term that needs a gradient (a constant one, alibi's, is SDPA's mask);
    "flex" on CUDA for other content-free terms without dropout; else "sdpa"."""
    if device != "cpu" and "fold" in terms:
        return "fold"
    learned_term = "layer" in terms or ("content_free" in terms and "constant" not in terms)
    if device == "cpu" and trains and dtype in (torch.float32, torch.float64) and (dropout or learned_term):
        return "fused"
    if device == "cuda" and "content_free" in terms and not dropout:
        return "flex"
    return "sdpa"


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_auto_choice_follows_the_documented_rule(scheme: str, device: torch.device) -> None:
    """What "auto" picks on this device, float32/bfloat16/float16, training step / eval, attention dropout or not."""
    terms = scheme_class(scheme).terms
    for dropout_p in (0.0, 0.1):
        config = _config(scheme, attention_probs_dropout_prob=dropout_p)
        for dtype in (torch.float32, *HALF):
            for training in (True, False):
                got = resolve_attention_kernel(config, device, dtype, training, grad=training)
                want = documented_auto(terms, device.type, dtype, training, training and dropout_p > 0)
                assert got == want, (scheme, dtype, training, dropout_p)
        # output_attentions: the kernel that returns probabilities, whatever "auto" would pick
        assert (
            resolve_attention_kernel(config, device, torch.float32, True, grad=True, probabilities=True)
            == "eager"
        )
    # a model on the device resolves the same way from its own device, dtype and mode
    model = _model(scheme, device, "auto")
    assert resolve_attention_kernel(model) == documented_auto(terms, device.type, torch.float32, True, False)


def test_a_kernel_that_cannot_apply_is_refused(device: torch.device) -> None:
    ids, mask, labels = _batch(device)
    model = _model("tupe-r", device, "flex", attention_probs_dropout_prob=0.1)
    with pytest.raises(ValueError, match="'tupe_flex' has no attention dropout"):
        model(ids, attention_mask=mask, labels=labels)
    model = _model("tupe-a", device, "fused")
    with pytest.raises(ValueError, match="'tupe_fused' runs in float32/float64 only, not bfloat16"):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            model(ids, attention_mask=mask, labels=labels)
    with pytest.raises(ValueError, match="low-rank"):
        _config("tupe-r", attention_kernel="fold")
    with pytest.raises(ValueError, match="content-free"):
        _config("bert-a", attention_kernel="flex")


def test_masked_lm_loss_on_the_device(device: torch.device) -> None:
    """The one-pass masked-LM loss (float32 pre-training's head) equals linear + cross-entropy, with gradients."""
    g = torch.Generator().manual_seed(2)
    hidden, weight, bias = (torch.randn(*s, generator=g) for s in ((29, 64), (100, 64), (100,)))
    targets = torch.randint(0, 100, (29,), generator=g)
    leaves = [t.to(device).requires_grad_() for t in (hidden, weight, bias)]
    loss, logits = masked_lm_loss(*leaves, targets.to(device))
    (loss + logits.square().mean()).backward()
    got = [loss, logits, *(t.grad for t in leaves)]
    refs = [t.detach().clone().requires_grad_() for t in leaves]
    ref_logits = torch.nn.functional.linear(refs[0], refs[1], refs[2])
    ref_loss = torch.nn.functional.cross_entropy(ref_logits, targets.to(device))
    (ref_loss + ref_logits.square().mean()).backward()
    for a, b in zip(got, [ref_loss, ref_logits, *(t.grad for t in refs)]):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def _pretrain_precisions():
    for precision in ("fp32", "bf16", "fp16"):
        marks = []
        if precision != "fp32" and not ON_CUDA:
            marks = [
                pytest.mark.skip(reason=f"--precision {precision} needs a GPU (refused on the CPU by design)")
            ]
        yield pytest.param(precision, marks=marks, id=precision)


@pytest.mark.parametrize("precision", list(_pretrain_precisions()))
def test_pretrain_steps_on_the_device(
    precision: str, tiny_corpus, tiny_tokenizer_dir, cache_dir, tmp_path: Path, monkeypatch, device
) -> None:  # noqa: ANN001
    """Three Trainer steps through `tupe pretrain`'s command line (tupe-a: the folded kernel with attention
    dropout), in-process so the device, the compute dtype and the kernels the model ran can be seen: the
    command's parser and `pretrain()`, i.e. `tupe pretrain` without its library-verbosity wrapper
    (`runtime.hushed_libraries`, which imports `datasets`, which a GPU machine may lack)."""
    import tupe.modeling.modeling_tupe as modeling
    import tupe.training.pretrain as pretrain_module
    from tests.training.conftest import tiny_cli_args
    from tupe.cli import build_parser
    from tupe.training.arguments import config_from_args

    seen: dict = {"kernels": set()}
    select = modeling._select_kernel

    def recording_select(config, dev, dtype, training, grad, probabilities, *rest):
        kernel = select(config, dev, dtype, training, grad, probabilities, *rest)
        seen["kernels"].add((kernel.name, dev.type, dtype, training and grad))
        return kernel

    finish = pretrain_module._finish

    def recording_finish(run, trainer, *args, **kwargs):
        seen["device"] = next(trainer.model.parameters()).device
        seen["args"] = (trainer.args.bf16, trainer.args.fp16)
        return finish(run, trainer, *args, **kwargs)

    monkeypatch.setattr(modeling, "_select_kernel", recording_select)
    monkeypatch.setattr(pretrain_module, "_finish", recording_finish)
    out = tmp_path / "run"
    args = ["pretrain", "--out", str(out), "--scheme", "tupe-a", "--max-steps", "3", "--precision", precision]
    parsed = build_parser("pretrain").parse_args(
        [*args, *tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir)]
    )
    pretrain_module.pretrain(config_from_args(parsed))

    assert seen["device"].type == device.type
    assert seen["args"] == (precision == "bf16", precision == "fp16")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    want = documented_auto(scheme_class("tupe-a").terms, device.type, half, True, True)
    assert (want, device.type, half, True) in seen["kernels"], seen[
        "kernels"
    ]  # a training pass under autocast
    summary = json.loads((out / "pretrain_summary.json").read_text())
    assert summary["steps"] == 3 and math.isfinite(summary["final_eval_loss"]), summary
    losses = [
        json.loads(line)["loss"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), losses


@pytest.mark.parametrize("scheme, kernel", _kernel_cases(), ids=lambda v: str(v))
def test_kernel_matches_eager_in_float32(scheme: str, kernel: str, device: torch.device) -> None:
    """Logits and the gradient of every parameter equal the eager kernel's (padding in one row, dropout 0)."""
    ref_loss, ref_logits, ref_grads = _eager_reference(scheme, device)
    model = _model(scheme, device, kernel)
    ids, mask, labels = _batch(device)
    with _compiled_flex_only():
        if not _trains_here(scheme, kernel):  # e.g. flex on the CPU (no backward there): its forward only
            assert not ON_CUDA, f"{kernel} cannot train {scheme} on CUDA in float32"
            model.eval()
            assert resolve_attention_kernel(model) == kernel
            with torch.no_grad():
                logits = model(ids, attention_mask=mask).logits.float()
            torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=RTOL)
            return
        assert resolve_attention_kernel(model) == kernel
        loss, logits, grads = _step(model, ids, mask, labels)
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=RTOL)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=ATOL, rtol=RTOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
@pytest.mark.parametrize(
    "dtype", HALF, ids=lambda d: {torch.bfloat16: "bf16", torch.float16: "fp16"}[d]
)  # bf16 first
def test_mixed_precision_auto_close_to_float32(scheme: str, dtype: torch.dtype, device: torch.device) -> None:
    """bf16/fp16 autocast forward and backward with "auto" (the kernel it picks checked against the rule)."""
    ref_loss, ref_logits, ref_grads = _eager_reference(scheme, device)
    model = _model(scheme, device, "auto")
    kernel = resolve_attention_kernel(model, dtype=dtype)
    assert kernel == documented_auto(scheme_class(scheme).terms, device.type, dtype, True, False)
    with _compiled_flex_only():
        loss, logits, grads = _step(model, *_batch(device), dtype=dtype)
    assert torch.isfinite(loss) and torch.isfinite(logits).all(), kernel
    assert abs(loss.item() - ref_loss.item()) <= HALF_LOSS_RTOL[dtype] * ref_loss.item(), (
        kernel,
        loss,
        ref_loss,
    )
    worst = (logits - ref_logits).abs().max().item() / ref_logits.abs().max().item()
    assert worst <= HALF_LOGITS_RTOL[dtype], (kernel, worst)
    assert grads.keys() == ref_grads.keys()
    assert all(torch.isfinite(g).all() for g in grads.values()), kernel
    flat = torch.cat([grads[n].flatten() for n in ref_grads])
    ref_flat = torch.cat([g.flatten() for g in ref_grads.values()])
    cosine = torch.nn.functional.cosine_similarity(flat, ref_flat, dim=0).item()
    assert cosine >= HALF_GRAD_COSINE[dtype], (kernel, cosine)


def test_glue_first_batch_check_on_the_device(device, tmp_path: Path) -> None:
    """`tupe glue`'s finite-loss check before training: the model is on the device, the collated batch is built
    on the CPU (on the first GPU run every GLUE fine-tune failed here: 'index is on cpu')."""
    from transformers import DataCollatorWithPadding

    from tests.glue.fixtures import make_checkpoint, make_tokenizer
    from tupe.finetuning.pipeline.trainer import check_finite_start
    from tupe.modeling import TupeForSequenceClassification

    folder = make_checkpoint(tmp_path / "ckpt", scheme="tupe-a")
    model = TupeForSequenceClassification.from_pretrained(folder, num_labels=2).to(device)
    tok = make_tokenizer()
    rows = [dict(tok("the film was good ."), labels=1), dict(tok("the day was sad ."), labels=0)]
    check_finite_start(model, rows, DataCollatorWithPadding(tok), str(folder))  # raises on a device mismatch


def test_glue_command_on_the_device(device, tmp_path: Path) -> None:
    """A whole `tupe glue` grid (one lr, one seed) through the command line on the device: it finishes and
    scores the dev set."""
    from tests.glue.fixtures import make_checkpoint, write_task
    from tupe.cli import main as cli

    folder = make_checkpoint(tmp_path / "ckpt", scheme="tupe-r")
    write_task(tmp_path / "glue", "SST-2", n_train=16, n_dev=8)
    out = tmp_path / "out"
    argv = ["glue", "--model", str(folder), "--task", "SST-2", "--data-dir", str(tmp_path / "glue"),
            "--out", str(out), "--lrs", "1e-4", "--seeds", "1", "--epochs", "1", "--no-progress"]  # fmt: skip
    assert cli(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["complete"] and 0.0 <= result["best"]["main_median"] <= 1.0


def _document_cases() -> list[tuple[str, str]]:
    """(scheme, kernel) for every kernel that keeps documents apart and runs the scheme here (not eager)."""
    cases = []
    for scheme in POSITION_SCHEMES:
        terms = scheme_class(scheme).terms
        for name in kernels_for_terms(terms):
            situation = KernelSituation(terms, DEVICE.type, documents=True)
            if name not in ("auto", "eager") and get_attention_kernel(name).refusal(situation) is None:
                cases.append((scheme, name))
    return cases


@pytest.mark.parametrize("scheme, kernel", _document_cases(), ids=lambda v: str(v))
def test_documents_kernel_matches_eager_in_float32(scheme: str, kernel: str, device: torch.device) -> None:
    """Rows of several documents (position_ids restarting at 0, padding in one row): logits and gradients equal
    the eager kernel's (which tests/modeling/test_documents.py holds to each document alone)."""
    ids, mask, labels = _batch(device)
    positions = torch.stack([torch.arange(LENGTH) % m for m in (13, 9, 37)]).to(device)

    def run(name: str):
        model = _model(scheme, device, name)
        trains = name == "eager" or _trains_here(scheme, name)
        model.train(trains)
        with torch.set_grad_enabled(trains):
            out = model(ids, attention_mask=mask, labels=labels, position_ids=positions)
            if trains:
                out.loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
        return out.logits.detach().float(), grads, trains

    ref_logits, ref_grads, _ = run("eager")
    with _compiled_flex_only():
        logits, grads, trains = run(kernel)
    real = mask.bool()
    torch.testing.assert_close(logits[real], ref_logits[real], atol=ATOL, rtol=RTOL)
    if trains:
        for name, grad in ref_grads.items():
            torch.testing.assert_close(
                grads[name], grad, atol=ATOL, rtol=RTOL, msg=lambda m, n=name: f"{n}: {m}"
            )
