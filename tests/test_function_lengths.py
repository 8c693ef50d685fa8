"""No function in `tupe/` is longer than 80 lines (from its `def` to its last line), except the declarative ones
named below: argument-parser definitions, which read as a table of flags.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tupe"
LIMIT = 80

# "path:qualified name" of the functions allowed to be longer, each with why
ALLOWED = {
    # declarative: argparse definitions (one `add_argument` call per flag)
    "tupe/evaluation/command.py:add_arguments",
    "tupe/comparison/study.py:parse_args",
    "tupe/bench/command.py:add_arguments",
    "tupe/bench/gpu_suite.py:_parser",
}


def function_lengths(source: str) -> dict[str, int]:
    """Qualified name (`Class.method`, `outer.inner`) -> lines from `def` to the function's last line."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def long_functions() -> dict[str, int]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name, n in function_lengths(path.read_text(encoding="utf-8")).items():
            if n > LIMIT:
                found[f"{rel}:{name}"] = n
    return found


def test_no_function_is_longer_than_80_lines_but_the_declarative_ones() -> None:
    assert {k: n for k, n in long_functions().items() if k not in ALLOWED} == {}


def test_the_allow_list_names_only_long_functions_that_exist() -> None:
    """An entry whose function got short (or was moved) leaves the list."""
    assert ALLOWED - set(long_functions()) == set()


def test_the_count_is_from_def_to_the_last_line() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    source = (
        f"class A:\n    def short(self):\n        pass\n\ndef f():\n{body}\n    def g():\n        return 1\n"
    )
    assert function_lengths(source) == {"A.short": 2, "f": LIMIT + 3, "f.g": 2}
