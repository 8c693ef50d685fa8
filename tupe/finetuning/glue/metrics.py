"""GLUE metrics, computed with scikit-learn and scipy so they match what everyone else reports.

Values are on the libraries' scale (accuracy 0.8529, not 85.29); `tupe report` multiplies by 100 like the paper.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# scipy and scikit-learn are imported by the functions that use them: they take seconds to import, and
# `tupe glue --help` imports this module

METRIC_NAMES = ("accuracy", "f1", "macro_f1", "mcc", "pearson", "spearman")
CLASS_METRICS = ("accuracy", "f1", "macro_f1", "mcc")  # of label ids; pearson and spearman: of scores


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Fraction of exact matches."""
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(labels, predictions))


def f1(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Binary F1 of the positive class (label id 1: paraphrase / duplicate), as GLUE reports for MRPC and QQP."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))


def macro_f1(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """The mean over classes of each class's F1: the F1 of a task with more than two labels."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, average="macro", zero_division=0.0))


def mcc(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Matthews correlation (CoLA); 0 when a constant prediction makes it undefined, like scikit-learn."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, predictions))


def _constant(x: np.ndarray) -> bool:
    return bool(np.all(x == x[0]))


def pearson(labels: Sequence[float], predictions: Sequence[float]) -> float:
    """Pearson correlation (STS-B); NaN when either side is constant (correlation undefined)."""
    from scipy.stats import pearsonr

    y, p = np.asarray(labels, dtype=np.float64), np.asarray(predictions, dtype=np.float64)
    if len(y) < 2 or _constant(y) or _constant(p):
        return float("nan")
    return float(pearsonr(y, p)[0])


def spearman(labels: Sequence[float], predictions: Sequence[float]) -> float:
    """Spearman rank correlation (STS-B); NaN when either side is constant."""
    from scipy.stats import spearmanr

    y, p = np.asarray(labels, dtype=np.float64), np.asarray(predictions, dtype=np.float64)
    if len(y) < 2 or _constant(y) or _constant(p):
        return float("nan")
    return float(spearmanr(y, p)[0])


_FUNCTIONS = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "mcc": mcc,
    "pearson": pearson,
    "spearman": spearman,
}


def compute_metrics(names: Sequence[str], labels: Sequence, predictions: Sequence) -> dict[str, float]:
    """Every metric in `names` on one split: {"accuracy": 0.85, "f1": 0.89}."""
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels but {len(predictions)} predictions")
    return {name: _FUNCTIONS[name](labels, predictions) for name in names}


def predictions_from_logits(logits: np.ndarray, regression: bool) -> np.ndarray:
    """Class ids (argmax) or, for regression (one output), the scores themselves."""
    logits = np.asarray(logits)
    if regression:
        return logits.reshape(len(logits), -1)[:, 0].astype(np.float64)
    return logits.argmax(axis=-1)
