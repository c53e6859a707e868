"""What one package uses of another is public: no private name crosses a package boundary.

import-linter sees imports between layers, not which names cross them; this test
reads the source with :mod:`ast` (nothing is imported) and checks the names.
A *package* is a subpackage of hpcdist (``hpcdist.distribute``, ``hpcdist.nn``,
...) or a top-level module (``hpcdist.arrays``); each script in ``benchmarks/``
and ``examples/`` is a package of its own. A private name starts with one
underscore (dunders are not private).

1. **Imports**: no ``from hpcdist.x.y import _name`` in another module, and a
   private module (``hpcdist.kernels._llvm``) is imported inside its own package
   only. A name another module needs is public, except a private exception class
   imported inside its own package (control flow that never reaches users: the
   errors policy, ``tests/unit/test_errors.py``, keeps those private).
2. **Attributes**: ``obj._name`` (``obj`` not ``self``/``cls``) in package P,
   where hpcdist defines ``_name`` (a ``def``/``class``, an assignment, a
   ``setattr``) in other packages only. A name that P defines too cannot be told
   apart by name alone, so
3. **The extended API**: ``extended._name`` (a name or attribute ``extended``/``ext``/
   ``_extended``) outside ``hpcdist.distribute``: what other layers use of
   ``StrategyExtended`` is its public names.

``test_checker_catches_planted_violations`` runs the same checker on a small
tree with one violation of each kind.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTENDED_NAMES = {"extended", "ext", "_extended"}
EXTENDED_HOME = "hpcdist.distribute"

# Private names still used across packages, each to be made public; empty now, and
# every entry must still be used (the list can only shrink).
PENDING: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Tree:
    """The modules under ``root``: hpcdist's, and the scripts in ``benchmarks``/``examples``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, Path] = {}
        for path in sorted((root / "hpcdist").rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            self.modules[".".join(parts)] = path
        self.scripts = {
            f"{d}.{p.stem}": p
            for d in ("benchmarks", "examples")
            for p in sorted((root / d).rglob("*.py"))
        }
        self.trees = {
            m: ast.parse(p.read_text(), str(p)) for m, p in {**self.modules, **self.scripts}.items()
        }

    @staticmethod
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "hpcdist" and len(parts) > 1 else module

    def private_exceptions(self, module: str) -> set[str]:
        """The private exception classes of ``module`` (a base named ``*Error``/``*Exception``)."""
        found = set()
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.ClassDef) and _private(node.name):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    found.add(node.name)
        return found

    def is_package_init(self, module: str) -> bool:
        return module in self.modules and self.modules[module].name == "__init__.py"

    def definitions(self) -> dict[str, set[str]]:
        """Every private name hpcdist defines, and the packages that define it."""
        found: dict[str, set[str]] = defaultdict(set)
        for module in self.modules:
            package = self.package(module)
            for node in ast.walk(self.trees[module]):
                names: list[str] = []
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names = [node.name]
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names = [node.attr]
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names = [node.id]
                elif isinstance(node, ast.Call) and _setattr_name(node):
                    names = [_setattr_name(node) or ""]
                for name in names:
                    if _private(name):
                        found[name].add(package)
        return found

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if self.is_package_init(module) else module.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        return base


def _setattr_name(node: ast.Call) -> str | None:
    """``"_x"`` of ``setattr(obj, "_x", v)`` / ``object.__setattr__(obj, "_x", v)``."""
    func = node.func
    named = (isinstance(func, ast.Name) and func.id == "setattr") or (
        isinstance(func, ast.Attribute) and func.attr == "__setattr__"
    )
    if named and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
        value = node.args[1].value
        return value if isinstance(value, str) else None
    return None


def _is_extended(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in EXTENDED_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in EXTENDED_NAMES
    )


def violations(root: Path) -> Iterator[tuple[str, str, str, str]]:
    """``(where, package, name, what)`` for every private name that crosses a package boundary."""
    tree = Tree(root)
    defined = tree.definitions()
    for module, syntax in tree.trees.items():
        package = tree.package(module)
        where_of = tree.modules.get(module) or tree.scripts[module]
        for node in ast.walk(syntax):
            where = f"{where_of.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom):
                source = tree.absolute(module, node)
                if source.split(".")[0] != "hpcdist":
                    continue
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    imported = target if target in tree.modules else source
                    private_module = any(_private(p) for p in imported.split("."))
                    if private_module and tree.package(imported) != package:
                        yield where, package, imported, f"imports the private module {imported}"
                    elif _private(alias.name) and imported != module:
                        if tree.package(imported) == package and imported in tree.modules:
                            if alias.name in tree.private_exceptions(imported):
                                continue
                        what = f"imports the private name {alias.name} from {source}"
                        yield where, package, alias.name, what
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "hpcdist" and any(_private(p) for p in parts):
                        if tree.package(alias.name) != package:
                            what = f"imports the private module {alias.name}"
                            yield where, package, alias.name, what
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                receiver = node.value
                if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                    continue
                if _is_extended(receiver) and package != EXTENDED_HOME:
                    what = f"uses {ast.unparse(node)} of the extended API"
                    yield where, package, node.attr, what
                    continue
                owners = defined.get(node.attr, set())
                if owners and package not in owners:
                    what = f"uses {ast.unparse(node)}, private to {', '.join(sorted(owners))}"
                    yield where, package, node.attr, what


@functools.cache
def _here() -> list[tuple[str, str, str, str]]:
    return list(violations(ROOT))


def test_no_private_name_crosses_a_package() -> None:
    found = [v for v in _here() if (v[1], v[2]) not in PENDING]
    assert not found, "private names used across packages (make them public):\n" + "\n".join(
        f"{where}: {what}" for where, _, _, what in found
    )


def test_pending_entries_are_still_used() -> None:
    used = {(package, name) for _, package, name, _ in _here()}
    assert PENDING <= used, f"no longer used, remove from PENDING: {sorted(PENDING - used)}"


def test_checker_catches_planted_violations(tmp_path: Path) -> None:
    files = {
        "hpcdist/__init__.py": "",
        "hpcdist/low/__init__.py": "",
        "hpcdist/low/_impl.py": "def helper():\n    return 1\n",
        "hpcdist/low/core.py": (
            "class Engine:\n"
            "    def __init__(self):\n"
            "        self._state = 0\n"
            "        object.__setattr__(self, '_board', {})\n"
            "    def _run(self):\n"
            "        return self._state\n"
            "def _helper():\n"
            "    return 2\n"
            "class _Retry(Exception):\n"
            "    pass\n"
        ),
        "hpcdist/low/ok.py": (
            "from hpcdist.low._impl import helper\n"
            "from hpcdist.low.core import Engine, _Retry\n"
        ),
        "hpcdist/high/__init__.py": "",
        "hpcdist/high/user.py": (
            "from hpcdist.low.core import Engine, _helper, _Retry\n"
            "from hpcdist.low._impl import helper\n"
            "def go(engine, strategy, mine):\n"
            "    engine._run()\n"
            "    engine._board.clear()\n"
            "    mine._local = 1\n"
            "    mine._local\n"
            "    return strategy.extended._worker_index\n"
        ),
        "benchmarks/bench.py": "def f(e):\n    return e._state\n",
        "examples/.keep": "",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = sorted((where, what) for where, _, _, what in violations(tmp_path))
    assert found == [
        ("benchmarks/bench.py:2", "uses e._state, private to hpcdist.low"),
        ("hpcdist/high/user.py:1", "imports the private name _Retry from hpcdist.low.core"),
        ("hpcdist/high/user.py:1", "imports the private name _helper from hpcdist.low.core"),
        ("hpcdist/high/user.py:2", "imports the private module hpcdist.low._impl"),
        ("hpcdist/high/user.py:4", "uses engine._run, private to hpcdist.low"),
        ("hpcdist/high/user.py:5", "uses engine._board, private to hpcdist.low"),
        ("hpcdist/high/user.py:8", "uses strategy.extended._worker_index of the extended API"),
    ]
