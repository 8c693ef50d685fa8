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


def test_memory_limit_is_the_smallest_of_machine_cgroup_and_ulimit(monkeypatch) -> None:  # noqa: ANN001
    """Issue 38: under a memory limit, `tupe pretrain --batch-size 100000` ended in a torch allocation traceback;
    the pre-check compares with the limit the process really has."""
    import resource

    from tupe import validators as V

    machine = V.physical_memory()
    assert machine is not None and machine > 0
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 30, resource.RLIM_INFINITY))
    assert V.physical_memory() == min(machine, 1 << 30)
    with pytest.raises(
        TupeError, match=r"--batch-size 4096 needs about .* GiB of memory, more than this machine's 1.0"
    ):
        V.check_memory(
            "--batch-size 4096", V.activation_bytes(4096, 128, 256, 4, 4, 1024, 8192, training=True)
        )


def test_memory_check_leaves_room_for_what_the_process_already_holds(monkeypatch) -> None:  # noqa: ANN001
    """Issue 49, item 15: `tupe evaluate --lengths 19000` passed its check (9.45 of 9.54 GiB) and then failed to
    allocate 2.9 GB with a traceback: the process's own memory (Python, torch, the model) was not counted."""
    from tupe import validators as V

    baseline = V.resident_bytes()
    assert baseline > 50 * 2**20  # this process holds torch: far more than 50 MiB
    need = 9 * 2**30
    monkeypatch.setattr(
        V, "physical_memory", lambda: need + baseline // 2
    )  # fits alone, not beside the process
    with pytest.raises(TupeError, match=r"--lengths 19000 .* needs about 9\.0 GiB of memory, more than this "
                                        r"machine's .* GiB leaves beside this process's .* GiB"):  # fmt: skip
        V.check_memory("--lengths 19000 with --batch-size 1", need)
    monkeypatch.setattr(V, "physical_memory", lambda: need + 2 * baseline)
    V.check_memory("--lengths 19000 with --batch-size 1", need)


def test_activation_estimate_grows_with_batch_length_and_vocabulary() -> None:
    from tupe.validators import activation_bytes

    base = activation_bytes(8, 32, 32, 2, 2, 64, 300, training=True)
    assert 1.95 * base < activation_bytes(16, 32, 32, 2, 2, 64, 300, training=True) < 2 * base  # x batch
    assert activation_bytes(8, 32, 32, 2, 2, 64, 3000, training=True) > 2 * base  # logits over the vocabulary
    assert activation_bytes(8, 32, 32, 2, 2, 64, 300, training=False) < base  # inference keeps one layer
    # the case of the audit: a 2 x 32 model, blocks of 32, --batch-size 100000: about 31 GB
    assert 25e9 < activation_bytes(100_000, 32, 32, 2, 2, 64, 300, training=True) < 40e9
