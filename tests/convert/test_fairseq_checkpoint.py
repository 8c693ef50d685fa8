"""`tupe convert fairseq` / `TupeForMaskedLM.from_fairseq` on checkpoints of the released format (built in
tests/convert/released.py from the released modules' definitions: the "released" layout of guolinke/TUPE master,
and the "fused" layout of its unmerged pull request), against the released forward written there: float64, 1e-10."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from tests.convert.bpe import write_codes_and_dict
from tests.convert.released import (
    ENC,
    fairseq_args,
    random_state_dict,
    released_forward,
    save_checkpoint,
)
from tupe.errors import TupeError
from tupe.modeling.fairseq import read_dict_txt

TOL = 1e-10


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return write_codes_and_dict(tmp_path_factory.mktemp("bpe"))


LAYOUTS = ["released", "fused"]


def _checkpoint(tmp_path, bpe, heads=None, layout="released", **arg_overrides):
    args = fairseq_args(**arg_overrides)
    vocab = 7 + len(read_dict_txt(bpe[1])) + 1
    sd = random_state_dict(args, vocab, heads=heads, layout=layout)
    path = tmp_path / "checkpoint_best.pt"
    save_checkpoint(path, args, sd)
    return path, args, sd, vocab


def _tokens(vocab, lengths, total):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(7, vocab - 1, (len(lengths), total), generator=g)
    ids[:, 0] = 0  # <s>
    for row, n in enumerate(lengths):
        ids[row, n - 1] = 2  # </s>
        ids[row, n:] = 1  # <pad>
    return ids


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kernel", ["auto", "eager"])
@pytest.mark.parametrize("rel_pos", [True, False], ids=["tupe-r", "tupe-a"])
def test_masked_lm_logits_equal_the_released_forward(tmp_path, bpe, rel_pos, kernel, layout):
    from tupe import TupeForMaskedLM

    path, args, sd, vocab = _checkpoint(tmp_path, bpe, rel_pos=rel_pos, layout=layout)
    assert (ENC + "rp_bucket" in sd) == (rel_pos and layout == "fused")  # the released code never saves it
    model = TupeForMaskedLM.from_fairseq(path, bpe[1], dtype=torch.float64)
    model.set_attn_implementation(kernel)  # "eager": the reference path (also what output_attentions uses)
    assert model.config.position_scheme == ("tupe-r" if rel_pos else "tupe-a")
    # no padding, at the full length (every position row, every relative bucket the length reaches)
    ids = _tokens(vocab, [24, 24], 24)
    with torch.no_grad():
        got = model(ids).logits
    assert (got - released_forward(sd, args, ids)).abs().max().item() < TOL
    # right padding: the released code zeroes padded embeddings, which changes padded outputs only
    ids = _tokens(vocab, [19, 7, 13], 19)
    mask = (ids != 1).long()
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
    assert (got - released_forward(sd, args, ids))[mask.bool()].abs().max().item() < TOL


def test_config_carries_the_fairseq_ids_and_shape(tmp_path, bpe):
    from tupe import TupeForMaskedLM

    path, args, _, vocab = _checkpoint(tmp_path, bpe)
    config = TupeForMaskedLM.from_fairseq(path, bpe[1]).config
    assert (config.cls_token_id, config.pad_token_id, config.sep_token_id) == (0, 1, 2)
    assert config.mask_token_id == vocab - 1 and config.vocab_size == vocab
    assert config.max_position_embeddings == args.max_positions
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 16, 4)
    assert config.relative_attention_num_buckets == 32 and config.embedding_layer_norm


@pytest.mark.parametrize("layout", LAYOUTS)
def test_classification_head_equals_the_released_head(tmp_path, bpe, layout):
    from tupe.modeling.fairseq import classifiers_from_fairseq

    path, args, sd, vocab = _checkpoint(
        tmp_path, bpe, heads={"sentence_classification_head": 3}, layout=layout
    )
    heads = classifiers_from_fairseq(path, dtype=torch.float64)
    model = heads["sentence_classification_head"]
    assert model.config.num_labels == 3
    ids = _tokens(vocab, [15, 9], 15)
    mask = (ids != 1).long()
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
    want = released_forward(sd, args, ids, head="sentence_classification_head")
    assert (got - want).abs().max().item() < TOL


def test_convert_command_writes_a_complete_folder(tmp_path, bpe):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    import tupe  # noqa: F401
    from tupe.cli import main
    from tupe.io.checkpoints import load_model_and_tokenizer

    # a float64 checkpoint (as a released model run in float64 saves): converted without rounding
    args = fairseq_args()
    sd = random_state_dict(
        args, 7 + len(read_dict_txt(bpe[1])) + 1, heads={"sentence_classification_head": 2}
    )
    sd = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
    sd["decoder.lm_head.weight"] = sd[ENC + "embed_tokens.weight"]
    path = tmp_path / "checkpoint_best.pt"
    save_checkpoint(path, args, sd)
    out = tmp_path / "converted"
    codes, dict_txt, _ = bpe
    argv = [
        "convert",
        "fairseq",
        str(path),
        "--dict",
        str(dict_txt),
        "--bpe-codes",
        str(codes),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    for f in (
        "model.safetensors",
        "config.json",
        "tokenizer_config.json",
        "vocab.json",
        "merges.txt",
        "README.md",
    ):
        assert (out / f).is_file(), f
    assert (out / "heads" / "sentence_classification_head" / "model.safetensors").is_file()
    assert (
        "checkpoint_best.pt" in (out / "README.md").read_text()
        and "guolinke/TUPE" in (out / "README.md").read_text()
    )
    assert json.loads((out / "config.json").read_text())["pretrain_steps"] == 1000

    model = AutoModelForMaskedLM.from_pretrained(out).eval()
    assert model.dtype == torch.float64
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok(
        ["The lazy dog jumps.", "Mr. Smith went to Washington, and the fox followed."],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        got = model(**enc).logits
    want = released_forward(sd, args, enc["input_ids"])
    assert (got - want)[enc["attention_mask"].bool()].abs().max().item() < TOL
    fill = pipeline("fill-mask", model=model, tokenizer=tok)
    assert len(fill(f"The lazy {tok.mask_token} jumps.", top_k=3)) == 3
    # what `tupe glue`, `tupe evaluate` and `tupe analyze` load (checks: pad token, <s> first, vocabulary)
    model2, tok2 = load_model_and_tokenizer(out)
    assert tok2("a", "b")["input_ids"][0] == model2.config.cls_token_id == 0

    # an existing folder is never overwritten
    assert main(argv) == 2


def test_a_pickle_that_would_run_a_command_is_refused_and_nothing_runs(tmp_path, bpe, capsys):
    from tupe.cli import main
    from tupe.modeling.fairseq import load_fairseq_checkpoint

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    args = fairseq_args()
    # torch's legacy (non-zip) format too, and the payload hidden inside the Namespace
    legacy = tmp_path / "legacy.pt"
    args_payload = fairseq_args(save_dir=Payload())
    torch.save({"args": args_payload, "model": {}}, str(legacy), _use_new_zipfile_serialization=False)
    with pytest.raises(TupeError, match=r"legacy.pt: refused to load.*(posix|os)\.system"):
        load_fairseq_checkpoint(legacy)
    bad = tmp_path / "hostile.pt"
    torch.save({"args": args, "model": {}, "extra_state": {"x": Payload()}}, str(bad))
    with pytest.raises(TupeError, match=r"hostile.pt: refused to load.*(posix|os)\.system"):
        load_fairseq_checkpoint(bad)
    codes, dict_txt, _ = bpe
    out = tmp_path / "out"
    argv = [
        "convert",
        "fairseq",
        str(bad),
        "--dict",
        str(dict_txt),
        "--bpe-codes",
        str(codes),
        "--out",
        str(out),
    ]
    assert main(argv) == 2
    assert "refused to load" in capsys.readouterr().err
    assert not marker.exists() and not out.exists()


def test_missing_and_unknown_tensors_are_refused_by_name(tmp_path, bpe):
    from tupe import TupeForMaskedLM

    args = fairseq_args()
    vocab = 7 + len(read_dict_txt(bpe[1])) + 1
    sd = random_state_dict(args, vocab)
    missing = dict(sd)
    del missing[ENC + "layers.1.fc2.bias"]
    save_checkpoint(tmp_path / "missing.pt", args, missing)
    with pytest.raises(TupeError, match=r"missing tensor decoder\.sentence_encoder\.layers\.1\.fc2\.bias"):
        TupeForMaskedLM.from_fairseq(tmp_path / "missing.pt", bpe[1])
    unknown = dict(sd)
    unknown[ENC + "segment_embeddings.weight"] = torch.zeros(2, 16)
    save_checkpoint(tmp_path / "unknown.pt", args, unknown)
    with pytest.raises(
        TupeError, match=r"unknown tensor decoder\.sentence_encoder\.segment_embeddings\.weight"
    ):
        TupeForMaskedLM.from_fairseq(tmp_path / "unknown.pt", bpe[1])


def test_what_tupe_cannot_represent_is_refused_by_name(tmp_path, bpe):
    from tupe import TupeForMaskedLM

    path, *_ = _checkpoint(tmp_path, bpe, encoder_normalize_before=True)
    with pytest.raises(TupeError, match="encoder_normalize_before=True"):
        TupeForMaskedLM.from_fairseq(path, bpe[1])
    path, *_ = _checkpoint(tmp_path, bpe, activation_fn="swish")
    with pytest.raises(TupeError, match="activation_fn='swish'"):
        TupeForMaskedLM.from_fairseq(path)
    # issue 49, item 16: a string where fairseq saves an integer read "encoder_layers=2 but the weights hold 2"
    path, args, sd, _ = _checkpoint(tmp_path, bpe)
    for name, value in (("encoder_layers", str(args.encoder_layers)), ("encoder_embed_dim", 16.0)):
        save_checkpoint(path, argparse.Namespace(**{**vars(args), name: value}), sd)
        with pytest.raises(
            TupeError, match=rf"args\.{name}={value!r} is a {type(value).__name__}, not an integer"
        ):
            TupeForMaskedLM.from_fairseq(path)
    # a dictionary of another model
    path, *_ = _checkpoint(tmp_path, bpe)
    short = tmp_path / "short.txt"
    short.write_text("the 5\n")
    with pytest.raises(TupeError, match=r"short.txt: 1 entries do not fit the checkpoint's"):
        TupeForMaskedLM.from_fairseq(path, short)


@pytest.mark.slow
def test_evaluate_analyze_and_glue_run_on_a_converted_folder(tmp_path, bpe):
    from tests.convert.bpe import TEXT
    from tupe.cli import main

    path, *_ = _checkpoint(tmp_path, bpe, max_positions=32, tokens_per_sample=32)
    codes, dict_txt, _ = bpe
    model, text = tmp_path / "model", tmp_path / "text.txt"
    text.write_text("\n".join(TEXT * 12) + "\n")
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    rows = [f"{i % 2}\t{i}\t{i + 100}\t{TEXT[i % 7]}\t{TEXT[(i + 3) % 7]}\n" for i in range(16)]
    (tmp_path / "train.tsv").write_text(header + "".join(rows))
    (tmp_path / "dev.tsv").write_text(header + "".join(rows[:6]))
    commands = [
        f"convert fairseq {path} --dict {dict_txt} --bpe-codes {codes} --out {model}",
        f"evaluate --model {model} --text {text} --max-length 16 --max-blocks 4 --pppl-tokens 8 --bootstrap 5 "
        f"--cache-dir {tmp_path / 'cache'} --no-progress",
        f"analyze --model {model} --text {text} --out {tmp_path / 'an'} --max-length 16 --num-blocks 2 --no-progress",
        f"glue --model {model} --task MRPC --train-file {tmp_path / 'train.tsv'} --dev-file {tmp_path / 'dev.tsv'} "
        f"--out {tmp_path / 'glue'} --lrs 1e-4 --seeds 1 --epochs 1 --max-seq-len 32 --no-progress",
    ]
    for command in commands:
        assert main(command.split()) == 0, command
    assert (tmp_path / "an" / "patterns.png").is_file()
    assert (tmp_path / "glue" / "results.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("rel_pos", [True, False], ids=["tupe-r", "tupe-a"])
def test_bert_base_shape_equals_the_released_forward(tmp_path, bpe, rel_pos):
    """The released BERT-Base shape (12 x 768, 12 heads, FFN 3072, 512 positions), 160 tokens with and without
    padding; prints the max abs differences reported in docs/RESULTS.md."""
    from tupe import TupeForMaskedLM

    args = fairseq_args(
        encoder_layers=12, encoder_embed_dim=768, encoder_ffn_embed_dim=3072, encoder_attention_heads=12,
        max_positions=512, tokens_per_sample=512, rel_pos=rel_pos,
    )  # fmt: skip
    vocab = 7 + len(read_dict_txt(bpe[1])) + 1
    sd = random_state_dict(args, vocab, scale=0.05)
    save_checkpoint(tmp_path / "base.pt", args, sd)
    model = TupeForMaskedLM.from_fairseq(tmp_path / "base.pt", bpe[1], dtype=torch.float64)
    ids = _tokens(vocab, [160, 97], 160)
    mask = (ids != 1).long()
    with torch.no_grad():
        want = released_forward(sd, args, ids[:1])
        full = (model(ids[:1]).logits - want).abs().max().item()
        padded = (model(ids, attention_mask=mask).logits - released_forward(sd, args, ids))[mask.bool()]
    padded = padded.abs().max().item()
    print(f"\nlogits up to {want.abs().max().item():.1f} in magnitude", end="")
    print(f"\n{model.config.position_scheme} BERT-Base shape, 160 tokens: max |logit diff| {full:.2e} unpadded, "
          f"{padded:.2e} padded")  # fmt: skip
    assert full < TOL and padded < TOL


def test_the_two_layouts_are_told_apart_and_a_mix_or_neither_is_refused(tmp_path, bpe):
    from tupe import TupeForMaskedLM
    from tupe.modeling.fairseq import positional_layout

    args = fairseq_args()
    vocab = 7 + len(read_dict_txt(bpe[1])) + 1
    released, fused = (random_state_dict(args, vocab, layout=layout) for layout in LAYOUTS)
    assert positional_layout(released) == "released" and positional_layout(fused) == "fused"
    both = {**released, ENC + "pos_proj.weight": fused[ENC + "pos_proj.weight"]}
    neither = {k: v for k, v in released.items() if ".pos_q_linear." not in k and ".pos_k_linear." not in k}
    half = {k: v for k, v in released.items() if ".pos_k_linear." not in k}
    cases = [
        (both, "holds both decoder.sentence_encoder.pos_q_linear/pos_k_linear"),
        (neither, r"missing tensor decoder\.sentence_encoder\.pos_q_linear\.weight \(the released layout"),
        (half, r"missing tensor decoder\.sentence_encoder\.pos_k_linear\.(weight|bias)"),
    ]
    for i, (sd, message) in enumerate(cases):
        save_checkpoint(tmp_path / f"{i}.pt", args, sd)
        with pytest.raises(TupeError, match=rf"^{tmp_path / f'{i}.pt'}: {message}"):
            TupeForMaskedLM.from_fairseq(tmp_path / f"{i}.pt", bpe[1])


def test_a_saved_rp_bucket_that_is_not_the_released_rule_is_refused(tmp_path, bpe):
    from tupe import TupeForMaskedLM

    args = fairseq_args()
    sd = random_state_dict(args, 7 + len(read_dict_txt(bpe[1])) + 1, layout="fused")
    sd[ENC + "rp_bucket"] = sd[ENC + "rp_bucket"].clone()
    sd[ENC + "rp_bucket"][0, :] = 32  # [CLS] -> others on row 32: not the released rule (row 16)
    save_checkpoint(tmp_path / "b.pt", args, sd)
    with pytest.raises(TupeError, match=r"b\.pt: decoder\.sentence_encoder\.rp_bucket is not T5's bucketing"):
        TupeForMaskedLM.from_fairseq(tmp_path / "b.pt", bpe[1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_finite_weights_are_named_as_such_not_as_an_untied_head(tmp_path, bpe, layout):
    from tupe import TupeForMaskedLM

    args = fairseq_args()
    sd = random_state_dict(args, 7 + len(read_dict_txt(bpe[1])) + 1, layout=layout)
    sd = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in sd.items()}
    save_checkpoint(tmp_path / "nan.pt", args, sd)
    with pytest.raises(TupeError) as err:
        TupeForMaskedLM.from_fairseq(tmp_path / "nan.pt", bpe[1])
    assert "non-finite weights" in str(err.value) and "untied" not in str(err.value)
    assert str(err.value).startswith(
        f"{tmp_path / 'nan.pt'}: tensor decoder.sentence_encoder.embed_tokens.weight"
    )
    # the LM head's copy alone: NaN != NaN must not read as "untied"
    sd = random_state_dict(args, 7 + len(read_dict_txt(bpe[1])) + 1, layout=layout)
    sd["decoder.lm_head.weight"] = torch.full_like(sd["decoder.lm_head.weight"], float("inf"))
    save_checkpoint(tmp_path / "inf.pt", args, sd)
    with pytest.raises(TupeError, match=r"tensor decoder\.lm_head\.weight holds non-finite weights"):
        TupeForMaskedLM.from_fairseq(tmp_path / "inf.pt", bpe[1])


def test_convert_errors_start_with_the_checkpoint_path(tmp_path, bpe, capsys):
    from tupe.cli import main

    codes, dict_txt, _ = bpe
    text = tmp_path / "notes.txt"
    text.write_text("hello world\nthis is a text file, not a checkpoint\n")
    missing_path, args, sd, _ = _checkpoint(tmp_path, bpe)
    del sd[ENC + "layers.0.fc1.bias"]
    save_checkpoint(missing_path, args, sd)
    folder = tmp_path / "ft"
    folder.mkdir()
    good = tmp_path / "good.pt"
    save_checkpoint(good, args, random_state_dict(args, 7 + len(read_dict_txt(dict_txt)) + 1))
    cases = [
        (text, dict_txt, f"{text}: not a torch checkpoint (a text file"),
        (missing_path, dict_txt, f"{missing_path}: missing tensor {ENC}layers.0.fc1.bias"),
        (good, folder, f"--dict {folder}: a folder, not a file"),
    ]
    for ckpt, dictionary, message in cases:
        argv = ["convert", "fairseq", str(ckpt), "--dict", str(dictionary), "--bpe-codes", str(codes)]
        assert main([*argv, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"tupe convert: error: {message}"), err
        assert not (tmp_path / "out").exists()


def test_a_failed_write_names_out_and_leaves_nothing(tmp_path, bpe, monkeypatch, capsys):
    """A read-only parent of --out (the staging folder cannot be made) and a disk that fills while writing: one
    line naming --out, not the hidden staging folder beside it; nothing left behind."""
    import errno
    import types
    from pathlib import Path

    from transformers import PreTrainedModel

    import tupe.convert
    from tupe.cli import main

    path, *_ = _checkpoint(tmp_path, bpe)
    codes, dict_txt, _ = bpe
    out = tmp_path / "parent" / "converted"
    argv = [
        "convert",
        "fairseq",
        str(path),
        "--dict",
        str(dict_txt),
        "--bpe-codes",
        str(codes),
        "--out",
        str(out),
    ]

    def read_only(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(out.parent / ".converted-x1y2"))

    def disk_full(self, folder, *a, **k):
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(folder) / "model.safetensors"))

    patches = [
        (tupe.convert, "tempfile", types.SimpleNamespace(mkdtemp=read_only), "Permission denied"),
        (PreTrainedModel, "save_pretrained", disk_full, "No space left on device"),
    ]
    for owner, name, replacement, reason in patches:
        with monkeypatch.context() as m:
            m.setattr(owner, name, replacement)
            assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(
            f"tupe convert: error: cannot write --out {out}: {reason}"
        ), err
        assert ".converted-" not in err[0]
        assert not out.exists() and [p.name for p in out.parent.iterdir()] == []
