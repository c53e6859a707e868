"""Every public name of hpcdist has a docstring and appears in the generated API reference.

The public names are ``hpcdist.__all__`` and, recursively, the public names of
every module in it: a module's ``__all__`` when it has one, else the names it
defines that do not start with ``_`` (what mkdocstrings shows). The reference is
the inventory (``objects.inv``) of a ``mkdocs build --strict`` of the site, so a
name counts only when mkdocstrings rendered it, under its public path or the
path where it is defined. Docstrings are read with griffe through the same
extension the site uses, so "has a docstring" means "shows a description in the
reference" (``#:`` comments document constants).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import types
import zlib
from functools import cache
from pathlib import Path

import pytest

import hpcdist

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"


def _is_module(obj: object) -> bool:
    return isinstance(obj, types.ModuleType)


def module_public_names(module: types.ModuleType) -> list[str]:
    """``__all__``, else the names the module defines (not imported, not ``_``-prefixed).

    Example: ``"Dense" in module_public_names(hpcdist.nn)``.
    """
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    source = Path(inspect.getsourcefile(module) or "")
    import ast

    tree = ast.parse(source.read_text(encoding="utf-8"))
    defined: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined += [t.id for t in targets if isinstance(t, ast.Name)]
    return [n for n in dict.fromkeys(defined) if not n.startswith("_")]


@cache
def public_objects() -> dict[str, tuple[str, ...]]:
    """``{public path: (other paths of the same object...)}`` for every public name.

    Modules reachable twice (``hpcdist.coordinator`` is
    ``hpcdist.experimental.coordinator``) are walked once.
    """
    found: dict[str, tuple[str, ...]] = {}
    seen_modules: set[str] = set()

    def walk(module: types.ModuleType, path: str) -> None:
        for name in module_public_names(module):
            if name.startswith("__"):
                continue  # __version__ and friends
            obj = getattr(module, name)
            public = f"{path}.{name}"
            if _is_module(obj):
                found[public] = (obj.__name__,)
                if obj.__name__ not in seen_modules:
                    seen_modules.add(obj.__name__)
                    walk(obj, public)
                continue
            where = []
            if inspect.isclass(obj) or inspect.isfunction(obj):
                where.append(f"{obj.__module__}.{obj.__qualname__}")
            where.append(f"{module.__name__}.{name}")
            found[public] = tuple(dict.fromkeys(where))

    seen_modules.add("hpcdist")
    walk(hpcdist, "hpcdist")
    return found


@cache
def griffe_package():
    """hpcdist as the API reference sees it (with the site's docstring extension)."""
    import griffe

    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        from griffe_docstrings import HpcdistDocstrings
    finally:
        sys.path.pop(0)
    extensions = griffe.load_extensions(HpcdistDocstrings())
    return griffe.load("hpcdist", search_paths=[str(ROOT)], extensions=extensions)


def _griffe_object(path: str):
    pkg = griffe_package()
    obj = pkg[path.split(".", 1)[1]]
    return obj.final_target if obj.is_alias else obj


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> set[str]:
    """The identifiers of a strict build of the site (built once for this module)."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    data = (site / "objects.inv").read_bytes()
    _, _, compressed = data.partition(b"zlib.\n")
    lines = zlib.decompress(compressed).decode().splitlines()
    return {line.split(" ", 1)[0] for line in lines if line.strip()}


def test_the_walk_finds_the_main_names():
    names = public_objects()
    for path in (
        "hpcdist.MirroredStrategy",
        "hpcdist.cluster_resolver.SlurmClusterResolver",
        "hpcdist.coordinator.ClusterCoordinator",
        "hpcdist.nn.losses.BinaryCrossentropy",
        "hpcdist.optimizers.schedules.CosineDecay",
        "hpcdist.data.Dataset",
        "hpcdist.errors.CollectiveTimeoutError",
    ):
        assert path in names, path
    assert "hpcdist.nn.losses.array_module" not in names  # imported, not defined there
    assert len(names) > 200


def test_every_public_name_has_a_docstring():
    missing = []
    for path in public_objects():
        obj = _griffe_object(path)
        if obj.docstring is None or not obj.docstring.value.strip():
            missing.append(path)
    assert not missing, "public names without a docstring:\n" + "\n".join(missing)


def test_every_public_method_has_a_docstring():
    """Public methods and properties of public classes, inherited docstrings counting."""
    missing = []
    for path in public_objects():
        module, _, name = path.rpartition(".")
        parent = hpcdist
        for part in path.split(".")[1:-1]:
            parent = getattr(parent, part)
        cls = getattr(parent, name)
        if not inspect.isclass(cls) or not cls.__module__.startswith("hpcdist"):
            continue
        for member, value in vars(cls).items():
            if member.startswith("_"):
                continue
            if (
                isinstance(value, property)
                or callable(value)
                or isinstance(value, (staticmethod, classmethod))
            ):
                if not inspect.getdoc(getattr(cls, member, None)):
                    missing.append(f"{path}.{member}")
    assert not missing, "public members without a docstring:\n" + "\n".join(missing)


def test_every_public_name_is_in_the_reference(inventory):
    absent = [
        path
        for path, others in public_objects().items()
        if path not in inventory and not any(o in inventory for o in others)
    ]
    assert not absent, "public names missing from the API reference (docs/api/):\n" + "\n".join(
        absent
    )
