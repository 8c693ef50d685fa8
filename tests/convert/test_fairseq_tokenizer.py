"""The released pipeline's tokenizer against sacremoses + fastBPE (written in tests/convert/bpe.py) + dict.txt."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.convert.bpe import TEXT, released_pieces, write_codes_and_dict
from tupe.errors import TupeError
from tupe.modeling.fairseq import build_dictionary, build_tokenizer, read_bpe_codes, read_dict_txt

SENTENCES = [
    # Moses keeps these periods attached: a non-breaking prefix ("Mr."), an abbreviation with inner periods
    # ("e.g."), and a word followed by a lower-case word ("left." in "left. she")
    "Mr. Smith went to Washington.",
    "He left. she came back, e.g. at noon.",
    "Dr. Jones' foxes don't jump -- they walk (quickly)!",
    'A zebra? "Quixotic" words: 3.5 kg, $12 & 50%.',
    "the lazy dog",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_codes_and_dict(tmp_path_factory.mktemp("bpe"))


def _tokenizer(files, lowercase=False):
    codes, dict_txt, _ = files
    entries = read_dict_txt(dict_txt)
    dictionary = build_dictionary(dict_txt, 7 + len(entries) + 1)
    return build_tokenizer(dictionary, codes, lowercase=lowercase), dictionary


@pytest.mark.parametrize("sentence", SENTENCES + TEXT)
def test_pieces_and_ids_are_the_released_pipelines(files, sentence):
    tok, dictionary = _tokenizer(files)
    _, _, ranks = files
    expected = released_pieces(sentence, ranks)
    assert tok.fairseq_pieces(sentence) == expected
    ids = [dictionary.symbols.index(p) if p in dictionary.symbols else 3 for p in expected]  # <unk> is 3
    assert tok(sentence)["input_ids"] == [0, *ids, 2]  # <s> ... </s>


def test_moses_keeps_the_period_attached(files):
    tok, _ = _tokenizer(files)
    pieces = tok.fairseq_pieces("Mr. Smith left. she came.")
    assert "Mr." in "".join(p.replace("@@", "") + ("" if p.endswith("@@") else " ") for p in pieces).split()
    assert pieces[-1] == "."  # the sentence-final period is split off


def test_lowercase_option_lowercases_before_moses(files):
    tok, _ = _tokenizer(files, lowercase=True)
    _, _, ranks = files
    sentence = "Mr. Smith LEFT. She came."
    assert tok.fairseq_pieces(sentence) == released_pieces(sentence, ranks, lowercase=True)


def test_pairs_and_special_ids(files):
    tok, dictionary = _tokenizer(files)
    assert (tok.cls_token_id, tok.pad_token_id, tok.sep_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.mask_token_id == len(dictionary.symbols) - 1
    assert tok.convert_tokens_to_ids(["<file>", "<email>", "<url>"]) == [4, 5, 6]
    a, b = tok("the dog")["input_ids"], tok("the fox")["input_ids"]
    assert tok("the dog", "the fox")["input_ids"] == a + [2] + b[1:]  # <s> A </s> </s> B </s>
    assert "token_type_ids" not in tok("the dog")


def test_saved_tokenizer_reloads_with_autotokenizer(files, tmp_path):
    from transformers import AutoTokenizer

    import tupe  # noqa: F401 - registers the class

    tok, _ = _tokenizer(files, lowercase=True)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert type(again).__name__ == "FairseqMosesBPETokenizer" and again.do_lower_case
    for s in SENTENCES:
        assert again(s)["input_ids"] == tok(s)["input_ids"]
    # without tupe imported: the code file saved in the folder (`auto_map`, trust_remote_code)
    code = (
        "import sys\nfrom transformers import AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)\n"
        f"print('tupe' in sys.modules, type(t).__module__, t({SENTENCES[0]!r})['input_ids'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    imported_tupe, module, ids = out.stdout.strip().split(" ", 2)
    assert (
        imported_tupe == "False"
        and module.startswith("transformers_modules.")
        and "tokenization_fairseq" in module
    )
    assert ids == str(tok(SENTENCES[0])["input_ids"])


def test_bad_codes_and_dict_lines_are_named(tmp_path):
    bad = tmp_path / "dict.txt"
    bad.write_text("the 10\nno-count-here\n")
    with pytest.raises(TupeError, match=r"dict.txt: line 2"):
        read_dict_txt(bad)
    good = tmp_path / "d.txt"
    good.write_text("the 10\n")
    codes = tmp_path / "codes"
    codes.write_text("t h 5\nth e</w> 4 extra\n")
    with pytest.raises(TupeError, match=r"codes: line 2"):
        build_tokenizer(build_dictionary(good, 4 + 1 + 1), codes)


@pytest.mark.parametrize(
    ("reader", "text", "message"),
    [
        ("dict", "a 5\nb\n", "line 2: expected '<symbol> <count>', got 'b'"),
        ("dict", "a 5\n\na 3\n", "line 3: symbol 'a' repeats line 1"),
        ("dict", "\n\n", "no entries"),
        ("bpe", "t h 9\nx\n", "line 2: expected fastBPE's 'first second count', got 'x'"),
        ("bpe", "t h 9\nt h 4\n", "line 2: merge 't h' repeats line 1"),
        ("bpe", "", "no BPE codes"),
    ],
)
def test_dict_and_bpe_codes_errors_name_the_line(tmp_path, reader, text, message):
    path = tmp_path / "file.txt"
    path.write_text(text, encoding="utf-8")
    read = read_dict_txt if reader == "dict" else read_bpe_codes
    with pytest.raises(TupeError, match=re.escape(f"{path}: {message}")):
        read(path)
    option = "--dict" if reader == "dict" else "--bpe-codes"
    with pytest.raises(TupeError, match=f"^{option} .* does not exist$"):
        read(tmp_path / "missing.txt")


def test_dict_and_bpe_codes_read_in_order(tmp_path):
    (tmp_path / "dict.txt").write_text("the 9\r\n, 7\n\nof -1\n", encoding="utf-8")
    (tmp_path / "codes").write_text("t h 9\nth e\n", encoding="utf-8")
    assert read_dict_txt(tmp_path / "dict.txt") == ["the", ",", "of"]
    assert read_bpe_codes(tmp_path / "codes") == [("t", "h"), ("th", "e")]
