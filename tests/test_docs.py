"""The Python examples in the README and docs/model.md run as written."""

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
