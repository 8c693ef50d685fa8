"""`tupe pretrain --init-from`: continued pre-training from a BERT folder or a tupe run, for the same scheme or
another; what is copied, what starts fresh, and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tupe.errors import TupeError
from tupe.training.pretrain import pretrain

from ..helpers import random_bert

SHAPE_FROM_SOURCE = dict(num_attention_heads=None, tokenizer=None)  # the BERT has 4 heads, TINY says 2


def _bert_folder(
    folder: Path, tokenizer_dir: Path, with_tokenizer: bool = True, seed_shift: float = 0.0
) -> Path:
    """A small random BertForMaskedLM saved with save_pretrained, with the tests' tiny tokenizer beside it."""
    from tupe.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    bert = random_bert("BertForMaskedLM", vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    if seed_shift:
        with torch.no_grad():
            bert.bert.embeddings.word_embeddings.weight.add_(seed_shift)
    bert.save_pretrained(folder)
    if with_tokenizer:
        tok.save_pretrained(folder)
    return folder


def _stock_bert_tokenizer(corpus: Path | None = None, without: str = ""):  # noqa: ANN202 - a BertTokenizer
    """A WordPiece vocabulary laid out as Google's BERT's: [PAD] 0, [unused*], [UNK] 100, [CLS] 101, [SEP] 102,
    [MASK] 103, then the corpus's most frequent words (`without`: a special token left out)."""
    import re
    from collections import Counter

    from transformers import BertTokenizer

    words = Counter()
    for path in sorted(corpus.glob("*.txt")) if corpus else []:
        words.update(re.findall(r"\w+|[^\w\s]", path.read_text().lower()))
    special = [t for t in ("[UNK]", "[CLS]", "[SEP]", "[MASK]") if t != without]
    vocab = ["[PAD]", *(f"[unused{i}]" for i in range(99)), *special, *(w for w, _ in words.most_common(300))]
    return BertTokenizer(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))})


def _spy_first_step(monkeypatch: pytest.MonkeyPatch) -> list:
    """Record the first training batch and the loss the Trainer backpropagates for it."""
    from tupe.training.trainer import PretrainTrainer

    seen: list = []
    original = PretrainTrainer.compute_loss

    def spy(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001, ANN202
        out = original(self, model, inputs, return_outputs, num_items_in_batch)
        if model.training and not seen:
            loss = out[0] if isinstance(out, tuple) else out
            seen.append(({k: v.detach().clone() for k, v in inputs.items()}, float(loss.detach())))
        return out

    monkeypatch.setattr(PretrainTrainer, "compute_loss", spy)
    return seen


def _spy_model_before_training(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The model's state dict as the Trainer receives it (after --init-from copied, before the first step)."""
    import tupe.training.pretrain as pretrain_module

    captured: dict = {}
    original = pretrain_module.build_trainer

    def spy(run, args, data, model, *rest):  # noqa: ANN001, ANN202
        captured.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return original(run, args, data, model, *rest)

    monkeypatch.setattr(pretrain_module, "build_trainer", spy)
    return captured


@pytest.mark.slow
def test_from_a_bert_folder_the_first_loss_is_berts(
    tiny_run, tiny_tokenizer_dir, tmp_path, monkeypatch
) -> None:  # noqa: ANN001
    from transformers import BertForMaskedLM

    source = _bert_folder(tmp_path / "bert", tiny_tokenizer_dir)
    seen = _spy_first_step(monkeypatch)
    out = tmp_path / "run"
    summary = pretrain(tiny_run(out, scheme="bert-a", init_from=str(source), max_steps=1, dropout=0.0,
                                **SHAPE_FROM_SOURCE))  # fmt: skip
    inputs, loss = seen[0]
    bert = BertForMaskedLM.from_pretrained(source).eval()
    with torch.no_grad():
        expected = bert(**inputs).loss.item()
    assert loss == pytest.approx(expected, rel=1e-5, abs=1e-6)
    first_logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert first_logged == pytest.approx(expected, rel=1e-3)
    record = summary["init_from"]
    assert record["kind"] == "transformers BERT" and record["new"] == []  # bert-a takes every BERT weight
    assert set(record["kept_groups"]) >= {"word embeddings", "attention", "FFN", "LM head", "position table"}
    assert json.loads((out / "config.json").read_text())["layer_norm_eps"] == bert.config.layer_norm_eps
    assert "Continued pre-training" in (out / "README.md").read_text()
    # the tokenizer is the source's, not one trained anew
    assert (out / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()


@pytest.mark.slow
def test_from_a_bert_with_a_stock_wordpiece_vocabulary(tiny_run, tiny_corpus, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """[CLS] at 101 as in Google's BERT: the run's tokenizer is the source's with its special tokens moved to the
    ids the data pipeline writes, the embedding and LM-head rows moved alike: the same function, so the first
    loss is BERT's own on that batch read back in the source's ids."""
    from transformers import AutoTokenizer, BertForMaskedLM

    from tupe.training.init_from import contract_order

    tok = _stock_bert_tokenizer(tiny_corpus)
    source = tmp_path / "bert"
    random_bert("BertForMaskedLM", vocab_size=len(tok), max_position_embeddings=64).save_pretrained(source)
    tok.save_pretrained(source)
    seen = _spy_first_step(monkeypatch)
    out = tmp_path / "run"
    pretrain(
        tiny_run(out, scheme="bert-a", init_from=str(source), max_steps=1, dropout=0.0, **SHAPE_FROM_SOURCE)
    )
    order = torch.tensor(contract_order(tok))
    inputs, loss = seen[0]
    labels = inputs["labels"]
    source_ids = {"input_ids": order[inputs["input_ids"]], "attention_mask": inputs["attention_mask"],
                  "labels": torch.where(labels >= 0, order[labels.clamp(min=0)], labels)}  # fmt: skip
    assert int((labels >= 0).sum()) > 0
    with torch.no_grad():
        expected = BertForMaskedLM.from_pretrained(source).eval()(**source_ids).loss.item()
    assert loss == pytest.approx(expected, rel=1e-5, abs=1e-6)
    saved = AutoTokenizer.from_pretrained(out)
    text = "the man said that he was there."
    assert saved.tokenize(text) == tok.tokenize(text) and saved.cls_token_id == 1 and tok.cls_token_id == 101
    assert order[saved(text)["input_ids"]].tolist() == tok(text)["input_ids"]


@pytest.mark.slow
def test_from_a_tupe_run_of_another_scheme(tiny_run, tmp_path, monkeypatch, capsys) -> None:  # noqa: ANN001
    from transformers import set_seed

    from tupe.modeling import TupeConfig, TupeForMaskedLM

    first = tmp_path / "bert-a"
    pretrain(tiny_run(first, scheme="bert-a", max_steps=2))
    source = TupeForMaskedLM.from_pretrained(first).state_dict()
    before = _spy_model_before_training(monkeypatch)
    out = tmp_path / "tupe-a"
    summary = pretrain(tiny_run(out, scheme="tupe-a", init_from=str(first), max_steps=1, tokenizer=None,
                                quiet=False))  # fmt: skip
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("init from"))
    assert f"the final model of the tupe run {first}" in line and "bert-a -> tupe-a" in line
    assert "positional projections pos_query/pos_key" in line and "not used: 1 (position table)" in line

    positional = [k for k in before if ".positional." in k]
    content = [k for k in before if k not in positional]
    assert content and all(torch.equal(before[k], source[k]) for k in content)
    # the positional parts tupe-a adds: exactly as a new tupe-a model of this run initialises them
    set_seed(0)
    fresh = TupeForMaskedLM(
        TupeConfig(**json.loads((out / "tupe_run.json").read_text())["model"])
    ).state_dict()
    assert sorted(positional) == sorted(summary["init_from"]["new"])
    assert all(torch.equal(before[k], fresh[k]) for k in positional)
    assert not any(
        torch.equal(before[k], fresh[k]) for k in content if "LayerNorm" not in k and "norm" not in k
    )


@pytest.mark.slow
def test_refusals(tiny_run, tiny_tokenizer_dir, tmp_path) -> None:  # noqa: ANN001
    source = _bert_folder(tmp_path / "bert", tiny_tokenizer_dir)

    def run(out: str = "run", **over):  # noqa: ANN003, ANN202
        kw = dict(SHAPE_FROM_SOURCE, scheme="tupe-a", init_from=str(source), max_steps=1, save_steps=1)
        return pretrain(tiny_run(tmp_path / out, **{**kw, **over}))

    with pytest.raises(
        TupeError, match=r"^--hidden-size 64 conflicts with --init-from .*: its hidden_size is 32"
    ):
        run(hidden_size=64)
    with pytest.raises(TupeError, match=r"^--num-heads 2 conflicts with .*num_attention_heads is 4; drop"):
        run(num_attention_heads=2)
    with pytest.raises(TupeError, match=r"--vocab-size 999 conflicts"):
        run(vocab_size=999)
    bare = _bert_folder(tmp_path / "bare", tiny_tokenizer_dir, with_tokenizer=False)
    with pytest.raises(TupeError, match=r"no tokenizer in .*bare .*uses the source's tokenizer"):
        run(init_from=str(bare))
    no_mask = _bert_folder(tmp_path / "no-mask", tiny_tokenizer_dir, with_tokenizer=False)
    _stock_bert_tokenizer(without="[MASK]").save_pretrained(no_mask)
    with pytest.raises(TupeError, match=r"its tokenizer cannot feed .* special tokens \[PAD\]=0, \[CLS\]=1"):
        run(init_from=str(no_mask))
    other = tmp_path / "gpt"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 300}))
    with pytest.raises(TupeError, match=r"model_type 'gpt2' is not supported .*--init-from takes a tupe run"):
        run(init_from=str(other))
    with pytest.raises(TupeError, match=r"no config.json, so not a model folder"):
        run(init_from=str(tmp_path))
    with pytest.raises(TupeError, match=r"--tokenizer .* and --init-from"):
        run(tokenizer=str(tiny_tokenizer_dir))

    run()  # a run from `source`, then --resume with another source (or none) is another run
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(tmp_path / "run" / "tupe_run.json", unfinished)
    shutil.copytree(tmp_path / "run" / "checkpoint-1", unfinished / "checkpoint-1")
    with pytest.raises(TupeError, match=r"a tupe run without a final model .*--init-from .*checkpoint-1"):
        run("from-unfinished", init_from=str(unfinished))
    record = run("from-checkpoint", init_from=str(unfinished / "checkpoint-1"))["init_from"]
    assert record["source_scheme"] == "tupe-a" and record["new"] == []
    shutil.rmtree(tmp_path / "run" / "checkpoint-1", ignore_errors=True)
    (tmp_path / "run" / "pretrain_summary.json").unlink()
    changed = _bert_folder(tmp_path / "changed", tiny_tokenizer_dir, seed_shift=0.5)
    with pytest.raises(TupeError, match=r"holds a different run \(init_from"):
        run(init_from=str(changed), resume=True, max_steps=2)
    with pytest.raises(TupeError, match=r"holds a different run"):
        pretrain(tiny_run(tmp_path / "run", scheme="tupe-a", num_attention_heads=4, max_steps=2, resume=True))


def test_cli_refusal_is_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from tupe.cli import main

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    code = main(["pretrain", "--init-from", str(folder), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "model_type 'roberta' is not supported" in err and "\n" not in err


@pytest.mark.slow
def test_from_a_deberta_folder_the_first_loss_is_debertas(
    tiny_run, tiny_tokenizer_dir, tmp_path, monkeypatch
) -> None:  # noqa: ANN001
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    from tupe.data.tokenizer import load_tokenizer

    from ..modeling.test_deberta import V3

    tok = load_tokenizer(tiny_tokenizer_dir)
    torch.manual_seed(0)
    deberta = DebertaV2ForMaskedLM(DebertaV2Config(**{**V3, "vocab_size": len(tok)})).eval()
    with torch.no_grad():
        for p in deberta.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    source = tmp_path / "deberta"
    deberta.save_pretrained(source)
    tok.save_pretrained(source)
    seen = _spy_first_step(monkeypatch)
    shape = dict(SHAPE_FROM_SOURCE, hidden_size=None, intermediate_size=None)
    summary = pretrain(tiny_run(tmp_path / "run", scheme="deberta", init_from=str(source), max_steps=1,
                                dropout=0.0, **shape))  # fmt: skip
    inputs, loss = seen[0]
    with torch.no_grad():
        expected = DebertaV2ForMaskedLM.from_pretrained(source).eval()(**inputs).loss.item()
    assert loss == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert summary["init_from"]["kind"] == "transformers DeBERTa-v2" and summary["init_from"]["new"] == []


def test_init_from_a_file_or_a_converted_fairseq_folder_is_named(tmp_path: Path) -> None:
    """Issue 38: `--init-from` a file said "no such folder"; a converted fairseq folder (vocab.json + merges.txt)
    said it had no tokenizer."""
    from tests.convert.bpe import write_codes_and_dict
    from tests.glue.fixtures import make_checkpoint
    from tupe.modeling.fairseq import build_dictionary, build_tokenizer, read_dict_txt
    from tupe.training.init_from import model_folder, read_source

    model = make_checkpoint(tmp_path / "model")
    with pytest.raises(
        TupeError, match=r"model.safetensors: a file, not a folder; give the folder that holds it: "
    ):
        model_folder(str(model / "model.safetensors"))
    loose = tmp_path / "loose.bin"
    loose.write_bytes(b"x")
    with pytest.raises(TupeError, match=r"loose.bin: a file, not a folder; --init-from takes a tupe run"):
        model_folder(str(loose))

    (tmp_path / "bpe").mkdir()
    codes, dict_txt, _ = write_codes_and_dict(tmp_path / "bpe")
    tok = build_tokenizer(build_dictionary(dict_txt, 7 + len(read_dict_txt(dict_txt)) + 1), codes)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)
    tok.save_pretrained(model)
    assert (model / "vocab.json").is_file() and (model / "merges.txt").is_file()
    folder, _, _ = read_source(str(model))  # the tokenizer is found, not "no tokenizer"
    from tupe.training.init_from import _check_tokenizer

    with pytest.raises(
        TupeError, match=r"its tokenizer \(FairseqMosesBPETokenizer, vocab.json \+ merges.txt\) is a "
    ):
        _check_tokenizer(folder, str(model), None)
