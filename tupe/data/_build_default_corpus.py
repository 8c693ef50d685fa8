"""Rebuild the built-in default corpus (and the built-in evaluation text) from Project Gutenberg plain-text books (a maintainer tool, not run by users).

    python -m tupe.data._build_default_corpus /path/to/gutenberg/books

Each book is cleaned (Project Gutenberg header, footer and licence removed, CRLF -> LF, hard-wrapped paragraphs
unwrapped to one paragraph per line, blank lines dropped) and written as one gzip file per book, so that one book is
one document for the packer (documents are separated by blank lines or file ends; see tupe.data.corpus).
"""

from __future__ import annotations

import gzip
import hashlib
import re
import sys
from pathlib import Path

# (file in the Gutenberg folder, PG ebook number, title, author). Held out from this list on purpose (tests and
# users may use them as unseen text): everything else in the source folder.
BOOKS: list[tuple[str, int, str, str]] = [
    ("11-0.txt", 11, "Alice's Adventures in Wonderland", "Lewis Carroll"),
    ("Pride_and_Prejudice_JaneAusten.txt", 1342, "Pride and Prejudice", "Jane Austen"),
    ("2701-0.txt", 2701, "Moby Dick; or The Whale", "Herman Melville"),
    ("98-0.txt", 98, "A Tale of Two Cities", "Charles Dickens"),
    ("120-0.txt", 120, "Treasure Island", "Robert Louis Stevenson"),
    ("74-0.txt", 74, "The Adventures of Tom Sawyer", "Mark Twain"),
    ("76-0.txt", 76, "Adventures of Huckleberry Finn", "Mark Twain"),
    ("pg345.txt", 345, "Dracula", "Bram Stoker"),
    ("2852-0.txt", 2852, "The Hound of the Baskervilles", "Arthur Conan Doyle"),
    ("36-0.txt", 36, "The War of the Worlds", "H. G. Wells"),
    ("35-0.txt", 35, "The Time Machine", "H. G. Wells"),
    ("43-0.txt", 43, "The Strange Case of Dr. Jekyll and Mr. Hyde", "Robert Louis Stevenson"),
    ("46-0.txt", 46, "A Christmas Carol", "Charles Dickens"),
    ("219-0.txt", 219, "Heart of Darkness", "Joseph Conrad"),
    ("pg768.txt", 768, "Wuthering Heights", "Emily Bronte"),
    ("pg174.txt", 174, "The Picture of Dorian Gray", "Oscar Wilde"),
    ("16-0.txt", 16, "Peter Pan", "J. M. Barrie"),
    ("pg55.txt", 55, "The Wonderful Wizard of Oz", "L. Frank Baum"),
    ("pg161.txt", 161, "Sense and Sensibility", "Jane Austen"),
    ("205-0.txt", 205, "Walden, and On The Duty Of Civil Disobedience", "Henry David Thoreau"),
    ("308-0.txt", 308, "Three Men in a Boat", "Jerome K. Jerome"),
    ("829-0.txt", 829, "Gulliver's Travels", "Jonathan Swift"),
    ("25344-0.txt", 25344, "The Scarlet Letter", "Nathaniel Hawthorne"),
    ("244-0.txt", 244, "A Study in Scarlet", "Arthur Conan Doyle"),
]

# The built-in out-of-domain evaluation text (`tupe demo`, `--eval-text built-in`): expository science prose, a kind
# of English the novels above do not contain, written to tupe/data/eval_text/.
EVAL_BOOKS: list[tuple[str, int, str, str]] = [
    ("pg2298.txt", 2298, "Great Astronomers", "Robert S. Ball"),
]

_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*?\*\*\*", re.M | re.I | re.S)
_END = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_END_OLD = re.compile(r"^\s*End of (the )?Project Gutenberg.*$", re.M | re.I)
_PRODUCED = re.compile(
    r"^(Produced by|This e-?text was produced|E-text prepared by|Transcribed from).*$", re.I
)


def clean_gutenberg(text: str) -> str:
    """Strip the PG header/footer/licence and unwrap paragraphs (one paragraph per line, no blank lines)."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    start = _START.search(text)
    if start:
        text = text[start.end() :]
    for pattern in (_END, _END_OLD):
        end = pattern.search(text)
        if end:
            text = text[: end.start()]
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.split("\n") if ln.strip()]
        if not lines or _PRODUCED.match(lines[0]):
            continue
        paragraphs.append(" ".join(lines))
    return "\n".join(paragraphs) + "\n"


def main(src: str) -> None:
    for books, folder in ((BOOKS, "default_corpus"), (EVAL_BOOKS, "eval_text")):
        write_books(src, books, Path(__file__).parent / folder)


def write_books(src: str, books: list[tuple[str, int, str, str]], out_dir: Path) -> None:
    rows = []
    for fname, pg, title, author in books:
        raw = (Path(src) / fname).read_bytes()
        cleaned = clean_gutenberg(raw.decode("utf-8"))
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40]
        out = out_dir / f"pg{pg:05d}-{slug}.txt.gz"
        with gzip.GzipFile(filename="", mode="wb", fileobj=out.open("wb"), mtime=0, compresslevel=9) as fh:
            fh.write(cleaned.encode("utf-8"))
        rows.append(
            f"| {out.name} | {title} | {author} | {pg} | {fname} | {hashlib.sha1(raw).hexdigest()[:12]} | "
            f"{len(raw):,} | {len(cleaned.encode()):,} |"
        )
        print(out.name, len(raw), len(cleaned))
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1])
