"""benchmarks/texts/conll_news.py: CoNLL-2003 -> the study's news text (issue 37, item 5)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "texts" / "conll_news.py"

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O

-DOCSTART- -X- -X- O

" " O O
We PRP B-NP O
do VBP B-VP O
n't RB I-VP O
agree VB I-VP O
, , O O
" " O O
Germany NNP B-NP B-LOC
's POS B-NP O
minister NN I-NP O
said VBD B-VP O
( ( O O
Bonn NNP B-NP B-LOC
) ) O O
. . O O
"""


def run(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    src = tmp_path / "train.txt"
    src.write_text(text, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(src), str(tmp_path / "news.txt")], capture_output=True, text=True
    )


def test_articles_become_paragraphs_of_detokenized_sentences(tmp_path):
    done = run(tmp_path, CONLL)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "news.txt").read_text(encoding="utf-8") == (
        "EU rejects German call.\nBRUSSELS 1996-08-22\n\n"
        "\"We don't agree,\" Germany's minister said (Bonn).\n"
    )
    assert "2 articles" in done.stderr


def test_a_line_that_is_not_conll_is_named(tmp_path):
    done = run(tmp_path, "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nbroken\n")
    assert done.returncode != 0
    assert "train.txt:4" in done.stderr and "'broken'" in done.stderr


def script(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def assert_one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    err = done.stderr.strip()
    assert done.returncode == 2 and err.startswith("conll_news.py: error:") and "\n" not in err, done.stderr
    assert all(n in err for n in needles), err


def test_the_input_and_an_existing_output_are_never_written_over(tmp_path):
    """Issue 49, item 12: `conll_news.py IN IN` used to replace the CoNLL file with its text, silently."""
    src = tmp_path / "train.txt"
    src.write_text(CONLL, encoding="utf-8")
    assert_one_line_error(script(src, src), "is the input file")
    assert_one_line_error(script(src, src, "--overwrite"), "is the input file")
    assert src.read_text(encoding="utf-8") == CONLL
    mine = tmp_path / "news.txt"
    mine.write_text("my own text\n")
    assert_one_line_error(script(src, mine), "news.txt exists; pass --overwrite")
    assert mine.read_text() == "my own text\n"
    done = script(src, mine, "--overwrite")
    assert done.returncode == 0 and mine.read_text(encoding="utf-8").startswith("EU rejects"), done.stderr


def test_latin1_empty_and_folder_inputs_are_one_line(tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes("-DOCSTART- -X- -X- O\n\nM\xfcnchen NNP B-NP B-LOC\n".encode("latin-1"))
    assert_one_line_error(script(latin, tmp_path / "a.txt"), "latin.txt: not UTF-8 text", "byte offset 23")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_one_line_error(script(empty, tmp_path / "b.txt"), "empty.txt: no token lines")  # was "1 articles"
    assert_one_line_error(script(tmp_path, tmp_path / "c.txt"), "is a folder, expected a file")
    assert_one_line_error(script(latin, tmp_path), "is a folder, expected a file")
    assert not list(tmp_path.glob("[abc].txt"))
