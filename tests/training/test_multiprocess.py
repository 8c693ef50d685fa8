"""Data-parallel pre-training with 2 CPU processes (torchrun, gloo) equals the 1-process run (same global batch):
every logged loss, every validation loss, and the final train-loss summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.conftest import tiny_cli_args
from tupe import POSITION_SCHEMES
from tupe.modeling import TupeConfig, TupeForMaskedLM


def _run(cmd: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_every_parameter_gets_a_gradient(scheme: str) -> None:
    """Pre-training tells DDP that no parameter is unused (ddp_find_unused_parameters=False, no graph search each
    step); true only if the masked-LM loss reaches every parameter of every scheme, with and without documents."""
    torch.manual_seed(0)
    config = TupeConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, position_scheme=scheme,
    )  # fmt: skip
    model = TupeForMaskedLM(config)
    ids = torch.randint(5, 64, (2, 16))
    labels = torch.where(torch.rand(2, 16) < 0.3, ids, -100)
    labels[:, 0] = ids[:, 0]  # at least one target a row
    documents = torch.tensor([list(range(8)) * 2, list(range(16))])  # row 0: two packed documents
    for position_ids in (None, documents):
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=labels, position_ids=position_ids).loss.backward()
        unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert not unused, (scheme, position_ids is not None, unused)


def test_pretraining_tells_ddp_no_parameter_is_unused(tmp_path: Path) -> None:
    from tupe.cli import build_parser
    from tupe.training.arguments import config_from_args, pretrain_training_arguments

    args = build_parser("pretrain").parse_args(["pretrain", "--out", str(tmp_path / "o")])
    assert pretrain_training_arguments(config_from_args(args).resolve()).ddp_find_unused_parameters is False


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_one(
    tiny_corpus: Path, tiny_tokenizer_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    args = tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir)
    # logging every 3 steps of 4: the last step is not a logging step, so the summary's mean train loss includes
    # losses logged by no record (the Trainer adds them from each process's own tally unless the last step logs)
    args += [
        "--dropout",
        "0",
        "--max-steps",
        "4",
        "--save-steps",
        "2",
        "--scheme",
        "tupe-r",
        "--logging-steps",
        "3",
    ]
    root = Path(__file__).resolve().parents[2]
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "tupe", "pretrain", "--out", str(one), *args], root)
    _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tupe", "pretrain", "--out", str(two), *args],
        root,
    )  # fmt: skip
    a, b = _records(one), _records(two)
    assert [(r["step"], "loss" in r) for r in a] == [(r["step"], "loss" in r) for r in b]  # each record once
    for ra, rb in zip(a, b):
        key = "loss" if "loss" in ra else "eval_loss"
        assert rb[key] == pytest.approx(ra[key], rel=2e-4, abs=2e-4), (ra, rb)
    # checkpoints written once, by one process; each process saved its own RNG state into the same folder
    assert sorted(p.name for p in two.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    names = sorted(p.name for p in (two / "checkpoint-4").iterdir())
    assert names.count("model.safetensors") == 1 and {"rng_state_0.pth", "rng_state_1.pth"} <= set(names)
    assert not list(two.glob(".tmp-checkpoint-*"))
    sa, sb = (json.loads((run / "pretrain_summary.json").read_text()) for run in (one, two))
    assert sb["steps"] == sa["steps"] == 4
    assert sb["train_loss"] == pytest.approx(sa["train_loss"], rel=2e-4, abs=2e-4)
    assert [r["step"] for r in b if "loss" in r] == [3, 4]  # the last step logged, as in the 1-process run
    # and the summary is the mean of the 4 steps' losses: record 3 averages steps 1-3, record 4 is step 4 alone
    logged = {r["step"]: r["loss"] for r in a if "loss" in r}
    assert sa["train_loss"] == pytest.approx((3 * logged[3] + logged[4]) / 4, abs=2e-4)
