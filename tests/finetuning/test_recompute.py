"""Every metric in `tupe finetune`'s results.json recomputed from predictions.jsonl and the validation file alone,
as a user checking the numbers would: gold labels read from the file with a parser written here, the metric
computed with the library everyone uses (seqeval for entities; the official SQuAD v2.0 evaluation script,
written out below, for answers; the definition of accuracy). The files are hand-made in formats the other tests
do not use: a two-column tab-separated CoNLL split with WNUT's lower-case types, a four-column IOB1 CoNLL file
with CRLF line ends, SQuAD v2.0 JSON with `plausible_answers` and repeated gold answers, SWAG's own CSV
header (an unnamed index column first, quoted endings)."""

import collections
import csv
import json
import re
import string

import pytest

from tupe.cli import main


def _finetune(model, task, train, validation, out, *extra):
    args = ["finetune", "--task", task, "--model", str(model), "--train", str(train)]
    args += ["--validation", str(validation), "--out", str(out), "--lrs", "1e-3", "--seeds", "1,2"]
    args += ["--epochs", "2", "--batch-size", "4", "--threads", "1", "--no-progress", *extra]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    best_seed = results["best_run"].rsplit("seed", 1)[1]
    for m in results["metrics"]:  # the top level is the mean over the seeds of the best learning rate
        assert results[m] == pytest.approx(sum(s[m] for s in results["per_seed"].values()) / 2)
    return results, rows, results["per_seed"][best_seed]  # predictions.jsonl is the best run's


def _conll(path):
    """Sentences of (tokens, tags): token first, tag last, blank lines between, -DOCSTART- skipped."""
    sentences, tokens, tags = [], [], []
    for line in path.read_text().splitlines() + [""]:
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if tokens:
                sentences.append((tokens, tags))
            tokens, tags = [], []
            continue
        tokens.append(fields[0])
        tags.append(fields[-1])
    return sentences


@pytest.mark.slow
@pytest.mark.parametrize("split", ["wnut", "iob1_crlf"])
def test_ner_entity_scores_recomputed_with_seqeval(tiny_model, data_dir, tmp_path, split):
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    dev = data_dir / f"{split}_dev.{'conll' if split == 'wnut' else 'txt'}"
    train = dev.with_name(dev.name.replace("_dev", "_train"))
    results, rows, best = _finetune(tiny_model, "ner", train, dev, tmp_path / "out")
    gold = _conll(dev)
    assert [(r["tokens"], r["tags"]) for r in rows] == gold  # one line per sentence, in file order
    assert all(len(r["predicted"]) == len(r["tokens"]) for r in rows)
    y, p = [tags for _, tags in gold], [r["predicted"] for r in rows]
    assert best["f1"] == pytest.approx(100 * f1_score(y, p, zero_division=0))
    assert best["precision"] == pytest.approx(100 * precision_score(y, p, zero_division=0))
    assert best["recall"] == pytest.approx(100 * recall_score(y, p, zero_division=0))
    assert best["accuracy"] == pytest.approx(100 * accuracy_score(y, p))
    assert results["baseline"]["all_O"]["f1"] == 0.0
    assert set(results["data"]["entity_types"]) == {
        t[2:] for _, tags in _conll(train) for t in tags if t != "O"
    }


# -- the official SQuAD v2.0 evaluation script (evaluate-v2.0.py), its scoring functions as published


def _normalize_answer(s):
    def remove_articles(text):
        return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _get_tokens(s):
    return _normalize_answer(s).split() if s else []


def _compute_exact(a_gold, a_pred):
    return int(_normalize_answer(a_gold) == _normalize_answer(a_pred))


def _compute_f1(a_gold, a_pred):
    gold_toks, pred_toks = _get_tokens(a_gold), _get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _squad_v2_eval(dataset, preds):
    exact, f1, has_ans = {}, {}, {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid = qa["id"]
                has_ans[qid] = bool(qa["answers"])
                gold_answers = [a["text"] for a in qa["answers"] if _normalize_answer(a["text"])] or [""]
                exact[qid] = max(_compute_exact(a, preds[qid]) for a in gold_answers)
                f1[qid] = max(_compute_f1(a, preds[qid]) for a in gold_answers)

    def make_eval_dict(qids):
        return {
            "exact": 100.0 * sum(exact[k] for k in qids) / len(qids),
            "f1": 100.0 * sum(f1[k] for k in qids) / len(qids),
            "total": len(qids),
        }

    out = make_eval_dict(list(exact))
    for name, keep in (("HasAns", True), ("NoAns", False)):
        qids = [k for k, v in has_ans.items() if v == keep]
        if qids:
            out.update({f"{name}_{k}": v for k, v in make_eval_dict(qids).items()})
    return out


@pytest.mark.slow
def test_squad_v2_scores_recomputed_with_the_official_script(tiny_model, data_dir, tmp_path):
    dev = data_dir / "squad2_official_dev.json"
    extra = ("--version-2-with-negative", "--max-seq-len", "64", "--doc-stride", "8")
    results, rows, best = _finetune(
        tiny_model, "qa", data_dir / "squad2_official_train.json", dev, tmp_path, *extra
    )
    dataset = json.loads(dev.read_text())["data"]
    ids = [qa["id"] for a in dataset for p in a["paragraphs"] for qa in p["qas"]]
    assert [r["id"] for r in rows] == ids  # one line per question
    official = _squad_v2_eval(dataset, {r["id"]: r["prediction"] for r in rows})
    assert official["HasAns_total"] == 2 and official["NoAns_total"] == 2
    assert best["exact_match"] == pytest.approx(official["exact"]) and best["f1"] == pytest.approx(
        official["f1"]
    )
    for name in ("HasAns", "NoAns"):
        for metric in ("exact", "f1", "total"):
            assert best[f"{name}_{metric}"] == pytest.approx(official[f"{name}_{metric}"])
            assert results[f"{name}_{metric}"] == pytest.approx(results["best"]["mean"][f"{name}_{metric}"])
    assert results["baseline"]["always_empty"]["exact_match"] == pytest.approx(50.0)  # 2 of 4 unanswerable


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "train", "dev", "label"),
    [
        ("multiple-choice", "swag_official_train.csv", "swag_official_dev.csv", "label"),
        ("classification", "sentiment_train.csv", "sentiment_val.csv", "label"),
    ],
)
def test_accuracy_recomputed_from_the_file(tiny_model, data_dir, tmp_path, task, train, dev, label):
    results, rows, best = _finetune(tiny_model, task, data_dir / train, data_dir / dev, tmp_path)
    with open(data_dir / dev, newline="") as f:
        gold = [r[label] for r in csv.DictReader(f)]
    assert len(rows) == len(gold)
    predicted = [str(r["prediction"]) for r in rows]  # a label name (classification), an ending (choice)
    assert best["accuracy"] == pytest.approx(100.0 * sum(g == q for g, q in zip(gold, predicted)) / len(gold))
