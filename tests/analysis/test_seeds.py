"""Seed aggregation and the unigram baseline against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tupe.analysis.baseline import block_token_counts, unigram_log_probs, unigram_loss
from tupe.analysis.seeds import aggregate, mean_std, render_table, t_interval
from tupe.data.packing import PackedCorpus


def _curve(*pairs):
    return [{"step": s, "eval_loss": v} for s, v in pairs]


def test_mean_std_and_t_interval_match_hand_computation():
    m, s = mean_std([1.0, 2.0, 4.0])
    assert m == pytest.approx(7 / 3)
    assert s == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    lo, hi = t_interval([1.0, 2.0, 4.0])
    half = 4.302652729911275 * s / math.sqrt(3)  # t_{0.975, 2}
    assert (lo, hi) == pytest.approx((m - half, m + half))
    assert mean_std([5.0]) == (5.0, None) and t_interval([5.0]) == (None, None)


def test_aggregate_pairs_seeds_with_the_reference():
    runs = {
        "bert-a": {0: _curve((100, 6.5), (200, 6.2)), 1: _curve((100, 6.4), (200, 6.0))},
        "tupe-a": {0: _curve((100, 6.1), (200, 5.0)), 1: _curve((100, 6.3), (200, 4.8))},
    }
    s = aggregate(runs, "bert-a", unigram=6.9, margin=1.0)
    t = s["schemes"]["tupe-a"]
    assert t["final_losses"] == [5.0, 4.8]
    assert t["diff_vs_reference"] == pytest.approx([5.0 - 6.2, 4.8 - 6.0])
    assert t["diff_mean"] == pytest.approx(-1.2) and t["diff_std"] == pytest.approx(0.0)
    assert t["seeds_better_than_reference"] == "2/2"
    # seed 0: 6.1 is not <= 6.2? it is: reached at step 100; seed 1: 6.3 > 6.0, reached at 200
    assert t["steps_to_reach_reference"] == [100, 200]
    # off the plateau: <= 5.9 -> step 200 for both tupe-a seeds, never for bert-a
    assert t["plateau_exit_steps"] == [200, 200] and t["left_plateau"] == "2/2"
    assert s["schemes"]["bert-a"]["plateau_exit_steps"] == [None, None]
    table = render_table(s)
    assert (
        "| tupe-a | 2 | 4.900 ± 0.141 | 200, 200 (2/2) | 100, 200 (2/2) | -1.200 [-1.200, -1.200] | 2/2 |"
        in table
    )
    assert "never, never (0/2)" in table and "6.900 nats" in table


def test_unigram_baseline_equals_hand_computation(tmp_path):
    stream = np.array([5, 5, 6, 7, 5, 6, 8, 5, 5], dtype=np.int32)  # 3 blocks of [CLS] + 3 tokens
    packed = PackedCorpus(tmp_path, stream, block_size=4, meta={})
    counts = block_token_counts(packed, np.array([0, 2]), vocab_size=10)
    assert counts.tolist() == [0, 0, 0, 0, 0, 4, 1, 0, 1, 0]  # tokens 5 5 6 | 8 5 5
    lp = unigram_log_probs(counts, num_special=5, smoothing=0.5)
    denom = 4.5 + 1.5 + 0.5 + 1.5 + 0.5
    assert math.exp(lp[5]) == pytest.approx(4.5 / denom)
    assert unigram_loss(lp, np.array([7, 5, 6, 1])) == pytest.approx(
        -(math.log(0.5 / denom) + math.log(4.5 / denom) + math.log(1.5 / denom)) / 3
    )
