"""`tupe analyze` end to end, as a user would run it, on TUPE and transformers BERT directories."""

from __future__ import annotations

import base64
import json
import re

import pytest
import torch

from tupe import TupeForMaskedLM
from tupe.analysis import decompose, head_patterns
from tupe.analysis.loading import read_text_sample, text_blocks
from tupe.cli import main
from tupe.io.checkpoints import load_tokenizer


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


@pytest.mark.slow
def test_analyze_transformers_bert_directory(bert_dir, text_file, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "analyze",
            "--model",
            str(bert_dir),
            "--text",
            str(text_file),
            "--out",
            str(out),
            "--max-seq-len",
            "32",
            "--num-blocks",
            "6",
        ]
    )
    assert rc == 0
    assert (out / "decomposition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((out / "analysis.json").read_text())
    assert result["position_scheme"] == "bert-a" and result["num_blocks"] == 6
    dec = result["decomposition"]
    assert dec["max_abs_error"] < 1e-9
    # the numbers agree with a direct computation from the transformers weights
    from transformers import BertForMaskedLM

    bert = BertForMaskedLM.from_pretrained(bert_dir).eval()
    blocks = text_blocks(read_text_sample(text_file), load_tokenizer(bert_dir), 32, 6)
    h = bert.config.num_attention_heads
    with torch.no_grad():
        x = bert.bert.embeddings(input_ids=blocks)
        att = bert.bert.encoder.layer[0].attention.self
        q = att.query(x).view(6, 32, h, -1).transpose(1, 2)
        k = att.key(x).view(6, 32, h, -1).transpose(1, 2)
        logits = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).mean((0, 1))
    total = torch.tensor(dec["mean_maps"]["total"])
    summed = sum(torch.tensor(dec["mean_maps"][t]) for t in ("word_word", "word_pos", "pos_word", "pos_pos"))
    assert torch.allclose(total, logits, atol=1e-4)
    assert torch.allclose(summed, logits, atol=1e-3)  # maps are rounded to 5 decimals in the JSON
    assert "patterns" not in result  # bert-a has no content-free logit term
    html = (out / "analysis.html").read_text()
    assert len(_images(html)) == 1 and "word → position" in html
    assert "row std" in capsys.readouterr().out


@pytest.mark.slow
def test_analyze_tupe_a_patterns_and_bert_r_both(tupe_dir, text_file, tmp_path):
    model_dir = tupe_dir("tupe-a", with_tokenizer=False)
    out = tmp_path / "tupe-a"
    # content-free patterns need no text and no tokenizer
    assert main(["analyze", "--model", str(model_dir), "--out", str(out), "--max-seq-len", "24"]) == 0
    result = json.loads((out / "analysis.json").read_text())
    heads = result["patterns"]["heads"]
    assert len(heads) == 4
    model = TupeForMaskedLM.from_pretrained(model_dir)
    with torch.no_grad():
        expected = head_patterns(model.tupe.positional_logits(24))
    for got, want in zip(heads, expected):
        assert got["label"] == want.label
        assert got["entropy"] == pytest.approx(want.entropy, rel=1e-6)
        assert got["from_cls_entropy"] == pytest.approx(1.0)  # TUPE-A's reset: [CLS] attends uniformly
    assert {p.name for p in out.iterdir()} >= {"patterns.png", "patterns_zoom.png", "offset_profile.png"}
    assert len(_images((out / "analysis.html").read_text())) == 3

    r_dir = tupe_dir("bert-r")
    out_r = tmp_path / "bert-r"
    assert (
        main(
            [
                "analyze",
                "--model",
                str(r_dir),
                "--text",
                str(text_file),
                "--out",
                str(out_r),
                "--max-seq-len",
                "20",
                "--num-blocks",
                "4",
            ]
        )
        == 0
    )
    result = json.loads((out_r / "analysis.json").read_text())
    assert "decomposition" in result and "patterns" in result
    model = TupeForMaskedLM.from_pretrained(r_dir)
    blocks = text_blocks(read_text_sample(text_file), load_tokenizer(r_dir), 20, 4)
    dec = decompose(model, blocks)
    for name, stats in dec.stats.items():
        assert result["decomposition"]["stats"][name]["row_std"] == pytest.approx(stats["row_std"], rel=1e-6)


def test_user_errors_are_one_line(tupe_dir, text_file, tmp_path, capsys):
    no_tok = tupe_dir("bert-a", with_tokenizer=False)
    rc = main(["analyze", "--model", str(no_tok), "--text", str(text_file), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "no tokenizer" in err and "--tokenizer" in err and "Traceback" not in err
    # bert-a needs text for its split
    assert main(["analyze", "--model", str(no_tok), "--out", str(tmp_path / "o")]) == 2
    assert "needs --text" in capsys.readouterr().err
    assert main(["analyze", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")]) == 2
    assert f"--model {tmp_path / 'missing'}: no such folder" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()  # refused before any work: --out not even made
    rope = tupe_dir("rope")
    assert (
        main(["analyze", "--model", str(rope), "--text", str(text_file), "--out", str(tmp_path / "o")]) == 2
    )
    assert "nothing to analyse" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("a few words")
    with_tok = tupe_dir("bert-a")
    assert (
        main(["analyze", "--model", str(with_tok), "--text", str(short), "--out", str(tmp_path / "o")]) == 2
    )
    assert "fewer than one block" in capsys.readouterr().err


def test_bare_bert_model_directory_keeps_its_weights(tmp_path, tokenizer, text_file):
    """A `BertModel` (no MLM head) saved to disk: the encoder weights are used as they are, not re-initialised."""
    from transformers import BertConfig, BertModel

    from tupe.analysis.decomposition import first_layer_terms
    from tupe.analysis.loading import load_encoder

    from .conftest import randomise

    bert = BertModel(
        BertConfig(
            vocab_size=300,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=40,
        )
    ).eval()
    randomise(bert, 5)
    bert.save_pretrained(tmp_path / "bare")
    tokenizer.save_pretrained(tmp_path / "bare")
    encoder, description = load_encoder(tmp_path / "bare")
    assert "BERT" in description
    ids = text_blocks(read_text_sample(text_file), tokenizer, 16, 2)
    terms, _ = first_layer_terms(encoder, ids)
    with torch.no_grad():
        x = bert.embeddings(input_ids=ids)
        att = bert.encoder.layer[0].attention.self
        q = att.query(x).view(2, 16, 2, 16).transpose(1, 2)
        k = att.key(x).view(2, 16, 2, 16).transpose(1, 2)
        logits = q @ k.transpose(-1, -2) / 4.0
    assert torch.allclose(sum(terms.values()).float(), logits, atol=1e-4)
    assert (
        main(
            [
                "analyze",
                "--model",
                str(tmp_path / "bare"),
                "--text",
                str(text_file),
                "--out",
                str(tmp_path / "o"),
                "--max-seq-len",
                "16",
                "--num-blocks",
                "2",
            ]
        )
        == 0
    )


def test_threads_and_no_progress(tupe_dir, tmp_path, capsys, monkeypatch):
    import transformers

    assert main(["analyze", "--model", "x", "--out", str(tmp_path / "o"), "--threads", "0"]) == 2
    assert "argument --threads: must be an integer from 1 to 1024, got 0" in capsys.readouterr().err
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    seen = {}

    import tupe.analysis.analyze as analyze_module

    real = analyze_module._analyze_from_args

    def spy(args):  # noqa: ANN001, ANN202 - the bars are off while the analysis runs
        seen["bars"] = transformers.utils.logging.is_progress_bar_enabled()
        return real(args)

    monkeypatch.setattr(analyze_module, "_analyze_from_args", spy)
    model = tupe_dir("tupe-a")
    argv = ["analyze", "--model", str(model), "--out", str(tmp_path / "o"), "--threads", "1", "--no-progress"]
    assert main(argv) == 0
    assert calls == [1] and seen["bars"] is False
    assert "wrote" in capsys.readouterr().out


def test_flags_and_paths_checked_when_parsed_and_a_second_writer_refused(
    tupe_dir, text_file, tmp_path, capsys
):
    import signal

    from ..helpers import hold_lock

    model = tupe_dir("tupe-a")
    out = tmp_path / "o"
    base = ["analyze", "--model", str(model), "--text", str(text_file), "--out", str(out)]
    assert main([*base, "--max-seq-len", "3"]) == 2
    assert "argument --max-seq-len: must be an integer from 4 to 1048576, got 3" in capsys.readouterr().err
    assert main([*base, "--tokenizer", str(text_file)]) == 2
    assert f"--tokenizer {text_file} is a file, expected a folder" in capsys.readouterr().err
    assert main(["analyze", "--model", str(text_file), "--out", str(out)]) == 2
    assert f"--model {text_file} is a file, expected a folder" in capsys.readouterr().err
    assert not out.exists()
    holder = hold_lock("folder_lock", out, "tupe analyze")
    try:
        assert main([*base, "--num-blocks", "2", "--max-seq-len", "16"]) == 2
        err = capsys.readouterr().err
        assert (
            len(err.strip().splitlines()) == 1
            and f"another `tupe analyze` is writing here (pid {holder.pid} " in err
        )
        assert not (out / "analysis.json").exists()
        holder.send_signal(signal.SIGKILL)  # a killed holder's lock is taken over
        holder.wait()
        assert main([*base, "--num-blocks", "2", "--max-seq-len", "16"]) == 0
        assert (out / "analysis.json").is_file()
    finally:
        holder.kill()
        holder.wait()
