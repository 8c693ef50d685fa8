"""A `transformers` user's habits on a pre-trained model: tokenizer limits, pipelines on long text, the model
card, Trainer-style report_to / Hub arguments, and the logged epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tupe.training.pretrain import pretrain

LONG_TEXT = " ".join(["the man opened the door and walked into the garden"] * 40)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_corpus, tiny_tokenizer_dir, cache_dir) -> Path:  # noqa: ANN001
    from tests.training.conftest import TINY
    from tupe.training.pretrain import PretrainConfig

    out = tmp_path_factory.mktemp("habits") / "run"
    kw = dict(TINY, out=str(out), corpus=[str(tiny_corpus)], tokenizer=str(tiny_tokenizer_dir), max_steps=3)
    pretrain(PretrainConfig(**kw, cache_dir=str(cache_dir), scheme="tupe-a", report_to="tensorboard"))
    return out


def test_saved_tokenizer_knows_the_model_length(finished_run: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(finished_run)
    assert tok.model_max_length == 32
    assert len(tok(LONG_TEXT, truncation=True)["input_ids"]) == 32


def test_fill_mask_pipeline_truncates_long_text(finished_run: Path) -> None:
    import torch
    import transformers

    fill = transformers.pipeline("fill-mask", model=str(finished_run))
    preds = fill("the [MASK] " + LONG_TEXT, tokenizer_kwargs={"truncation": True})
    assert len(preds) == 5 and all("[MASK]" not in p["sequence"] for p in preds)
    enc = fill.tokenizer(LONG_TEXT, return_tensors="pt")  # no truncation: the model names the limit
    with pytest.raises(ValueError, match=r"exceeds max_position_embeddings 32 .*truncation=True"):
        with torch.no_grad():
            fill.model(**enc)


def test_model_card(finished_run: Path) -> None:
    card = (finished_run / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: fill-mask\n")
    assert "# TUPE-A (tupe-a)" in card and "ICLR 2021" in card and "arXiv:2006.15595" in card
    summary = json.loads((finished_run / "pretrain_summary.json").read_text())
    assert f"| validation masked-LM loss | {summary['final_eval_loss']:.6g} |" in card
    assert "| max_steps | 3 |" in card and "| learning_rate | 0.002 |" in card
    assert "training blocks of 32 tokens" in card
    assert 'AutoModelForMaskedLM.from_pretrained("' in card and "trust_remote_code=True" in card


def test_the_card_s_recipe_runs_without_tupe_and_without_a_prompt(finished_run: Path, tmp_path: Path) -> None:
    """Issue 49: the card's code, where tupe cannot be imported and stdin is closed: `AutoTokenizer` loads
    without asking whether to run the folder's code (the card passes trust_remote_code=True: config.json's
    auto_map names it), the same token ids as tupe's tokenizer, and the fill-mask pipeline predicts as with tupe."""
    import transformers

    from tests.helpers import run_card_without_tupe
    from tupe.io.checkpoints import load_tokenizer

    text = "The man [MASK] the door."
    after = f"""
        import json
        print("IDS " + json.dumps(tokenizer({text!r})["input_ids"]))
        print("FILL " + json.dumps([p["token_str"] for p in fill({text!r})]))
    """
    done = run_card_without_tupe(finished_run / "README.md", after, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "custom code" not in done.stdout + done.stderr  # no "Do you wish to run the custom code? [y/N]"
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line[:4] in ("IDS ", "FILL"))
    assert json.loads(lines["IDS"]) == load_tokenizer(finished_run)(text)["input_ids"]
    fill = transformers.pipeline("fill-mask", model=str(finished_run))
    assert json.loads(lines["FILL"]) == [p["token_str"] for p in fill(text)]


def test_report_to_tensorboard_and_real_epochs(finished_run: Path) -> None:
    assert list((finished_run / "tensorboard").glob("events.out.tfevents.*"))
    summary = json.loads((finished_run / "pretrain_summary.json").read_text())
    recs = [json.loads(x) for x in (finished_run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r]
    per_step = 8 / summary["train_blocks"]  # global batch 8
    assert [r["epoch"] for r in train] == [round(s * per_step, 4) for s in (1, 2, 3)]


def test_one_tensorboard_value_per_quantity_and_step(finished_run: Path) -> None:
    """Issue 38: `train/train_runtime` came twice at the last step with two values (the Trainer's running
    throughput log and its end-of-training total shared the key); the running one has its own key now."""
    import collections

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (finished_run / "tensorboard").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    clashes = {}
    for tag in tags:
        values = collections.defaultdict(set)
        for e in acc.Scalars(tag):
            values[e.step].add(round(e.value, 6))
        clashes.update({(tag, step): v for step, v in values.items() if len(v) > 1})
    assert clashes == {}
    assert len(acc.Scalars("train/train_runtime")) == 1  # the end-of-training total only
    assert len(acc.Scalars("train/tokens_per_second_since_start")) == 3  # one a logged step


def test_report_to_and_hub_flags_reach_the_trainer(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from transformers.integrations import integration_utils

    from tupe.cli import build_parser

    # mlflow installed or not: the plumbing is what is tested
    monkeypatch.setattr(integration_utils, "is_mlflow_available", lambda: True)
    from tupe.training.arguments import config_from_args, pretrain_training_arguments

    args = build_parser("pretrain").parse_args(
        ["pretrain", "--out", str(tmp_path / "o"), "--report-to", "tensorboard,mlflow", "--push-to-hub",
         "--hub-model-id", "me/tupe-a-mini"]
    )  # fmt: skip
    config = config_from_args(args)
    targs = pretrain_training_arguments(config.resolve())
    assert targs.report_to == ["tensorboard", "mlflow"]
    assert targs.push_to_hub is True and targs.hub_model_id == "me/tupe-a-mini"
    none = pretrain_training_arguments(
        config_from_args(args, report_to="none", push_to_hub=False, hub_model_id=None).resolve()
    )
    assert none.report_to == [] or none.report_to == "none" and none.push_to_hub is False


def test_quiet_run_and_resume_print_nothing_spurious(
    tiny_corpus, tiny_tokenizer_dir, cache_dir, tmp_path, capfd
):  # noqa: ANN001
    from tests.training.conftest import tiny_cli_args
    from tupe.cli import main

    base = [
        "pretrain",
        "--out",
        str(tmp_path / "r"),
        *tiny_cli_args(tiny_corpus, tiny_tokenizer_dir, cache_dir),
    ]
    assert main([*base, "--max-steps", "2"]) == 0
    got = capfd.readouterr()
    assert got.out == "" and got.err == ""  # no "Writing model shards" bars, no warnings
    assert main([a for a in base if a != "--quiet"] + ["--max-steps", "4", "--resume"]) == 0
    got = capfd.readouterr()
    assert "--resume: continuing from" in got.out
    assert "missing keys" not in got.err and "Writing model shards" not in got.err + got.out
    assert "PAD/BOS/EOS" not in got.err
