"""Imports only go down: the layers of `tupe/`, bottom up, and a test over every import statement in the package
(module-level and function-level alike; `if TYPE_CHECKING:` blocks excepted, they never run).

A module may import from its own package and from packages in lower layers. Packages in the same layer are
siblings and import neither each other nor anything above. No two modules import each other, directly or
through others. docs/architecture.md draws the same table (checked below). A new package or top-level module
joins a layer here and a row there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tupe"

# Bottom up. Each entry: the packages or top-level modules of one layer. The layer order is written here once.
LAYERS: list[tuple[str, ...]] = [
    ("tupe.errors", "tupe.runtime"),
    ("tupe.validators",),
    ("tupe.modeling",),
    ("tupe.io",),
    ("tupe.data", "tupe.scripts"),
    ("tupe.training",),
    ("tupe.evaluation", "tupe.analysis", "tupe.bench", "tupe.convert"),
    ("tupe.finetuning.pipeline",),
    ("tupe.finetuning.glue",),
    ("tupe.finetuning",),
    ("tupe.pipelines", "tupe.comparison", "tupe.diagnostics"),
    ("tupe.cli",),
    ("tupe.__main__", "tupe"),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST):  # noqa: ANN202
    """Every node except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """module -> the tupe modules (or packages) it imports, resolved to the most specific module that exists."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == "tupe")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.split(".")[0] != "tupe":
                    continue
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.add(sub if sub in files else module)
        graph[name] = targets - {name}
    return graph


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the package or module of LAYERS that holds `module`), by the longest matching prefix."""
    best: tuple[int, str] | None = None
    for i, members in enumerate(LAYERS):
        for member in members:
            inside = module == member or (member != "tupe" and module.startswith(member + "."))
            if inside and (best is None or len(member) > len(best[1])):
                best = (i, member)
    assert best is not None, f"{module} is in no layer: add its package to LAYERS in {__file__} and docs"
    return best


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in sorted(graph.items()):
        s_layer, s_unit = layer_of(source)
        for target in sorted(targets):
            t_layer, t_unit = layer_of(target)
            if s_unit == t_unit:
                continue
            if t_layer >= s_layer:
                bad.append(
                    f"{source} imports {target} ({s_unit}: layer {s_layer}, {t_unit}: layer {t_layer})"
                )
    return bad


def test_every_module_is_in_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_imports_only_go_down() -> None:
    assert upward_imports(import_graph()) == []


def test_no_import_cycles() -> None:
    assert _cycles(import_graph()) == []


def test_the_checks_catch_what_they_are_for() -> None:
    """The same checks on a made-up graph with two upward imports (one between the layers of one package), one
    sibling import and one cycle."""
    graph = {
        "tupe.training.pretrain": {"tupe.comparison.compare"},
        "tupe.evaluation.evaluate": {"tupe.bench.flops"},
        "tupe.finetuning.pipeline.run": {"tupe.finetuning.glue.tasks"},
        "tupe.comparison.compare": {"tupe.comparison.demo", "tupe.analysis.curves"},
        "tupe.comparison.demo": {"tupe.comparison.compare"},
    }
    assert upward_imports(graph) == [
        "tupe.evaluation.evaluate imports tupe.bench.flops (tupe.evaluation: layer 6, tupe.bench: layer 6)",
        "tupe.finetuning.pipeline.run imports tupe.finetuning.glue.tasks (tupe.finetuning.pipeline: layer 7, "
        "tupe.finetuning.glue: layer 8)",
        "tupe.training.pretrain imports tupe.comparison.compare (tupe.training: layer 5, tupe.comparison: layer 10)",
    ]
    assert _cycles(graph) == [["tupe.comparison.compare", "tupe.comparison.demo"]]
    # function-level imports count; TYPE_CHECKING ones do not
    tree = ast.parse("if TYPE_CHECKING:\n    import tupe.cli\ndef f():\n    from tupe import errors\n")
    names = [n.names[0].name for n in _runtime_nodes(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert names == ["errors"]


def test_architecture_doc_lists_the_layers_in_this_order() -> None:
    """docs/architecture.md's layer table names the same packages, in the same order, bottom up."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if re.match(r"\| *\d+ *\|", line)]
    documented = [
        tuple(
            m.replace("/", ".").removesuffix(".").removesuffix(".py").removesuffix(".__init__")
            for m in re.findall(r"`(tupe/[\w/.]*)`", row.split("|")[3])
        )
        for row in rows
    ]
    assert documented == LAYERS


def test_no_module_imports_another_modules_private_names() -> None:
    """A `_name` is its module's own business: another module that needs it gets a public name."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tupe")):
                found |= {(module, a.name) for a in node.names if a.name.startswith("_") and a.name[1] != "_"}
    assert found == set()


# ---- inside the model package ----------------------------------------------------------------------------------

# The model core's modules, bottom up (docs/architecture.md, the model row): a module imports only modules of lower
# rows of this table (and modules outside it); modules of one row are siblings.
MODEL_MODULES: list[tuple[str, ...]] = [
    ("documents", "ops"),  # positions and documents; dropout and the masked-LM loss
    ("context",),  # the positional context a scheme hands the kernels
    ("kernels",),  # the attention kernels
    ("kernel_registry",),  # the registry and its built-in entries
    ("positional",),  # the schemes
    ("configuration_tupe",),
    ("modeling_tupe",),
]


def model_module_upward_imports(graph: dict[str, set[str]]) -> list[str]:
    row = {f"tupe.modeling.{m}": i for i, members in enumerate(MODEL_MODULES) for m in members}
    return [
        f"{source} imports {target}"
        for source in sorted(row)
        for target in sorted(graph.get(source, ()))
        if target in row and row[target] >= row[source]
    ]


def test_the_model_core_modules_import_only_down() -> None:
    graph = import_graph()
    assert {f"tupe.modeling.{m}" for members in MODEL_MODULES for m in members} <= set(graph)
    assert model_module_upward_imports(graph) == []
    made_up = {"tupe.modeling.kernels": {"tupe.modeling.kernel_registry", "tupe.modeling.ops"}}
    assert model_module_upward_imports(made_up) == [
        "tupe.modeling.kernels imports tupe.modeling.kernel_registry"
    ]


# ---- a positional scheme is one class -----------------------------------------------------------------------------

POSITIONAL = PACKAGE / "modeling" / "positional.py"
# what positional.py offers the rest of the package about schemes: the interface, not the schemes' own classes
_SCHEME_INTERFACE = {
    "PositionalScheme",
    "PositionalModule",
    "SchemeField",
    "SchemeReport",
    "PositionalContext",
}


def _scheme_classes() -> set[str]:
    """The classes positional.py defines for particular schemes (the schemes and the modules they are built of)."""
    tree = ast.parse(POSITIONAL.read_text(encoding="utf-8"))
    names = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    return {n for n in names if not n.startswith("_")} - _SCHEME_INTERFACE


def scheme_knowledge(source: str, scheme_names: set[str], classes: set[str]) -> list[str]:
    """Where `source` compares a value with a scheme's name (`==`, `!=`, `in`, also against a literal tuple, list
    or set) or names one of a scheme's classes; one `line: code` per place."""
    found = []
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                items = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
                if any(isinstance(i, ast.Constant) and i.value in scheme_names for i in items):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
                    break
        named = (
            node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        )
        if named in classes:
            found.append(f"{node.lineno}: {named}")
        if isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name in classes]
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_no_module_but_positional_compares_scheme_names_or_knows_their_classes() -> None:
    """Everything about a scheme is asked of its class (`PositionalScheme`'s attributes): adding a scheme touches
    positional.py, its test and its docs row, so no other module may branch on a scheme's name or class."""
    from tupe.modeling import POSITION_SCHEMES

    names, classes = set(POSITION_SCHEMES), _scheme_classes()
    assert {"TupeA", "UntiedPositions", "RelativeBias"} <= classes
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != POSITIONAL
        and (found := scheme_knowledge(path.read_text(encoding="utf-8"), names, classes))
    }
    assert offenders == {}


def test_the_scheme_check_catches_what_it_is_for() -> None:
    code = (
        "if config.position_scheme == 'tupe-r': pass\n"
        "ok = scheme in ('rope', 'x')\n"
        "from tupe.modeling.positional import UntiedPositions\n"
        "isinstance(m, positional.RelativeBias)\n"
        "fine = scheme_class(scheme).report.relative_bias and scheme == other\n"
    )
    found = scheme_knowledge(code, {"tupe-r", "rope"}, {"UntiedPositions", "RelativeBias"})
    assert [f.split(":")[0] for f in found] == ["1", "2", "3", "4"]
