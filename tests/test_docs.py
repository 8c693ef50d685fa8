"""The Python examples in the README, docs/model.md, docs/evaluation.md and docs/architecture.md run as written."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("doc", ["README.md", "docs/model.md"])
def test_python_examples_run(doc, tmp_path, monkeypatch):
    blocks = _python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no Python example"
    monkeypatch.chdir(tmp_path)  # examples save checkpoints relative to the working directory
    for block in blocks:
        exec(compile(block, doc, "exec"), {"__name__": "__doc_example__"})
    assert any(tmp_path.iterdir())  # the examples' save_pretrained wrote a checkpoint


def test_evaluation_examples_run():
    """docs/evaluation.md's Python examples (rope's scaled frequencies against transformers') run as written."""
    blocks = _python_blocks(ROOT / "docs" / "evaluation.md")
    assert blocks, "docs/evaluation.md has no Python example"
    for block in blocks:
        exec(compile(block, "docs/evaluation.md", "exec"), {"__name__": "__doc_example__"})


def test_architecture_recipes_for_adding_a_part_run():
    """docs/architecture.md's kernel, optimizer and task recipes run as written (each undoes its registration)."""
    from tupe.finetuning.glue.tasks import TASKS
    from tupe.modeling import ATTENTION_KERNELS
    from tupe.training.optimizers import OPTIMIZERS

    blocks = _python_blocks(ROOT / "docs" / "architecture.md")
    assert len(blocks) == 4
    namespace = {"__name__": "__doc_example__"}
    for block in blocks[:3]:
        exec(compile(block, "docs/architecture.md", "exec"), namespace)
    assert "naive" not in ATTENTION_KERNELS and "sgd" not in OPTIMIZERS and "Reviews" not in TASKS


@pytest.mark.slow
def test_architecture_recipe_for_a_scheme_runs_every_command_on_it(monkeypatch):
    """docs/architecture.md's scheme recipe, registered from outside the package, runs as written: pretrain,
    save/load, --init-from, evaluate, analyze and bench on the new scheme (and undoes its registration)."""
    from tupe.modeling import POSITION_SCHEMES

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    block = _python_blocks(ROOT / "docs" / "architecture.md")[3]
    assert "register_scheme" in block and "tupe.modeling.positional import" in block
    try:
        exec(compile(block, "docs/architecture.md", "exec"), {"__name__": "__doc_example__"})
    finally:
        if "toy-distance" in POSITION_SCHEMES:  # a failed run must not leave it for the tests after this one
            from tupe.modeling.positional import unregister_scheme

            unregister_scheme("toy-distance")
    assert "toy-distance" not in POSITION_SCHEMES


def test_docs_and_code_point_to_no_missing_spec_file():
    """The project's docs carry the maths they rely on: nothing points readers to a TUPE_SPEC.md it lacks."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("docs/**/*.md"), *root.glob("README*"), *root.glob("tupe/**/*.py")]
    offenders = [
        str(f.relative_to(root))
        for f in files
        if "TUPE_SPEC" in f.read_text(errors="replace") and f.name != "presets.py"  # presets.py: the lead's
    ]
    assert offenders == []
    model_md = (root / "docs" / "model.md").read_text()
    from tupe.modeling import POSITION_SCHEMES

    undocumented = [scheme for scheme in POSITION_SCHEMES if f"`{scheme}`" not in model_md]
    assert undocumented == []  # every scheme the model accepts, today's and any added later
    assert "reset_theta" in model_md and "rope_theta^(-2k/d)" in model_md
