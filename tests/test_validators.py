"""The shared option parsers of `tupe.validators`."""

from __future__ import annotations

import pytest

from tupe import validators as V
from tupe.errors import TupeError


def test_name_list_keeps_order_and_refuses_unknown_empty_and_repeated_names() -> None:
    valid = ("bert-a", "tupe-a", "tupe-r")
    assert V.name_list(" tupe-r, bert-a ,", valid, "--schemes", "scheme") == ["tupe-r", "bert-a"]
    with pytest.raises(
        TupeError, match=r"^unknown scheme 'tupe-x' in --schemes; choose from: bert-a, tupe-a"
    ):
        V.name_list("bert-a,tupe-x", valid, "--schemes", "scheme")
    with pytest.raises(TupeError, match=r"^--backends needs at least one backend$"):
        V.name_list(" , ", valid, "--backends", "backend")
    with pytest.raises(TupeError, match=r"^--schemes lists a scheme twice: bert-a,bert-a$"):
        V.name_list("bert-a,bert-a", valid, "--schemes", "scheme")


def test_compare_demo_and_bench_read_scheme_lists_alike(capsys) -> None:  # noqa: ANN001
    from tupe.cli import main

    for argv in (
        ["compare", "--out", "unused", "--schemes", "bert-a,tupe-q"],
        ["bench", "--schemes", "tupe-q"],
    ):
        assert main(argv) == 2
        assert "unknown scheme 'tupe-q' in --schemes; choose from: bert-a, " in capsys.readouterr().err


def test_seed_lists_are_checked_while_parsing() -> None:
    """`--seeds` of `tupe glue` / `tupe finetune`: a seed numpy cannot take is an argparse error naming the
    option, before any model is loaded."""
    import argparse

    import pytest

    from tupe import validators as V

    assert V.seed_list("0, 1,4294967295") == [0, 1, 4294967295]
    for bad in ("1,4294967296", "-1", "a", ""):
        with pytest.raises(
            argparse.ArgumentTypeError, match="comma-separated seeds, each from 0 to 4294967295"
        ):
            V.seed_list(bad)
