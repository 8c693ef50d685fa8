"""The shared I/O policy (tupe/io/reading.py, tupe/io/outputs.py): bounded, non-blocking reads and an output
folder in which tupe writes over or deletes only what it wrote itself."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tupe.errors import TupeError
from tupe.io.files import atomic_write_text
from tupe.io.outputs import TEMP_OF, OutputFolder, claim_file, read_record
from tupe.io.reading import iter_lines, read_json, read_text


def test_a_fifo_is_refused_by_name_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)  # no writer: open() without O_NONBLOCK would block forever
    t0 = time.monotonic()
    with pytest.raises(
        TupeError, match=r"metrics.jsonl: a FIFO \(named pipe\), not a regular file \(metrics log\)"
    ):
        list(iter_lines(fifo, "metrics log"))
    with pytest.raises(TupeError, match="FIFO"):
        read_json(fifo, "run record")
    assert time.monotonic() - t0 < 5


def test_a_link_to_dev_zero_is_refused_and_a_huge_file_is_bounded(tmp_path: Path) -> None:
    link = tmp_path / "results.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(TupeError, match="results.json: a character device, not a regular file"):
        read_json(link, "results")
    big = tmp_path / "big.json"
    with big.open("wb") as fh:  # sparse: 1 GiB without using the disk
        fh.truncate(1 << 30)
    with pytest.raises(TupeError, match=r"big.json: larger than 1.0 MiB, far more than a run record holds"):
        read_text(big, 1 << 20, "run record")
    long_line = tmp_path / "m.jsonl"
    long_line.write_bytes(b"x" * 5000)
    with pytest.raises(TupeError, match="m.jsonl:1: a line longer than"):
        list(iter_lines(long_line, "metrics log", line_limit=1000))


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("null", "expected an object (run record), got null"),
        ("42", "expected an object (run record), got a number"),
        ("[1, 2]", "expected an object (run record), got a list"),
        ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
        ('{"a": ', "tupe_run.json:1: not valid JSON"),
        (b"\xe9t\xe9", "not UTF-8 text (byte 0xe9 at offset 0"),
    ],
)
def test_json_of_the_wrong_shape_is_one_line_naming_the_file(tmp_path: Path, content, needle: str) -> None:  # noqa: ANN001
    path = tmp_path / "tupe_run.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TupeError) as err:
        read_json(path, "run record")
    assert str(err.value).startswith(str(path)) and needle in str(err.value), str(err.value)


def test_temporary_files_have_names_no_user_file_has(tmp_path: Path) -> None:
    seen = []
    real_replace = os.replace

    def spy(src, dst):  # noqa: ANN001, ANN202
        seen.append(Path(src).name)
        return real_replace(src, dst)

    os.replace = spy
    try:
        atomic_write_text(tmp_path / "README.md", "x")
    finally:
        os.replace = real_replace
    assert TEMP_OF.match(seen[0]) and TEMP_OF.match(seen[0])["name"] == "README.md", seen
    for user_file in (".README.md.draft.tmp", ".notes.tmp", ".README.md.a1b2c3d4.tmp"):
        assert not TEMP_OF.match(user_file)


def test_a_command_claims_only_what_is_free_or_its_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("mine\n")
    glue = OutputFolder(out, "tupe glue")
    with pytest.raises(
        TupeError, match=r"holds 'README.md', which tupe did not write; `tupe glue` would write"
    ):
        glue.claim("results.json", "README.md")
    assert not (out / "tupe_files.json").exists()  # refused before recording anything
    glue.claim("results.json", "runs")
    assert read_record(out) == {"results.json": "tupe glue", "runs": "tupe glue"}
    (out / "results.json").write_text("{}")
    OutputFolder(out, "tupe glue").claim("results.json")  # its own: fine
    with pytest.raises(
        TupeError, match="holds 'results.json', which `tupe glue` wrote; `tupe analyze` would"
    ):
        OutputFolder(out, "tupe analyze").claim("results.json")
    assert (out / "README.md").read_text() == "mine\n"


def test_removal_never_goes_through_a_symbolic_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "lr0.001_seed1").mkdir(parents=True)
    (elsewhere / "lr0.001_seed1" / "precious.txt").write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs").symlink_to(elsewhere)
    glue = OutputFolder(out, "tupe glue")
    with pytest.raises(TupeError, match="holds 'runs', which tupe did not write"):
        glue.claim("runs")
    # even a recorded name that became a link is neither written through nor deleted through
    from tupe.io.outputs import update_record

    update_record(out, add={"runs": "tupe glue"})
    glue = OutputFolder(out, "tupe glue")
    with pytest.raises(TupeError, match="a symbolic link tupe did not make"):
        glue.claim("runs")
    with pytest.raises(TupeError, match="runs is a symbolic link tupe did not make"):
        glue.remove("runs/lr0.001_seed1")
    assert (elsewhere / "lr0.001_seed1" / "precious.txt").read_text() == "keep"


def test_output_files_named_by_the_user(tmp_path: Path) -> None:
    mine = tmp_path / "eval.json"
    mine.write_text("my numbers\n")
    with pytest.raises(TupeError, match="--json .*eval.json exists and tupe did not write it"):
        claim_file(mine, "tupe evaluate", "--json")
    new = claim_file(tmp_path / "new.json", "tupe evaluate", "--json")
    new.write_text("{}")
    claim_file(new, "tupe evaluate", "--json")  # rewriting its own file
    with pytest.raises(TupeError, match="was written by `tupe evaluate`; `tupe plot` does not write over it"):
        claim_file(new, "tupe plot", "--out")
    assert mine.read_text() == "my numbers\n"


def test_parquet_is_checked_from_its_footer_before_datasets_reads_it(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """GLUE and `tupe finetune` parquet inputs: shape and columns come from the footer alone (bounded); a file
    that is not parquet, has a damaged or huge footer, a row group too large, or lacks the task's columns is
    refused in one line naming it, before `datasets` reads (and caches) any row."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tupe.finetuning.classification import _columns
    from tupe.finetuning.glue.tasks import get_task, read_split_file
    from tupe.io import reading

    good = tmp_path / "train.parquet"
    pq.write_table(pa.table({"sentence": ["a b", "c d"], "label": [0, 1], "idx": [0, 1]}), good)
    assert reading.check_parquet(good) == ["sentence", "label", "idx"]

    def no_read(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("datasets read a file the footer check should have refused")

    monkeypatch.setattr(datasets, "load_dataset", no_read)
    sst2, mrpc = get_task("sst2"), get_task("mrpc")
    with pytest.raises(
        TupeError, match=r"train\.parquet: missing column 'sentence1' for MRPC \(has: sentence, label, idx\)"
    ):
        read_split_file(mrpc, good)

    data = good.read_bytes()
    cases = {
        "short.parquet": (b"PAR1", r"short\.parquet: cannot read it as parquet: 4 bytes, too short"),
        "text.parquet": (
            b"sentence\tlabel\n" * 4,
            r"text\.parquet: cannot read it as parquet: no PAR1 footer",
        ),
        "huge_footer.parquet": (
            data[:-8] + (1 << 31).to_bytes(4, "little") + b"PAR1",
            r"huge_footer\.parquet: cannot read it as parquet: a footer of 2\.0 GiB, damaged",
        ),
        "garbled.parquet": (
            data[:-100] + b"\xff" * 92 + data[-8:],
            r"garbled\.parquet: cannot read it as parquet: ",
        ),
    }
    for name, (content, needle) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(TupeError, match=needle) as info:
            read_split_file(sst2, tmp_path / name)
        assert "\n" not in str(info.value)
    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(
        TupeError, match=r"fifo\.parquet: a FIFO \(named pipe\), not a regular file \(GLUE file\)"
    ):
        read_split_file(sst2, fifo)
    with pytest.raises(TupeError, match=r"fifo\.parquet: a FIFO"):
        _columns(fifo)  # `tupe finetune`'s column check
    assert time.monotonic() - t0 < 5
    monkeypatch.setattr(reading, "PARQUET_ROW_GROUP_LIMIT", 10)
    with pytest.raises(
        TupeError, match=r"train\.parquet: row group 0 holds .* uncompressed, more than 10 bytes"
    ):
        read_split_file(sst2, good)
    with pytest.raises(TupeError, match=r"train\.parquet: row group 0"):
        _columns(good)


def test_a_fifo_in_place_of_lock_info_neither_hangs_nor_hides_the_refusal(tmp_path: Path) -> None:
    """`.lock.info` is read only to name the holder of a held lock: a FIFO there (no writer: a blocking open would
    wait forever) gives the refusal with 'holder unknown', at once. The second command runs in a subprocess with a
    timeout, so a hang fails the test instead of stalling the suite."""
    import subprocess
    import sys

    from tupe.io.files import file_lock, folder_lock

    from .conftest import subprocess_env

    out, result = tmp_path / "out", tmp_path / "results" / "eval.json"
    result.parent.mkdir()
    second = (
        "import sys\nfrom tupe.errors import TupeError\nfrom tupe.io.files import file_lock, folder_lock\n"
        "lock = folder_lock(sys.argv[1], 'tupe glue') if sys.argv[2] == 'folder' else file_lock(sys.argv[1], "
        "'tupe evaluate')\ntry:\n    with lock:\n        print('ACQUIRED')\nexcept TupeError as err:\n    print(err)\n"
    )
    for kind, lock, target, info in (
        ("folder", folder_lock(out, "tupe glue"), out, out / ".lock.info"),
        ("file", file_lock(result, "tupe evaluate"), result, result.parent / ".eval.json.lock.info"),
    ):
        with lock:
            info.unlink()
            os.mkfifo(info)
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-c", second, str(target), kind],
                env=subprocess_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert time.monotonic() - t0 < 60
            assert proc.returncode == 0, proc.stderr
            assert (
                f"{target}: another `" in proc.stdout
                and "(holder unknown); wait for it or stop it" in proc.stdout
            )
            assert "ACQUIRED" not in proc.stdout and proc.stdout.count("\n") == 1
        assert not os.path.lexists(info)  # the holder removed its lock files, the FIFO included
