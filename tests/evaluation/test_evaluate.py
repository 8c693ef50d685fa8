"""The numbers `tupe evaluate` reports, checked against hand computations on tiny texts and models."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from tupe.data.corpus import resolve_corpus
from tupe.data.mlm import MaskedLMCollator
from tupe.data.tokenizer import CLS_ID, SEP_ID
from tupe.evaluation import evaluate as ev
from tupe.evaluation.evaluate import (
    EVAL_SPLIT,
    Masker,
    Ratio,
    Settings,
    bootstrap,
    bootstrap_rng,
    evaluate,
    load_eval_model,
    make_blocks,
    sample_pppl_positions,
)

from .conftest import save_bert, save_tupe, write_text

FAST = dict(bootstrap=0, pppl_tokens=0, progress=False)


def run(paths, text, **settings):
    models = [load_eval_model(p) for p in paths]
    return evaluate(models, resolve_corpus([str(text)]), Settings(**{**FAST, **settings}), log=lambda m: None)


def small_text(path):
    path.write_text("cat dog cat cat dog\nbread milk bread\n\nred blue red red\nblue red car\n")
    return path


def test_unigram_baseline_equals_hand_computation(tmp_path, tokenizer):
    text = small_text(tmp_path / "small.txt")
    model = save_tupe(tmp_path / "m", tokenizer)
    result = run([model], text, max_length=6, mlm_probability=0.4)
    group = result["tokenizer_groups"][0]

    # by hand: documents end at the blank line and at the end of the file; lines of a document are joined by " "
    docs = ["cat dog cat cat dog bread milk bread", "red blue red red blue red car"]
    stream = []
    for doc in docs:
        stream += tokenizer(doc, add_special_tokens=False)["input_ids"] + [SEP_ID]
    blocks = [[CLS_ID, *stream[i * 5 : (i + 1) * 5]] for i in range(len(stream) // 5)]
    counts = Counter(t for b in blocks for t in b if t >= 5)
    total = sum(counts.values())
    collator = MaskedLMCollator(len(tokenizer), seed=0, mlm_probability=0.4)
    targets = []
    for i, b in enumerate(blocks):
        _, labels = collator.mask_one(np.array(b), (EVAL_SPLIT, i))
        targets += [int(t) for t in labels if t != -100]
    expected = sum(-math.log(counts[t] / total) for t in targets) / len(targets)

    assert group["tokens"] == len(stream)
    assert group["full_blocks"] == group["blocks"] == len(blocks)
    assert group["masked_tokens"] == len(targets) > 0
    assert group["unigram_tokens"] == total
    assert group["unigram"]["loss"]["value"] == pytest.approx(expected, rel=1e-12)
    assert group["unigram"]["perplexity"]["value"] == pytest.approx(math.exp(expected), rel=1e-12)


def test_trained_model_beats_unigram_on_its_training_text(trained_dir, text_file):
    result = run([trained_dir], text_file, bootstrap=300, pppl_tokens=200)
    m = result["models"][0]
    u = result["tokenizer_groups"][0]["unigram"]
    assert m["loss"]["value"] < u["loss"]["value"] - 0.5
    assert m["minus_unigram"]["high"] < 0  # the whole 95% interval of the paired difference is below zero
    assert m["minus_unigram"]["value"] == pytest.approx(m["loss"]["value"] - u["loss"]["value"])
    assert m["pseudo_perplexity"]["value"] < u["pseudo_perplexity"]["value"]
    assert m["perplexity"]["value"] == pytest.approx(math.exp(m["loss"]["value"]))


def test_loss_equals_the_models_own_masked_lm_loss(tmp_path, tokenizer, text_file):
    """The per-token loss is what TupeForMaskedLM / BertForMaskedLM compute themselves on the same masked blocks."""
    from transformers import BertForMaskedLM

    tupe_path = save_tupe(tmp_path / "tupe", tokenizer, seed=1)
    bert_path = save_bert(tmp_path / "bert", seed=2)
    result = run([tupe_path, bert_path], text_file, max_blocks=20)
    for path, entry in zip([tupe_path, bert_path], result["models"]):
        m = load_eval_model(path)
        assert (m.kind == "bert") == (path == bert_path)
        if m.kind == "bert":
            assert isinstance(m.model, BertForMaskedLM)  # transformers' own model, not a conversion
        blocks = make_blocks(
            resolve_corpus([str(text_file)]), m.tokenizer, m.max_length, 20, log=lambda _: None
        )
        masker = Masker(m.tokenizer)
        total = count = 0.0
        with torch.no_grad():
            for k in range(len(blocks)):
                inputs, labels = masker.mask(blocks.ids(k), int(blocks.indices[k]))
                n = int((labels != -100).sum())
                if n == 0:  # transformers' mean over no token is NaN
                    continue
                out = m.model(input_ids=torch.from_numpy(inputs)[None], labels=torch.from_numpy(labels)[None])
                total += float(out.loss) * n
                count += n
        assert entry["loss"]["value"] == pytest.approx(total / count, rel=1e-5)


def test_two_runs_identical_and_models_sharing_a_tokenizer_see_identical_masks(
    tmp_path, tokenizer, text_file, monkeypatch
):
    a = save_tupe(tmp_path / "a", tokenizer, "tupe-a", seed=1)
    b = save_tupe(tmp_path / "b", tokenizer, "bert-a", seed=2)
    seen: dict[str, list] = {}
    original = ev.EvalModel.target_nll

    def record(self, inputs, labels):
        seen.setdefault(self.name, []).append((inputs.clone(), labels.clone()))
        return original(self, inputs, labels)

    monkeypatch.setattr(ev.EvalModel, "target_nll", record)
    settings = dict(bootstrap=200, pppl_tokens=60, max_blocks=12)
    first = run([a, b], text_file, **settings)
    calls = {name: list(v) for name, v in seen.items()}
    seen.clear()
    second = run([a, b], text_file, **settings)
    first.pop("seconds"), second.pop("seconds")
    assert first == second
    for (xa, la), (xb, lb) in zip(calls[str(a)], calls[str(b)], strict=True):
        assert torch.equal(xa, xb) and torch.equal(la, lb)  # same inputs, masks, shuffles, pppl positions
    assert calls[str(a)] and any((la != -100).any() for _, la in calls[str(a)])
    # the two models differ, so the paired difference is a real comparison
    diff = first["tokenizer_groups"][0]["differences"][0]
    la, lb = (m["loss"]["value"] for m in first["models"])
    assert diff["loss"]["value"] == pytest.approx(la - lb) and la != lb
    assert diff["loss"]["low"] <= diff["loss"]["value"] <= diff["loss"]["high"]


def test_masks_are_pre_trainings_for_the_project_tokenizer(tokenizer):
    masker = Masker(tokenizer, seed=3)
    collator = MaskedLMCollator(len(tokenizer), seed=3)
    assert masker.identity
    ids = np.array(
        [CLS_ID, *tokenizer("cat dog red blue milk bread " * 6, add_special_tokens=False)["input_ids"]]
    )
    for key in (0, 7):
        got = masker.mask(ids, key)
        want = collator.mask_one(ids, (EVAL_SPLIT, key))
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_bert_wordpiece_masking_keeps_its_own_special_ids(tmp_path):
    m = load_eval_model(save_bert(tmp_path / "bert"))
    tok = m.tokenizer
    assert (tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (4, 5, 6)  # not the project's 1, 2, 3
    masker = Masker(tok, seed=0)
    ids = np.array(
        [tok.cls_token_id, *tok("cat dog red blue milk bread " * 40, add_special_tokens=False)["input_ids"]]
    )
    ids[50] = tok.sep_token_id
    inputs, labels = masker.mask(ids, 0)
    selected = labels != -100
    assert not selected[[0, 50]].any()  # [CLS] and [SEP] are never selected
    assert np.array_equal(labels[selected], ids[selected])
    assert 0.08 < selected.mean() < 0.25
    changed = selected & (inputs != ids)
    assert (inputs[changed] == tok.mask_token_id).mean() > 0.6  # mostly BERT's [MASK], id 6
    assert not np.isin(inputs[changed & (inputs != tok.mask_token_id)], masker.special_ids).any()
    assert np.array_equal(inputs[~selected], ids[~selected])


def test_bert_folder_loads_and_evaluates(tmp_path, text_file):
    path = save_bert(tmp_path / "bert")
    result = run([path], text_file, bootstrap=100, pppl_tokens=40)
    m, g = result["models"][0], result["tokenizer_groups"][0]
    assert m["kind"] == "bert" and "BertForMaskedLM" in m["description"]
    assert g["block_length"] == 32 and g["blocks"] > 10 and g["pppl_tokens"] == 40
    assert 0 < m["loss"]["low"] < m["loss"]["value"] < m["loss"]["high"]
    blocks = make_blocks(
        resolve_corpus([str(text_file)]), load_eval_model(path).tokenizer, 32, log=lambda _: None
    )
    first = blocks.ids(0)
    assert first[0] == 4 and (first[1:] != 1).all()  # BERT's [CLS]; no stray project [CLS] id
    sep_positions = [blocks.ids(k) for k in range(len(blocks))]
    assert any((b == 5).any() for b in sep_positions)  # documents are separated by BERT's [SEP]


def test_bootstrap_matches_numpy(tmp_path):
    rng = np.random.default_rng(5)
    n, resamples, seed = 5000, 300, 11  # n large enough that the resamples are drawn in several chunks
    num_a, num_b = rng.gamma(2.0, size=n), rng.gamma(2.2, size=n)
    den = rng.integers(1, 9, size=n).astype(float)
    out = bootstrap(
        {"a": [(1.0, Ratio(num_a, den))], "diff": [(1.0, Ratio(num_a, den)), (-1.0, Ratio(num_b, den))]},
        n,
        resamples,
        seed,
    )
    idx = np.random.default_rng([seed, ev.BOOTSTRAP_STREAM]).integers(0, n, size=(resamples, n))
    a = num_a[idx].sum(1) / den[idx].sum(1)
    d = a - num_b[idx].sum(1) / den[idx].sum(1)
    assert out["a"]["value"] == pytest.approx(num_a.sum() / den.sum())
    assert [out["a"]["low"], out["a"]["high"]] == pytest.approx(
        np.quantile(a, [0.025, 0.975]).tolist(), rel=1e-12
    )
    assert [out["diff"]["low"], out["diff"]["high"]] == pytest.approx(
        np.quantile(d, [0.025, 0.975]).tolist(), rel=1e-12
    )
    assert bootstrap_rng(seed).integers(0, n, size=3).tolist() == idx[0, :3].tolist()
    none = bootstrap({"a": [(1.0, Ratio(num_a, den))]}, n, 0, seed)
    assert none["a"]["low"] is None and none["a"]["value"] == out["a"]["value"]


def test_word_order_shuffle_keeps_masked_and_special_positions(tokenizer):
    masker = Masker(tokenizer, seed=0)
    ids = np.array(
        [
            CLS_ID,
            *tokenizer("cat dog red blue milk bread fish rice " * 8, add_special_tokens=False)["input_ids"],
        ]
    )
    ids[30] = SEP_ID
    inputs, labels = masker.mask(ids, 4)
    shuffled = masker.shuffle(ids, inputs, labels, 4)
    fixed = (labels != -100) | (ids < 5)
    assert fixed[0] and fixed[30] and (labels != -100).sum() > 3
    assert np.array_equal(shuffled[fixed], inputs[fixed])  # masked targets' inputs, [CLS], [SEP] in place
    assert sorted(shuffled[~fixed]) == sorted(inputs[~fixed])  # the rest is a permutation ...
    assert (shuffled[~fixed] != inputs[~fixed]).mean() > 0.5  # ... that moves most tokens
    assert np.array_equal(shuffled, masker.shuffle(ids, inputs, labels, 4))  # seeded
    assert not np.array_equal(shuffled, masker.shuffle(ids, inputs, labels, 5))


def test_pseudo_perplexity_is_salazar_on_every_token(tmp_path, tokenizer):
    """With a sample as large as the text, the pseudo-loss is the mean of -log p(token | all others) over all
    tokens, each masked in turn (Salazar et al. 2020), which is computed here with full logits."""
    text = small_text(tmp_path / "small.txt")
    path = save_tupe(tmp_path / "m", tokenizer, seed=4)
    result = run([path], text, max_length=6, pppl_tokens=10**6)
    m = load_eval_model(path)
    blocks = make_blocks(resolve_corpus([str(text)]), m.tokenizer, 6, log=lambda _: None)
    nll = []
    with torch.no_grad():
        for k in range(len(blocks)):
            ids = blocks.ids(k)
            for pos in range(len(ids)):
                if ids[pos] < 5:
                    continue
                masked = ids.copy()
                masked[pos] = tokenizer.mask_token_id
                logits = m.model(input_ids=torch.from_numpy(masked)[None]).logits[0, pos]
                nll.append(-float(torch.log_softmax(logits.double(), -1)[ids[pos]]))
    g = result["tokenizer_groups"][0]
    assert g["pppl_tokens"] == len(nll)
    assert result["models"][0]["pseudo_loss"]["value"] == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    assert result["models"][0]["pseudo_perplexity"]["value"] == pytest.approx(
        math.exp(sum(nll) / len(nll)), rel=1e-5
    )


def test_pppl_sample_is_seeded_non_special_and_bounded(tokenizer, text_file):
    blocks = make_blocks(resolve_corpus([str(text_file)]), tokenizer, 32, log=lambda _: None)
    masker = Masker(tokenizer)
    ks, pos = sample_pppl_positions(blocks, masker, 100, seed=0)
    assert len(ks) == 100 and len(set(zip(ks.tolist(), pos.tolist()))) == 100
    assert all(blocks.ids(int(k))[p] >= 5 for k, p in zip(ks, pos))
    assert list(zip(ks, pos)) == sorted(zip(ks, pos))
    again = sample_pppl_positions(blocks, masker, 100, seed=0)
    assert np.array_equal(ks, again[0]) and np.array_equal(pos, again[1])
    assert len(set(ks.tolist())) > 10  # spread over the text, not the first blocks only


def test_max_blocks_takes_evenly_spaced_blocks(tokenizer, tmp_path):
    text = write_text(tmp_path / "long.txt", n_docs=80)
    blocks = make_blocks(resolve_corpus([str(text)]), tokenizer, 16, max_blocks=5, log=lambda _: None)
    n = blocks.full_blocks
    assert blocks.indices.tolist() == [k * n // 5 for k in range(5)]


def test_per_block_losses_rebuild_every_loss_and_pair_across_separate_calls(tmp_path, tokenizer, text_file):
    """The JSON's per-block sums give back each loss, and two calls on the same text and seed (one model each)
    share blocks and masks, so their per-block differences are the paired difference of one call with both."""
    a = save_tupe(tmp_path / "a", tokenizer, "tupe-a", seed=1)
    b = save_tupe(tmp_path / "b", tokenizer, "rope", seed=2)
    both = run([a, b], text_file, max_blocks=15, pppl_tokens=40)
    g = both["tokenizer_groups"][0]
    masked = np.array(g["per_block"]["masked_tokens"])
    assert (
        g["per_block"]["index"] == [k * g["full_blocks"] // 15 for k in range(15)]
        and masked.sum() == g["masked_tokens"]
    )
    unigram = np.array(g["per_block"]["unigram_nll"]).sum() / masked.sum()
    assert g["unigram"]["loss"]["value"] == pytest.approx(unigram, rel=1e-12)
    for m in both["models"]:
        pb = m["per_block"]
        assert len(pb["nll"]) == 15
        assert m["loss"]["value"] == pytest.approx(sum(pb["nll"]) / masked.sum(), rel=1e-12)
        shuffled = sum(pb["shuffled_nll"]) / masked.sum()
        assert m["word_order_delta"]["value"] == pytest.approx(shuffled - m["loss"]["value"], rel=1e-9)
        pppl = sum(pb["pppl_nll"]) / sum(g["per_block"]["pppl_tokens"])
        assert m["pseudo_loss"]["value"] == pytest.approx(pppl, rel=1e-12)
    alone_a, alone_b = run([a], text_file, max_blocks=15), run([b], text_file, max_blocks=15)
    nll_a = np.array(alone_a["models"][0]["per_block"]["nll"])
    nll_b = np.array(alone_b["models"][0]["per_block"]["nll"])
    assert alone_a["tokenizer_groups"][0]["per_block"] == alone_b["tokenizer_groups"][0]["per_block"]
    assert (nll_a - nll_b).sum() / masked.sum() == pytest.approx(
        g["differences"][0]["loss"]["value"], rel=1e-9
    )


def test_masked_tokens_budget_takes_the_fewest_evenly_spaced_blocks_that_reach_it(tmp_path, tokenizer):
    text = resolve_corpus([str(write_text(tmp_path / "long.txt", n_docs=120))])
    masker = Masker(tokenizer)
    for length, budget in ((16, 50), (32, 50), (64, 200)):
        blocks = make_blocks(text, tokenizer, length, log=lambda _: None)
        indices = ev.budget_blocks(blocks, masker, budget)
        n = blocks.full_blocks

        def masked(idx, blocks=blocks):
            return sum(int((masker.mask(blocks.packed.block(int(i)), int(i))[1] != -100).sum()) for i in idx)

        b = len(indices)
        assert indices.tolist() == [k * n // b for k in range(b)]
        assert masked(indices) >= budget and b < n
        fewer = (np.arange(b - 1) * n) // (b - 1) if b > 1 else np.zeros(0, dtype=np.int64)
        assert masked(fewer) < budget  # one block fewer misses the budget
    blocks = make_blocks(text, tokenizer, 64, log=lambda _: None)
    assert (
        len(ev.budget_blocks(blocks, masker, 10**9)) == blocks.full_blocks
    )  # more than the text: every block
    result = run(
        [save_tupe(tmp_path / "m", tokenizer)], tmp_path / "long.txt", masked_tokens=120, max_length=16
    )
    assert (
        result["settings"]["masked_tokens"] == 120 and result["tokenizer_groups"][0]["masked_tokens"] >= 120
    )
    with pytest.raises(ev.TupeError, match="--masked-tokens and --max-blocks exclude each other"):
        run([tmp_path / "m"], tmp_path / "long.txt", masked_tokens=120, max_blocks=3)


def test_tokens_per_word_is_the_texts_tokens_over_its_words(tmp_path, tokenizer):
    """Counted by hand: the tokenizer's pieces of each document, over the whitespace words (no [SEP], no [CLS]);
    words the tokenizer never saw are cut into several pieces, so the ratio is above 1."""
    text = tmp_path / "small.txt"
    text.write_text("cat dog cat zebrafish dog\nbread milk bread\n\nred blue quokka red\nblue red car\n")
    result = run([save_tupe(tmp_path / "m", tokenizer)], text, max_length=4)
    docs = [" ".join(doc.split("\n")) for doc in text.read_text().strip().split("\n\n")]
    words = sum(len(doc.split()) for doc in docs)
    pieces = sum(len(tokenizer(doc, add_special_tokens=False)["input_ids"]) for doc in docs)
    g = result["tokenizer_groups"][0]
    assert result["text"]["words"] == g["words"] == words == 15
    assert g["tokens_per_word"] == pytest.approx(pieces / words) and pieces > words
    assert result["models"][0]["tokens_per_word"] == g["tokens_per_word"]
    from tupe.evaluation.report import format_report

    assert f"{pieces / words:.2f} tokens per word" in format_report(result)


def test_no_forward_pass_holds_padding(tmp_path, tokenizer, text_file, monkeypatch):
    """docs/evaluation.md, "No padding": the loss, word-order and pseudo-perplexity passes are full blocks of one
    length with a mask of ones, so padding-free batches have nothing to remove."""
    from tupe.modeling.modeling_tupe import TupeModel

    seen = []
    forward = TupeModel.forward

    def spy(self, input_ids=None, attention_mask=None, **kwargs):  # noqa: ANN001, ANN202
        seen.append((tuple(input_ids.shape), attention_mask, kwargs.get("position_ids")))
        return forward(self, input_ids, attention_mask, **kwargs)

    monkeypatch.setattr(TupeModel, "forward", spy)
    model = save_tupe(tmp_path / "m", tokenizer)
    run([model], text_file, max_length=16, max_blocks=5, pppl_tokens=7, batch_size=2)
    assert len(seen) >= 3 + 4  # loss and shuffled copies in 3 passes, pseudo-perplexity in 4
    for shape, mask, positions in seen:
        assert shape[1] == 16 and positions is None
        assert mask is None or bool(mask.all())
