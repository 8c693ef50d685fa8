"""The metrics of `tupe finetune`, on the scale users compare with (0-100), each the definition everyone reports.

- Named entities: entity-level micro precision, recall and F1 of `seqeval` (the conlleval definition that
  transformers' run_ner reports; IOB1 and IOB2 tags alike): an entity counts only if its type and both ends match.
- SQuAD: exact match and F1 with the official evaluation script's answer normalisation (lower case, punctuation
  and the articles a/an/the removed, white space collapsed), the best over the gold answers; for v2.0 also over the
  answerable (`HasAns_*`) and unanswerable (`NoAns_*`) questions, where the empty prediction is the right answer
  to an unanswerable one. Written out here from the official v1.1/v2.0 scripts: `evaluate`'s squad metric fetches
  its code from the Hub at run time.
- Multiple choice and sentence classification: accuracy.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """seqeval's entity-level micro precision, recall and F1, and the token accuracy, x 100."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    gold, predicted = [list(s) for s in gold], [list(s) for s in predicted]
    return {
        "f1": 100.0 * float(f1_score(gold, predicted, zero_division=0)),
        "precision": 100.0 * float(precision_score(gold, predicted, zero_division=0)),
        "recall": 100.0 * float(recall_score(gold, predicted, zero_division=0)),
        "accuracy": 100.0 * float(accuracy_score(gold, predicted)),
    }


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 of the normalised answers; an empty side scores 1 only if both are empty (v2.0)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_scores(golds: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """Exact match and F1 x 100, each the best over a question's gold answers. A question without gold answers is
    unanswerable (SQuAD v2.0): its only gold answer is the empty string; with any of them, `HasAns_*` and
    `NoAns_*` (and the counts `HasAns_total`, `NoAns_total`) are added, as the official v2.0 script reports."""
    if len(golds) != len(predictions):
        raise ValueError(f"{len(golds)} questions but {len(predictions)} predictions")
    em, f1, has = [], [], []
    for answers, pred in zip(golds, predictions):
        refs = [a for a in answers if normalize_answer(a)] or [""]
        has.append(
            bool(answers)
        )  # the official script: answerable if it has answers, whatever they normalise to
        em.append(max(exact_match(pred, a) for a in refs))
        f1.append(max(token_f1(pred, a) for a in refs))

    def mean(values: list[float]) -> float:
        return 100.0 * sum(values) / len(values) if values else 0.0

    out = {"exact_match": mean(em), "f1": mean(f1)}
    if not all(has):
        for name, keep in (("HasAns", True), ("NoAns", False)):
            rows = [i for i, h in enumerate(has) if h == keep]
            out[f"{name}_exact"] = mean([em[i] for i in rows])
            out[f"{name}_f1"] = mean([f1[i] for i in rows])
            out[f"{name}_total"] = float(len(rows))
    return out


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels but {len(predictions)} predictions")
    return {"accuracy": 100.0 * sum(int(a == b) for a, b in zip(labels, predictions)) / max(1, len(labels))}
