"""The GPU benchmark suite (benchmarks/gpu/run.sh = `python -m tupe.bench.gpu_suite`): its CPU dry run end to end,
so the script cannot rot between lent GPUs, and the summary's arithmetic on made-up figures. No timing asserted."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tupe import POSITION_SCHEMES
from tupe.bench import children, gpu_environment, gpu_stages, gpu_suite, gpu_summary
from tupe.modeling.kernels import flex_kernel_options

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cpu_dry_run_runs_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tupe.bench.gpu_suite", "--out", str(out), "--device", "cpu", "--smoke"]
    cmd += ["--work", str(tmp_path / "work")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (out / "summary.json").read_text()
    summary = json.loads(text)
    # what comes back names the suite's folders, not this machine's paths
    for path in (str(tmp_path), str(ROOT), sys.executable):
        assert path not in text and path not in (out / "summary.md").read_text(), path
    stages = summary["stages"]
    assert list(stages) == list(gpu_stages.DEFAULT_STAGES)  # packing-speed, studies: test_gpu_studies.py
    assert summary["environment"]["torch"] == torch.__version__

    tests = stages["cuda-tests"]
    assert tests["counts"]["passed"] == 2 and tests["counts"]["failures"] == 0, tests

    (shape,) = stages["steps"]["shapes"]
    bench = shape["bench"]
    labels = {r["label"] for r in bench["steps"]}
    assert {"hf-bert", "hf-deberta", "bert-a [sdpa-flash]"} <= labels
    assert {f"{s} [default]" for s in POSITION_SCHEMES} <= labels
    assert all(r["tokens_per_s"] > 0 for r in bench["steps"])
    assert "tupe-a [default] / bert-a [sdpa-flash]" in bench["ratios"]

    profiled = stages["profile"]["rows"]
    assert [r["label"] for r in profiled] == [
        "bert-a [sdpa-flash]",
        "tupe-a [default]",
        "alibi [default]",
        "hf-bert",
    ]
    assert all(r["wall_ms"] > 0 and r["top_cpu_ops"] for r in profiled), profiled

    rows = stages["long"]["rows"]
    assert {r["scheme"] for r in rows} == set(POSITION_SCHEMES)
    assert not [r for r in rows if "error" in r]
    assert {r["kernel"] for r in rows if r["scheme"] == "bert-a"} == {"sdpa-flash"}

    e2e = stages["end-to-end"]
    assert e2e["figures"]["timed_steps"] == 6 and e2e["figures"]["tokens_per_s"] > 0, e2e

    md = (out / "summary.md").read_text()
    for name in gpu_stages.DEFAULT_STAGES:
        assert f"## {name}" in md
    assert "Targets (base/512):" in md
    # scratch (model, checkpoints) went to --work, not into the results folder
    assert not list(out.rglob("*.safetensors"))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_work_folder_of_the_users_is_refused_untouched(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """Issue 49, item 11: `--work` used to be `shutil.rmtree`d whatever it held (exit 0)."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "notes.txt").write_text("my notes\n")
    (work / "sub" / "results.csv").write_text("a,b\n1,2\n")
    before = _tree(work)
    out = tmp_path / "out"
    argv = ["--out", str(out), "--device", "cpu", "--smoke", "--stages", "end-to-end", "--work", str(work)]
    assert gpu_suite.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--work" in err and "notes.txt" in err, err
    assert _tree(work) == before and not out.exists()  # nothing run, nothing made


def test_only_a_scratch_folder_the_suite_made_is_emptied(tmp_path: Path) -> None:
    from tupe.scripts import claim_scratch_folder, reset_scratch_folder

    work = tmp_path / "work"
    reset_scratch_folder(work, gpu_stages.WORK_MARKER)  # new: made and marked
    (work / "model.safetensors").write_bytes(b"scratch of the last run")
    assert claim_scratch_folder("--work", work, gpu_stages.WORK_MARKER) == work
    reset_scratch_folder(work, gpu_stages.WORK_MARKER)
    assert [p.name for p in work.iterdir()] == [gpu_stages.WORK_MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_scratch_folder("--work", empty, gpu_stages.WORK_MARKER) == empty


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--device", "cpu"], "--device cpu runs the base shapes"),  # item 16: no --smoke
        (
            ["--device", "cpu", "--smoke", "--stages", "steps,long,steps"],
            "--stages: steps given more than once",
        ),
        (["--device", "cpu", "--smoke", "--budget", "0"], "argument --budget"),
        (["--device", "cpu", "--smoke", "--e2e-steps", "0"], "argument --e2e-steps"),
        (["--device", "tpu", "--smoke"], "argument --device"),
    ],
)
def test_flags_are_refused_in_one_line_before_any_stage(tmp_path: Path, capsys, extra, needle) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    assert gpu_suite.main(["--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpu_suite: error:") and "\n" not in err and needle in err, err
    assert not out.exists()


def test_an_out_folder_of_other_files_is_refused(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "project"
    out.mkdir()
    (out / "summary.md").write_text("my summary\n")
    assert gpu_suite.main(["--out", str(out), "--device", "cpu", "--smoke"]) == 2
    assert "--out" in capsys.readouterr().err and (out / "summary.md").read_text() == "my summary\n"


def _row(label: str, scheme: str, backend: str, step_s: float, tflops: float = 1.0) -> dict:
    return {
        "label": label,
        "scheme": scheme,
        "backend": backend,
        "kernel": backend,
        "step_s_median": step_s,
        "tokens_per_s": 1000 / step_s,
        "model_tflops_per_step": tflops,
        "peak_memory_bytes": 2**30,
    }


def test_targets_read_ratios_and_mfu_off_the_run() -> None:
    bench = {
        "matmul_peak_flops": 800e12,
        "steps": [
            _row("hf-bert", "hf-bert", "sdpa", 0.012),
            _row("bert-a [sdpa-flash]", "bert-a", "sdpa-flash", 0.010, tflops=5.0),
            _row("bert-a [default]", "bert-a", "sdpa", 0.010),
            _row("tupe-a [default]", "tupe-a", "fold", 0.0125),  # 0.8 x flash
            _row("alibi [default]", "alibi", "flex", 0.0110),  # 0.909 x flash
        ],
    }
    lines = "\n".join(gpu_summary.targets(bench, 1000e12))
    assert "every scheme >= 0.85 x bert-a [sdpa-flash]: **not met** (lowest tupe-a [default] 0.800" in lines
    assert "tupe-a >= 0.95 x bert-a [sdpa-flash]: **not met** (0.800)" in lines
    assert "bert-a [default] >= 1.0 x hf-bert (SDPA): **met** (1.200" in lines
    # 5 TFLOP in 10 ms = 500 TFLOP/s = 50% of 1000
    assert "MFU of bert-a [sdpa-flash] >= 40% of the dense bf16 peak: **met** (50.0%)" in lines
    table, info = gpu_summary.steps_table(bench, 1000e12)
    assert info["ratios"]["alibi [default]"] == pytest.approx(0.010 / 0.011)
    assert len(table) == 2 + len(bench["steps"])


def test_long_table_reports_memory_growth_per_doubling() -> None:
    state = 10
    rows = (
        [
            {
                "scheme": "lin",
                "seq_len": n,
                "kernel": "fold",
                "step_s": 0.01,
                "peak_bytes": state + 100 * n,
                "step_peak_above_state_bytes": 100 * n,
            }
            for n in (1024, 2048)
        ]
        + [
            {
                "scheme": "quad",
                "seq_len": n,
                "kernel": "sdpa",
                "step_s": 0.01,
                "peak_bytes": state + n * n,
                "step_peak_above_state_bytes": n * n,
            }
            for n in (1024, 2048)
        ]
        + [{"scheme": "oom", "seq_len": 1024, "error": "out of memory"}]
    )
    text = "\n".join(gpu_summary.long_table({"rows": rows}))
    assert "| lin | fold |" in text and "| 2.00 |" in text
    assert "| quad | sdpa |" in text and "| 4.00 |" in text
    assert "| oom | - | out of memory | not run |" in text


def test_a_stage_past_its_time_is_interrupted(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run = children.run_logged(
        [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
        tmp_path / "log",
        timeout=2,
    )
    assert run["timed_out"] and time.monotonic() - t0 < 30
    assert "started" in (tmp_path / "log").read_text()


def test_dense_peak_by_gpu_name() -> None:
    assert gpu_environment.dense_bf16_peak("NVIDIA H200")[0] == pytest.approx(989.4e12)
    assert gpu_environment.dense_bf16_peak("NVIDIA H100 PCIe")[0] == pytest.approx(756.5e12)
    peak, why = gpu_environment.dense_bf16_peak("Some GPU")
    assert peak is None and "Some GPU" in why


def test_flex_kernel_options_from_the_environment(monkeypatch) -> None:
    q = torch.zeros(1, 1, 4, 8)
    monkeypatch.delenv("TUPE_FLEX_KERNEL_OPTIONS", raising=False)
    assert flex_kernel_options(q) is None  # float32: PyTorch's own choice
    monkeypatch.setenv("TUPE_FLEX_KERNEL_OPTIONS", '{"BLOCK_M": 32}')
    assert flex_kernel_options(q) == {"BLOCK_M": 32}
    monkeypatch.setenv("TUPE_FLEX_KERNEL_OPTIONS", "{}")
    assert flex_kernel_options(q) is None
    monkeypatch.setenv("TUPE_FLEX_KERNEL_OPTIONS", "BLOCK_M=32")
    with pytest.raises(ValueError, match="TUPE_FLEX_KERNEL_OPTIONS is not JSON"):
        flex_kernel_options(q)
    monkeypatch.setenv("TUPE_FLEX_KERNEL_OPTIONS", "[64]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        flex_kernel_options(q)


def test_checkpointing_argument_names_a_field_the_installed_transformers_has() -> None:
    from transformers import TrainingArguments

    from tupe.training.flags import checkpointing_argument

    (name,) = checkpointing_argument(True)
    assert name in {f.name for f in dataclasses.fields(TrainingArguments)}
    assert TrainingArguments(output_dir="x", **checkpointing_argument(True), use_cpu=True)


def test_hushed_libraries_without_datasets(monkeypatch) -> None:
    import transformers

    from tupe.runtime import hushed_libraries

    monkeypatch.setitem(
        sys.modules, "datasets", None
    )  # `import datasets` raises ImportError, as on the GPU image
    before = transformers.utils.logging.get_verbosity()
    with hushed_libraries(progress=False, quiet=True):
        assert transformers.utils.logging.get_verbosity() == transformers.utils.logging.ERROR
    assert transformers.utils.logging.get_verbosity() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only machine")
def test_flex_probe_on_a_cpu_says_it_tested_nothing(tmp_path: Path) -> None:
    """Issue 49, item 16: benchmarks/gpu/flex_probe.py on a CPU exited 0 having tested nothing."""
    script = ROOT / "benchmarks" / "gpu" / "flex_probe.py"
    for extra, needle in (([], "no CUDA GPU here"), (["--timeout", "0"], "argument --timeout")):
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "probe.json"), *extra],
            capture_output=True,
            text=True,
        )
        err = done.stderr.strip()
        assert done.returncode == 2 and err.startswith("flex_probe.py: error:") and "\n" not in err, (
            done.stderr
        )
        assert needle in err and not (tmp_path / "probe.json").exists()
