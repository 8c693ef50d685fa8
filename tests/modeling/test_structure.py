"""The paper's structural facts about TUPE, and the backends' agreement with the eager reference."""

import pytest
import torch

import tupe
from tupe import TupeConfig, TupeForMaskedLM, TupeModel

from ..helpers import tiny_config

SCHEMES = list(tupe.POSITION_SCHEMES)


def test_tupe_a_adds_shared_projections_at_bert_base_size():
    """At BERT-Base size, TUPE-A has about 1.18 M more parameters than BERT-A: the shared U^Q, U^K."""
    with torch.device("meta"):
        bert = TupeModel(TupeConfig(position_scheme="bert-a"))
        tupe_a = TupeModel(TupeConfig(position_scheme="tupe-a"))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    extra = count(tupe_a) - count(bert)
    assert (
        2 * 768 * 768 <= extra <= 2 * 768 * 768 + 10 * 768
    )  # + their biases, the LayerNorm on p, two p_theta
    assert round(extra / 1e6, 2) == 1.18


def test_content_free_term_is_shared_by_all_layers():
    """One set of positional parameters for the whole encoder: none lives inside a layer."""
    model = TupeModel(tiny_config("tupe-r", num_hidden_layers=3))
    layer_params = {n for n, _ in model.layers.named_parameters()}
    assert not any("position" in n or "untied" in n or "relative" in n for n in layer_params)
    assert sum(1 for _ in model.positional.parameters()) > 0


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_theta1_changes_nothing_and_gets_no_gradient(implementation):
    model = TupeForMaskedLM(tiny_config("tupe-a")).eval()
    model.config._attn_implementation = implementation
    ids = torch.randint(5, 50, (2, 10))
    before = model(ids).logits
    with torch.no_grad():
        model.tupe.positional.untied.theta_positions[0].add_(torch.randn(16) * 5)
    after = model(ids).logits
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)
    model(ids).logits.square().sum().backward()
    grad = model.tupe.positional.untied.theta_positions.grad
    assert grad[1].abs().max() > 1e-6  # theta_2 matters
    assert grad[0].abs().max() < 1e-7  # theta_1 cancels in the softmax


def test_identical_tokens_attend_by_position_only():
    model = TupeModel(tiny_config("tupe-a")).eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for p in model.positional.parameters():
            p.add_(torch.randn_like(p))
    out = model(torch.full((1, 12), 9), output_attentions=True)
    torch.testing.assert_close(
        out.attentions[0][0], torch.softmax(model.positional_logits(12), -1), atol=1e-6, rtol=1e-5
    )


def test_theta2_changes_only_attention_to_cls():
    model = TupeModel(tiny_config("tupe-a")).eval()
    model.config._attn_implementation = "eager"
    ids = torch.randint(5, 50, (1, 10))
    bias_before = model.positional_logits(10)
    probs_before = model(ids, output_attentions=True).attentions[0]
    with torch.no_grad():
        model.positional.untied.theta_positions[1].add_(torch.randn(16) * 3)
    bias_after = model.positional_logits(10)
    probs_after = model(ids, output_attentions=True).attentions[0]
    changed = (bias_before - bias_after).abs() > 1e-7
    expected = torch.zeros_like(changed)
    expected[:, 1:, 0] = True
    assert torch.equal(changed, expected)
    # Relative attention among the non-[CLS] keys is untouched: only the weight on [CLS] moved.
    ratio = lambda p: p[..., 1:, 1:] / p[..., 1:, 1:].sum(-1, keepdim=True)  # noqa: E731
    torch.testing.assert_close(ratio(probs_before), ratio(probs_after), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(probs_before[..., 1:, 0], probs_after[..., 1:, 0])


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kernel", ["auto", "sdpa"])
def test_backends_agree_on_outputs_and_gradients(scheme, kernel):
    config = tiny_config(scheme, attention_kernel=kernel)
    ids = torch.randint(5, 50, (3, 14))
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 12:] = 0
    labels = torch.where(torch.rand(3, 14) < 0.3, ids, torch.full_like(ids, -100))
    results = {}
    for implementation in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = TupeForMaskedLM(config)
        model.config._attn_implementation = implementation
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.2)
        out = model(ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        results[implementation] = (
            out.logits,
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    (eager_logits, eager_grads), (sdpa_logits, sdpa_grads) = results["eager"], results["sdpa"]
    torch.testing.assert_close(sdpa_logits, eager_logits, atol=1e-5, rtol=1e-5)
    assert eager_grads.keys() >= sdpa_grads.keys()
    for name, grad in eager_grads.items():
        # The folded path never reads theta_1 (it cancels), so it has no gradient there at all.
        other = sdpa_grads.get(name, torch.zeros_like(grad))
        torch.testing.assert_close(other, grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_padding_is_invisible(scheme):
    model = TupeModel(tiny_config(scheme)).eval()
    ids = torch.randint(5, 50, (1, 10))
    mask = torch.ones(1, 10, dtype=torch.long)
    mask[0, 7:] = 0
    padded_a = model(ids, attention_mask=mask, output_attentions=True)
    ids_b = ids.clone()
    ids_b[0, 7:] = torch.randint(5, 50, (3,))
    padded_b = model(ids_b, attention_mask=mask)
    torch.testing.assert_close(padded_a.last_hidden_state[:, :7], padded_b.last_hidden_state[:, :7])
    for probs in padded_a.attentions:
        assert probs.shape == (1, 2, 10, 10)
        assert probs[..., 7:].abs().max() == 0


def test_the_saved_kernel_runs_and_output_attentions_says_what_it_fell_back_to():
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    model = TupeModel(tiny_config("tupe-r", attention_kernel="fused"))
    assert model.config._attn_implementation == "tupe_fused"  # the saved kernel is the runtime setting
    logging.get_logger(
        "tupe"
    ).warning_once.cache_clear()  # said once per process: forget earlier tests' passes
    with CaptureLogger(logging.get_logger("tupe.modeling.attention_interface")) as captured:
        out = model(torch.randint(5, 50, (2, 8)), output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 8, 8)
    assert "attention kernel 'tupe_fused' returns no attention probabilities" in captured.out
    assert "run 'eager'" in captured.out
    assert model.config._attn_implementation == "tupe_fused"  # the setting is kept: that pass said so


def test_unknown_scheme_lists_valid_ones():
    with pytest.raises(ValueError, match="bert-a-d.*tupe-r-tie-cls.*rope"):
        TupeConfig(position_scheme="tupe-x")


def test_too_long_input_names_both_numbers():
    model = TupeModel(tiny_config("tupe-a"))
    with pytest.raises(ValueError, match="41.*40"):
        model(torch.randint(5, 50, (1, 41)))
