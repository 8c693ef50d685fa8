"""CoNLL-2003 (Reuters 1996 news) as plain text: the news text of the length/seed study (issue 37, item 5).

    python benchmarks/texts/conll_news.py /path/to/conll2003/train.txt runs/texts/conll-news.txt

The file is not shipped (Reuters' licence); this script is how the study makes it. How:
- a CoNLL-2003 file holds one token per line (`token POS chunk NER`), sentences separated by blank lines and
  articles introduced by a `-DOCSTART-` line;
- each sentence's tokens are joined by sacremoses' Moses detokenizer (`MosesDetokenizer(lang="en")`: no space
  before `.`, `,`, `'s`, closing brackets and quotes, none after opening ones), one sentence per line; the
  Penn Treebank split of negations (`do n't`), which Moses leaves apart, is joined first (`don't`);
- articles are separated by a blank line (one document per article, as tupe's text files read paragraphs).
Nothing else changes: casing, the all-capitals headlines and datelines ("BRUSSELS 1996-08-22") stay as written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sacremoses import MosesDetokenizer

from tupe.errors import TupeError
from tupe.io.files import atomic_write_text
from tupe.scripts import ScriptParser, run_script
from tupe.validators import check_out_file, check_path_kind


def read_articles(path: Path) -> list[list[list[str]]]:
    """Articles -> sentences -> tokens of a CoNLL-2003 file."""
    articles: list[list[list[str]]] = []
    sentence: list[str] = []

    def end_sentence() -> None:
        if sentence:
            if not articles:
                articles.append([])
            articles[-1].append(list(sentence))
            sentence.clear()

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TupeError(
            f"{path}: not UTF-8 text (invalid byte 0x{err.object[err.start]:02x} at byte offset {err.start}); "
            "CoNLL-2003 is distributed as UTF-8 (convert it with iconv)"
        ) from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            end_sentence()
        elif line.startswith("-DOCSTART-"):
            end_sentence()
            articles.append([])
        else:
            fields = line.split(" ")
            if len(fields) < 2:
                raise TupeError(f"{path}:{number}: not a CoNLL token line (token and tags): {line!r}")
            sentence.append(fields[0])
    end_sentence()
    articles = [a for a in articles if a]
    if not articles:
        raise TupeError(f"{path}: no token lines (an empty file, or only -DOCSTART- and blank lines)")
    return articles


def join_negations(tokens: list[str]) -> list[str]:
    """`["do", "n't"]` -> `["don't"]` (the Penn Treebank split Moses does not undo)."""
    out: list[str] = []
    for token in tokens:
        if token.lower() == "n't" and out:
            out[-1] += token
        else:
            out.append(token)
    return out


def news_text(path: Path) -> str:
    detok = MosesDetokenizer(lang="en")
    articles = read_articles(path)
    return "\n\n".join("\n".join(detok.detokenize(join_negations(s)) for s in a) for a in articles) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = ScriptParser(prog="conll_news.py", description=__doc__.split("\n\n")[0])
    p.add_argument("conll", type=Path, help="a CoNLL-2003 file (train.txt)")
    p.add_argument("out", type=Path, help="the text file to write (new, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = p.parse_args(argv)
    check_path_kind("CONLL", args.conll, "file")
    check_out_file("OUT", args.out)
    if args.out.exists() and args.out.samefile(args.conll):
        raise TupeError(f"OUT {args.out} is the input file CONLL; give another file to write")
    if args.out.exists() and not args.overwrite:
        raise TupeError(f"OUT {args.out} exists; pass --overwrite to replace it, or give a new file")
    text = news_text(args.conll)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    articles = text.count("\n\n") + 1
    print(f"{args.out}: {articles} articles, {len(text.split())} words", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, prog="conll_news.py"))
