"""The import graph of hpcdist: no cycles, function-level imports only where marked, light start-up.

The graph is read from the source with :mod:`ast` (no import runs): an edge
``a -> b`` for every ``import``/``from ... import`` at module level in ``a``
(inside ``try``/``if``/``with``/class bodies too, but not under
``if TYPE_CHECKING:``, which never runs) that names a module ``b`` of hpcdist.
Importing ``p.q.r`` runs ``p/__init__`` and ``p/q/__init__`` first, so an edge
goes to each package on the way that is not already an ancestor of ``a``.

Imports inside a function body are allowed only where an optional dependency
or start-up cost requires them, and then carry a ``# lazy: <which>`` comment on
the import line or the line just above (see docs/architecture.md).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hpcdist"
LAZY = "# lazy:"
HEAVY = ("torch", "jax", "tensorflow", "cupy", "matplotlib")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The hpcdist modules an import statement in ``module`` names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    found = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES:
            found.append(name)
    return found


def _module_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported."""
    found: list[ast.Import | ast.ImportFrom] = []
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            found.append(statement)
        elif isinstance(statement, ast.If):
            if not _is_type_checking(statement.test):
                found += _module_level_imports(statement.body + statement.orelse)
        elif isinstance(statement, ast.Try):
            blocks = statement.body + statement.orelse + statement.finalbody
            for handler in statement.handlers:
                blocks += handler.body
            found += _module_level_imports(blocks)
        elif isinstance(statement, (ast.With, ast.ClassDef)):
            found += _module_level_imports(statement.body)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = graph.setdefault(module, set())
        for statement in _module_level_imports(tree.body):
            for target in _targets(module, path.name == "__init__.py", statement):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    step = ".".join(parts[:i])
                    if step != module and not module.startswith(step + "."):
                        edges.add(step)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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


def test_the_graph_sees_the_package() -> None:
    graph = _graph()
    assert len(graph) > 100
    assert "hpcdist.distribute.values" in graph["hpcdist.distribute.strategy"]
    # an import of a submodule runs its package's __init__ first
    assert "hpcdist.collectives" in graph["hpcdist.distribute.strategy"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_among_module_level_imports() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    detail = [
        " ; ".join(f"{a} -> {b}" for a in cycle for b in sorted(graph[a]) if b in cycle)
        for cycle in cycles
    ]
    assert not cycles, "import cycles (move the shared piece down, pass it in, or register):\n" + (
        "\n".join(detail)
    )


def _unmarked_function_imports(path: Path, name: str) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                first, last = inner.lineno, inner.end_lineno or inner.lineno
                window = lines[max(first - 2, 0) : last]
                if not any(LAZY in line for line in window):
                    found.append(f"{name}:{first}: {lines[first - 1].strip()}")
    return sorted(set(found))


@pytest.mark.parametrize(
    "path", sorted(MODULES.values()), ids=lambda p: str(p.relative_to(PACKAGE.parent))
)
def test_function_level_imports_say_why(path: Path) -> None:
    unmarked = _unmarked_function_imports(path, str(path.relative_to(PACKAGE.parent)))
    assert not unmarked, (
        "imports inside functions without a '# lazy: <which>' comment (move them to module "
        "level, or say which optional dependency or start-up cost keeps them there):\n"
        + "\n".join(unmarked)
    )


def test_lazy_rule_finds_unmarked_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    import json\n"
        "def g():\n    # lazy: optional GPU dependency\n    import cupy\n"
        "def h():\n    from os import (  # lazy: start-up cost\n        path,\n    )\n"
    )
    assert _unmarked_function_imports(probe, "probe.py") == ["probe.py:2: import json"]


def test_import_hpcdist_imports_no_optional_framework() -> None:
    code = (
        "import sys, hpcdist\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print('mpi4py.MPI' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out[0] == "", (
        f"import hpcdist imported {out[0]}; import them inside the function (# lazy:)"
    )
    assert out[1] == "False", "import hpcdist started MPI; the runtime starts it on first use"
