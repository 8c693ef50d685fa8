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
