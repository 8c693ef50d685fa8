"""GLUE metrics against scipy / scikit-learn and against textbook formulas, on random data."""

import math

import numpy as np
import pytest
from scipy.stats import pearsonr, rankdata, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from tupe.finetuning.glue.metrics import (
    accuracy,
    compute_metrics,
    f1,
    mcc,
    pearson,
    predictions_from_logits,
    spearman,
)


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn_and_formulas(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=200)
    p = np.where(rng.random(200) < 0.7, y, 1 - y)
    tp = int(((p == 1) & (y == 1)).sum())
    tn = int(((p == 0) & (y == 0)).sum())
    fp = int(((p == 1) & (y == 0)).sum())
    fn = int(((p == 0) & (y == 1)).sum())

    assert accuracy(y, p) == pytest.approx(accuracy_score(y, p))
    assert accuracy(y, p) == pytest.approx((tp + tn) / 200)
    assert f1(y, p) == pytest.approx(f1_score(y, p))
    assert f1(y, p) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert mcc(y, p) == pytest.approx(matthews_corrcoef(y, p))
    expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert mcc(y, p) == pytest.approx(expected)


def test_multiclass_accuracy():
    rng = np.random.default_rng(7)
    y = rng.integers(0, 3, size=300)
    p = rng.integers(0, 3, size=300)
    assert accuracy(y, p) == pytest.approx(float(np.mean(y == p)))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy_and_formulas(seed):
    rng = np.random.default_rng(seed)
    y = rng.uniform(0, 5, size=150)
    p = y + rng.normal(0, 1.5, size=150)
    assert pearson(y, p) == pytest.approx(pearsonr(y, p)[0])
    assert pearson(y, p) == pytest.approx(np.corrcoef(y, p)[0, 1])
    assert spearman(y, p) == pytest.approx(spearmanr(y, p)[0])
    assert spearman(y, p) == pytest.approx(np.corrcoef(rankdata(y), rankdata(p))[0, 1])


def test_spearman_with_ties_matches_scipy():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 6, size=100).astype(float)  # STS-B style tied scores
    p = y + rng.normal(0, 2, size=100)
    assert spearman(y, p) == pytest.approx(spearmanr(y, p)[0])


def test_degenerate_inputs():
    assert mcc([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0  # constant prediction: sklearn's convention
    assert math.isnan(pearson([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]))  # undefined, as in scipy
    assert f1([0, 0, 1], [0, 0, 0]) == 0.0


def test_compute_metrics_and_argmax():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 0.5]])
    preds = predictions_from_logits(logits, regression=False)
    assert preds.tolist() == [1, 0, 1]
    out = compute_metrics(["accuracy", "f1"], [1, 0, 0], preds)
    assert out == {"accuracy": pytest.approx(2 / 3), "f1": pytest.approx(2 / 3)}
    reg = predictions_from_logits(np.array([[1.5], [2.5]]), regression=True)
    assert reg.tolist() == [1.5, 2.5]
    with pytest.raises(ValueError):
        compute_metrics(["accuracy"], [1, 0], [1])


def test_default_grid_and_epochs_depend_on_the_models_width() -> None:
    """The paper's grid for BERT-Base-like widths; the sweep's grid and 3 epochs for the CPU presets' widths;
    anything given explicitly is kept."""
    from tupe.finetuning.glue.protocol import PAPER_LRS, SMALL_MODEL_EPOCHS, SMALL_MODEL_LRS, GlueSettings
    from tupe.finetuning.glue.tasks import get_task

    task = get_task("MRPC")
    base = GlueSettings(task="MRPC").resolved(task, 512, hidden_size=768)
    assert base.lrs == list(PAPER_LRS) and base.epochs == task.epochs == 10
    small = GlueSettings(task="MRPC").resolved(task, 128, hidden_size=128)
    assert small.lrs == list(SMALL_MODEL_LRS) and small.epochs == SMALL_MODEL_EPOCHS == 3
    unknown = GlueSettings(task="MRPC").resolved(task, 128)
    assert unknown.lrs == list(PAPER_LRS)
    given = GlueSettings(task="MRPC", lrs=[5e-5, 5e-5], epochs=2).resolved(task, 128, hidden_size=128)
    assert given.lrs == [5e-5] and given.epochs == 2
