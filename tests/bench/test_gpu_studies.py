"""The GPU suite's `packing-speed` and `studies` stages (tupe/bench/gpu_studies.py): their CPU dry run end to end
(every job, resumed), and what comes back: the archive within the device's return limits, the results kept and the
weights left behind. No timing asserted."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.glue.fixtures import write_task
from tupe import POSITION_SCHEMES
from tupe.bench import gpu_studies, gpu_suite

ROOT = Path(__file__).resolve().parents[2]
RETURNABLE = re.compile(r"^[A-Za-z0-9._-]+$")  # the device returns files named in these characters only


def _untar(files: list[Path]) -> tarfile.TarFile:
    data = b"".join(f.read_bytes() for f in sorted(files))
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


@pytest.mark.slow
def test_cpu_dry_run_of_the_studies_resumes_and_returns_one_archive(tmp_path: Path) -> None:
    write_task(tmp_path / "glue", "SST-2", n_train=8, n_dev=8)
    write_task(tmp_path / "glue", "CoLA", n_train=8, n_dev=8)
    news = tmp_path / "news.txt"
    news.write_text("Stocks rose on Monday.\nThe bank said rates would stay.\n\nOil fell.\n" * 20)
    out, ret, work = tmp_path / "out", tmp_path / "ret", tmp_path / "work"
    cmd = [sys.executable, "-m", "tupe.bench.gpu_suite", "--out", str(out), "--device", "cpu", "--smoke",
           "--budget", "3000", "--stages", "packing-speed,studies", "--studies-work", str(work),
           "--studies-parallel", "2", "--glue-data", str(tmp_path / "glue"), "--ood-text", str(news),
           "--ood-text", str(tmp_path / "absent.txt"), "--archive", str(ret / "gpu.tar.gz")]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (out / "summary.json").read_text()
    summary = json.loads(text)
    assert list(summary["stages"]) == ["packing-speed", "studies"]
    for path in (str(out), str(work), str(ROOT), sys.executable):  # named as $OUT, $STUDIES_WORK, ., python
        assert path not in text, path

    speed = summary["stages"]["packing-speed"]
    assert set(speed["packing_step"]["result"]["median_step_s"]) == {"stream", "documents"}
    glue = speed["glue"]["result"]
    assert sorted(k.split("/")[0] for k in glue) == ["CoLA", "SST-2"]
    assert all(g["examples_per_s"]["padding-free"] > 0 for g in glue.values())

    studies = summary["stages"]["studies"]
    jobs = {j["name"]: j for j in studies["jobs"]}
    assert list(jobs) == ["length-1", "regime", "paragraphs", "packing"]  # the smoke plan: one length chunk
    assert [s["step"] for s in jobs["regime"]["steps"]] == ["train", "evaluate", "glue"]
    assert "--preset small --max-steps 6000" in jobs["regime"]["steps"][0]["commands"][0]
    assert any("regime: no MRPC under --glue-data" in n for n in studies["notes"])
    assert [s["step"] for s in jobs["packing"]["steps"]] == ["train", "evaluate", "sst-2"]
    assert [s["step"] for s in jobs["paragraphs"]["steps"]] == ["train", "evaluate"]  # smoke: no SST-2 here
    assert all(
        "--corpus $STUDIES_WORK/texts/paragraphs" in c for c in jobs["paragraphs"]["steps"][0]["commands"]
    )
    assert [s["step"] for s in jobs["length-1"]["steps"]] == ["train", "evaluate"]
    assert {j["status"] for j in jobs.values()} == {"done"}, jobs
    assert any("absent.txt" in n for n in studies["notes"])

    results = out / "studies"
    for packing in gpu_studies.PACKINGS:
        folder = results / f"packing-{packing}"
        table = (folder / "study.md").read_text()
        assert "| tupe-a |" in table and "SST-2 dev acc." in table
        assert "built-in: word order" in table
        compare = json.loads((folder / "runs" / "compare_summary.json").read_text())
        assert set(compare["stats"]["schemes"]) == {"tupe-a"}
        assert json.loads((folder / "glue" / "SST-2-tupe-a-seed-0" / "results.json").read_text())["complete"]
        assert (folder / "runs" / "tupe-a" / "seed-1" / "metrics.jsonl").stat().st_size > 0
    record = json.loads(
        (results / "packing-documents" / "runs" / "tupe-a" / "seed-0" / "pretrain_summary.json").read_text()
    )
    assert record["packing"] == "documents"
    regime = results / "regime"
    table = (regime / "study.md").read_text()
    assert "| bert-a |" in table and "CoLA dev mcc" in table and "SST-2 dev acc." in table, table
    config = json.loads((regime / "runs" / "bert-a" / "seed-1" / "config.json").read_text())
    assert config["hidden_size"] == 256  # the small preset
    cola = json.loads((regime / "glue" / "CoLA-bert-a-seed-1" / "results.json").read_text())
    assert cola["complete"] and cola["data"]["train_examples"] == 8
    length = results / "length-1"
    assert {"ood-built-in.json", "ood-news.json", "lengths-none.json", "passkey-yarn.json", "study.md"} <= {
        p.name for p in length.iterdir()
    }
    assert "news: loss" in (length / "study.md").read_text()
    # results only: SST-2 finished on the device, so no weights come back; no checkpoints, no tokenizers
    assert studies["returned_models"] == []
    assert not [
        p for p in results.rglob("*") if p.suffix == ".safetensors" or p.name.startswith("checkpoint-")
    ]
    assert (work / "packing-stream" / "runs" / "tupe-a" / "seed-0" / "model.safetensors").is_file()

    # one archive of --out, named as the device returns files; the summary names every job
    (archive,) = ret.iterdir()
    assert RETURNABLE.match(archive.name) and archive.stat().st_size < gpu_studies.ARCHIVE_PART_BYTES
    with _untar([archive]) as tar:
        names = tar.getnames()
        assert "out/studies/length-1/study.md" in names
        assert tar.extractfile("out/summary.md").read().decode() == (out / "summary.md").read_text()
    md = (out / "summary.md").read_text()
    assert "## studies" in md and "**packing**: done" in md and "### packing-documents" in md

    # resumed: a second call finds every step done and trains nothing again
    metrics = work / "length-1" / "runs" / "rope" / "seed-1" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    again = subprocess.run([*cmd[:cmd.index("--stages")], "--stages", "studies", *cmd[cmd.index("--stages") + 2:]],
                           cwd=ROOT, capture_output=True, text=True, timeout=3000)  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert metrics.stat().st_mtime_ns == before
    jobs = json.loads((out / "summary.json").read_text())["stages"]["studies"]["jobs"]
    assert {j["status"] for j in jobs} == {"done"}


def test_length_chunks_cover_every_scheme_once_comparators_first() -> None:
    chunks = gpu_studies.length_chunks()
    flat = [s for c in chunks for s in c]
    assert sorted(flat) == sorted(POSITION_SCHEMES) and len(flat) == len(set(flat))
    assert chunks[0] == ["bert-a", "rope", "alibi", "fire"]
    assert all(len(c) <= gpu_studies.LENGTH_CHUNK for c in chunks)
    lengths = [f"length-{i + 1}" for i in range(len(chunks))]
    assert gpu_studies.job_names() == [*lengths, "regime", "paragraphs", "packing"]


def test_paragraph_corpus_makes_every_paragraph_a_document_and_keeps_the_text(tmp_path: Path) -> None:
    import gzip

    from tupe.data import DEFAULT_CORPUS_DIR
    from tupe.data.corpus import iter_line_batches, resolve_corpus

    n = gpu_studies.paragraph_corpus(tmp_path / "paragraphs")
    books = sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))
    assert sorted(p.name for p in (tmp_path / "paragraphs").iterdir()) == [b.name[:-3] for b in books]
    lines, ends = [], []
    for batch, batch_ends, _ in iter_line_batches(resolve_corpus([str(tmp_path / "paragraphs")])):
        lines += batch
        ends += batch_ends
    assert len(lines) == n and all(ends)  # every paragraph (line) closes a document
    original = [
        ln.strip() for b in books for ln in gzip.decompress(b.read_bytes()).decode().split("\n") if ln.strip()
    ]
    assert len(original) == n  # the same paragraphs; the reader only cuts over-long lines
    built_in = [
        ln for batch, _, _ in iter_line_batches(resolve_corpus([str(DEFAULT_CORPUS_DIR)])) for ln in batch
    ]
    assert lines == built_in


def test_unknown_study_job_is_refused(capsys) -> None:  # noqa: ANN001
    assert gpu_suite.main(["--out", "x", "--stages", "studies", "--studies", "packing,length-99"]) == 2
    assert "--studies: unknown length-99" in capsys.readouterr().err


def test_the_archive_is_split_into_parts_that_join(tmp_path: Path) -> None:
    src = tmp_path / "gpu"
    (src / "studies").mkdir(parents=True)
    (src / "studies" / "noise.bin").write_bytes(os.urandom(50_000))  # incompressible: 3 parts of 20 kB
    (src / "summary.md").write_text("# summary\n")
    dest = tmp_path / "ret" / "gpu.tar.gz"
    parts = gpu_studies.write_archive(src, dest, part_bytes=20_000)
    assert [p.name for p in parts] == ["gpu.tar.gz.part00", "gpu.tar.gz.part01", "gpu.tar.gz.part02"]
    assert all(p.stat().st_size <= 20_000 and RETURNABLE.match(p.name) for p in parts)
    with _untar(parts) as tar:
        assert tar.extractfile("gpu/summary.md").read() == b"# summary\n"
        assert tar.extractfile("gpu/studies/noise.bin").read() == (src / "studies" / "noise.bin").read_bytes()
    # written again smaller: one file, the old parts gone
    (src / "studies" / "noise.bin").unlink()
    assert gpu_studies.write_archive(src, dest, part_bytes=20_000) == [dest]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["gpu.tar.gz"]


def test_an_archive_inside_the_folder_it_packs_leaves_itself_out(tmp_path: Path) -> None:
    """Issue 49, item 13: `--archive OUT/gpu.tar.gz` used to pack the previous archive into the next one (1.9 ->
    3.8 -> 5.7 -> 7.6 MiB over four stages)."""
    src = tmp_path / "gpu"
    src.mkdir()
    (src / "summary.md").write_text("# summary\n")
    (src / "noise.bin").write_bytes(os.urandom(30_000))
    (src / "gpu.tar.gz.notes").write_text("the user's, named like the archive: kept in it\n")
    dest = src / "gpu.tar.gz"
    sizes = [sum(p.stat().st_size for p in gpu_studies.write_archive(src, dest)) for _ in range(4)]
    assert max(sizes) - min(sizes) < 200, sizes  # gzip headers aside, the same archive every time
    with _untar([dest]) as tar:
        assert sorted(tar.getnames()) == ["gpu", "gpu/gpu.tar.gz.notes", "gpu/noise.bin", "gpu/summary.md"]
    parts = gpu_studies.write_archive(src, dest, part_bytes=20_000)
    again = gpu_studies.write_archive(src, dest, part_bytes=20_000)
    assert [p.name for p in again] == [p.name for p in parts] == ["gpu.tar.gz.part00", "gpu.tar.gz.part01"]
    with _untar(again) as tar:
        assert "gpu/gpu.tar.gz.part00" not in tar.getnames()


def _run(folder: Path, weights: int = 10) -> None:
    folder.mkdir(parents=True)
    for name, size in (("metrics.jsonl", 10), ("config.json", 10), ("model.safetensors", weights),
                       ("tokenizer.json", 10), ("modeling_tupe.py", 10), ("training_args.bin", 10),
                       ("checkpoint-500/model.safetensors", 10), ("checkpoint-500/trainer_state.json", 10),
                       ("tensorboard/events", 10), (".lock", 0)):  # fmt: skip
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x" * size)


def test_collect_keeps_results_and_leaves_weights_unless_the_run_comes_back_whole(tmp_path: Path) -> None:
    study = tmp_path / "work" / "packing-stream"
    _run(study / "runs" / "bert-a" / "seed-0")
    _run(study / "runs" / "bert-a" / "seed-1")
    (study / "study.md").write_text("| table |\n")
    dest = tmp_path / "out" / "packing-stream"
    gpu_studies.collect(study, dest, {Path("runs/bert-a/seed-0")})
    kept = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert kept == {
        "study.md",
        "runs/bert-a/seed-1/metrics.jsonl",
        "runs/bert-a/seed-1/config.json",
        *(f"runs/bert-a/seed-0/{n}" for n in ("metrics.jsonl", "config.json", "model.safetensors",
                                              "tokenizer.json", "modeling_tupe.py", "training_args.bin")),
    }  # fmt: skip
    # its SST-2 finished since: collected again, the run's weights leave the results
    gpu_studies.collect(study, dest, set())
    assert not (dest / "runs" / "bert-a" / "seed-0" / "model.safetensors").exists()
    assert (dest / "runs" / "bert-a" / "seed-0" / "metrics.jsonl").is_file()


def test_models_to_return_seed_0_without_sst2_in_the_issues_order_within_budget(tmp_path: Path) -> None:
    work = tmp_path / "work"
    for packing in gpu_studies.PACKINGS:
        for scheme in gpu_studies.PACKING_SCHEMES:
            _run(work / f"packing-{packing}" / "runs" / scheme / "seed-0", weights=1000)
    done = work / "packing-stream" / "glue" / "SST-2-bert-a-seed-0" / "results.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"complete": True}))
    chosen = gpu_studies.models_to_return(work, budget=3 * (1000 + 2**20))
    assert [str(p) for p in chosen] == [
        "packing-documents/runs/bert-a/seed-0",  # bert-a stream has its SST-2 already
        "packing-stream/runs/tupe-a/seed-0",
        "packing-documents/runs/tupe-a/seed-0",
    ]


def test_a_suite_ended_by_sigterm_leaves_no_child_running(tmp_path: Path) -> None:
    """A child runs in its own session; the suite ended while waiting for it kills it first (on the device a child
    left running would train on into the next call's study folders)."""
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = (
        "import sys; from pathlib import Path; from tupe.bench.children import end_on_sigterm, run_logged; "
        f"end_on_sigterm(); run_logged([sys.executable, '-c', {child!r}], Path({str(tmp_path / 'log')!r}), 120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # reaped by the parent before it exited; a zombie would still take signal 0
            os.kill(pid, 0)
            time.sleep(0.1)


def test_paragraph_documents_script_refuses_a_folder_of_other_files(tmp_path: Path) -> None:
    """benchmarks/texts/paragraph_documents.py writes one .txt per book: a folder holding other files is refused
    untouched (exit 2, one line); its own earlier output is written again."""
    script = ROOT / "benchmarks" / "texts" / "paragraph_documents.py"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    done = subprocess.run([sys.executable, str(script), str(mine)], capture_output=True, text=True)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err and "'notes.txt'" in err, done.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
