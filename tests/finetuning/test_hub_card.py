"""Issue 49 (items 3, 4): the card of a model `tupe finetune --save-models` wrote is a Hub card (`base_model`,
`datasets`, `model-index` with the scores, the training hyper-parameters, the framework versions), its recipe
run without tupe gives the entities `import tupe` gives, the grid's header and bar count the optimizer steps
--max-steps and --grad-accum make, and the scores reach TensorBoard as run_ner names them (eval/f1, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import run_card_without_tupe
from tupe.cli import main

TEXT = "Alice Smith flew from Paris to Berlin. Xavier met Bob in Madrid, then (Rome)."


def _finetune(tiny_model, data_dir, out, *extra):  # noqa: ANN001, ANN202
    args = ["finetune", "--task", "ner", "--model", str(tiny_model), "--out", str(out), "--lrs", "3e-3"]
    args += ["--train", str(data_dir / "ner_train.conll"), "--validation", str(data_dir / "ner_valid.txt")]
    args += ["--seeds", "1", "--batch-size", "8", "--threads", "1", "--no-progress", *extra]
    assert main(args) == 0
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def ner_run(tiny_model, data_dir, tmp_path_factory):  # noqa: ANN001, ANN201
    """The issue's habit: --max-steps with --grad-accum, TensorBoard, the model kept. (out, results, header)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("hub-card") / "ner"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = _finetune(
            tiny_model, data_dir, out, "--epochs", "3", "--max-steps", "7", "--grad-accum", "2",
            "--report-to", "tensorboard", "--save-models",
        )  # fmt: skip
    return out, results, printed.getvalue()


@pytest.mark.slow
def test_header_and_steps_honour_max_steps_and_grad_accum(ner_run, tiny_model, data_dir, tmp_path, capsys):  # noqa: ANN001
    """--max-steps 7 with --epochs 3: the header names 7 steps a run (not 3 epochs' steps), the bar's total is
    what the Trainer runs; without --max-steps, epochs x steps with --grad-accum counted as the Trainer counts."""
    from tupe.finetuning.arguments import FinetuneSettings
    from tupe.finetuning.pipeline.grid import optimizer_steps

    _, results, header = ner_run
    assert "7 steps a run (--max-steps; an epoch is 6)" in header, header
    assert "batch 8 = 2 forward passes of 4" in header and "epochs x" not in header
    assert results["runs"][0]["steps"] == 7
    # by epochs: 48 examples, batches of 16 / 4 = 4 examples, 12 batches, 4 of them a step: 3 steps an epoch
    results = _finetune(
        tiny_model, data_dir, tmp_path / "epochs", "--epochs", "2", "--grad-accum", "4", "--batch-size", "16"
    )
    assert "2 epochs x 3 steps (batch 16 = 4 forward passes of 4" in capsys.readouterr().out
    assert results["runs"][0]["steps"] == 6
    settings = FinetuneSettings(task="ner", epochs=2, batch_size=16, grad_accum=4)
    assert optimizer_steps(settings, 48) == (3, 6)


@pytest.mark.slow
def test_tensorboard_has_the_scores_named_as_run_ner_names_them(ner_run):  # noqa: ANN001
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, results, _ = ner_run
    events = EventAccumulator(str(out / "tensorboard" / "lr0.003_seed1"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for metric in ("f1", "precision", "recall", "accuracy"):
        assert f"eval/{metric}" in tags, tags
        (value,) = events.Scalars(f"eval/{metric}")
        assert value.value == pytest.approx(results["runs"][0]["scores"][metric], rel=1e-6)
        assert value.step == 7


@pytest.mark.slow
def test_the_card_is_a_hub_card(ner_run, tiny_model):  # noqa: ANN001
    import transformers

    out, results, _ = ner_run
    card = (out / "runs" / "lr0.003_seed1" / "model" / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "token-classification"
    assert meta["base_model"] == Path(tiny_model).name and "/" not in meta["base_model"]
    assert meta["datasets"] == ["ner_train.conll"]
    (index,) = meta["model-index"]
    assert index["name"] == "ner-lr0.003_seed1"
    (result,) = index["results"]
    assert result["task"]["type"] == "token-classification" and result["dataset"]["split"] == "validation"
    scores = results["runs"][0]["scores"]
    assert {m["type"]: m["value"] for m in result["metrics"]} == {m: scores[m] for m in results["metrics"]}
    body = card.split("## Training hyperparameters", 1)[1]
    for row in (
        "| learning rate | 0.003 |", "| max steps | 7 |", "| optimizer steps | 7 |",
        "| batch size | 8 (2 accumulated forward passes of 4) |", "| weight decay | 0.01 |",
        "| learning-rate schedule | linear |", "| optimizer | adamw_torch_fused (betas 0.9, 0.999; epsilon 1e-06) |",
        "| warm-up | 0.06 of the steps (1 steps) |",
    ):  # fmt: skip
        assert row in body, row
    assert f"- Transformers {transformers.__version__}" in body and "- PyTorch " in body
    assert str(Path(tiny_model).resolve()) not in card.split("## How it was made")[0]  # no local path above


@pytest.mark.slow
def test_the_recipe_without_tupe_gives_the_entities_of_tupe(ner_run, tmp_path):  # noqa: ANN001
    """The card's own code, run where tupe cannot be imported and stdin is closed: no prompt, the folder's
    pipeline, the same entities (words, spans, types, scores) as `import tupe` and `pipeline(...)` give, and the
    same token ids from `AutoTokenizer` as tupe's tokenizer gives."""
    from transformers import pipeline

    import tupe  # noqa: F401
    from tupe.io.checkpoints import load_tokenizer

    out, _, _ = ner_run
    model = out / "runs" / "lr0.003_seed1" / "model"
    ours = pipeline("token-classification", model=str(model), device="cpu")
    expected = [[e["entity_group"], e["word"], e["start"], e["end"]] for e in ours(TEXT)]
    scores = [float(e["score"]) for e in ours(TEXT)]
    assert expected and all(w and w == TEXT[a:b] for _, w, a, b in expected)
    after = f"""
        import json
        got = ner({TEXT!r})
        print("ENTITIES " + json.dumps([[e["entity_group"], e["word"], e["start"], e["end"]] for e in got]))
        print("SCORES " + json.dumps([float(e["score"]) for e in got]))
        print("IDS " + json.dumps(tokenizer({TEXT!r})["input_ids"]))
        print("PIPELINE " + type(ner).__module__)
    """
    done = run_card_without_tupe(model / "README.md", after, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "custom code" not in done.stdout + done.stderr  # no "Do you wish to run the custom code?"
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.split(" ")[0].isupper())
    assert not lines["PIPELINE"].startswith(("tupe", "transformers.pipelines"))  # the folder's copy
    assert json.loads(lines["ENTITIES"]) == expected
    assert json.loads(lines["SCORES"]) == pytest.approx(scores, abs=1e-6)
    assert json.loads(lines["IDS"]) == load_tokenizer(model)(TEXT)["input_ids"]


def test_a_saved_aggregation_strategy_is_the_pipeline_s_default(tokenizer):  # noqa: ANN001
    """config.json's `aggregation_strategy` (what `tupe finetune --task ner` saves) is used when a call names
    none; a call's own wins; a model without one keeps the library's default ("none")."""
    from transformers import pipeline
    from transformers.pipelines.token_classification import AggregationStrategy

    from tests.finetuning.test_pipelines import _classifier

    model = _classifier(tokenizer)
    assert pipeline("token-classification", model=model, tokenizer=tokenizer)._postprocess_params == {}
    model.config.aggregation_strategy = "first"
    ner = pipeline("token-classification", model=model, tokenizer=tokenizer)
    assert ner._postprocess_params["aggregation_strategy"] is AggregationStrategy.FIRST
    assert all("entity_group" in e for e in ner("Alice met Bob in Paris."))
    assert all("entity" in e for e in ner("Alice met Bob in Paris.", aggregation_strategy="none"))
    named = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="max")
    assert named._postprocess_params["aggregation_strategy"] is AggregationStrategy.MAX
