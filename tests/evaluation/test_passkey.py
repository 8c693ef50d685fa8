"""`tupe evaluate --probe passkey`: blocks laid out as documented, a model that copies the earlier key scores 1
with the key and 0 with the decoy, a model that cannot copy scores the same on both (at chance), and the CLI."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from tupe.cli import main
from tupe.data.corpus import resolve_corpus
from tupe.errors import TupeError
from tupe.evaluation.evaluate import EvalModel, load_eval_model
from tupe.evaluation.passkey import (
    FILLER_AROUND,
    PasskeySettings,
    key_sentence,
    passkey_probe,
    probe_blocks,
)

from .conftest import save_tupe

TEMPLATE = "The pass key is {key}."
QUIET = dict(log=lambda m: None)


def test_key_sentence_is_the_tokenizers_own_cut_of_every_key(tokenizer):
    sentence = key_sentence(tokenizer, TEMPLATE, 5)
    rng = np.random.default_rng(0)
    assert sentence.digits.tolist() == list(
        range(10)
    )  # this tokenizer never saw a digit: each is its own byte
    for _ in range(20):
        key = rng.integers(0, 10, size=5)
        text = TEMPLATE.replace("{key}", " ".join(map(str, sentence.digits[key])))
        assert sentence.with_key(key).tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]
        pieces = tokenizer.convert_ids_to_tokens(sentence.with_key(key)[sentence.positions].tolist())
        assert [p.lstrip("Ġ") for p in pieces] == [str(d) for d in key]  # the masked tokens are the digits
    for bad in ("no key here", "{key} and {key}", "{key} {other}"):
        with pytest.raises(TupeError, match="--probe-template must hold"):
            key_sentence(tokenizer, bad, 5)


def test_digits_the_bpe_does_not_write_as_one_token_are_left_out_of_the_key():
    """A BPE that learnt ` 1` .. ` 9` but not ` 0` (as one trained on the books does) writes ` 0` as two tokens,
    which would shift the sentence: its keys use 1-9, chance 1/9."""
    from ..helpers import train_test_tokenizer

    lines = [
        "the pass key is " + " ".join(str(d) for d in np.random.default_rng(i).integers(1, 10, 8))
        for i in range(60)
    ]
    bpe = train_test_tokenizer(lines, vocab_size=300)
    assert (
        len(bpe(" 0", add_special_tokens=False)["input_ids"]) == 2
        and len(bpe(" 7", add_special_tokens=False)["input_ids"]) == 1
    )
    sentence = key_sentence(bpe, TEMPLATE, 4)
    assert sentence.digits.tolist() == list(range(1, 10)) and sentence.candidates.shape == (4, 9)
    key = np.array([0, 8, 3, 3])  # indices into the alphabet: digits 1 9 4 4
    ids = bpe(TEMPLATE.replace("{key}", "1 9 4 4"), add_special_tokens=False)["input_ids"]
    assert sentence.with_key(key).tolist() == ids
    _, decoys, at, keys = probe_blocks(sentence, np.arange(100, 200), 5, 30, seed=0, cls_id=1, mask_id=3)
    shown = decoys[:, 1 + FILLER_AROUND + sentence.positions]  # the decoy's digit tokens
    assert (shown != sentence.candidates[np.arange(4), keys]).all() and np.isin(
        shown, sentence.candidates
    ).all()


def test_blocks_hold_the_key_the_filler_and_the_masked_key_where_documented(tokenizer):
    sentence = key_sentence(tokenizer, TEMPLATE, 4)
    stream = np.arange(1000, 1400) % 300 + 30  # stand-in filler ids
    t, d = len(sentence.ids), 24
    key_b, decoy_b, masked_at, keys = probe_blocks(sentence, stream, d, 6, seed=3, cls_id=1, mask_id=3)
    again = probe_blocks(sentence, stream, d, 6, seed=3, cls_id=1, mask_id=3)
    assert all(np.array_equal(a, b) for a, b in zip((key_b, decoy_b, masked_at, keys), again))  # seeded
    assert key_b.shape == decoy_b.shape == (6, 1 + 2 * FILLER_AROUND + 2 * t + d)
    first, second = 1 + FILLER_AROUND, 1 + FILLER_AROUND + t + d
    assert masked_at.tolist() == (second + sentence.positions).tolist()
    for b in range(6):
        assert key_b[b, 0] == 1 and (key_b[b, masked_at] == 3).all()
        assert key_b[b, first : first + t].tolist() == sentence.with_key(keys[b]).tolist()
        differ = np.flatnonzero(key_b[b] != decoy_b[b])
        assert (
            differ.tolist() == (first + sentence.positions).tolist()
        )  # only the first key's digits, each one
        filler = np.concatenate([key_b[b, 1:first], key_b[b, first + t : second], key_b[b, second + t :]])
        assert len(filler) == 2 * FILLER_AROUND + d and np.isin(filler, stream).all()
    assert len({tuple(k) for k in keys}) == 6  # a key per block


@dataclasses.dataclass
class Copier(EvalModel):
    """Reads only its input: finds the template's words before the key (an induction-head's match), and puts all
    its mass at each masked position on the token found at the same place after that earlier match."""

    prefix: tuple[int, ...] = ()
    offsets: tuple[int, ...] = ()

    def logits_at(self, inputs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        out = []
        p = len(self.prefix)
        for row, sel in zip(inputs.tolist(), selected):
            start = next(
                i for i in range(len(row)) if tuple(row[i : i + p]) == self.prefix
            )  # the first sentence
            copied = [row[start + o] for o in self.offsets]
            for j in range(int(sel.sum())):
                logits = torch.zeros(len(self.tokenizer))
                logits[copied[j]] = 10.0
                out.append(logits)
        return torch.stack(out)


def _probe(models, text_file, **over):
    settings = PasskeySettings(
        **{"distances": (8, 40), "blocks": 40, "bootstrap": 200, "key_digits": 4, **over}
    )
    return passkey_probe(models, resolve_corpus([str(text_file)]), settings, **QUIET)


def test_the_probe_tells_a_copying_model_from_one_that_guesses(tmp_path, tokenizer, text_file):
    base = load_eval_model(save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=256))
    sentence = key_sentence(tokenizer, TEMPLATE, 4)
    p = int(sentence.positions[0])
    copier = Copier(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(EvalModel)},
        prefix=tuple(sentence.ids[:p].tolist()),
        offsets=tuple(sentence.positions.tolist()),
    )
    copier.name = "copier"
    result = _probe([copier, base], text_file)
    by = {(e["model"], e["distance"]): e for e in result["by_distance"]}
    for d in (8, 40):
        copy = by[("copier", d)]
        assert copy["accuracy"]["value"] == 1.0 and copy["guess_accuracy"]["value"] == 0.0
        assert copy["accuracy_minus_guess"]["low"] == 1.0
        random = by[(base.name, d)]  # an untrained model: no copying, so the key does not help it
        diff = random["accuracy_minus_guess"]
        assert diff["low"] <= 0.0 <= diff["high"], diff
        assert random["accuracy"]["low"] <= 0.1 <= random["accuracy"]["high"], random["accuracy"]  # chance
        assert len(random["per_block"]["recovered"]) == 40 and random["key_tokens"] == 160


def test_models_that_cannot_reach_a_distance_say_why_and_rope_extends(tmp_path, tokenizer, text_file):
    table = load_eval_model(save_tupe(tmp_path / "tupe-a", tokenizer, "tupe-a", max_len=128))
    rope = load_eval_model(save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=128))
    result = _probe([table, rope], text_file, distances=(0, 100), blocks=5, bootstrap=0, extend="yarn")
    by = {(e["model"], e["distance"]): e for e in result["by_distance"]}
    assert by[(table.name, 0)]["evaluated"] and by[(table.name, 0)]["block_length"] <= 128
    assert by[(rope.name, 0)]["evaluated"] and by[(rope.name, 0)]["note"] is None
    late = by[(table.name, 100)]
    assert not late["evaluated"] and late["note"].startswith("no positions beyond 128")
    n = by[(rope.name, 100)]["block_length"]
    assert by[(rope.name, 100)]["evaluated"]
    assert by[(rope.name, 100)]["note"] == f"rotary yarn, scale {n / 128:g} over 128 positions"


def test_cli_probe_writes_the_table_and_json_and_refuses_probe_options_without_it(
    tmp_path, tokenizer, text_file, capsys
):
    model = save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=64)
    out = tmp_path / "probe.json"
    args = [
        "evaluate",
        "--model",
        str(model),
        "--text",
        str(text_file),
        "--max-blocks",
        "2",
        "--bootstrap",
        "20",
    ]
    args += [
        "--probe",
        "passkey",
        "--probe-distances",
        "4,16",
        "--probe-blocks",
        "6",
        "--probe-key-digits",
        "3",
    ]
    assert main([*args, "--quiet", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "passkey probe" in printed and "accuracy - guess" in printed
    result = json.loads(out.read_text())
    assert [e["distance"] for e in result["passkey"]["by_distance"]] == [4, 16]
    assert result["passkey"]["settings"]["key_digits"] == 3 and "--probe passkey" in result["command"]
    assert main(["evaluate", "--model", str(model), "--text", str(text_file), "--probe-blocks", "6"]) == 2
    assert "--probe-blocks goes with --probe passkey" in capsys.readouterr().err
    assert (
        main(["evaluate", "--model", str(model), "--text", str(text_file), "--extend-positions", "pi"]) == 2
    )
    assert "--extend-positions goes with --lengths or --probe" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_rope_model_trained_to_copy_passes_and_its_untrained_start_does_not(tmp_path, tokenizer):
    """A real TupeForMaskedLM (rope, 2 layers) trained for 300 steps to fill masked key digits (blocks laid out as
    the probe's, other seeds, distances 0-23): its attention must find the earlier key, and the probe says so; the
    same network before training does not. (The probe gives no model anything but the blocks.)"""
    from tupe import TupeForMaskedLM

    from .conftest import make_documents, tiny_config

    sentence = key_sentence(tokenizer, TEMPLATE, 3)
    text = tmp_path / "filler.txt"
    text.write_text("\n\n".join(make_documents(40, seed=2)) + "\n")
    stream = np.asarray(tokenizer(text.read_text().replace("\n", " "), add_special_tokens=False)["input_ids"])
    torch.manual_seed(0)
    config = tiny_config(len(tokenizer), "rope", 128, hidden_size=64, intermediate_size=128)
    untrained = TupeForMaskedLM(config).eval()
    untrained.save_pretrained(tmp_path / "untrained")
    tokenizer.save_pretrained(tmp_path / "untrained")
    model = TupeForMaskedLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(300):
        d = int(np.random.default_rng([7, step]).integers(0, 24))
        blocks, _, at, keys = probe_blocks(sentence, stream, d, 16, seed=10_000 + step, cls_id=1, mask_id=3)
        labels = np.full_like(blocks, -100)
        labels[:, at] = sentence.candidates[np.arange(3), keys]
        loss = model(input_ids=torch.from_numpy(blocks), labels=torch.from_numpy(labels)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(tmp_path / "trained")
    tokenizer.save_pretrained(tmp_path / "trained")
    models = [load_eval_model(tmp_path / "trained"), load_eval_model(tmp_path / "untrained")]
    result = _probe(models, text, distances=(8, 20), blocks=60, key_digits=3)
    by = {(e["model"], e["distance"]): e for e in result["by_distance"]}
    for d in (8, 20):
        trained, start = by[(models[0].name, d)], by[(models[1].name, d)]
        assert trained["accuracy_minus_guess"]["low"] > 0.2, trained  # it copies
        assert trained["guess_nll_minus_nll"]["low"] > 0
        assert start["accuracy_minus_guess"]["low"] <= 0.0 <= start["accuracy_minus_guess"]["high"], start


@pytest.mark.parametrize(
    ("probe_args", "message"),
    [
        (["--probe-template", "no key here"], "--probe-template must hold {key} exactly once"),
        (["--probe-distances", "100000"], "(--probe-text, default: --text) has"),
        (["--probe-text", "MISSING"], "MISSING"),
    ],
)
def test_probe_inputs_are_refused_before_the_loss_evaluation(
    tmp_path, tokenizer, text_file, capsys, probe_args, message
):
    """A probe that cannot run says so before minutes of loss evaluation, not after its table: nothing on stdout."""
    model = save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=64)
    probe_args = [str(tmp_path / a) if a == "MISSING" else a for a in probe_args]
    argv = [
        "evaluate",
        "--model",
        str(model),
        "--text",
        str(text_file),
        "--max-blocks",
        "2",
        "--bootstrap",
        "0",
    ]
    assert main([*argv, "--probe", "passkey", "--probe-blocks", "2", *probe_args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""  # the loss table was never printed: the error came first
