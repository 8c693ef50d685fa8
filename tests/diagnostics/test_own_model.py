"""`diagnose_model` scores models trained by loops of their own on `training_batch`: a bag-of-words module and a
`nope` network, each trained here with plain Adam (not `tupe diagnose`'s loop), are held at chance on the tasks that
need order (exactly 1/2 on `order`) and give the position probe nothing to find, while the same network with rope,
trained the same way, answers `order`; a weightless module that copies by position answers every copy question; the
probe finds a position that the hidden states hold by construction."""

from __future__ import annotations

import pytest
import torch

from tupe.diagnostics.run import Settings, diagnose_model, fresh_vocabulary, training_batch
from tupe.modeling import TupeConfig, TupeForMaskedLM

SETTINGS = Settings(train_length=32, multiples=(1, 2), test_examples=64)


class BagOfWords(torch.nn.Module):
    """Each position's own token and the mean of the sequence's tokens, never where anything is."""

    def __init__(self, vocab_size: int, width: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, width)
        self.mix = torch.nn.Sequential(
            torch.nn.Linear(2 * width, 64), torch.nn.GELU(), torch.nn.Linear(64, width)
        )
        self.out = torch.nn.Linear(width, vocab_size)

    def states(self, input_ids: torch.Tensor) -> torch.Tensor:
        own = self.embed(input_ids)  # (rows, n, width)
        bag = own.mean(1, keepdim=True).expand_as(own)
        return self.mix(torch.cat([own, bag], -1))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.out(self.states(input_ids))  # (rows, n, vocab)


class ShiftCopier(torch.nn.Module):
    """No weights: the logits at position p are the one-hot of the token at p - 3 (the copy task's offset, read
    off the task's definition), whatever the task."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        source = torch.roll(input_ids, 3, dims=1)
        return torch.nn.functional.one_hot(source, self.vocab_size).float()


def _own_loop(model: torch.nn.Module, vocab, steps: int) -> float:
    """Plain Adam at a constant rate, cross-entropy on the questions: nothing of `tupe diagnose`'s loop."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        inputs, labels = training_batch(vocab, SETTINGS, seed=7, step=step)
        out = model(input_ids=inputs)
        logits = getattr(out, "logits", out)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def _held_at_chance(result: dict) -> None:
    lengths = {e["length"] for e in result["tasks"]}
    assert lengths == {32, 64}
    for e in result["tasks"]:
        acc = e["accuracy"]
        if e["task"] == "order":  # both markers: the same token in the same multiset, the same answer
            assert acc["value"] == acc["low"] == acc["high"] == 0.5, e
        else:
            assert acc["low"] <= e["chance"], e


def test_a_bag_of_words_trained_by_its_own_loop_is_held_at_chance():
    vocab = fresh_vocabulary(SETTINGS)
    torch.manual_seed(0)
    model = BagOfWords(vocab.size)
    before = _own_loop(model, vocab, 1)
    after = _own_loop(model, vocab, 150)
    assert after < before  # it did learn something: which tokens are answers, and which symbols are there
    result = diagnose_model(model, vocab, SETTINGS)
    _held_at_chance(result)
    assert (
        result["position_probe"] is None
    )  # a module of its own has no hidden states unless it is given them
    probed = diagnose_model(model, vocab, SETTINGS, hidden=model.states)
    assert probed["position_probe"]["r2"] < 0.05, probed["position_probe"]


@pytest.mark.parametrize("scheme", ["nope", "rope"])
def test_a_network_trained_by_its_own_loop_answers_order_only_with_positions(scheme):
    vocab = fresh_vocabulary(SETTINGS)
    torch.manual_seed(0)
    config = TupeConfig(
        position_scheme=scheme,
        vocab_size=vocab.size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
    )
    model = TupeForMaskedLM(config)
    _own_loop(model, vocab, 150)
    result = diagnose_model(model, vocab, SETTINGS)
    probe = result["position_probe"]  # the encoder's last hidden states, by default
    if scheme == "nope":
        _held_at_chance(result)
        assert probe["r2"] < 0.05, probe
    else:  # the same network and loop with rotary positions: which marker comes first, at 1x and 2x unextended
        order = {e["length"]: e for e in result["tasks"] if e["task"] == "order" and e["method"] == "none"}
        # far above chance (1/2, where nope is held exactly); how far depends on the CPU's float64/32 rounding
        # after 150 steps (at 32 tokens: 0.94 [0.89, 0.97] on an AVX2 CPU, above 0.9 at the low end on AVX-512)
        assert order[32]["accuracy"]["low"] > 0.75 and order[64]["accuracy"]["low"] > 0.75, order
        assert {e["method"] for e in result["tasks"] if e["length"] == 64} == {"none", "pi", "ntk", "yarn"}
        assert probe["r2"] > 0.1, probe


def test_a_weightless_copier_answers_every_copy_question_and_the_probe_finds_a_written_position():
    vocab = fresh_vocabulary(SETTINGS)
    result = diagnose_model(ShiftCopier(vocab.size), vocab, SETTINGS)
    copy = [e for e in result["tasks"] if e["task"] == "copy"]
    assert [e["length"] for e in copy] == [32, 64]  # a module has no extension methods: `none` only
    assert all(e["accuracy"]["value"] == e["accuracy"]["low"] == 1.0 for e in copy), copy

    def positions(ids: torch.Tensor) -> torch.Tensor:  # the position itself, and noise
        rows, n = ids.shape
        where = torch.arange(n, dtype=torch.float32).expand(rows, n)
        return torch.stack([where, torch.randn(rows, n, generator=torch.Generator().manual_seed(0))], -1)

    probed = diagnose_model(ShiftCopier(vocab.size), vocab, SETTINGS, hidden=positions)
    assert probed["position_probe"]["r2"] > 0.999 and probed["position_probe"]["positions"] == 30


def test_a_model_with_too_small_a_vocabulary_is_named():
    vocab = fresh_vocabulary(SETTINGS)
    with pytest.raises(
        ValueError, match=rf"small cannot read the tasks' token ids .* at least {vocab.size} ids"
    ):
        diagnose_model(BagOfWords(vocab.size - 10), vocab, SETTINGS, name="small")

    class NarrowHead(BagOfWords):  # reads every id, answers over fewer
        def forward(self, input_ids, attention_mask=None):
            return super().forward(input_ids)[..., :-10]

    with pytest.raises(ValueError, match=rf"narrow: its logits at a question are \(1, {vocab.size - 10}\)"):
        diagnose_model(NarrowHead(vocab.size), vocab, SETTINGS, name="narrow")


def test_results_of_ones_own_models_aggregate_over_seeds_as_the_commands_do():
    """`report.aggregate` and `report.markdown` take `diagnose_model` results named `<group>/seed-<s>`: one row
    per group with its interval over seeds; a group without hidden states has no probe cell."""
    from tupe.diagnostics.report import aggregate, markdown

    vocab = fresh_vocabulary(SETTINGS)
    results = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = BagOfWords(vocab.size)
        _own_loop(model, vocab, 20)
        results.append(diagnose_model(model, vocab, SETTINGS) | {"name": f"bag/seed-{seed}", "seed": seed})
    summary = aggregate(results)
    assert list(summary) == ["bag"] and summary["bag"]["seeds"] == [0, 1]
    order = summary["bag"]["cells"]["order@32/none"]
    assert order["above_chance"] == [0.0, 0.0] and order["mean"] == 0.0 and order["seeds"] == 2
    assert summary["bag"]["position_r2"] == {"values": []}
    text = markdown(summary, [32, 64], {})
    assert "| bag | +0.00 [+0.00, +0.00] |" in text and "| bag | - |" in text  # order; no probe
