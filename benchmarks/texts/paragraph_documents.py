"""The built-in corpus with every paragraph a document: the short-document arm of the packing study (issue 36).

    python benchmarks/texts/paragraph_documents.py runs/texts/paragraphs

The built-in corpus holds one paragraph per line and no blank lines, so for the packer each of its 24 books is one
document, and `--packing stream` and `--packing documents` differ on it only where a block crosses one of the 23
book ends. This writes the same books (one `.txt` per book, the same file names without `.gz`) with a blank line
after every paragraph, which makes every paragraph a document (34,083 of them; median 36 tokens under the mini
preset's BPE, 90% under 167), so that `--packing documents` puts several documents, each with its own [CLS] at
position 0, into one block, and `stream` runs them on behind one [CLS], separated by [SEP]. The text itself is
unchanged. Not shipped: made from the package's corpus (the GPU suite's `paragraphs` job makes it the same way,
with `tupe.bench.gpu_studies.paragraph_corpus`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tupe.bench.gpu_studies import paragraph_corpus
from tupe.data import DEFAULT_CORPUS_DIR
from tupe.errors import TupeError
from tupe.scripts import ScriptParser, run_script
from tupe.validators import check_out_folder


def main(argv: list[str] | None = None) -> int:
    p = ScriptParser(prog="paragraph_documents.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder to write: new, empty, or an earlier output of this script")
    args = p.parse_args(argv)
    check_out_folder("OUT", args.out)
    books = {b.name.removesuffix(".gz") for b in DEFAULT_CORPUS_DIR.glob("*.txt.gz")}
    foreign = sorted(e.name for e in args.out.iterdir() if e.name not in books) if args.out.is_dir() else []
    if foreign:
        raise TupeError(
            f"OUT {args.out} holds {foreign[0]!r}, which this script did not write; give a new folder"
        )
    paragraphs = paragraph_corpus(args.out)
    print(f"{paragraphs:,} paragraphs (documents) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, prog="paragraph_documents.py"))
