"""Every fast attention path equals the eager reference: outputs and gradients of every parameter.

The eager path writes the logits exactly as docs/model.md's equations do (tests/modeling/test_equations.py checks it against an
independent float64 oracle); here each kernel of `TupeConfig.attention_kernel` is compared with it, with and
without padding, and the kernels' own building blocks are checked against plain formulas.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tupe import POSITION_SCHEMES, TupeConfig, TupeForMaskedLM
from tupe.modeling import (
    ATTENTION_KERNELS,
    AttentionKernel,
    register_attention_kernel,
    resolve_attention_kernel,
    unregister_attention_kernel,
)
from tupe.modeling.kernels import FOLD_PAD_LOGIT, biased_attention, fold_queries_keys
from tupe.modeling.ops import FastDropout, keep_scale_mask
from tupe.modeling.positional import SCHEMES

from ..helpers import tiny_config

KERNELS = ("sdpa", "fold", "fused", "auto")


def _named(kernel: str) -> str:
    """What `config._attn_implementation` reads for registry kernel `kernel`: transformers' own names for tupe's
    eager and sdpa kernels, the `tupe_` name of the others."""
    return kernel if kernel in ("eager", "sdpa") else f"tupe_{kernel}"


def _batch(n: int = 13):
    ids = torch.randint(5, 50, (3, n))
    mask = torch.ones(3, n, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 11:] = 0
    labels = torch.where(torch.rand(3, n) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 1] = ids[:, 1]  # at least one masked token per row
    return ids, mask, labels


def _run(config, kernel: str, ids, mask, labels):
    torch.manual_seed(0)
    model = TupeForMaskedLM(config)
    model.set_attn_implementation(kernel)
    with torch.no_grad():  # move away from the init so every term (theta, relative bias) matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


@pytest.mark.parametrize(
    "scheme, kernel",
    # only the kernels that apply: the others are refused (test_kernel_validated_against_scheme)
    [(s, k) for s in POSITION_SCHEMES for k in KERNELS if k in SCHEMES[s].kernels()],
)
@pytest.mark.parametrize("padded", [False, True])
def test_kernel_matches_eager_outputs_and_gradients(scheme, kernel, padded):
    config = tiny_config(scheme)
    ids, mask, labels = _batch()
    if not padded:
        mask = None
    ref_logits, ref_grads = _run(config, "eager", ids, mask, labels)
    logits, grads = _run(config, kernel, ids, mask, labels)
    torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("scheme", ["bert-r", "tupe-a", "tupe-r"])
def test_flex_kernel_matches_eager_forward(scheme):
    """flex_attention has no CPU backward; on CPU its (unfused) forward is checked, the GPU runs it compiled."""
    config = tiny_config(scheme)
    ids, mask, _ = _batch(16)
    outs = {}
    for kernel in ("eager", "flex"):
        torch.manual_seed(0)
        model = TupeForMaskedLM(config).eval()
        model.set_attn_implementation(kernel)
        with torch.no_grad():
            outs[kernel] = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(outs["flex"], outs["eager"], atol=2e-5, rtol=1e-5)


def _kernel(model, dtype=torch.float32, **kwargs) -> str:
    """The kernel the model's forward pass runs: the AttentionInputs it builds, and the public resolver agree."""
    name = model.tupe._attention_inputs(8, None, dtype, **kwargs).kernel.name
    assert (
        name
        == resolve_attention_kernel(model, dtype=dtype, **kwargs)
        == model.tupe.resolve_attention_kernel(dtype, **kwargs)
    )
    return name


def test_auto_kernel_choice_on_cpu():
    config = tiny_config("tupe-a", attention_probs_dropout_prob=0.1)
    model = TupeForMaskedLM(config)
    assert _kernel(model) == "fused"  # training with attention dropout: SDPA would run its math fallback
    assert _kernel(model, probabilities=True) == "eager"  # output_attentions: the kernel that returns them
    model.eval()
    assert _kernel(model) == "sdpa"
    model.set_attn_implementation("fold")
    assert _kernel(model) == "fold"
    model.set_attn_implementation("auto")
    assert model.config._attn_implementation == "sdpa"  # resolved at once: CPU, eval
    model.train()  # "auto" resolved again for the mode, whether or not a pass records gradients
    assert model.config._attn_implementation == "tupe_fused"
    with torch.no_grad():
        assert _kernel(model) == "fused"
    model.double()  # another dtype: the next pass resolves "auto" again and updates the setting
    model.config.attention_probs_dropout_prob = 0.0
    model.eval()
    model(torch.randint(5, 50, (1, 8)))
    assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_auto == ("cpu", torch.float64, False)
    # no dropout: a learned content-free term (or DeBERTa's per-layer one) still sends SDPA to its math kernel (its
    # mask needs a gradient), so "fused"; without a term, or with ALiBi's constant one, SDPA's flash kernel applies
    fused = ("tupe-a", "tupe-r", "t5", "deberta")
    for scheme in (*fused, "alibi", "bert-a", "rope", "nope"):
        expected = "fused" if scheme in fused else "sdpa"
        model = TupeForMaskedLM(tiny_config(scheme, attention_probs_dropout_prob=0.0))
        assert _kernel(model) == expected, scheme
        assert _kernel(model, torch.bfloat16) == "sdpa", scheme


def test_auto_kernel_choice_on_gpus_from_a_config():
    """The rules for devices this machine may lack, read from the config alone (no model, no GPU needed)."""
    cases = (
        ("tupe-a", "fold"),
        ("tupe-a-tie-cls", "fold"),
        ("tupe-r", "flex"),
        ("bert-r", "flex"),
        ("rope", "sdpa"),
    )
    for scheme, expected in cases:
        config = tiny_config(scheme)
        assert resolve_attention_kernel(config, "cuda", torch.bfloat16, training=True, grad=True) == expected
    # flex has no attention dropout: "auto" passes it over, an explicit request is refused
    config = tiny_config("tupe-r", attention_probs_dropout_prob=0.1)
    assert resolve_attention_kernel(config, "cuda", torch.float32, training=True, grad=True) == "sdpa"
    config.attention_kernel = "flex"  # the older name of the setting
    assert config._attn_implementation == "tupe_flex"
    with pytest.raises(ValueError, match="attn_implementation 'tupe_flex' has no attention dropout"):
        resolve_attention_kernel(config, "cuda", torch.float32, training=True, grad=True)


def test_fused_refuses_half_precision_instead_of_switching_kernel():
    model = TupeForMaskedLM(tiny_config("tupe-a", attention_kernel="fused"))
    assert _kernel(model) == "fused"
    with pytest.raises(ValueError, match="'tupe_fused' runs in float32/float64 only, not bfloat16"):
        _kernel(model, torch.bfloat16)


def test_kernel_validated_against_scheme():
    """A kernel that cannot apply to the scheme is refused with the reason, not silently replaced."""
    with pytest.raises(ValueError, match="low-rank"):
        TupeConfig(position_scheme="tupe-r", attention_kernel="fold")
    with pytest.raises(ValueError, match="content-free"):
        TupeConfig(position_scheme="bert-a", attention_kernel="flex")
    with pytest.raises(ValueError, match='Specified `attention_kernel="flash"` is not supported'):
        TupeConfig(attention_kernel="flash")
    model = TupeForMaskedLM(tiny_config("rope")).eval()
    with pytest.raises(ValueError, match="low-rank"):  # through transformers: checked at once
        model.set_attn_implementation("fold")
    with pytest.raises(ValueError, match="low-rank"):  # the setting's older name: the same setting, checked
        model.config.attention_kernel = "fold"
    with pytest.raises(ValueError, match="low-rank"):  # set directly, bypassing transformers: checked at once
        model.config._attn_implementation = "fold"
    assert model.config._attn_implementation == "sdpa"  # unchanged


def test_flex_refuses_attention_dropout_in_training():
    """flex_attention has no dropout: training with attention dropout must fail loudly, not drop it silently."""
    model = TupeForMaskedLM(tiny_config("tupe-r", attention_probs_dropout_prob=0.1, attention_kernel="flex"))
    with pytest.raises(ValueError, match="dropout"):
        model(torch.randint(5, 50, (1, 8)))
    model.eval()  # no dropout in eval mode: allowed
    assert _kernel(model) == "flex"
    model.train()
    model.config.attention_probs_dropout_prob = 0.0
    with pytest.raises(ValueError, match="no backward on cpu"):  # flex_attention has no CPU backward
        model(torch.randint(5, 50, (1, 8)))


def test_kernel_saved_and_overridden_at_load(tmp_path):
    """The setting is saved in config.json and read back into `config._attn_implementation`, which names what
    runs; `from_pretrained(attn_implementation=K)` sets it for the loaded model, and the model saves what it
    runs ("auto" stays "auto"); "sdpa" is tupe's SDPA kernel."""
    TupeForMaskedLM(tiny_config("tupe-a", attn_implementation="fold")).save_pretrained(tmp_path)
    assert '"attn_implementation": "tupe_fold"' in (tmp_path / "config.json").read_text()
    model = TupeForMaskedLM.from_pretrained(tmp_path)
    assert model.config._attn_implementation == "tupe_fold" and resolve_attention_kernel(model) == "fold"
    for name, expected in (
        ("sdpa", "sdpa"),
        ("fused", "fused"),
        ("eager", "eager"),
        ("flex_attention", "flex"),
        ("auto", "sdpa"),
    ):
        model = TupeForMaskedLM.from_pretrained(tmp_path, attn_implementation=name).eval()
        assert model.config._attn_implementation == _named(expected), name
        assert resolve_attention_kernel(model) == expected, name
        assert model.tupe.config is model.config  # the encoder (its own PreTrainedModel) sees the same choice
    model.save_pretrained(tmp_path / "again")
    assert '"attn_implementation": "auto"' in (tmp_path / "again" / "config.json").read_text()
    assert TupeForMaskedLM.from_pretrained(tmp_path / "again").config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    "name", ["flash_attention_2", "flash_attention_3", "paged|sdpa", "kernels-community/x"]
)
def test_unknown_attn_implementation_refused_in_one_line(tmp_path, name):
    TupeForMaskedLM(tiny_config("tupe-r")).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        TupeForMaskedLM.from_pretrained(tmp_path, attn_implementation=name)
    message = str(err.value)
    assert "\n" not in message and "http" not in message and "huggingface.co" not in message
    assert message.startswith(
        f'Specified `attn_implementation="{name}"` is not supported; valid: auto, tupe_eager, tupe_sdpa, '
        "tupe_fold, tupe_fused, tupe_flex"
    )
    assert "flex_attention=flex" in message
    model = TupeForMaskedLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is not supported"):
        model.set_attn_implementation(name)
    with pytest.raises(ValueError, match="is not supported"):  # set directly, bypassing transformers
        model.config._attn_implementation = name


@pytest.mark.parametrize(
    "head",
    ["TupeModel", "TupeForMaskedLM", "TupeForSequenceClassification", "TupeForTokenClassification",
     "TupeForQuestionAnswering", "TupeForMultipleChoice"],
)  # fmt: skip
def test_every_head_resolves_its_kernel_and_aliases_read_back_alike(tmp_path, head):
    """docs/model.md's `model.resolve_attention_kernel()` on the encoder and every head; "flex_attention" reads
    back as "flex" whether given to from_pretrained, set_attn_implementation or assigned to the config."""
    import tupe

    cls = getattr(tupe, head)
    cls(tiny_config("alibi")).save_pretrained(tmp_path)
    model = cls.from_pretrained(tmp_path).eval()
    assert (
        model.resolve_attention_kernel() == resolve_attention_kernel(model) == "sdpa"
    )  # CPU, eval, no dropout
    model.config._attn_implementation = "eager"
    assert model.resolve_attention_kernel() == "eager" and model.config._attn_implementation == "eager"
    readings = {
        "from_pretrained": cls.from_pretrained(tmp_path, attn_implementation="flex_attention").config,
        "set_attn_implementation": model.set_attn_implementation("flex_attention") or model.config,
    }
    assigned = cls.from_pretrained(tmp_path).config
    assigned._attn_implementation = "flex_attention"
    readings["config._attn_implementation"] = assigned
    assert {how: c._attn_implementation for how, c in readings.items()} == dict.fromkeys(
        readings, "tupe_flex"
    )
    assigned.attention_kernel = "flex_attention"
    assert (
        assigned.attention_kernel == tiny_config("alibi", attention_kernel="flex_attention").attention_kernel
    )
    assert assigned.attention_kernel == "flex"


def test_attn_implementation_refuses_a_kernel_the_scheme_cannot_run(tmp_path):
    TupeForMaskedLM(tiny_config("bert-a")).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="attn_implementation 'flex' needs a content-free logit term"):
        TupeForMaskedLM.from_pretrained(tmp_path, attn_implementation="flex_attention")
    with pytest.raises(ValueError, match="kernels for it: auto, eager, sdpa, fused"):
        TupeForMaskedLM.from_pretrained(tmp_path).set_attn_implementation("fold")


def test_set_attn_implementation_on_a_loaded_model(tmp_path):
    """`set_attn_implementation` switches the kernel of a loaded model; the outputs stay those of the reference."""
    TupeForMaskedLM(tiny_config("tupe-a")).save_pretrained(tmp_path)
    model = TupeForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask, _ = _batch()
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
    for name in ("eager", "fold", "fused", "sdpa", "auto", "flex_attention"):
        model.set_attn_implementation(name)
        expected = {"sdpa": "sdpa", "auto": "sdpa", "flex_attention": "flex"}.get(name, name)  # CPU, eval
        assert resolve_attention_kernel(model) == expected, name
        with torch.no_grad():
            torch.testing.assert_close(
                model(ids, attention_mask=mask).logits, reference, atol=2e-5, rtol=1e-5
            )
    model.set_attn_implementation("sdpa")  # the SDPA kernel, in training too
    model.train()
    assert model.config._attn_implementation == "sdpa" and resolve_attention_kernel(model) == "sdpa"
    model.set_attn_implementation("auto")
    assert resolve_attention_kernel(model) == "fused"  # "auto": CPU training with a content-free term


def test_a_registered_kernel_runs_a_model_and_is_gone_after_unregistering():
    """Adding a kernel is one function plus one registry entry: it becomes a valid `attention_kernel`, applies to
    the schemes its `needs` allow, runs every layer, and can be chosen by "auto"."""
    calls = []

    def toy(q, k, v, ctx, mask, dropout_p, probabilities):  # the eager formula, written out plainly
        calls.append(q.shape)
        logits = q @ k.transpose(-1, -2) * ctx.logit_scale + ctx.content_free + (0 if mask is None else mask)
        return torch.softmax(logits, -1) @ v, None

    register_attention_kernel(
        AttentionKernel(
            "toy", toy, "a test kernel", needs=frozenset({"content_free"}), auto=lambda s: not s.trains
        )
    )
    try:
        assert "toy" in ATTENTION_KERNELS and "toy" in SCHEMES["tupe-r"].kernels()
        assert "toy" not in SCHEMES["bert-a"].kernels()
        with pytest.raises(ValueError, match="needs a content-free logit term"):
            TupeConfig(position_scheme="rope", attention_kernel="toy")
        config = tiny_config("tupe-r", attention_kernel="toy")
        ids, mask, labels = _batch()
        ref_logits, ref_grads = _run(config, "eager", ids, mask, labels)
        logits, grads = _run(config, "toy", ids, mask, labels)
        assert len(calls) == config.num_hidden_layers
        torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-5)
        for name in ref_grads:
            torch.testing.assert_close(grads[name], ref_grads[name], atol=2e-5, rtol=1e-4, msg=name)
        model = TupeForMaskedLM(tiny_config("tupe-r")).eval()  # "auto" picks it by its own rule (no training)
        assert resolve_attention_kernel(model) == "toy"
        with pytest.raises(ValueError, match="already registered"):
            register_attention_kernel(AttentionKernel("toy", toy, "again"))
    finally:
        unregister_attention_kernel("toy")
    assert "toy" not in ATTENTION_KERNELS and "toy" not in SCHEMES["tupe-r"].kernels()
    with pytest.raises(ValueError, match='Specified `attention_kernel="toy"` is not supported'):
        TupeConfig(position_scheme="tupe-r", attention_kernel="toy")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_eager_softmax_runs_in_the_model_dtype(dtype):
    """The reference is exact in float64 (its softmax in float64), and float32 for half types."""
    from tupe.modeling.kernels import eager_attention
    from tupe.modeling.positional import PositionalContext

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    padding = torch.zeros(2, 1, 1, 6, dtype=dtype)
    padding[1, ..., 4:] = torch.finfo(dtype).min
    ctx = PositionalContext(0.5, content_free=bias.to(dtype))
    out, probs = eager_attention(q.to(dtype), k.to(dtype), v.to(dtype), ctx, padding, 0.0, True)
    assert out.dtype == probs.dtype == dtype
    exact = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + bias + padding.double().clamp(min=-1e300), -1)
    tol = {torch.float64: 1e-15, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(probs.double(), exact, atol=tol, rtol=0)
    assert probs[1, ..., 4:].abs().max() == 0
    torch.testing.assert_close(out.double(), exact @ v, atol=tol * 10, rtol=tol * 10)


def test_float64_eager_model_equals_the_fast_kernels_to_rounding():
    """With the softmax in float64, the eager reference and the float64 kernels agree to ~1e-15, not 1e-6."""
    config = tiny_config("tupe-r")
    ids, mask, labels = _batch()
    outs = {}
    for kernel in ("eager", "fused", "sdpa"):
        torch.manual_seed(0)
        model = TupeForMaskedLM(config).double()
        model.set_attn_implementation(kernel)
        outs[kernel] = model(ids, attention_mask=mask).logits
    for kernel in ("fused", "sdpa"):
        torch.testing.assert_close(outs[kernel], outs["eager"], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("scheme", ["tupe-a", "tupe-r", "bert-a", "rope"])
def test_export_with_a_padding_mask_and_dynamic_shapes(scheme):
    """No Python branch on tensor values: torch.export traces the forward with a mask, for every batch size and
    length, and the exported program equals the model at other shapes, with and without padding."""
    from torch.export import Dim, export

    model = TupeForMaskedLM(tiny_config(scheme)).eval()
    ids, mask, _ = _batch(12)
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=model.config.max_position_embeddings)
    dynamic = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    program = export(model, (ids,), {"attention_mask": mask}, dynamic_shapes=dynamic)
    for b, n, pad in ((1, 5, 0), (4, 17, 3), (2, 30, 0)):
        ids = torch.randint(5, 50, (b, n))
        mask = torch.ones(b, n, dtype=torch.long)
        mask[-1, n - pad :] = 0
        with torch.no_grad():
            expected = model(ids, attention_mask=mask).logits
        got = program.module()(ids, attention_mask=mask).logits
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _reference_attention(q, k, v, bias, padding, scale, p):
    """The eager formula, with the dropout mask drawn as `biased_attention` draws it (tested below)."""
    probs = torch.softmax(q @ k.transpose(-1, -2) * scale + bias + padding, dim=-1)
    return (probs * keep_scale_mask(probs.shape, p, probs)) @ v


def test_biased_attention_gradcheck_and_dropout():
    b, h, n, d = 2, 3, 7, 4
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(h, n, n, dtype=torch.float64, requires_grad=True)
    padding = torch.zeros(b, 1, 1, n, dtype=torch.float64)
    padding[1, ..., 5:] = torch.finfo(torch.float64).min
    assert torch.autograd.gradcheck(lambda *t: biased_attention(*t, padding, 0.3, 0.0), (q, k, v, bias))

    torch.manual_seed(1)
    out = biased_attention(q, k, v, bias, padding, 0.3, 0.2)
    grads = torch.autograd.grad((out * torch.arange(d)).sum(), (q, k, v, bias))
    torch.manual_seed(1)
    ref = _reference_attention(q, k, v, bias, padding, 0.3, 0.2)
    ref_grads = torch.autograd.grad((ref * torch.arange(d)).sum(), (q, k, v, bias))
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_biased_attention_saves_fewer_square_tensors():
    """The point of the fused path: the probabilities and the keep mask kept for backward, fewer than eager."""
    b, h, n, d = 1, 2, 24, 8
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    bias = torch.randn(h, n, n, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    for fn in ("fused", "eager"):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if fn == "fused":
                biased_attention(q, k, v, bias, None, 0.3, 0.1)
                # custom Functions save through ctx.save_for_backward, which the hooks also see
                fused = [t for t in saved if t.shape[-2:] == (n, n)]
            else:
                probs = torch.softmax(q @ k.transpose(-1, -2) * 0.3 + bias, -1)
                torch.nn.functional.dropout(probs, 0.1, True) @ v
                eager = [t for t in saved if t.shape[-2:] == (n, n)]
    assert [t.dtype for t in fused] == [torch.float32, torch.float32]  # probabilities, scaled keep mask
    assert len(eager) > len(fused)


def test_fast_dropout_distribution_and_gradient():
    x = torch.randn(400, 500, requires_grad=True)
    layer = FastDropout(0.1)
    y = layer(x)
    kept = y != 0
    p_used = round(0.1 * 65536) / 65536
    # 200k Bernoulli draws: the kept fraction is within 5 standard deviations of 1 - p
    assert abs(kept.float().mean().item() - (1 - p_used)) < 5 * (0.1 * 0.9 / x.numel()) ** 0.5
    torch.testing.assert_close(y[kept], x[kept] / (1 - p_used))
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, kept.float() / (1 - p_used))
    assert torch.equal(layer.eval()(x), x)
    assert FastDropout(1.0)(x).abs().sum() == 0


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1e-6])
def test_keep_mask_is_uniform_and_unbiased(p):
    """Every element independent Bernoulli: the kept fraction matches in every column and every block of rows,
    neighbouring elements (which share a 64-bit draw) are uncorrelated, and the mean of the mask is 1."""
    n = 256 * 1024
    mask = keep_scale_mask(torch.Size([n // 64, 64]), p, torch.empty(0))
    kept = (mask > 0).float()
    sd = (p * (1 - p) / n) ** 0.5 + 1e-12
    assert abs(mask.mean().item() - 1.0) < 6 * sd / (1 - p)
    for part in (
        kept[:, 0::4],
        kept[:, 1::4],
        kept[:, 2::4],
        kept[:, 3::4],
        kept[: n // 128],
        kept[n // 128 :],
    ):
        assert abs(part.mean().item() - (1 - p)) < 6 * sd * 2 + 1e-9
    if 0.01 < p < 0.99:
        flat = kept.flatten() - kept.mean()
        corr = (flat[:-1] * flat[1:]).mean() / flat.var()
        assert abs(corr.item()) < 6 / n**0.5


def test_fold_is_exact_padded_to_eight_and_builds_no_square_tensor():
    b, h, n, d, r = 2, 3, 11, 4, 5
    q, k = torch.randn(b, h, n, d), torch.randn(b, h, n, d)
    fold = (torch.randn(h, n, r), torch.randn(h, n, r))
    padding = torch.zeros(b, 1, 1, n)
    padding[1, ..., 7:] = torch.finfo(torch.float32).min
    qf, kf = fold_queries_keys(q, k, fold, 0.5, padding)
    assert qf.shape[-1] % 8 == 0 and qf.shape == kf.shape
    logits = qf @ kf.transpose(-1, -2)
    expected = q @ k.transpose(-1, -2) * 0.5 + fold[0] @ fold[1].transpose(-1, -2)
    keep = (padding >= 0).expand(b, h, n, n)
    torch.testing.assert_close(logits[keep], expected[keep])
    assert bool((logits[~keep] <= FOLD_PAD_LOGIT / 2).all())


class _ShapeRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def test_fold_path_never_builds_a_square_mask(monkeypatch):
    """With padding, the folded path hands SDPA no mask and builds no n x n tensor of its own (the released
    code expanded a (b x h, n, n) one per layer). SDPA itself is stubbed: which kernel it runs is the backend's business."""
    config = tiny_config("tupe-a")
    model = TupeForMaskedLM(config).eval()
    model.set_attn_implementation("fold")
    ids, mask, _ = _batch(13)
    b, n, h = ids.shape[0], ids.shape[1], config.num_attention_heads
    seen = []

    def stub(q, k, v, attn_mask=None, **kwargs):
        seen.append((attn_mask, q.shape[-1]))
        return v.new_zeros(*q.shape[:-1], v.shape[-1])

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", stub)
    recorder = _ShapeRecorder()
    with torch.no_grad(), recorder:
        model(ids, attention_mask=mask)
    assert len(seen) == config.num_hidden_layers
    assert all(m is None and width % 8 == 0 for m, width in seen)
    # not even the (h, n, n) content-free term: the folded pass never builds it (seq 8192 on GPU needs this)
    assert not any(len(s) >= 2 and s[-2:] == (n, n) for s in recorder.shapes), (b, h)


def test_content_free_term_computed_once_per_forward():
    config = tiny_config("tupe-r", num_hidden_layers=3)
    model = TupeForMaskedLM(config)
    calls = []
    model.tupe.positional.register_forward_hook(lambda *a: calls.append(1))
    ids, mask, labels = _batch()
    model(ids, attention_mask=mask, labels=labels).loss.backward()
    assert len(calls) == 1


def test_masked_lm_loss_equals_linear_plus_cross_entropy():
    """The fused head: loss, logits and the gradients of hidden, weight and bias, through either output."""
    from tupe.modeling.ops import masked_lm_loss

    torch.manual_seed(0)
    m, d, vocab = 9, 6, 17
    hidden = torch.randn(m, d, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, d, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (m,))
    inputs = (hidden, weight, bias)
    check = torch.randn(m, vocab, dtype=torch.float64)  # a downstream use of the logits as well

    def reference(h, w, b):
        logits = torch.nn.functional.linear(h, w) + b
        return torch.nn.functional.cross_entropy(logits, targets), logits

    for use_logits in (False, True):
        loss, logits = masked_lm_loss(*inputs, targets)
        ref_loss, ref_logits = reference(*inputs)
        torch.testing.assert_close(loss, ref_loss)
        torch.testing.assert_close(logits, ref_logits)
        extra = (lambda lg: (lg * check).sum()) if use_logits else (lambda lg: 0.0)
        grads = torch.autograd.grad(loss * 3 + extra(logits), inputs)
        ref_grads = torch.autograd.grad(ref_loss * 3 + extra(ref_logits), inputs)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r)
    # only the logits used (the loss ignored)
    _, logits = masked_lm_loss(*inputs, targets)
    g = torch.autograd.grad((logits * check).sum(), hidden)[0]
    torch.testing.assert_close(g, check @ weight)
    # no rows: loss 0, not NaN
    loss, logits = masked_lm_loss(hidden[:0], weight, bias, targets[:0])
    assert loss.item() == 0.0 and logits.shape == (0, vocab)
    loss.backward()
    # a second backward through the reused softmax buffer is refused by autograd, not silently wrong
    loss, _ = masked_lm_loss(*inputs, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()
