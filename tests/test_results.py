"""docs/results in the repository (issue 48, item 6): every committed report regenerates from the committed records,
byte for byte; stripped records come back whole through `tupe.io.results.load_result`; `docs/results` stays small;
no tracked file names an absolute path of the machine it was made on."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import load_script
from tupe.io.results import (
    MACHINE_PATH,
    anonymise_paths,
    load_result,
    recorded_command,
    recorded_path,
    restore,
    strip_result,
    stripped_files,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
LIMIT = 5 * 2**20  # bytes of docs/results in the tree

# Files that may name an absolute /tmp path (never /work, /root or /home), with why: each names a scratch folder of
# the lent GPU machine (nothing of the machine that ran it) or shows the pattern itself.
ALLOWED = {
    "tupe/bench/gpu_suite.py": "--studies-work's default: a scratch folder on the GPU machine, kept between calls",
    "tupe/bench/gpu_studies.py": "its usage line and --studies-work's default on the GPU machine",
    "benchmarks/gpu/carry.sh": "where the GPU machine installs the carried wheels",
    "docs/benchmarks.md": "the GPU calls as run there: scratch folders of the GPU machine",
}
PATTERN_FILES = {
    "tupe/io/results.py",
    "tests/test_results.py",
}  # they write the patterns out, to find and rewrite them


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, check=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.stdout.split()


def test_no_tracked_file_names_a_machine_path():
    found = []
    for rel in _tracked():
        path = ROOT / rel
        if rel in PATTERN_FILES or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # images, archives
        for n, line in enumerate(text.splitlines(), 1):
            if any(
                rel not in ALLOWED or not m.group().startswith("/tmp/") for m in MACHINE_PATH.finditer(line)
            ):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, (
        "absolute machine paths (anonymise them: tupe.io.results.anonymise_paths):\n" + "\n".join(found[:40])
    )


def test_docs_results_is_small_and_holds_no_scripts():
    files = [f for f in _tracked() if f.startswith("docs/results/") and (ROOT / f).is_file()]
    size = sum((ROOT / f).stat().st_size for f in files)
    assert size <= LIMIT, (
        f"docs/results holds {size / 2**20:.1f} MiB in the tree (at most {LIMIT / 2**20:.0f})"
    )
    scripts = [f for f in _tracked() if f.startswith("docs/") and f.endswith(".py")]
    assert not scripts, f"scripts belong in scripts/ or benchmarks/, not docs/: {scripts}"


def test_the_machine_path_pattern_and_its_rewrite():
    for path in ["/work/runs/x", "/root/.cache/tupe", "/home/ann/data", "/tmp/gpu/a.json", "'/tmp/x'"]:
        assert MACHINE_PATH.search(path), path
        assert not MACHINE_PATH.search(anonymise_paths(path)), anonymise_paths(path)
    for text in ["runs/x", "~/x", "/tmp/", "a/work/b", "/opt/torch/bin/python3", "https://x.org/home/a"]:
        assert not MACHINE_PATH.search(text), text
    assert anonymise_paths("/work/main/tupe/comparison/study.py --out /work/runs/length/length-1") == (
        "tupe/comparison/study.py --out runs/length/length-1"
    )
    assert anonymise_paths('"/root/.cache/tupe/packed/x"') == '"~/.cache/tupe/packed/x"'


def test_recorded_paths_are_relative_to_the_record(tmp_path):
    out = tmp_path / "study"
    assert recorded_path(out / "runs" / "a", out) == "runs/a"
    assert recorded_path(tmp_path / "texts" / "t.txt", out) == "../texts/t.txt"
    argv = [
        str(ROOT / "tupe" / "comparison" / "study.py"),
        "--out",
        str(out),
        f"--text={tmp_path / 't.txt'}",
        "-x",
    ]
    assert recorded_command(argv, out) == "tupe/comparison/study.py --out . --text=../t.txt -x"
    assert recorded_command([str(ROOT / "tupe" / "__main__.py"), "evaluate"], out) == "tupe evaluate"


def test_strip_and_restore_give_back_the_record():
    record = {
        "a": 1,
        "groups": [{"per_block": {"nll": [1.5, 2.0]}, "x": 2, "differences": [{"a": "m"}]}],
        "z": [],
    }
    stripped = strip_result(record)
    assert stripped == {"a": 1, "groups": [{"x": 2}], "z": []}
    assert restore(stripped, record, ("per_block", "differences")) == record
    renamed = json.loads(json.dumps(stripped).replace('"x": 2', '"x": 3'))  # what the tree holds wins
    assert restore(renamed, record, ("per_block", "differences"))["groups"][0]["x"] == 3


def _history() -> bool:
    manifest = json.loads((RESULTS / "length" / "stripped.json").read_text())
    probe = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", manifest["commit"]], capture_output=True
    )
    return probe.returncode == 0


@pytest.mark.slow
def test_a_stripped_record_comes_back_whole_from_history(tmp_path):
    if not _history():
        pytest.skip("no git history here (a source archive or a shallow clone)")
    folder = RESULTS / "length"
    rel = "length-1/passkey-pi.json"
    assert rel in stripped_files(folder)
    whole = load_result(folder / rel)
    tree = json.loads((folder / rel).read_text())
    assert "per_block" not in json.dumps(tree)
    entry = whole["by_distance"][0]
    assert len(entry["per_block"]["nll"]) == whole["settings"]["blocks"] or len(entry["per_block"]["nll"]) > 0
    assert strip_result(whole) == tree  # the tree's record is the whole one, stripped
    export = load_script("scripts/results/stored.py")
    export.main(["export", str(folder), str(tmp_path)])
    import numpy as np

    arrays = np.load(tmp_path / "per_block.npz")
    listed = json.loads((tmp_path / "per_block.json").read_text())["arrays"]
    one = next(a for a in listed if a["file"] == rel and a["key"].endswith("by_distance/0/per_block/nll"))
    assert arrays[one["array"]].tolist() == entry["per_block"]["nll"]
    assert arrays[one["array"]].dtype == np.float64


def test_a_passkey_rerun_replaces_the_passkey_columns(tmp_path):
    """`combine_length.py --passkey RERUN`: the re-run's token use and copying replace the chunks' passkey columns
    (a scheme the re-run lacks has none, and says so), the verdict gains a copying column, and the re-run's final losses are
    set beside the originals', paired by seed."""
    folder, rerun = tmp_path / "length", tmp_path / "rerun"
    shutil.copytree(RESULTS / "length", folder, ignore=shutil.ignore_patterns("*.png"))
    for path in sorted(folder.glob("length-*/study.json")):
        study = json.loads(path.read_text())
        for scheme, row in study["schemes"].items():
            row["final_losses"] = [x + 0.01 for x in row["final_losses"]]
            for col in [c for c in row if c.startswith("passkey d=")]:
                row[col] = [0.25] * len(row[col]) if scheme == "rope" else [0.0] * len(row[col])
                row[col.replace("passkey", "copying")] = (
                    [0.2, 0.21, 0.19, 0.2, 0.2] if scheme == "rope" else [0] * 5
                )
        study["schemes"].pop("nope", None)
        (rerun / path.parent.name).mkdir(parents=True)
        (rerun / path.parent.name / "study.json").write_text(json.dumps(study))
    load_script("scripts/results/combine_length.py").main([str(folder), "--passkey", str(rerun)])
    md = (folder / "length.md").read_text()
    assert (
        "| rope | 4.731 ± 0.048 | 4.677, 4.732, 4.739, 4.702, 4.804 | +0.010 [+0.010, +0.010] * | +0.01 |"
        in md
    )
    assert "| nope | not in the re-run | | | |" in md
    assert "token use above 0 at | copies the key at |" in md
    verdict = md.split("## Verdict per scheme")[1].splitlines()
    rope = next(line for line in verdict if line.startswith("| rope | yarn | 5.212"))
    assert rope.endswith("| 16: +0.250 [+0.250, +0.250], 64: +0.250 [+0.250, +0.250], 128: +0.250 [+0.250, +0.250]"
                         ", 256: +0.250 [+0.250, +0.250], 512: +0.250 [+0.250, +0.250], 1,024: +0.250 [+0.250, +0.250]"
                         " | 16: +0.200 [+0.191, +0.209], 64: +0.200 [+0.191, +0.209], 128: +0.200 [+0.191, +0.209], "
                         "256: +0.200 [+0.191, +0.209], 512: +0.200 [+0.191, +0.209], 1,024: +0.200 [+0.191, +0.209] |")  # fmt: skip
    nope = next(line for line in verdict if line.startswith("| nope | none | 6.543"))
    assert nope.endswith("| not in the re-run | not in the re-run |")  # no passkey reading at all, not "none"
    rows = json.loads((folder / "length.json").read_text())["schemes"]
    assert (
        not any(k.startswith(("passkey", "copying")) for k in rows["nope"])
        and rows["nope"]["rerun_final_losses"] == []
    )


def test_length_report_regenerates(tmp_path):
    """docs/results/length/length.md and length.json, from the chunks' committed study.json and lengths-*.json."""
    folder = tmp_path / "length"
    shutil.copytree(RESULTS / "length", folder, ignore=shutil.ignore_patterns("*.png"))
    load_script("scripts/results/combine_length.py").main([str(folder)])
    for name in ("length.md", "length.json"):
        assert (folder / name).read_bytes() == (RESULTS / "length" / name).read_bytes(), name


def test_packing_report_regenerates(tmp_path):
    """docs/results/packing/packing.md and packing.json, from the committed records (the command line aside)."""
    script = load_script("scripts/results/compare_packing.py")
    script.main(["report", "--records", str(RESULTS / "packing" / "records"), "--out", str(tmp_path)])
    assert (tmp_path / "packing.md").read_bytes() == (RESULTS / "packing" / "packing.md").read_bytes()
    made, kept = (json.loads((d / "packing.json").read_text()) for d in (tmp_path, RESULTS / "packing"))
    made.pop("command"), kept.pop("command")
    assert made == kept


def test_regime_claims_regenerate_from_their_record():
    """docs/results/regime/paper6k/claims.md (RESULTS G.4), from the claims.json beside it, which holds every run's
    validation curve; and by that record every bert-a seed of the regime recipe has left the plateau (G.3)."""
    from tupe.comparison.claims import PLATEAU_MARGIN, render

    folder = RESULTS / "regime" / "paper6k"
    record = json.loads((folder / "claims.json").read_text())
    assert render(record) == (folder / "claims.md").read_text()
    threshold = record["unigram_loss"] - PLATEAU_MARGIN
    for k in (0, 1, 2):
        run = record["runs"][f"bert-a/seed-{k}"]
        assert run["finished"] and run["last_step"] == 6000
        exit_step = next(step for step, loss in run["valid"] if loss <= threshold)
        assert exit_step == run["plateau_exit"] and exit_step <= 4700


def test_regime_figures_regenerate_from_the_analyses():
    """docs/results/regime/paper6k/analysis/figures.md (RESULTS G.5), from the committed analysis.json files; the
    records hold no machine paths, and the decomposition they report adds up (the four terms sum to the logits)."""
    folder = RESULTS / "regime" / "paper6k" / "analysis"
    made = load_script("scripts/results/paper_figures.py").table(folder)
    assert made == (folder / "figures.md").read_text()
    for path in folder.glob("*/analysis.json"):
        text = path.read_text()
        assert "/work/" not in text and "/root/" not in text, path
        assert json.loads(text)["decomposition"]["max_abs_error"] < 1e-9, path


def test_paper_figures_collect_keeps_the_named_figures_and_no_machine_paths(tmp_path):
    """`paper_figures.py collect`: analysis.json with its machine paths made relative, the named figures as palette
    PNGs, and no other figure (one left from an earlier collection is removed)."""
    from PIL import Image

    script = load_script("scripts/results/paper_figures.py")
    src, dest = tmp_path / "runs", tmp_path / "results"
    for name in ("bert-a-s0-6000", "bert-a-s1-6000"):
        (src / name).mkdir(parents=True)
        (src / name / "analysis.json").write_text(json.dumps({"model": f"/work/runs/paper6k/runs/{name}"}))
        Image.new("RGB", (40, 20), (10, 200, 30)).save(src / name / "decomposition.png")
    (dest / "bert-a-s1-6000").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(dest / "bert-a-s1-6000" / "decomposition.png")  # a figure no longer named
    assert script.collect(src, dest, ["bert-a-s0-6000/decomposition.png"]) == 2
    assert json.loads((dest / "bert-a-s0-6000" / "analysis.json").read_text()) == {
        "model": "runs/paper6k/runs/bert-a-s0-6000"
    }
    with Image.open(dest / "bert-a-s0-6000" / "decomposition.png") as image:
        assert image.mode == "P" and image.size == (40, 20)
    assert not (dest / "bert-a-s1-6000" / "decomposition.png").exists()


def test_part_h_demo_column_regenerates(tmp_path, capsys):
    """RESULTS Part H's demo-recipe column: scripts/results/final_pairs.py on Part E's committed study.json files
    gives every pair's mean and interval that the table shows, with its verdict."""
    out = tmp_path / "pairs.md"
    assert (
        load_script("scripts/results/final_pairs.py").main([str(RESULTS / "length"), "--out", str(out)]) == 0
    )
    rows = [
        line.split(" | ")
        for line in out.read_text().splitlines()
        if line.startswith("| tupe-") or line.startswith("| bert-")
    ]
    assert len(rows) == 6 and capsys.readouterr().out == out.read_text()
    part_h = (ROOT / "docs" / "RESULTS.md").read_text().split("# Part H")[1].split("\n# ")[0]
    for row in rows:
        assert row[2] in part_h, row  # e.g. "-0.874 [-1.161, -0.586]"
    assert {row[3].rstrip(" |") for row in rows} == {"holds", "direction"}
    with pytest.raises(SystemExit, match=r"no length-\*/study\.json"):
        load_script("scripts/results/final_pairs.py").main([str(tmp_path)])


def test_part_h_regime_column_is_the_record():
    """RESULTS Part H's regime column: every pre-training pair's final difference there is the one in the committed
    record's claims.md (G.4), which regenerates from claims.json."""
    claims = (RESULTS / "regime" / "paper6k" / "claims.md").read_text()
    part_h = (ROOT / "docs" / "RESULTS.md").read_text().split("# Part H")[1].split("\n# ")[0]
    finals = [
        line.split(" | ")[5]
        for line in claims.splitlines()
        if line.startswith("| ") and line.count(" | ") == 6 and line.split(" | ")[1] == "0, 1, 2"
    ]  # the pair tables' rows (pair | seeds | ... | final difference | verdict), not the per-step ones
    assert len(finals) == 6  # 4 Fig. 5a pairs, 2 orderings
    for final in finals:
        assert final.rstrip(" *") in part_h, final
