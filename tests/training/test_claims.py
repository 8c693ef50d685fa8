"""`python -m tupe.comparison.claims`: the paper's claims read on a study folder, paired by seed.

The folder is written here by hand (curves, GLUE grids, the study summary), so every expected number is known;
the intervals are checked against scipy's own paired t-test, not against the module's formula."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tupe.comparison.claims import PAPER_GLUE, _grid_text, judge, main, render, verdict

STEPS = [100, 200, 300, 400]
# validation loss by scheme and seed at STEPS; tupe-a is above bert-a at step 100 in seed 2 only
CURVES = {
    "bert-a": {0: [6.3, 6.2, 6.1, 5.0], 1: [6.3, 6.1, 5.9, 5.2], 2: [6.2, 6.2, 6.2, 6.0]},
    "tupe-a": {0: [6.0, 5.05, 4.5, 4.0], 1: [6.1, 5.1, 4.6, 4.3], 2: [6.3, 5.5, 4.9, 4.7]},
    "tupe-r": {0: [5.9, 4.8]},  # still training (no pretrain_summary.json)
}
# CoLA: best learning rate's median MCC (0-1) per pre-training seed
# per GLUE task the best learning rate's median (0-1) per pre-training seed; "tupe-a-mid": its 30% checkpoint
GLUE = {
    "CoLA": {
        "bert-a": {0: 0.10, 1: 0.12, 2: 0.08},
        "tupe-a": {0: 0.20, 1: 0.14, 2: 0.21},
        "tupe-a-mid": {0: 0.15, 1: 0.09, 2: 0.10},
    },
    "MRPC": {"bert-a": {0: 0.70, 1: 0.71, 2: 0.69}, "tupe-a": {0: 0.72, 1: 0.70}},
}


def _study(root: Path) -> Path:
    for scheme, by_seed in CURVES.items():
        for seed, losses in by_seed.items():
            run = root / "runs" / scheme / f"seed-{seed}"
            run.mkdir(parents=True)
            lines = [{"step": st, "eval_loss": x} for st, x in zip(STEPS, losses)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
            if len(losses) == len(STEPS):
                (run / "pretrain_summary.json").write_text(json.dumps({"steps": STEPS[-1]}))
    for task, by_scheme in GLUE.items():
        metric = "mcc" if task == "CoLA" else "accuracy"
        for scheme, by_seed in by_scheme.items():
            for seed, score in by_seed.items():
                folder = root / "glue" / f"{task}-{scheme}-seed-{seed}"
                folder.mkdir(parents=True)
                result = {
                    "task": task,
                    "main_metric": metric,
                    "complete": True,
                    "best": {"main_median": score},
                    "pretrain_steps": 1750 if scheme.endswith("-mid") else 400,
                    "settings": {"lrs": [5e-5, 1e-4, 3e-4], "seeds": [1, 2, 3, 4, 5], "epochs": 3.0},
                }
                result["settings"]["max_train_samples"] = None
                (folder / "results.json").write_text(json.dumps(result))
    # an unfinished grid is not read
    (root / "glue" / "CoLA-tupe-r-seed-0").mkdir()
    (root / "glue" / "CoLA-tupe-r-seed-0" / "results.json").write_text(
        json.dumps({"task": "CoLA", "main_metric": "mcc", "complete": False, "best": {"main_median": 0.9}})
    )
    rows = {
        "bert-a": {
            "ood:news": [6.0, 6.1, 6.2],
            "word_order:news": [1.0, 1.5, 0.5],
            "CoLA dev mcc": [10, 12, 8],
        },
        "tupe-a": {
            "ood:news": [5.0, 5.3, None],
            "word_order:news": [2.0, 2.5, 1.0],
            "CoLA dev mcc": [20, 14, 21],
        },
    }
    (root / "study.json").write_text(json.dumps({"seeds": [0, 1, 2], "schemes": rows}))
    return root


def _scipy_ci(a: list[float], b: list[float]) -> tuple[float, float]:
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    return float(ci.low), float(ci.high)


def test_fig5a_and_steps_claims_pair_by_seed(tmp_path: Path) -> None:
    result = judge(_study(tmp_path), seeds=(0, 1, 2), steps=(200, 400), unigram=6.9)
    pair = result["loss"]["tupe-a - bert-a"]
    assert pair["seeds"] == [0, 1, 2] and pair["finished_seeds"] == [0, 1, 2]
    per = pair["per_seed"]
    assert [per[k]["below_at_every_step"] for k in "012"] == [True, True, False]
    assert per["2"]["share_below"] == 0.75 and per["2"]["below_from_step"] == 200
    assert per["0"]["below_from_step"] == 100
    # first evaluation at or below bert-a's final loss of the same seed: 5.0 -> step 300 (4.5); 5.2 -> 200 (5.1)
    assert [per[k]["reaches_baseline_final_at"] for k in "012"] == [300, 200, 200]
    assert per["2"]["reach_share"] == 0.5
    ta = [CURVES["tupe-a"][k][-1] for k in range(3)]
    ba = [CURVES["bert-a"][k][-1] for k in range(3)]
    assert pair["final"]["mean"] == pytest.approx(np.mean(np.subtract(ta, ba)))
    assert pair["final"]["ci95"] == pytest.approx(_scipy_ci(ta, ba))
    assert pair["verdict"] == "holds"  # every seed ~1 nat below, tight
    at200 = pair["at_steps"]["200"]
    assert at200["diffs"] == pytest.approx([5.05 - 6.2, 5.1 - 6.1, 5.5 - 6.2])
    # a running run: its evaluations so far are compared, but it has no final difference and no steps claim
    running = result["loss"]["tupe-r - bert-a"]
    assert running["finished_seeds"] == [] and running["per_seed"]["0"]["below_at_every_step"]
    assert running["final"]["mean"] is None and running["verdict"] == "no data"
    assert running["per_seed"]["0"]["reaches_baseline_final_at"] is None
    assert "tupe-a - bert-r" not in result["loss"]  # no bert-r runs
    # the paper's other ordering: tupe-r (still training) against tupe-a, below at both its evaluations
    order = result["order"]
    assert list(order) == ["tupe-r - tupe-a"]  # no bert-r runs for bert-r - bert-a
    assert order["tupe-r - tupe-a"]["per_seed"]["0"]["diffs_at"] == {"200": pytest.approx(4.8 - 5.05)}
    assert order["tupe-r - tupe-a"]["per_seed"]["0"]["share_below"] == 1.0
    # plateau exit at 1 nat below the unigram (5.9): bert-a seed 2 never gets there
    assert result["runs"]["bert-a/seed-0"]["plateau_exit"] == 400
    assert result["runs"]["bert-a/seed-2"]["plateau_exit"] is None
    assert result["runs"]["tupe-r/seed-0"] == {
        "finished": False,
        "last_step": 200,
        "last_loss": 4.8,
        "plateau_exit": 100,
        "valid": [[100, 5.9], [200, 4.8]],
    }


def test_unigram_comes_from_the_comparisons_record(tmp_path: Path) -> None:
    study = _study(tmp_path)
    assert (
        judge(study)["unigram_loss"] is None
    )  # no record, no finished run with its data: no plateau reading
    (study / "runs" / "compare_summary.json").write_text(json.dumps({"stats": {"unigram_loss": 6.5}}))
    result = judge(study)
    assert result["unigram_loss"] == 6.5 and result["runs"]["bert-a/seed-1"]["plateau_exit"] == 400


def test_glue_pairs_read_complete_grids_against_the_papers_sign(tmp_path: Path) -> None:
    result = judge(_study(tmp_path), seeds=(0, 1, 2), unigram=6.9)
    assert result["glue"]["CoLA"]["metric"] == "mcc"
    assert "tupe-r" not in result["glue"]["CoLA"]["scores"]  # its grid is not complete
    cola = result["glue_pairs"]["CoLA"]["tupe-a - bert-a"]
    a = [100 * GLUE["CoLA"]["tupe-a"][k] for k in range(3)]
    b = [100 * GLUE["CoLA"]["bert-a"][k] for k in range(3)]
    assert cola["diffs"] == pytest.approx(np.subtract(a, b))
    assert cola["ci95"] == pytest.approx(_scipy_ci(a, b))
    assert cola["paper"] == pytest.approx(PAPER_GLUE["CoLA"]["tupe-a"] - PAPER_GLUE["CoLA"]["bert-a"])
    lo, hi = cola["ci95"]
    assert cola["verdict"] == ("holds" if lo > 0 else "direction")
    assert list(result["glue_pairs"]["CoLA"]) == ["tupe-a - bert-a", "tupe-a-mid - bert-a"]
    # the 30% checkpoint against the baseline at 100%, and the paper's 300k row against its BERT-A
    mid = result["glue_pairs"]["CoLA"]["tupe-a-mid - bert-a"]
    assert mid["diffs"] == pytest.approx([5.0, -3.0, 2.0])
    assert mid["paper"] == pytest.approx(62.13 - 55.19) and mid["verdict"] == "direction"
    # the tasks' average: the seeds both tasks have for both schemes (tupe-a has no MRPC seed 2)
    avg = result["glue_pairs"]["average"]["tupe-a - bert-a"]
    assert avg["tasks"] == ["CoLA", "MRPC"] and avg["seeds"] == [0, 1]
    assert avg["diffs"] == pytest.approx([(10.0 + 2.0) / 2, (2.0 - 1.0) / 2])
    paper = (PAPER_GLUE["CoLA"]["tupe-a"] - PAPER_GLUE["CoLA"]["bert-a"] + 88.37 - 88.29) / 2
    assert avg["paper"] == pytest.approx(paper)
    assert "tupe-a-mid - bert-a" not in result["glue_pairs"]["average"]  # one task only


def test_stage_readings_pair_by_seed_and_skip_missing(tmp_path: Path) -> None:
    stages = judge(_study(tmp_path), seeds=(0, 1, 2), unigram=6.9)["stages"]
    assert set(stages) == {"ood:news", "word_order:news"}  # GLUE columns have their own section
    ood = stages["ood:news"]["tupe-a"]
    assert ood["diffs"] == pytest.approx([-1.0, -0.8])  # seed 2 has no tupe-a value
    assert ood["ci95"] == pytest.approx(_scipy_ci([5.0, 5.3], [6.0, 6.1]))
    wo = stages["word_order:news"]["tupe-a"]
    assert wo["mean"] == pytest.approx((1.0 + 1.0 + 0.5) / 3) and wo["value"] == pytest.approx(5.5 / 3)
    # each scheme's own mean with its interval (the reference's too): is a reading above 0?
    assert wo["own"]["ci95"] == pytest.approx(
        stats.t.interval(0.95, 2, loc=5.5 / 3, scale=stats.sem([2.0, 2.5, 1.0]))
    )
    assert stages["ood:news"]["bert-a"] == {"own": pytest.approx(stages["ood:news"]["bert-a"]["own"])}
    assert stages["ood:news"]["bert-a"]["own"]["mean"] == pytest.approx(6.1)


@pytest.mark.parametrize(
    ("paper", "diffs", "expected"),
    [
        (-1.0, [-1.0, -1.1, -0.9], "holds"),
        (-1.0, [-1.0, 0.5, -0.9], "direction"),
        (-1.0, [1.0, -0.5, 0.9], "not found"),
        (-1.0, [1.0, 1.1, 0.9], "reversed"),
        (2.0, [1.0], "one seed"),
        (2.0, [], "no data"),
    ],
)
def test_verdict(paper: float, diffs: list[float], expected: str) -> None:
    assert verdict(paper, diffs) == expected


def test_cli_writes_both_files_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = _study(tmp_path / "study")
    assert main([str(study), "--unigram", "6.9", "--steps", "200,400"]) == 0
    md = (study / "claims.md").read_text()
    assert "| tupe-a - bert-a | 0, 1, 2 | y, y, n | 1.00, 1.00, 0.75 | 100, 100, 200 |" in md
    assert "| tupe-r - bert-a | 0 r |" in md and "(no seed with both runs finished)" in md
    assert (
        "## The paper's other orderings in pre-training" in md
        and "| tupe-r - tupe-a | 0 r | y | 1.00 |" in md
    )
    grid = (
        "learning rates 5e-05, 0.0001, 0.0003; fine-tuning seeds 1, 2, 3, 4, 5; 3 epochs; whole training set"
    )
    assert (
        f"- {grid}; checkpoint at step 400: bert-a/seed-0, bert-a/seed-1, bert-a/seed-2, tupe-a/seed-0" in md
    )
    assert (
        f"- {grid}; checkpoint at step 1,750: tupe-a-mid/seed-0, tupe-a-mid/seed-1, tupe-a-mid/seed-2" in md
    )
    assert "### CoLA (mcc)" in md and "| bert-a | 0: 10.00, 1: 12.00, 2: 8.00 | 10.00 ± 2.00 | 55.19 |" in md
    assert "### The tasks' average" in md and "| tupe-a - bert-a (CoLA, MRPC) | +3.25 [" in md
    assert "| 1/2 | +0.08 | direction (2 seeds) |" in md  # MRPC: two pre-training seeds only
    record = json.loads((study / "claims.json").read_text())
    assert record["loss"]["tupe-a - bert-a"]["verdict"] == "holds"
    assert render(record) == md  # the JSON record alone regenerates the report
    capsys.readouterr()
    assert main([str(tmp_path / "nothing")]) == 2
    assert "no runs/ folder" in capsys.readouterr().err
    assert main([str(study), "--reference", "rope"]) == 2
    assert "--reference 'rope' is not one of --schemes" in capsys.readouterr().err
    assert main([str(study), "--steps", "10,x"]) == 2
    assert "--steps" in capsys.readouterr().err
    (study / "glue" / "CoLA-bert-a-seed-1" / "results.json").write_text("[1, 2]")
    assert main([str(study), "--unigram", "6.9"]) == 2
    assert "CoLA-bert-a-seed-1/results.json: not a `tupe glue` results.json" in capsys.readouterr().err
    (study / "glue" / "CoLA-bert-a-seed-1" / "results.json").write_text("{cut")
    assert main([str(study), "--unigram", "6.9"]) == 2
    assert "CoLA-bert-a-seed-1/results.json: not a readable results.json" in capsys.readouterr().err


def test_a_grids_protocol_names_its_training_data() -> None:
    """The task's own files (whole, or a subset), or the files given with --train-file / --dev-file by name."""
    settings = {"lrs": [1e-4], "seeds": [1, 2], "epochs": 3.0, "max_train_samples": None}
    head = "learning rates 0.0001; fine-tuning seeds 1, 2; 3 epochs"
    given = {"source": "/d/MNLI/train_subset.json + /d/MNLI/heldout_subset.json", "train_examples": 8999}
    assert _grid_text({"settings": settings, "data": given}) == (
        f"{head}; all of the files train_subset.json + heldout_subset.json (8,999 examples)"
    )
    glue = {"source": "/d/glue/CoLA", "train_examples": 8551}
    assert _grid_text({"settings": settings, "data": glue, "pretrain_steps": 1750}) == (
        f"{head}; whole training set (8,551 examples); checkpoint at step 1,750"
    )
    assert _grid_text({"settings": {**settings, "max_train_samples": 500}, "data": glue}) == (
        f"{head}; 500 training examples"
    )


def test_against_a_record_finds_the_first_step_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A retrained study compared with an earlier claims.json: equal runs have no differing step, a changed
    validation loss is found at its step, a run the record lacks is new, one the study lacks is missing."""
    study = _study(tmp_path / "study")
    record = json.loads(json.dumps(judge(study, seeds=(0, 1, 2), unigram=6.9)))
    record["runs"]["tupe-a/seed-1"]["valid"][2][1] += 1e-9  # step 300 differs, by a billionth
    record["runs"]["rope/seed-0"] = {"valid": [[100, 6.0]]}
    del record["runs"]["bert-a/seed-2"]
    path = tmp_path / "old_claims.json"
    path.write_text(json.dumps(record))
    assert main([str(study), "--unigram", "6.9", "--against", str(path)]) == 0
    written = json.loads((study / "claims.json").read_text())
    rows = written["against"]["runs"]
    assert rows["bert-a/seed-0"] == {
        "in_record": True,
        "steps_compared": 4,
        "record_steps": 4,
        "last_step_compared": 400,
        "max_abs_difference": 0.0,
        "first_step_differing": None,
    }
    assert rows["tupe-a/seed-1"]["first_step_differing"] == 300
    assert 0 < rows["tupe-a/seed-1"]["max_abs_difference"] < 2e-9
    assert rows["tupe-r/seed-0"]["steps_compared"] == 2  # still training: the steps it has
    assert rows["bert-a/seed-2"] == {"in_record": False}
    assert written["against"]["missing"] == ["rope/seed-0"]
    md = (study / "claims.md").read_text()
    assert "| bert-a/seed-0 | 4 (4) | 0 | - |" in md and "| tupe-a/seed-1 | 4 (4) | 1e-09 | 300 |" in md
    assert "| bert-a/seed-2 | not in the record | | |" in md
    assert render(written) == md
    capsys.readouterr()
    (tmp_path / "bad.json").write_text('{"runs": [1]}')
    assert main([str(study), "--unigram", "6.9", "--against", str(tmp_path / "bad.json")]) == 2
    assert "bad.json: not a claims.json" in capsys.readouterr().err
