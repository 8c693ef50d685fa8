"""`tupe bench`: model FLOPs against PyTorch's FLOP counter, and the command end to end on a tiny shape.

No timing assertions: speed is measured by running the benchmark; these tests check what it reports is computed
correctly (FLOPs, ratios, memory, JSON) and that every backend runs.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForMaskedLM

from tupe import POSITION_SCHEMES, TupeConfig, TupeForMaskedLM
from tupe.bench.flops import Shape, forward_flops, matmul_peak, train_step_flops
from tupe.bench.runner import make_batch
from tupe.cli import main
from tupe.modeling.positional import SCHEMES

SHAPE = Shape(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100
)


def _counted(model, batch):
    with FlopCounterMode(display=False) as fwd:
        loss = model(**batch).loss
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_model_flops_match_pytorch_flop_counter(scheme):
    batch = make_batch(2, 16, SHAPE.vocab_size, torch.device("cpu"))
    config = TupeConfig(
        vocab_size=SHAPE.vocab_size,
        hidden_size=SHAPE.hidden_size,
        num_hidden_layers=SHAPE.num_hidden_layers,
        num_attention_heads=SHAPE.num_attention_heads,
        intermediate_size=SHAPE.intermediate_size,
        position_scheme=scheme,
        sparse_prediction=True,  # as benchmarked (runner.tupe_config)
    )
    model = TupeForMaskedLM(config)
    model.config._attn_implementation = "eager"  # the reference: no extra work from folding
    fwd, bwd = _counted(model, batch)
    rows = int((batch["labels"] != -100).sum())
    # Work the implementation adds is not counted: deberta multiplies every query (key) against all 2n offset
    # slots, twice the n x n pairs its equation needs, in both of its terms
    added = 0
    if SCHEMES[scheme].content_position:
        added = SHAPE.num_hidden_layers * 2 * 2 * 2 * 16 * 16 * SHAPE.hidden_size
    assert fwd == forward_flops(SHAPE, scheme, 2, 16, rows) + added
    assert fwd + bwd == train_step_flops(SHAPE, scheme, 2, 16, rows) + 3 * added


def test_hf_bert_flops_match_pytorch_flop_counter():
    batch = make_batch(2, 16, SHAPE.vocab_size, torch.device("cpu"))
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=SHAPE.vocab_size,
            hidden_size=SHAPE.hidden_size,
            num_hidden_layers=SHAPE.num_hidden_layers,
            num_attention_heads=SHAPE.num_attention_heads,
            intermediate_size=SHAPE.intermediate_size,
            attn_implementation="sdpa",
        )
    )
    fwd, bwd = _counted(model, batch)
    assert fwd + bwd == train_step_flops(SHAPE, "hf-bert", 2, 16, 2 * 16)  # dense head: every row


def test_hf_deberta_is_timed_with_deberta_and_counted_as_it(tmp_path):
    """`--schemes` with deberta adds transformers' DebertaV2ForMaskedLM (the scheme's choices) and its ratio."""
    from tupe.bench.flops import HF_DEBERTA
    from tupe.bench.runner import build_hf_deberta

    batch = make_batch(2, 16, SHAPE.vocab_size, torch.device("cpu"))
    cand = build_hf_deberta(SHAPE, 16, batch, torch.device("cpu"), torch.float32)
    config = cand.model.config
    assert config.relative_attention and config.share_att_key and not config.position_biased_input
    assert cand.flops == train_step_flops(SHAPE, HF_DEBERTA, 2, 16, 2 * 16)
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "--preset", "mini", "--shape", "1x64", "--batch-size", "2", "--seq-len", "16", "--rounds", "1",
         "--warmup", "0", "--schemes", "deberta", "--backends", "default", "--peak-flops", "1e11", "--quiet",
         "--no-memory", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert [r["label"] for r in result["steps"]] == ["hf-bert", "hf-deberta", "deberta [default]"]
    assert "deberta [default] / hf-deberta" in result["ratios"]
    machine = result["machine"]  # the timed loops keep blocks over 32 MiB too, wherever the tuning is on
    assert machine["malloc_large_blocks_kept"] == machine["malloc_tuned"]


def test_make_batch_is_packed_and_masked():
    batch = make_batch(3, 40, 500, torch.device("cpu"))
    assert batch["attention_mask"].all()
    masked = batch["labels"] != -100
    assert masked.any(dim=1).all() and not masked[:, 0].any()
    assert (batch["input_ids"][masked] == 3).all()


def test_matmul_peak_is_positive():
    peak, by_size = matmul_peak(torch.device("cpu"), torch.float32, sizes=(64, 128), repeats=2)
    assert peak == max(by_size.values()) > 0


@pytest.mark.slow
def test_bench_command_end_to_end(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--preset",
            "mini",
            "--layers",
            "1",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
            "--rounds",
            "2",
            "--warmup",
            "0",
            "--schemes",
            "bert-a,tupe-a,tupe-r",
            "--attention-kernel",
            "eager,sdpa,fused,default",  # kernels every scheme has (sdpa-fold: the attention-only test)
            "--peak-flops",
            "1e11",  # fixed: measuring the peak would take most of this test's time
            "--quiet",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert result["matmul_peak_flops"] == 1e11
    labels = [r["label"] for r in result["steps"]]
    assert labels[0] == "hf-bert" and len(labels) == 1 + 3 * 4
    for r in result["steps"]:
        assert r["steps_timed"] == 2 and r["step_s_q1"] <= r["step_s_median"] <= r["step_s_q3"]
        assert 0 < r["mfu"] and r["peak_memory_bytes"] > 0
    steps = {r["label"]: r for r in result["steps"]}
    ratio = result["ratios"]["tupe-a / bert-a [default]"]
    assert ratio == pytest.approx(
        steps["tupe-a [default]"]["step_s_median"] / steps["bert-a [default]"]["step_s_median"]
    )
    # CPU training with a content-free term: "auto" runs the fused kernel
    assert steps["tupe-a [default]"]["kernel"] == "fused" and steps["tupe-r [fused]"]["kernel"] == "fused"
    assert steps["tupe-a [eager]"]["kernel"] == "eager"
    assert "hf-bert" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_attention_only(tmp_path):
    out = tmp_path / "attn.json"
    code = main(
        [
            "bench",
            "--attention-only",
            "--preset",
            "mini",
            "--seq-len",
            "16",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--schemes",
            "tupe-a",
            "--backends",
            "eager,sdpa,sdpa-fold,fused",
            "--quiet",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())["attention"]
    assert [r["kernel"] for r in rows] == ["eager", "sdpa", "fold", "fused"]
    assert rows[0]["vs_eager"] == 1.0


def test_bench_rejects_unknown_scheme(capsys):
    assert main(["bench", "--schemes", "tupe-x"]) == 2
    assert "unknown scheme 'tupe-x'" in capsys.readouterr().err


# ---------------------------------------------------------------------- shapes, breakdown, end-to-end mode
def test_backends_are_registry_kernels_refused_where_they_cannot_run(capsys):
    """Every kernel of the registry (and the aliases default, sdpa-fold) is a backend; one that cannot run a
    scheme is refused before any timing, with the reason, never silently replaced by another kernel."""
    from tupe.bench.runner import backend_kernel
    from tupe.modeling import ATTENTION_KERNELS

    assert [backend_kernel(k, "tupe-a") for k in ATTENTION_KERNELS] == list(ATTENTION_KERNELS)
    assert backend_kernel("sdpa-fold", "tupe-a") == "fold" and backend_kernel("default", "tupe-r") == "auto"
    # any value of attn_implementation: the tupe_ names and transformers' names of tupe's kernels
    assert (
        backend_kernel("tupe_fused", "tupe-a") == "fused"
        and backend_kernel("flex_attention", "tupe-r") == "flex"
    )
    assert main(["bench", "--schemes", "tupe-a,tupe-r", "--attention-kernel", "eager,sdpa-fold"]) == 2
    err = capsys.readouterr().err
    assert "'fold' needs a low-rank content-free term" in err and "position_scheme 'tupe-r'" in err
    assert main(["bench", "--backends", "flash"]) == 2  # the old flag name still works
    assert (
        "unknown attention kernel 'flash' in --attention-kernel; choose from: auto, tupe_eager, tupe_sdpa, "
        "tupe_fold, tupe_fused, tupe_flex, eager, sdpa, fold, fused, flex, flex_attention, sdpa-fold, default"
        in capsys.readouterr().err
    )


def test_shapes_and_mini_batch_defaults():
    from tupe.bench.command import default_batch, parse_shapes

    (name, mini), (_, between) = parse_shapes("mini,4x256", "mini")
    assert name == "mini" and (mini.num_hidden_layers, mini.hidden_size, mini.vocab_size) == (2, 128, 8192)
    assert (between.num_hidden_layers, between.hidden_size, between.num_attention_heads) == (4, 256, 4)
    assert between.intermediate_size == 1024 and between.vocab_size == 8192
    assert default_batch("mini", None, None) == (128, 32)
    assert default_batch("base", None, None) == (512, 1)
    with pytest.raises(Exception, match="LxH"):
        parse_shapes("4xwide", "mini")


@pytest.mark.parametrize("which", ["tupe-a", "hf-bert"])
def test_breakdown_categories_sum_to_the_profiled_step(which):
    from tupe.bench.breakdown import CATEGORIES, breakdown
    from tupe.bench.runner import build_hf_bert, build_tupe

    device = torch.device("cpu")
    batch = make_batch(2, 16, SHAPE.vocab_size, device)
    cand = (
        build_hf_bert(SHAPE, 16, batch, device, torch.float32)
        if which == "hf-bert"
        else build_tupe(which, "default", SHAPE, 16, batch, device, torch.float32)
    )
    r = breakdown(cand, steps=2, warmup=1)
    ms = r["ms_per_step"]
    assert set(ms) == set(CATEGORIES)
    for cat in (
        "embeddings + positional",
        "attention",
        "feed-forward",
        "LM head + loss",
        "optimizer (clip + AdamW)",
    ):
        assert ms[cat] > 0, cat
    assert sum(ms.values()) == pytest.approx(r["profiled_total_ms"])
    assert sum(r["fraction"].values()) == pytest.approx(1.0)
    # operator self times cover the profiled step's wall time (the rest is Python outside any operator)
    assert 0.5 * r["profiled_wall_ms"] <= r["profiled_total_ms"] <= 1.05 * r["profiled_wall_ms"]


def test_end_to_end_summary_from_step_stamps():
    from tupe.bench.endtoend import summarize_run

    run = {
        "launch": 100.0,
        "step_starts": [103.0, 104.0, 105.0, 107.0, 108.0],
        "wall_s": 9.0,
        "peak_rss_bytes": 1,
    }
    s = summarize_run(run, steps=4, tokens_per_step=64)
    assert s["time_to_first_step_s"] == 3.0 and s["loop_s"] == 5.0
    assert s["tokens_per_s"] == pytest.approx(4 * 64 / 5.0)
    assert s["steady_tokens_per_s"] == pytest.approx(64 / 1.0)
    with pytest.raises(RuntimeError):
        summarize_run(run, steps=5, tokens_per_step=64)


@pytest.mark.slow
def test_bench_breakdown_and_end_to_end_mode(tmp_path, capsys, monkeypatch):
    """Two tiny shapes, the breakdown and a real `tupe pretrain` end to end (tiny corpus and model)."""
    import gzip

    from tupe.data.corpus import DEFAULT_CORPUS_DIR

    corpus = tmp_path / "corpus.txt"
    with gzip.open(sorted(DEFAULT_CORPUS_DIR.glob("*.txt.gz"))[0], "rt", encoding="utf-8") as fh:
        corpus.write_text("".join(next(fh) for _ in range(300)))
    monkeypatch.setenv("TUPE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "bench.json"
    tiny = [
        "--hidden-size=32",
        "--num-layers=1",
        "--num-heads=2",
        "--intermediate-size=64",
        "--vocab-size=300",
    ]
    tiny += ["--batch-size=4", "--max-length=32", "--eval-steps=2", "--logging-steps=1", "--save-steps=100"]
    code = main(
        ["bench", "--preset", "mini", "--shape", "1x32,2x64", "--seq-len", "16", "--batch-size", "2"]
        + ["--rounds", "2", "--warmup", "0", "--schemes", "tupe-a", "--backends", "default", "--no-memory"]
        + ["--breakdown", "--breakdown-steps", "1", "--end-to-end", "--e2e-steps", "3", "--quiet"]
        + [f"--e2e-arg={a}" for a in ["--corpus", str(corpus), *tiny]]
        + ["--json", str(out)]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert [g["name"] for g in result["shapes"]] == ["1x32", "2x64"]
    assert result["shapes"][1]["shape"]["num_hidden_layers"] == 2
    assert len(result["shapes"][0]["breakdown"]) == 2  # hf-bert and tupe-a
    (run,) = result["end_to_end"]["runs"]
    assert run["tokens_per_s"] > 0 and run["bare_tokens_per_s"] > 0 and run["ratio_end_to_end_to_bare"] > 0
    assert run["tokens_per_step"] == 4 * 32 and run["time_to_first_step_s"] > 0 and run["peak_rss_bytes"] > 0
    assert "end to end, tupe-a" in capsys.readouterr().out


# ---------------------------------------------------------------------- profiler noise, --threads, --no-progress
def test_profiler_start_and_stop_print_no_usdt_lines(capfd):
    from torch.profiler import ProfilerActivity

    from tupe.bench.profiling import quiet_profile

    with quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.ones(4, 4).matmul(torch.ones(4, 4))
    assert prof.events()  # it profiled
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err and "profiler_stop" not in err


def test_only_kineto_lines_are_dropped_from_the_captured_window(capfd):
    import os
    import sys

    from tupe.bench.profiling import kineto_lines_dropped

    with kineto_lines_dropped():
        os.write(
            2, b"USDT:2026-11-23 14:23:00 24660:24660 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        )
        os.write(2, b"STAGE:2026-11-23 14:23:00 24660:24660 SyncActivityProfilerHandler.cpp:51] Completed\n")
        os.write(2, b"ERROR:2026-11-23 14:23:00 24660:24660 Foo.cpp:9] a real problem\n")
        print("warning from python", file=sys.stderr)
    print("after", file=sys.stderr)
    err = capfd.readouterr().err  # (pytest's sys.stderr bypasses fd 2: order across the two is not kept)
    assert sorted(err.splitlines()) == [
        "ERROR:2026-11-23 14:23:00 24660:24660 Foo.cpp:9] a real problem", "after", "warning from python",
    ]  # fmt: skip


def test_bench_threads_and_no_progress(tmp_path, capsys):
    for bad in ("0", "-1", "two"):
        assert main(["bench", "--threads", bad]) == 2
        assert "argument --threads: must be an integer from 1 to 1024, got" in capsys.readouterr().err
    assert main(["bench", "--rounds", "0"]) == 2
    assert "argument --rounds: must be an integer >= 1, got 0" in capsys.readouterr().err
    args = ["bench", "--preset", "mini", "--layers", "1", "--seq-len", "16", "--batch-size", "2", "--rounds", "2",
            "--warmup", "0", "--schemes", "tupe-a", "--backends", "default", "--peak-flops", "1e11", "--no-memory",
            "--threads", "1"]  # fmt: skip
    assert main([*args, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "round 1/2" not in err and "matmul peak before" in err  # log lines stay, progress lines go
    assert main(args) == 0
    assert "round 2/2: tupe-a [default]" in capsys.readouterr().err
