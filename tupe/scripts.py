"""What the scripts outside the `tupe` command share with it (`python -m tupe.bench.gpu_suite`,
`python -m tupe.comparison.study`, benchmarks/, docs/benchmarks/): a user error is one line
`PROG: error: ...` naming the flag, file or value, exit code 2, no traceback and no usage dump, raised before any
work starts; and an output folder the script did not make is never emptied (`claim_scratch_folder`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tupe.errors import TupeError, one_line


class ScriptParser(argparse.ArgumentParser):
    """argparse whose errors are a `TupeError` of one line (no usage dump), printed by `run_script`."""

    def error(self, message: str) -> NoReturn:
        raise TupeError(f"{message} (see `{self.prog} --help`)")


def run_script(
    main: Callable[[Sequence[str] | None], Any], argv: Sequence[str] | None = None, prog: str | None = None
) -> int:
    """`main(argv)`, with a `TupeError` printed as `PROG: error: MESSAGE` (PROG: `prog`, else the script's file
    name) and exit code 2. A main that returns something other than an int (a result dict) counts as success."""
    prog = prog or Path(sys.argv[0]).name
    try:
        result = main(argv)
    except TupeError as err:
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


def parse_or_exit(parser: ScriptParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args(argv)` for a script whose work runs at module level: a bad argument is the one line
    `PROG: error: ...` and exit code 2, before any work."""
    try:
        return parser.parse_args(argv)
    except TupeError as err:
        print(f"{parser.prog}: error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None


def claim_output_file(flag: str, path: str | Path, script: str) -> Path:
    """An output file named by the user (`--json OUT.json`): a file that can be written (not a folder, `/proc` or a
    device), not one the script did not write (`tupe.io.outputs.claim_file`: recorded in its folder's
    `tupe_files.json` before it is written, so a rerun may write it again)."""
    from tupe.io.outputs import claim_file
    from tupe.validators import check_out_file

    return claim_file(check_out_file(flag, path), script, flag)


def check_positive(flag: str, value: int | float | None) -> None:
    """A count flag (`--rounds`, `--steps`, `--batch-size`) must be at least 1."""
    if value is not None and value < 1:
        raise TupeError(f"{flag} must be at least 1, got {value}")


def check_device(flag: str, text: str) -> None:
    """`--device`: cpu, or cuda where CUDA is available (one line instead of torch's traceback later)."""
    from tupe.validators import parse_device

    try:
        parse_device(text)
    except TupeError as err:
        raise TupeError(str(err).replace("--device", flag, 1)) from None


def claim_scratch_folder(flag: str, path: str | Path, marker: str) -> Path:
    """`path` as a scratch folder the script may empty: refused (one line) when it exists, is not empty and does not
    hold `marker` (the file the script writes into every folder it makes), so a folder of the user's is never
    deleted. Returns the path; `reset_scratch_folder` empties and marks it."""
    from tupe.validators import check_out_folder

    p = check_out_folder(flag, path)
    if p.is_dir() and not (p / marker).is_file():
        entries = sorted(e.name for e in p.iterdir())
        if entries:
            raise TupeError(
                f"{flag} {p} is not empty and was not made by this script (it holds {entries[0]!r}); the script "
                "empties its scratch folder, so give a new or empty folder"
            )
    return p


def reset_scratch_folder(path: Path, marker: str) -> None:
    """Empty a folder `claim_scratch_folder` accepted (it holds `marker` or nothing), then mark it as the
    script's."""
    import shutil

    if path.is_dir() and (path / marker).is_file():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / marker).write_text("made by tupe: emptied by the next run that is given this folder\n")
