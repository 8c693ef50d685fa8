"""Export at any shape: torch.export with dynamic batch and length, the ONNX exporter run in onnxruntime, and
torch.compile(dynamic=True) without a recompilation per length. Traced once, checked at other shapes."""

import pytest
import torch
from torch.export import Dim

import tupe
from tupe import TupeForMaskedLM

from ..helpers import tiny_config

SCHEMES = list(tupe.POSITION_SCHEMES)
FAST = {"tupe-a", "tupe-r"}  # the paper's schemes run by default; every scheme with -m slow
OTHER_SHAPES = [(3, 16), (1, 5), (4, 33)]  # none is the traced (2, 9)


def _schemes():
    def marks(s):
        return [] if s in FAST else [pytest.mark.slow]

    return [pytest.param(s, marks=marks(s)) for s in SCHEMES]


def _inputs(batch, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (batch, n), generator=g)
    mask = torch.ones_like(ids)
    mask[0, n // 2 :] = 0  # padding in every batch
    return ids, mask


class Logits(torch.nn.Module):
    """(input_ids, attention_mask) -> logits: the plain tensor signature exporters want."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def _model(scheme):
    model = TupeForMaskedLM(tiny_config(scheme)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return Logits(model).eval()


DYNAMIC = {"input_ids": {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=40)}}
DYNAMIC["attention_mask"] = DYNAMIC["input_ids"]


@pytest.mark.parametrize("scheme", _schemes())
def test_torch_export_with_attention_mask_runs_at_other_shapes(scheme):
    model = _model(scheme)
    program = torch.export.export(model, _inputs(2, 9), dynamic_shapes=DYNAMIC)
    exported = program.module()
    for batch, n in OTHER_SHAPES:
        ids, mask = _inputs(batch, n, seed=n)
        torch.testing.assert_close(exported(ids, mask), model(ids, mask), atol=1e-5, rtol=1e-5)
        full = torch.ones_like(mask)  # a mask without padding follows the same graph
        torch.testing.assert_close(exported(ids, full), model(ids, full), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", _schemes())
def test_onnx_graph_runs_in_onnxruntime_at_other_shapes(tmp_path, scheme):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    model = _model(scheme)
    program = torch.onnx.export(model, _inputs(2, 9), dynamo=True, dynamic_shapes=DYNAMIC, verbose=False)
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch, n in OTHER_SHAPES:
        ids, mask = _inputs(batch, n, seed=n)
        (got,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), model(ids, mask), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scheme", _schemes())
def test_compile_dynamic_does_not_recompile_per_length(scheme):
    model = _model(scheme)
    graphs = []

    def counting_backend(
        gm, example_inputs
    ):  # dynamo's graphs, run as traced (no inductor: the count is the test)
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counting_backend, dynamic=True)
    with torch.no_grad():
        for i, n in enumerate((7, 11, 16, 23, 33)):
            ids, mask = _inputs(2, n, seed=n)
            torch.testing.assert_close(compiled(ids, mask), model(ids, mask), atol=1e-5, rtol=1e-5)
            if i == 0:
                first = len(graphs)
    assert first >= 1
    assert len(graphs) == first, f"recompiled for new lengths: {len(graphs)} graphs after {first}"


@pytest.mark.slow
def test_export_doc_runs(tmp_path, monkeypatch):
    """docs/export.md's blocks as written, on a tiny checkpoint named as the page names it: torch.export, the ONNX
    file, and that file run in onnxruntime on tokenized text, equal to PyTorch within 1e-4."""
    import re
    from pathlib import Path

    pytest.importorskip("onnxruntime")
    from tests.glue.fixtures import make_checkpoint

    doc = Path(__file__).resolve().parents[2] / "docs" / "export.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    make_checkpoint(tmp_path / "my-tupe")
    namespace = {"__name__": "__doc_example__"}
    for block in blocks:
        exec(compile(block, str(doc), "exec"), namespace)
    assert (tmp_path / "tupe.onnx").is_file()
    assert (
        namespace["logits"].shape[:2] == namespace["enc"]["input_ids"].shape
    )  # any length: not the traced 9
