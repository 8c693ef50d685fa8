"""`tupe evaluate --probe passkey`: blocks laid out as documented; models written here, each reading only its input
blocks (independent of the probe's code), score what they can do: an exact copier copies 1.0 at every distance; a
bag-of-symbols model, a unigram model and a model without positions trained to copy all score copying 0; a tiny
rope model trained to copy scores above 0 at short distances; and the CLI."""

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
    MIN_KEY_DIGITS,
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
    sentence = key_sentence(bpe, TEMPLATE, 5)
    assert sentence.digits.tolist() == list(range(1, 10)) and sentence.candidates.shape == (5, 9)
    key = np.array([0, 8, 3, 3, 5])  # indices into the alphabet: digits 1 9 4 4 6
    ids = bpe(TEMPLATE.replace("{key}", "1 9 4 4 6"), add_special_tokens=False)["input_ids"]
    assert sentence.with_key(key).tolist() == ids
    blocks = probe_blocks(sentence, np.arange(100, 200), 5, 30, seed=0, cls_id=1, mask_id=3)
    shown = blocks.decoy[:, 1 + FILLER_AROUND + sentence.positions]  # the decoy's digit tokens
    assert (shown != sentence.candidates[np.arange(5), blocks.keys]).all() and np.isin(
        shown, sentence.candidates
    ).all()


def test_blocks_hold_the_key_the_filler_and_the_masked_key_where_documented(tokenizer):
    sentence = key_sentence(tokenizer, TEMPLATE, 5)
    stream = np.arange(1000, 1400) % 300 + 30  # stand-in filler ids
    t, d = len(sentence.ids), 24
    blocks = probe_blocks(sentence, stream, d, 6, seed=3, cls_id=1, mask_id=3)
    again = probe_blocks(sentence, stream, d, 6, seed=3, cls_id=1, mask_id=3)
    names = ("key", "decoy", "permuted", "masked_at", "keys")
    assert all(np.array_equal(getattr(blocks, f), getattr(again, f)) for f in names)  # seeded
    key_b, decoy_b, perm_b, masked_at, keys = (getattr(blocks, f) for f in names)
    assert key_b.shape == decoy_b.shape == perm_b.shape == (6, 1 + 2 * FILLER_AROUND + 2 * t + d)
    first, second = 1 + FILLER_AROUND, 1 + FILLER_AROUND + t + d
    key_at = first + sentence.positions
    assert masked_at.tolist() == (second + sentence.positions).tolist()
    for b in range(6):
        assert key_b[b, 0] == 1 and (key_b[b, masked_at] == 3).all()
        assert key_b[b, first : first + t].tolist() == sentence.with_key(keys[b]).tolist()
        assert len(set(keys[b].tolist())) == 5  # distinct digits
        for other in (decoy_b, perm_b):  # only the first key's digits differ, each one
            assert np.flatnonzero(key_b[b] != other[b]).tolist() == key_at.tolist()
        # the permuted key holds the same digits, none in its place
        assert sorted(perm_b[b, key_at].tolist()) == sorted(key_b[b, key_at].tolist())
        filler = np.concatenate([key_b[b, 1:first], key_b[b, first + t : second], key_b[b, second + t :]])
        assert len(filler) == 2 * FILLER_AROUND + d and np.isin(filler, stream).all()
    assert len({tuple(k) for k in keys}) == 6  # a key per block


def test_keys_need_five_distinct_digits_the_tokenizer_writes_alone(tokenizer):
    """A bag-of-symbols guess is at most 1 in k: fewer than 5 digits, or more than the tokenizer's key alphabet
    holds, is a one-line error naming the option."""
    with pytest.raises(TupeError, match=f"--probe-key-digits must be at least {MIN_KEY_DIGITS}"):
        key_sentence(tokenizer, TEMPLATE, 4)
    with pytest.raises(TupeError, match="writes 10 digit.s. as one token each .* needs 11"):
        key_sentence(tokenizer, TEMPLATE, 11)


# Models that read only their input blocks, written from the probe's documented layout, not from its code: each
# knows the tokenizer (as any model does) and what its skill lets it see.


def _digit_ids(tokenizer) -> list[int]:
    """The ids of the tokens that spell one digit (with or without the byte-level space mark)."""
    vocab = tokenizer.get_vocab()
    return sorted(i for t, i in vocab.items() if len(t.lstrip("Ġ")) == 1 and t.lstrip("Ġ").isdigit())


@dataclasses.dataclass
class Copier(EvalModel):
    """An exact copier: finds the first "The pass key is" in the block (an induction head's match) and puts all its
    mass at the j-th masked position on the j-th digit token after it."""

    def logits_at(self, inputs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        prefix = self.tokenizer("The pass key is", add_special_tokens=False)["input_ids"]
        digits = set(_digit_ids(self.tokenizer))
        out = []
        for row, sel in zip(inputs.tolist(), selected):
            start = next(i for i in range(len(row)) if row[i : i + len(prefix)] == prefix) + len(prefix)
            key = [t for t in row[start : start + 4 * int(sel.sum())] if t in digits]
            for j in range(int(sel.sum())):
                out.append(torch.zeros(len(self.tokenizer)).index_fill_(0, torch.tensor(key[j]), 10.0))
        return torch.stack(out)


@dataclasses.dataclass
class BagOfSymbols(EvalModel):
    """Knows which digits the block holds, not where: at the j-th masked position it answers the j-th smallest
    digit present (the largest where fewer are present): a different guess per place, so its accuracy with the key
    is above chance."""

    def logits_at(self, inputs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        digits = set(_digit_ids(self.tokenizer))
        out = []
        for row, sel in zip(inputs.tolist(), selected):
            present = sorted(digits & set(row))
            for j in range(int(sel.sum())):
                out.append(
                    torch.zeros(len(self.tokenizer)).index_fill_(
                        0, torch.tensor(present[min(j, len(present) - 1)]), 10.0
                    )
                )
        return torch.stack(out)


@dataclasses.dataclass
class Unigram(EvalModel):
    """The text's unigram distribution at every masked position, whatever the block holds."""

    log_frequency: torch.Tensor | None = None

    def logits_at(self, inputs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        return self.log_frequency.expand(int(selected.sum()), -1).clone()


def _as(cls, base: EvalModel, name: str, **extra) -> EvalModel:
    model = cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(EvalModel)}, **extra)
    model.name = name
    return model


def _probe(models, text_file, **over):
    settings = PasskeySettings(**{"distances": (8, 40), "blocks": 40, "bootstrap": 200, **over})
    return passkey_probe(models, resolve_corpus([str(text_file)]), settings, **QUIET)


def _holds_zero(ci: dict) -> bool:
    return ci["low"] <= 0.0 <= ci["high"]


def test_an_exact_copier_copies_and_models_that_know_only_which_digits_occur_do_not(
    tmp_path, tokenizer, text_file
):
    base = load_eval_model(save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=256))
    ids = tokenizer(text_file.read_text(), add_special_tokens=False)["input_ids"]
    counts = torch.bincount(torch.tensor(ids), minlength=len(tokenizer)).double() + 1.0
    models = [
        _as(Copier, base, "copier"),
        _as(BagOfSymbols, base, "bag"),
        _as(Unigram, base, "unigram", log_frequency=(counts / counts.sum()).log().float()),
        base,
    ]
    result = _probe(models, text_file, distances=(0, 8, 40, 150))
    by = {(e["model"], e["distance"]): e for e in result["by_distance"]}
    for d in (0, 8, 40, 150):
        copy = by[("copier", d)]
        assert copy["accuracy"]["value"] == 1.0 and copy["permuted_accuracy"]["value"] == 0.0
        assert copy["copying"]["low"] == copy["copying"]["value"] == 1.0
        assert copy["accuracy_minus_guess"]["low"] == 1.0
        # it reads the key's digits (1 in 5 right, twice chance; a decoy's digits serve it as well) but cannot copy
        # them in order: the permuted key shows it the same digits
        bag = by[("bag", d)]
        assert bag["copying"] == {"value": 0.0, "low": 0.0, "high": 0.0}
        assert bag["symbols_guess"] == 0.2 and bag["accuracy"]["value"] > bag["chance"] == 0.1
        unigram = by[("unigram", d)]
        assert (
            unigram["copying"] == unigram["accuracy_minus_guess"] == {"value": 0.0, "low": 0.0, "high": 0.0}
        )
        random = by[(base.name, d)]  # an untrained model: the key does not help it
        assert _holds_zero(random["accuracy_minus_guess"]) and _holds_zero(random["copying"]), random
        assert len(random["per_block"]["permuted_recovered"]) == 40 and random["key_tokens"] == 200


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
        "6",
    ]
    assert main([*args, "--quiet", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "passkey probe" in printed and "token use" in printed and "copying" in printed
    result = json.loads(out.read_text())
    assert [e["distance"] for e in result["passkey"]["by_distance"]] == [4, 16]
    assert result["passkey"]["settings"]["key_digits"] == 6 and "--probe passkey" in result["command"]
    assert main(["evaluate", "--model", str(model), "--text", str(text_file), "--probe-blocks", "6"]) == 2
    assert "--probe-blocks goes with --probe passkey" in capsys.readouterr().err
    assert (
        main(["evaluate", "--model", str(model), "--text", str(text_file), "--extend-positions", "pi"]) == 2
    )
    assert "--extend-positions goes with --lengths or --probe" in capsys.readouterr().err


def _train_to_copy(tokenizer, stream: np.ndarray, scheme: str, steps: int = 500):
    """A real TupeForMaskedLM (2 layers x 64) trained, with a loop of its own, to fill the masked digits of blocks in
    the probe's documented layout (keys of 5 distinct digits written with spaces, filler of the test text, distances
    0-12), blocks built here, not by the probe."""
    from tupe import TupeForMaskedLM

    from .conftest import tiny_config

    digits = _digit_ids(tokenizer)
    cls_id, mask_id = tokenizer.cls_token_id, tokenizer.mask_token_id
    rng = np.random.default_rng(7)
    torch.manual_seed(0)
    model = TupeForMaskedLM(tiny_config(len(tokenizer), scheme, 128, hidden_size=64, intermediate_size=128))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        d = int(rng.integers(0, 13))
        rows, labels = [], []
        for _ in range(16):
            key = "".join(f" {c}" for c in rng.permutation(10)[:5])
            shown = tokenizer(f"The pass key is{key}.", add_special_tokens=False)["input_ids"]
            at = np.flatnonzero(np.isin(shown, digits))
            query = np.array(shown)
            query[at] = mask_id
            start = int(rng.integers(0, len(stream) - 32 - d))
            f = stream[start : start + 32 + d]
            row = np.concatenate([[cls_id], f[:16], shown, f[16 : 16 + d], query, f[16 + d :]])
            label = np.full(len(row), -100)
            label[1 + 16 + len(shown) + d + at] = np.array(shown)[at]
            rows.append(row)
            labels.append(label)
        loss = model(input_ids=torch.tensor(np.stack(rows)), labels=torch.tensor(np.stack(labels))).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.slow
def test_rope_trained_to_copy_copies_and_nope_trained_the_same_way_does_not(tmp_path, tokenizer):
    """rope, trained 500 steps to copy, copies in order at distances it was trained at (copying > 0.2); the same
    network without positions (nope), trained the same way, learns which digits the key holds (token use > 0) but
    cannot know their order: copying 0; neither copies before training."""
    from .conftest import make_documents

    text = tmp_path / "filler.txt"
    text.write_text("\n\n".join(make_documents(40, seed=2)) + "\n")
    stream = np.asarray(tokenizer(text.read_text().replace("\n", " "), add_special_tokens=False)["input_ids"])
    folders = {}
    for scheme in ("rope", "nope"):
        folders[scheme] = save_tupe(tmp_path / f"{scheme}-untrained", tokenizer, scheme, max_len=128)
        _train_to_copy(tokenizer, stream, scheme).save_pretrained(tmp_path / scheme)
        tokenizer.save_pretrained(tmp_path / scheme)
    models = [load_eval_model(tmp_path / s) for s in ("rope", "nope")]
    models += [load_eval_model(folders[s]) for s in ("rope", "nope")]
    result = _probe(models, text, distances=(4, 8), blocks=60)
    by = {(e["model"], e["distance"]): e for e in result["by_distance"]}
    for d in (4, 8):
        rope, nope = by[(models[0].name, d)], by[(models[1].name, d)]
        assert rope["copying"]["low"] > 0.2 and rope["permuted_nll_minus_nll"]["low"] > 0, rope
        assert nope["accuracy_minus_guess"]["low"] > 0, nope  # it uses the key's digits ...
        assert _holds_zero(nope["copying"]) and abs(nope["copying"]["value"]) < 1e-9, (
            nope
        )  # ... not their order
        for start in models[2:]:
            assert _holds_zero(by[(start.name, d)]["copying"]), by[(start.name, d)]


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


def test_a_model_of_ones_own_is_wrapped_by_kind_and_a_module_without_weights_runs(tokenizer):
    """`EvalModel.of`: tupe's and BERT's masked LMs keep their own paths (and tables); any other module is called
    as `forward(input_ids=, attention_mask=)`, its logits as `.logits` or the tensor itself; one without weights
    runs on the CPU. A module that answers the next position's token everywhere (an exact copier of its input,
    shifted) is read where the probe asks."""
    from transformers import BertConfig, BertForMaskedLM

    from tupe.evaluation.lengths import at_length, table_key
    from tupe.modeling import TupeConfig, TupeForMaskedLM

    size = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    tupe = EvalModel.of(
        TupeForMaskedLM(TupeConfig(vocab_size=300, max_position_embeddings=64, **size)), tokenizer
    )
    bert = EvalModel.of(
        BertForMaskedLM(BertConfig(vocab_size=300, max_position_embeddings=64, **size)), tokenizer
    )
    assert (tupe.kind, tupe.max_length, bert.kind, table_key(bert)) == (
        "tupe",
        64,
        "bert",
        "bert.embeddings.position_embeddings.weight",
    )

    class Shifted(torch.nn.Module):  # no weights: one-hot logits of the token one place to the right
        def forward(self, input_ids, attention_mask=None):  # noqa: ANN001, ANN201
            nxt = torch.roll(input_ids, -1, dims=1)
            return torch.nn.functional.one_hot(nxt, 300).float()

    own = EvalModel.of(Shifted(), tokenizer, name="shifted")
    assert own.kind == "module" and own.num_parameters == 0 and own.device == torch.device("cpu")
    assert at_length(own, 4096, "none") == (own, None)  # no table, no limit of its own
    inputs = torch.tensor([[5, 6, 7, 8]])
    selected = torch.tensor([[False, True, False, True]])
    assert own.logits_at(inputs, selected).argmax(-1).tolist() == [7, 5]
