"""The protocol's summary (median over seeds, best lr) and the Table-1-shaped report, on hand-made results."""

import csv
import io
import json

import pytest

from tupe.cli import main
from tupe.errors import TupeError
from tupe.finetuning.glue.finetune import summarize
from tupe.finetuning.glue.report import PAPER_COLUMNS, PAPER_ROWS, average, make_report, paper_rows
from tupe.finetuning.glue.tasks import get_task


def _run(lr, seed, acc, f1=0.5):
    return {"lr": lr, "seed": seed, "scores": {"dev": {"accuracy": acc, "f1": f1}}}


def test_median_over_seeds_and_best_lr():
    task = get_task("MRPC")
    runs = [_run(2e-5, s, a) for s, a in zip(range(1, 6), [0.70, 0.90, 0.71, 0.72, 0.10])]
    runs += [_run(3e-5, s, a) for s, a in zip(range(1, 6), [0.80, 0.60, 0.69, 0.70, 0.95])]
    out = summarize(task, runs, [2e-5, 3e-5], [1, 2, 3, 4, 5])
    assert out["per_lr"]["2e-05"]["main_median"] == pytest.approx(0.71)
    assert out["per_lr"]["3e-05"]["main_median"] == pytest.approx(0.70)
    # 3e-5 has the best single run but 2e-5 the best median: the median decides
    assert out["best"]["lr"] == 2e-5
    assert out["best"]["median"]["dev"]["f1"] == pytest.approx(0.5)
    assert out["per_lr"]["2e-05"]["complete"]


def test_incomplete_lr_and_undefined_scores():
    task = get_task("STS-B")
    runs = [
        {"lr": 1e-5, "seed": 1, "scores": {"dev": {"pearson": None, "spearman": None}}},
        {"lr": 1e-5, "seed": 2, "scores": {"dev": {"pearson": 0.5, "spearman": 0.4}}},
        {"lr": 1e-5, "seed": 3, "scores": {"dev": {"pearson": 0.6, "spearman": 0.6}}},
    ]
    out = summarize(task, runs, [1e-5, 2e-5], [1, 2, 3, 4])
    lr = out["per_lr"]["1e-05"]
    assert lr["main_median"] == pytest.approx(0.5)  # the undefined score counts as the lowest
    assert not lr["complete"] and "2e-05" not in out["per_lr"]


def test_mnli_uses_matched_for_selection():
    task = get_task("MNLI")
    runs = [
        {
            "lr": 1e-5,
            "seed": 1,
            "scores": {"dev_matched": {"accuracy": 0.6}, "dev_mismatched": {"accuracy": 0.9}},
        },
        {
            "lr": 2e-5,
            "seed": 1,
            "scores": {"dev_matched": {"accuracy": 0.7}, "dev_mismatched": {"accuracy": 0.1}},
        },
    ]
    out = summarize(task, runs, [1e-5, 2e-5], [1])
    assert out["best"]["lr"] == 2e-5 and out["best"]["median"]["dev_mismatched"]["accuracy"] == 0.1


def test_paper_rows_average_matches_the_paper():
    stated = {"BERT-A": 82.96, "BERT-R": 83.66, "TUPE-A": 84.47, "TUPE-R": 85.04, "TUPE-R mid": 83.68}
    rows = {r.name: r for r in paper_rows()}
    for name, avg in stated.items():
        assert average(rows[name], PAPER_COLUMNS)[0] == pytest.approx(avg, abs=0.006)
    assert len(PAPER_ROWS) == 8


def _results(tmp_path, name, task, scheme, steps, sha, best_median, complete=True):
    t = get_task(task)
    d = tmp_path / name
    d.mkdir(parents=True)
    data = {
        "format": 1,
        "task": t.name,
        "scheme": scheme,
        "pretrain_steps": steps,
        "model": {"path": f"/models/{scheme}-{steps}", "scheme": scheme, "weights_sha256": sha},
        "complete": complete,
        "best": {"lr": 2e-5, "main_median": 0.0, "n_seeds": 5, "median": best_median},
    }
    (d / "results.json").write_text(json.dumps(data))
    return d


def _fill(tmp_path):
    _results(tmp_path / "tupe", "MNLI", "MNLI", "tupe-a", 30000, "aa",
             {"dev_matched": {"accuracy": 0.61}, "dev_mismatched": {"accuracy": 0.62}})  # fmt: skip
    _results(tmp_path / "tupe", "CoLA", "CoLA", "tupe-a", 30000, "aa", {"dev": {"mcc": 0.2}})
    _results(
        tmp_path / "tupe",
        "STS-B",
        "STS-B",
        "tupe-a",
        30000,
        "aa",
        {"dev": {"pearson": 0.7, "spearman": 0.69}},
    )
    _results(tmp_path / "bert", "CoLA", "CoLA", "bert-a", 30000, "bb", {"dev": {"mcc": 0.1}}, complete=False)
    _results(tmp_path / "bert", "MRPC", "MRPC", "bert-a", 30000, "bb", {"dev": {"accuracy": 0.7, "f1": 0.8}})


def test_report_table(tmp_path):
    _fill(tmp_path)
    md, csv_text = make_report([str(tmp_path)])
    lines = md.splitlines()
    assert lines[0] == "| model | steps | MNLI-m/mm | CoLA | MRPC | STS | Avg |"
    tupe_row = next(line for line in lines if line.startswith("| TUPE-A"))
    # Avg only over the columns every row has (here CoLA), and the table says which
    assert tupe_row == "| TUPE-A | 30k | 61.00/62.00 | 20.00 | - | 70.00 | 20.00 |"
    bert_row = next(line for line in lines if line.startswith("| BERT-A"))
    assert "10.00†" in bert_row and bert_row.endswith("| 10.00 |")
    assert "Avg is the mean over the columns every row has: CoLA (" in md
    assert "spearman 69.00" in md  # secondary metrics in the details list
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    assert {r["model"] for r in rows} == {"TUPE-A", "BERT-A"}
    tupe = next(r for r in rows if r["model"] == "TUPE-A")
    assert float(tupe["MNLI-mm"]) == pytest.approx(62.0) and tupe["MRPC"] == "" and tupe["steps"] == "30000"


def test_report_with_paper_rows_and_cli(tmp_path, capsys):
    _fill(tmp_path)
    out = tmp_path / "table.md"
    assert main(["report", str(tmp_path / "tupe"), str(tmp_path / "bert"), "--paper", "--out", str(out)]) == 0
    md = out.read_text()
    assert "| TUPE-R (paper) | 1M | 86.21/86.19 | 63.56 | 89.89 | 89.23 |" in md
    assert (tmp_path / "table.csv").is_file()
    assert md in capsys.readouterr().out


def test_report_errors(tmp_path, capsys):
    with pytest.raises(TupeError, match="no results.json"):
        make_report([str(tmp_path)])
    _results(tmp_path / "a", "x", "CoLA", "tupe-a", 1, "aa", {"dev": {"mcc": 0.2}})
    _results(tmp_path / "b", "x", "CoLA", "tupe-a", 1, "aa", {"dev": {"mcc": 0.3}})
    with pytest.raises(TupeError, match="a second CoLA result"):
        make_report([str(tmp_path)])
    (tmp_path / "bad.json").write_text("{")
    assert main(["report", str(tmp_path / "bad.json")]) == 2
    assert "bad.json:1: not valid JSON" in capsys.readouterr().err


def test_report_flags_settings_other_than_the_papers(tmp_path):
    d = _results(tmp_path, "mnli", "MNLI", "tupe-r", 300, "cc", {"dev_matched": {"accuracy": 0.5}})
    data = json.loads((d / "results.json").read_text())
    paper = {"lrs": [2e-5, 3e-5, 4e-5, 5e-5], "seeds": [1, 2, 3, 4, 5], "epochs": 5.0, "batch_size": 32,
             "warmup_ratio": 0.06, "weight_decay": 0.01, "adam_epsilon": 1e-6, "dropout": 0.1, "max_seq_len": 512,
             "max_train_samples": None, "max_eval_samples": None}  # fmt: skip
    data["settings"] = paper
    (d / "results.json").write_text(json.dumps(data))
    md, _ = make_report([str(d)])
    assert "differs from the paper" not in md
    assert md.splitlines()[0] == "| model | steps | MNLI-m | Avg |"  # no mismatched dev set was scored
    data["settings"] = paper | {"epochs": 3.0, "seeds": [1, 2], "max_train_samples": 1000}
    data["data"] = {"train_examples": 1000}
    (d / "results.json").write_text(json.dumps(data))
    md, _ = make_report([str(d)])
    assert (
        "differs from the paper's protocol: 3 epochs (paper 5); 2 seeds (paper 5); train subset of 1000" in md
    )


def test_report_majority_baseline_and_subsets(tmp_path):
    d = _results(tmp_path, "mnli", "MNLI", "tupe-a", 100, "aa",
                 {"dev_matched": {"accuracy": 0.5}, "dev_mismatched": {"accuracy": 0.52}})  # fmt: skip
    data = json.loads((d / "results.json").read_text())
    data["data"] = {"dev_majority_accuracy": {"dev_matched": 0.354, "dev_mismatched": 0.352}}
    data["settings"] = {"max_eval_samples": 200}
    (d / "results.json").write_text(json.dumps(data))
    c = _results(tmp_path, "cola", "CoLA", "tupe-a", 100, "aa", {"dev": {"mcc": 0.1}})
    data = json.loads((c / "results.json").read_text())
    data["data"] = {"dev_majority_accuracy": {"dev": 0.691}}
    (c / "results.json").write_text(json.dumps(data))
    md, _ = make_report([str(tmp_path)])
    assert "| TUPE-A | 100 | 50.00‡/52.00‡ | 10.00 | 37.33 |" in md
    assert "| majority class | - | 35.40/35.20 | 0.00 | 23.53 |" in md  # no steps: not a model
    assert "‡ trained or scored on a subset of the task" in md
    assert "majority class: always predicting the most frequent dev label" in md


def test_report_says_whether_each_model_beats_the_majority_on_every_seed(tmp_path):
    def with_seeds(d, scores, majority):
        data = json.loads((d / "results.json").read_text())
        data["main_split"], data["main_metric"] = (
            ("dev", "mcc") if data["task"] == "CoLA" else ("dev", "accuracy")
        )
        data["per_lr"] = {
            "2e-05": {"lr": 2e-5, "main_scores": scores},
            "1e-04": {"lr": 1e-4, "main_scores": [0.99]},
        }
        data["data"] = {"dev_majority_accuracy": {"dev": majority}}
        (d / "results.json").write_text(json.dumps(data))

    a = _results(tmp_path, "a", "MRPC", "tupe-a", 100, "aa", {"dev": {"accuracy": 0.70}})
    with_seeds(a, [0.69, 0.70, 0.71], 0.684)
    b = _results(tmp_path, "b", "MRPC", "bert-a", 100, "bb", {"dev": {"accuracy": 0.684}})
    with_seeds(b, [0.684, 0.70, 0.684], 0.684)
    c = _results(tmp_path, "c", "CoLA", "bert-a", 100, "bb", {"dev": {"mcc": 0.0}})
    with_seeds(c, [None, 0.0, 0.0], 0.69)
    md, _ = make_report([str(tmp_path)])
    # the lowest seed of the best lr (2e-5, not the other lr's 0.99) is compared with the majority class
    assert (
        "- TUPE-A 100, MRPC: beats it on every seed (lowest 69.00); seeds 69.00, 70.00, 71.00 vs 68.40" in md
    )
    assert (
        "- BERT-A 100, MRPC: not beyond the seed spread (some seeds at or below it); seeds 68.40, 70.00" in md
    )
    assert "- BERT-A 100, CoLA: no seed above it; seeds undefined, 0.00, 0.00 vs 0.00" in md


def test_a_subset_cell_is_not_called_unfinished(tmp_path):
    d = _results(tmp_path, "sst", "SST-2", "tupe-a", 100, "aa", {"dev": {"accuracy": 0.7}})
    data = json.loads((d / "results.json").read_text())
    data["settings"] = {"max_train_samples": 8000}
    (d / "results.json").write_text(json.dumps(data))
    md, _ = make_report([str(tmp_path)])
    assert "70.00‡" in md and "‡ trained or scored on a subset" in md
    assert "not finished" not in md and "†" not in md
