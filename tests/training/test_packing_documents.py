"""`tupe pretrain/compare --packing documents` end to end on a corpus of many short documents; the run's identity."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tupe.cli import main
from tupe.errors import TupeError


@pytest.fixture(scope="module")
def short_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Many short documents, one per line, blank-line separated (and a few of several lines)."""
    rng = random.Random(1)
    words = "the a man woman dog cat saw met found left near by house river town old new".split()
    docs = [
        "\n".join(
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + "."
            for _ in range(1 + (d % 9 == 0))
        )
        for d in range(900)
    ]
    path = tmp_path_factory.mktemp("short") / "docs.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path


def _tiny(corpus: Path, cache: Path) -> list[str]:
    return [
        "--corpus", str(corpus), "--cache-dir", str(cache), "--vocab-size", "300",
        "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2", "--intermediate-size", "64",
        "--max-seq-len", "32", "--batch-size", "8", "--warmup-steps", "1", "--lr", "2e-3", "--max-steps", "2",
        "--eval-steps", "2", "--save-steps", "2", "--logging-steps", "1", "--valid-every", "20", "--no-progress",
    ]  # fmt: skip


@pytest.mark.slow
def test_cli_documents_run_end_to_end(short_docs: Path, tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    from tupe.modeling import TupeForMaskedLM

    seen: list[torch.Tensor] = []
    real = TupeForMaskedLM.forward

    def recording(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if self.training:
            seen.append(k.get("position_ids"))
        return real(self, *a, **k)

    monkeypatch.setattr(TupeForMaskedLM, "forward", recording)
    out = tmp_path / "docs-run"
    args = ["pretrain", "--scheme", "tupe-a", "--packing", "documents", "--out", str(out)]
    assert main([*args, *_tiny(short_docs, tmp_path / "cache")]) == 0
    console = capsys.readouterr().out
    assert "--packing documents: 900 documents in" in console and "packing efficiency" in console
    # the Trainer handed the model the batches' position_ids: (b, n), 0 at each document's [CLS]
    assert len(seen) == 2 and all(
        p is not None and p.shape == (8, 32) and p.dtype == torch.long for p in seen
    )
    assert all(int((p == 0).sum()) > 8 for p in seen)  # several documents per row
    summary = json.loads((out / "pretrain_summary.json").read_text())
    stats = summary["packing_stats"]
    assert summary["packing"] == "documents" and summary["packing_efficiency"] == stats["all"]["efficiency"]
    assert 0.9 < summary["packing_efficiency"] <= 1.0 and stats["documents"] == 900
    assert (
        summary["train_blocks"] == stats["train"]["blocks"]
        and summary["valid_blocks"] == stats["valid"]["blocks"]
    )
    assert Path(summary["documents_cache"]).parent.name == "documents"
    assert json.loads((out / "tupe_run.json").read_text())["data"]["packing"] == "documents"
    card = (out / "README.md").read_text()
    assert (
        "Packing: documents" in card
        and "| packing efficiency |" in card
        and "| packing | documents |" in card
    )

    # the run's identity: --resume with the other packing is refused, naming the flag
    monkeypatch.setattr(TupeForMaskedLM, "forward", real)
    stream_args = ["pretrain", "--scheme", "tupe-a", "--out", str(out), "--resume"]
    assert main([*stream_args, *_tiny(short_docs, tmp_path / "cache"), "--max-steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "holds a different run (--packing: 'documents' -> 'stream')" in err and "\n" not in err.strip()


@pytest.mark.slow
def test_stream_run_refuses_documents_resume_and_keeps_its_identity(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    from tupe.training.pretrain import pretrain

    out = tmp_path / "stream"
    summary = pretrain(tiny_run(out, max_steps=2))
    record = json.loads((out / "tupe_run.json").read_text())
    # a stream run records what it always recorded: no packing key, no packing statistics
    assert (
        "packing" not in record["data"] and "packing" not in summary and "packing_efficiency" not in summary
    )
    # ... but its card names its packing (issue 49)
    card = (out / "README.md").read_text().split("## How it was made")[0]
    assert "| packing | stream (FULL-SENTENCES: blocks cross documents) |" in card
    assert "Packing: stream (`--packing stream`, RoBERTa's FULL-SENTENCES)" in card
    with pytest.raises(TupeError, match=r"different run \(--packing: 'stream' -> 'documents'\)"):
        pretrain(tiny_run(out, max_steps=4, packing="documents", resume=True))
    # the documents run of the same corpus validates on the same text: the same non-special tokens
    docs = tmp_path / "documents"
    d_summary = pretrain(tiny_run(docs, max_steps=2, packing="documents"))
    from tupe.analysis.baseline import open_run_blocks, run_unigram

    _, stream_blocks = open_run_blocks(out)
    _, doc_blocks = open_run_blocks(docs)
    assert d_summary["data_cache"] == summary["data_cache"]  # one token stream in the cache for both
    a = [t for i in stream_blocks.split(20)[1] for t in stream_blocks.block(int(i)).tolist() if t > 4]
    b = [t for i in doc_blocks.split(20)[1] for t in doc_blocks.block(int(i)).tolist() if t > 4]
    assert sorted(a) == sorted(b) and a
    assert run_unigram(out) == run_unigram(docs)  # same training text: the same baseline
    # a comparison's baseline: its record's, else its first finished run's (claims and the study read it so)
    from tupe.analysis.baseline import study_unigram

    assert study_unigram(tmp_path, [tmp_path / "absent", docs]) == run_unigram(docs)["unigram_loss"]
    (tmp_path / "compare_summary.json").write_text('{"stats": {"unigram_loss": 6.25}}')
    assert study_unigram(tmp_path, [docs]) == 6.25


def test_hf_bert_with_documents_is_refused(tiny_run, tmp_path: Path) -> None:  # noqa: ANN001
    with pytest.raises(TupeError, match="hf-bert.*attention crosses documents"):
        tiny_run(tmp_path / "x", scheme="hf-bert", packing="documents").resolve()
    with pytest.raises(TupeError, match="unknown --packing 'rows'"):
        tiny_run(tmp_path / "x", packing="rows").resolve()


def test_compare_refuses_another_packing_on_resume(tmp_path: Path) -> None:
    from tupe.comparison.compare import COMPARE_RUN_FILE, _check_comparison
    from tupe.training.pretrain import PretrainConfig

    identity = {"schemes": ["bert-a", "tupe-a"], "seeds": [0], "max_steps": 5}
    base = PretrainConfig(out=str(tmp_path), resume=True)
    _check_comparison(tmp_path, identity, base)  # a stream comparison: its record is what it always was
    assert "packing" not in json.loads((tmp_path / COMPARE_RUN_FILE).read_text())
    with pytest.raises(TupeError, match=r"another comparison \(packing: 'stream' -> 'documents'\)"):
        _check_comparison(tmp_path, {**identity, "packing": "documents"}, base)


@pytest.mark.slow
def test_compare_documents_pairs_on_the_same_blocks(short_docs: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    args = ["compare", "--schemes", "bert-a,tupe-a", "--packing", "documents", "--out", str(tmp_path / "cmp")]
    assert main([*args, *_tiny(short_docs, tmp_path / "cache"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "cmp" / "compare_summary.json").read_text())
    valid = json.loads((tmp_path / "cmp" / "bert-a" / "pretrain_summary.json").read_text())["valid_blocks"]
    assert summary["paired"]["validation"]["blocks"] == valid
    assert summary["stats"]["unigram_loss"] is not None
    assert json.loads((tmp_path / "cmp" / "compare_run.json").read_text())["packing"] == "documents"
    # once the model keeps attention inside documents (issue 36, items 1-2), the paired recomputation (each piece
    # scored alone) equals each run's own final evaluation (packed rows with position_ids), as for stream runs
    from tupe.analysis.curves import read_metrics
    from tupe.evaluation.evaluate import load_eval_model

    model = load_eval_model(tmp_path / "cmp" / "tupe-a").model
    ids = torch.tensor([[1, 50, 60, 2, 1, 70, 80, 2]])
    honoured = not torch.equal(
        model(ids).logits, model(ids, position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])).logits
    )
    if honoured:
        for s in ("bert-a", "tupe-a"):
            own = read_metrics(tmp_path / "cmp" / s)[1][-1]["eval_loss"]
            assert summary["paired"][s]["value"] == pytest.approx(own, rel=1e-5)


def test_demo_passes_packing_on(monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    import tupe.comparison.compare as compare_module

    seen = {}

    def fake_compare(base, schemes, parallel=1, log=print):  # noqa: ANN001, ANN202
        seen["packing"] = base.packing
        raise TupeError("stop here")

    monkeypatch.setattr(compare_module, "compare", fake_compare)
    assert main(["demo", "--packing", "documents", "--out", str(tmp_path / "d"), "--no-eval-text"]) == 2
    assert seen == {"packing": "documents"}


def test_paired_scoring_of_a_document_block_is_per_piece() -> None:
    """The paired bootstrap scores a document block one piece at a time, each from position 0: the same sum as
    scoring each document alone."""
    from tupe.comparison.paired import _pieces_nll

    class Model:
        def target_nll(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            assert ids.shape[0] == 1 and int(ids[0, 0]) == 1  # one piece, starting with [CLS]
            return torch.tensor(
                [float(ids.shape[1]) * 10 + float((labels != -100).sum())], dtype=torch.float64
            )

    ids = torch.tensor([1, 7, 8, 2, 1, 9, 2])
    labels = torch.tensor([-100, 7, -100, -100, -100, 9, -100])
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    assert float(_pieces_nll(Model(), ids, labels, positions)) == (40 + 1) + (30 + 1)


@pytest.mark.slow
def test_one_document_a_line_without_blank_lines_is_warned_about(
    short_docs: Path, tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    """Issue 49: a `.txt` of one document a line (no blank line) with --packing documents asked for is one
    document cut into pieces: a warning says how documents are split and how to mark them; the same documents
    with a blank line after each (short_docs) get none."""
    lines = [line for line in short_docs.read_text().splitlines() if line.strip()]
    flat = tmp_path / "one-a-line.txt"
    flat.write_text("\n".join(lines) + "\n")
    args = ["pretrain", "--scheme", "tupe-a", "--packing", "documents", "--prepare-only"]
    assert main([*args, "--out", str(tmp_path / "flat"), *_tiny(flat, tmp_path / "cache")]) == 0
    captured = capsys.readouterr()
    assert "data: --packing documents: 1 document in " in captured.out
    (warning,) = [line for line in captured.err.splitlines() if "warning: --packing documents" in line]
    assert (
        "no text file of the corpus has a blank line" in warning and "put a blank line after each" in warning
    )
    assert main([*args, "--out", str(tmp_path / "docs"), *_tiny(short_docs, tmp_path / "cache")]) == 0
    assert "warning" not in capsys.readouterr().err
