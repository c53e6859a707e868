"""Every attribute hpcdist uses from ``numba.cuda``, ``cupy``/``cupyx`` and ``cupy.cuda.nccl``
exists in the installed packages: a scan of the source (AST), not a hand-kept list.

What counts as a use, per module: an ``import``/``from ... import`` of those packages (the
names must import), and every dotted attribute read (``cuda.grid``,
``self._cp.cuda.runtime.memcpyAsync``) whose root is bound to one of them: by an import,
by ``x = cupy`` / ``x = sys.modules.get("cupy")``, or by ``x = nccl_provider()`` (the
NCCL provider is ``cupy.cuda.nccl``). Methods called on NCCL communicators (``comm.allReduce``,
``comms[i].reduce``) must exist on ``cupy.cuda.nccl.NcclCommunicator``. This is what would
have caught ``numba.cuda.is_cuda_ndarray``, which numba-cuda does not have.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((REPO / "hpcdist").rglob("*.py")), *sorted(REPO.glob("benchmarks/gpu_*.py")),
           *sorted((REPO / "tests" / "gpu").rglob("*.py"))]
CHECKED = ("numba.cuda", "cupy", "cupyx")
NCCL = "cupy.cuda.nccl"
COMMUNICATOR_NAMES = {"comm", "communicator", "comms"}
NCCL_MODULE = "hpcdist/collectives/nccl.py"  # where provider communicators are called


@dataclass(frozen=True)
class Use:
    path: str
    line: int
    dotted: str  # the full dotted name, e.g. "cupy.cuda.runtime.memcpyAsync"


def _checked(dotted: str) -> bool:
    return any(dotted == root or dotted.startswith(root + ".") for root in CHECKED)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name (or ``self.x``); else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names (``cp``, ``self._cp``, ``provider``) bound to modules, over the whole module."""
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    alias[a.asname] = a.name
                else:
                    root = a.name.split(".")[0]
                    alias.setdefault(root, root)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):  # assignments of those names, and of the NCCL provider
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = _dotted(node.targets[0])
            value = node.value
            source = None
            if isinstance(value, ast.Name) and value.id in alias:
                source = alias[value.id]
            elif isinstance(value, ast.Call) and ast.unparse(value.func) == "nccl_provider":
                source = NCCL
            elif isinstance(value, ast.Call) and ast.unparse(value) in (
                "sys.modules.get('cupy')", "sys.modules['cupy']"
            ):
                source = "cupy"
            if target and source:
                alias[target] = source
    return alias


def uses(path: Path) -> list[Use]:
    """The checked uses of one source file."""
    tree = ast.parse(path.read_text(), str(path))
    alias = _aliases(tree)
    name = str(path.relative_to(REPO))
    found: list[Use] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [Use(name, node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if _checked(f"{node.module}.{a.name}") or _checked(node.module)]
        elif isinstance(node, ast.Import):
            found += [Use(name, node.lineno, a.name) for a in node.names if _checked(a.name)]
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node)
            if dotted is None:
                continue
            for prefix in sorted(alias, key=len, reverse=True):
                if dotted == prefix or dotted.startswith(prefix + "."):
                    full = alias[prefix] + dotted[len(prefix):]
                    if _checked(full):
                        found.append(Use(name, node.lineno, full))
                    break
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                name == NCCL_MODULE:
            owner = node.func.value
            owner = owner.value if isinstance(owner, ast.Subscript) else owner
            if isinstance(owner, ast.Name) and owner.id in COMMUNICATOR_NAMES:
                found.append(Use(name, node.lineno, f"{NCCL}.NcclCommunicator.{node.func.attr}"))
    return found


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _all_uses() -> list[Use]:
    return [u for path in SOURCES for u in uses(path)]


def test_the_scan_finds_the_uses_it_must_check():
    dotted = {u.dotted for u in _all_uses()}
    for expected in ("numba.cuda.grid", "numba.cuda.as_cuda_array", "numba.cuda.external_stream",
                     "cupy.cuda.runtime.memcpyAsync", "cupy.cuda.nccl.get_unique_id",
                     "cupy.cuda.nccl.NcclCommunicator.initAll",
                     "cupy.cuda.nccl.NcclCommunicator.allReduce",
                     "cupy.cuda.nccl.groupStart", "cupy.cuda.get_current_stream"):
        assert expected in dotted, expected


def test_the_scan_would_have_caught_is_cuda_ndarray(tmp_path, monkeypatch):
    bad = REPO / "hpcdist" / "_scan_probe.py"
    source = "from numba import cuda\n\ndef f(x):\n    return cuda.is_cuda_ndarray(x)\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    (found,) = [u for u in uses(bad) if u.dotted.endswith("is_cuda_ndarray")]
    with pytest.raises(AttributeError):
        resolve(found.dotted)


@pytest.mark.parametrize("root", ["numba.cuda", "cupy", "cupyx"])
def test_every_used_attribute_exists_in_the_installed_packages(root):
    pytest.importorskip(root, reason=f"{root} is part of the gpu extra (make gpu-contract)")
    missing, checked = [], 0
    for use in _all_uses():
        if use.dotted != root and not use.dotted.startswith(root + "."):
            continue
        checked += 1
        try:
            resolve(use.dotted)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{use.path}:{use.line} {use.dotted} ({type(exc).__name__})")
    assert checked >= 5, f"only {checked} uses of {root} found: the scan is broken"
    assert not missing, "\n".join(missing)
