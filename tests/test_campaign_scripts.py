"""The long campaigns' scripts (scripts/campaign/): valid bash, and the passkey re-run's chunks are Part E's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts" / "campaign").glob("*.sh"))


def test_there_are_campaign_scripts() -> None:
    assert {p.name for p in SCRIPTS} >= {"partE_passkey.sh", "regime.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_regime_grid_runner_runs_every_grid_and_reports_a_failure(tmp_path: Path) -> None:
    """regime.sh's `pairs` runs every queued grid, two at a time, and fails if any did (the others still run)."""
    text = (ROOT / "scripts" / "campaign" / "regime.sh").read_text()
    start = text.index("pairs() {")
    pairs = text[start : text.index("\n}\n", start) + 3]
    stub = (
        f'grid() {{ echo "$1" >> {tmp_path}/ran; [ "$1" != bad ]; }}\n{pairs}\n'
        "printf 'a --x 1\\nbad --y\\n\\nc --z\\n' | pairs\n"
    )
    proc = subprocess.run(["bash", "-c", stub], capture_output=True, text=True)
    assert proc.returncode == 1
    assert sorted((tmp_path / "ran").read_text().split()) == ["a", "bad", "c"]


def test_passkey_chunks_are_part_e_chunks() -> None:
    """The script asks tupe.bench.gpu_studies for chunk K; RESULTS E.1 names the same four chunks."""
    from tupe.bench.gpu_studies import length_chunks

    results = (ROOT / "docs" / "RESULTS.md").read_text()
    for chunk in length_chunks():
        assert ", ".join(chunk) in results.replace("`", "").replace("\n", " ")
