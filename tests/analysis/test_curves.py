"""`tupe plot` on run folders and on `tupe compare` folders (both layouts), from hand-written metrics files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tupe.analysis.curves import find_runs, legend_labels, plot_curves
from tupe.cli import main
from tupe.errors import TupeError


def _run(folder: Path, scheme: str, losses: list[float]) -> Path:
    folder.mkdir(parents=True)
    (folder / "tupe_run.json").write_text(json.dumps({"scheme": scheme}))
    lines = [json.dumps({"step": 10 * (i + 1), "loss": x + 0.1}) for i, x in enumerate(losses)]
    lines += [json.dumps({"step": 10 * (i + 1), "eval_loss": x}) for i, x in enumerate(losses)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _compare_folder(root: Path, schemes: list[str], seeds: list[int]) -> Path:
    """The layout `tupe compare` writes: DIR/<scheme>/ for one seed, DIR/<scheme>/seed-<k>/ for several."""
    for i, scheme in enumerate(schemes):
        for k in seeds:
            where = root / scheme if len(seeds) == 1 else root / scheme / f"seed-{k}"
            _run(where, scheme, [6.0 - i * 0.1 - k * 0.01, 5.0 - i * 0.1])
    (root / "logs").mkdir()  # a parallel comparison's logs: not a run
    summary = {"schemes": schemes, "stats": {"unigram_loss": 6.5}}
    (root / "compare_summary.json").write_text(json.dumps(summary))
    return root


def test_compare_folder_with_several_seeds_is_every_run_grouped_by_scheme(tmp_path: Path) -> None:
    # tupe-a listed first in the comparison: the reference comes first although bert-a sorts before it
    cmp = _compare_folder(tmp_path / "cmp", ["tupe-a", "bert-a"], [0, 2, 10])
    runs = find_runs(cmp)
    assert [str(d.relative_to(cmp)) for d, _ in runs] == [
        "tupe-a/seed-0", "tupe-a/seed-2", "tupe-a/seed-10", "bert-a/seed-0", "bert-a/seed-2", "bert-a/seed-10",
    ]  # fmt: skip
    assert [label for _, label in runs] == ["tupe-a"] * 3 + ["bert-a"] * 3
    assert legend_labels([cmp], [runs]) == ["tupe-a"] * 3 + ["bert-a"] * 3


def test_single_seed_compare_folder_and_a_lone_run(tmp_path: Path) -> None:
    cmp = _compare_folder(tmp_path / "cmp", ["bert-a", "tupe-r"], [0])
    assert [(d.name, label) for d, label in find_runs(cmp)] == [("bert-a", "bert-a"), ("tupe-r", "tupe-r")]
    lone = _run(tmp_path / "mine", "rope", [5.0])
    assert find_runs(lone) == [(lone, "rope")]


def test_labels_of_two_sources_sharing_a_scheme_name_their_folders(tmp_path: Path) -> None:
    one = _compare_folder(tmp_path / "cmp-1", ["bert-a", "tupe-a"], [0, 1])
    two = _compare_folder(tmp_path / "cmp-2", ["bert-a"], [0])
    lone = _run(tmp_path / "x" / "rope-run", "rope", [5.0])
    groups = [find_runs(one), find_runs(two), find_runs(lone)]
    labels = legend_labels([one, two, lone], groups)
    assert labels == ["bert-a [cmp-1]"] * 2 + ["tupe-a"] * 2 + ["bert-a [cmp-2]", "rope"]
    # two single runs of one scheme in folders of the same name: the paths tell them apart
    a, b = _run(tmp_path / "p" / "run", "bert-a", [5.0]), _run(tmp_path / "q" / "run", "bert-a", [5.0])
    assert legend_labels([a, b], [find_runs(a), find_runs(b)]) == ["bert-a [p/run]", "bert-a [q/run]"]


def test_legend_entries_say_how_many_seeds_and_sit_beside_the_axes(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmp = _compare_folder(tmp_path / "cmp", ["bert-a", "tupe-a"], [0, 1, 2])
    runs = find_runs(cmp)
    seen = {}
    close = plt.close

    def keep(fig=None):  # noqa: ANN001, ANN202 - read the legend before the figure is closed
        if fig is not None and fig.axes and fig.axes[0].get_legend() is not None:
            legend = fig.axes[0].get_legend()
            seen["texts"] = [t.get_text() for t in legend.get_texts()]
            seen["outside"] = legend.get_bbox_to_anchor().x0 > fig.axes[0].get_window_extent().x1
        return close(fig)

    monkeypatch.setattr(plt, "close", keep)
    plot_curves([d for d, _ in runs], tmp_path / "f.png", labels=[lab for _, lab in runs], baseline=6.5,
                show_train=True)  # fmt: skip
    assert seen["texts"] == [
        "bert-a (3 seeds)", "tupe-a (3 seeds)", "unigram baseline (6.50)", "training loss (dotted, same colour)",
    ]  # fmt: skip
    assert seen["outside"]


def test_plot_command_on_compare_folders(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    multi = _compare_folder(tmp_path / "multi", ["bert-a", "tupe-a"], [0, 1])
    single = _compare_folder(tmp_path / "single", ["bert-a", "tupe-a"], [0])
    png = tmp_path / "out" / "curves.png"
    assert main(["plot", str(multi), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == f"{png} (4 runs)"
    assert main(["plot", str(multi), str(single), str(single / "tupe-a"), "--out", str(png), "--train"]) == 0
    assert "(7 runs)" in capsys.readouterr().out
    # --labels names the legend entries (one per scheme group), not the folders
    assert main(["plot", str(multi), "--out", str(png), "--labels", "BERT-A,TUPE-A"]) == 0
    assert main(["plot", str(multi), "--out", str(png), "--labels", "only-one"]) == 2
    assert "--labels has 1 names for 2 legend entries (bert-a, tupe-a)" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(TupeError, match="not a `tupe compare` output folder either"):
        find_runs(tmp_path / "empty")
