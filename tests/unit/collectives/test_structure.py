"""The collectives package's shape: no import cycle, algorithms below the registry, a thin front.

Counts ``TYPE_CHECKING`` imports too (grimp's default): a cycle hidden behind
them is still a cycle for the reader.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import grimp

import hpcdist.collectives.engine as engine_module

PACKAGE = "hpcdist.collectives"


@functools.cache
def _graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("hpcdist")
    modules = {m for m in graph.modules if m == PACKAGE or m.startswith(PACKAGE + ".")}
    return {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among ``edges`` (a module list that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_collectives_package_has_no_import_cycle():
    edges = _graph()
    assert _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_algorithms_sit_below_the_registry_and_never_see_the_front():
    edges = _graph()
    algorithms = [m for m in edges if m.startswith(PACKAGE + ".algorithms.")]
    assert len(algorithms) >= 8
    for m in algorithms + [f"{PACKAGE}.session", f"{PACKAGE}.device_path", f"{PACKAGE}.where"]:
        assert f"{PACKAGE}.engine" not in edges[m], m
        assert f"{PACKAGE}.registry" not in edges[m], m
    # The registry imports each algorithm module plainly (no lazy import needed).
    assert set(algorithms) <= edges[f"{PACKAGE}.registry"]


def test_the_front_is_thin():
    tree = ast.parse(Path(engine_module.__file__).read_text())
    (front,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Collectives"]
    assert front.end_lineno is not None
    assert front.end_lineno - front.lineno + 1 <= 450
