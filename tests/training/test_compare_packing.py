"""scripts/results/compare_packing.py: a record per finished run (kept, skipped once complete), the report's
pairing of documents with stream by seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import load_script
from tests.training.conftest import tiny_cli_args
from tupe.cli import main as cli


def _script():  # noqa: ANN202 - the script as a module
    return load_script("scripts/results/compare_packing.py")


@pytest.mark.slow
def test_records_of_both_packings_and_the_report(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    cp = _script()
    records = tmp_path / "records"
    args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir) + ["--max-steps", "2"]
    for packing in cp.PACKINGS:
        runs = tmp_path / packing
        argv = ["compare", "--schemes", "bert-a,tupe-a", "--seeds", "0,1", "--packing", packing]
        assert cli([*argv, "--out", str(runs), *args]) == 0
        assert cp.main(["record", "--runs", str(runs), "--packing", packing, "--records", str(records),
                        "--blocks", "4"]) == 0  # fmt: skip
    rec = json.loads((records / "documents" / "tupe-a-seed-1.json").read_text())
    assert (
        rec["run"]
        == {
            "scheme": "tupe-a",
            "seed": 1,
            "packing": "documents",
            "folder": "../../documents/tupe-a/seed-1",  # relative to the record: no machine's folder in the repository
        }
    )
    summary = json.loads((tmp_path / "documents" / "tupe-a" / "seed-1" / "pretrain_summary.json").read_text())
    assert rec["pretraining"]["final_loss"] == summary["final_eval_loss"]
    assert rec["pretraining"]["packing_efficiency"] == summary["packing_efficiency"]
    assert rec["pretraining"]["valid_curve"][-1][0] == 2
    assert math.isfinite(rec["ood"]["loss"]["value"]) and rec["ood"]["tokens_per_word"] > 1.0
    cls = rec["cls"]
    assert cls["block_length"] == 32 and len(cls["attention_to_cls"]) == 2
    assert all(0.0 < a < 1.0 for a in cls["attention_to_cls"])
    assert len(cls["theta"]["theta_1"]) == 2  # tupe-a resets [CLS]: theta per head (2 heads)
    assert "theta" not in json.loads((records / "stream" / "bert-a-seed-0.json").read_text())["cls"]

    # a complete record is kept; a stream folder recorded as documents is refused by name
    mtime = (records / "documents" / "tupe-a-seed-1.json").stat().st_mtime_ns
    assert cp.main(["record", "--runs", str(tmp_path / "documents"), "--packing", "documents", "--records",
                    str(records)]) == 0  # fmt: skip
    assert (records / "documents" / "tupe-a-seed-1.json").stat().st_mtime_ns == mtime
    assert (
        cp.main(
            [
                "record",
                "--runs",
                str(tmp_path / "stream"),
                "--packing",
                "documents",
                "--records",
                str(tmp_path / "other"),
            ]
        )
        == 2
    )  # fmt: skip  (trained with --packing stream, not documents)

    out = tmp_path / "report"
    assert cp.main(["report", "--records", str(records), "--out", str(out)]) == 0
    payload = json.loads((out / "packing.json").read_text())
    assert payload["seeds"] == [0, 1] and list(payload["schemes"]) == ["bert-a", "tupe-a"]
    loss = payload["schemes"]["tupe-a"]["final_loss"]
    diffs = payload["schemes"]["tupe-a"]["documents_minus_stream"]
    assert diffs == pytest.approx([d - s for s, d in zip(loss["stream"], loss["documents"])])
    table = (out / "packing.md").read_text()
    assert "| tupe-a | " in table and "Uniform attention: 0.0312 over a 32-token block." in table


def test_a_one_seed_comparison_is_found_and_empty_folders_are_refused(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """Issue 49, item 16: `record` did nothing on the --out of a one-seed `tupe compare` (its runs are SCHEME/, not
    SCHEME/seed-K/) and `report` wrote empty tables for a missing records folder, both exit 0."""
    cp = _script()
    one = tmp_path / "one-seed"
    for scheme in ("bert-a", "tupe-a"):
        (one / scheme).mkdir(parents=True)
        (one / scheme / "config.json").write_text("{}")
    (one / "compare_run.json").write_text(
        json.dumps({"format": 1, "schemes": ["bert-a", "tupe-a"], "seeds": [3]})
    )
    assert cp.finished_runs(one) == {("bert-a", 3): one / "bert-a", ("tupe-a", 3): one / "tupe-a"}
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["record", "--runs", str(empty), "--packing", "stream", "--records", str(tmp_path / "rec")], "no finished run"),
        (["record", "--runs", str(tmp_path / "nope"), "--packing", "stream", "--records", str(tmp_path / "rec")],
         "--runs"),
        (["report", "--records", str(tmp_path / "nope"), "--out", str(tmp_path / "report")], "--records"),
        (["report", "--records", str(empty), "--out", str(tmp_path / "report")], "no record"),
        (["record", "--runs", str(one), "--packing", "stream", "--records", str(tmp_path / "rec"), "--blocks", "0"],
         "argument --blocks"),
    ]  # fmt: skip
    for argv, needle in cases:
        assert cp.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("compare_packing.py: error:") and "\n" not in err and needle in err, err
    assert not (tmp_path / "rec").exists() and not (tmp_path / "report").exists()
