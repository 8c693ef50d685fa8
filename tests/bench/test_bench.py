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
    )
    model = TupeForMaskedLM(config)
    model.config._attn_implementation = "eager"  # the reference: no extra work from folding
    fwd, bwd = _counted(model, batch)
    rows = int((batch["labels"] != -100).sum())
    assert fwd == forward_flops(SHAPE, scheme, 2, 16, rows)
    assert fwd + bwd == train_step_flops(SHAPE, scheme, 2, 16, rows)


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
            "--backends",
            "eager,sdpa,sdpa-fold,fused,default",
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
    assert labels[0] == "hf-bert" and len(labels) == 1 + 3 * 5
    for r in result["steps"]:
        assert r["steps_timed"] == 2 and r["step_s_q1"] <= r["step_s_median"] <= r["step_s_q3"]
        assert 0 < r["mfu"] and r["peak_memory_bytes"] > 0
    steps = {r["label"]: r for r in result["steps"]}
    ratio = result["ratios"]["tupe-a / bert-a [default]"]
    assert ratio == pytest.approx(
        steps["tupe-a [default]"]["step_s_median"] / steps["bert-a [default]"]["step_s_median"]
    )
    assert steps["tupe-a [sdpa-fold]"]["kernel"] == "fold" and steps["tupe-r [sdpa-fold]"]["kernel"] == "sdpa"
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
