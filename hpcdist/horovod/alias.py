"""``horovod`` as another name for :mod:`hpcdist.horovod`: a meta-path finder that loads
``horovod.X`` as ``hpcdist.horovod.X`` (the same module object under both names).

A real Horovod, if installed, is shadowed only in processes that call
:func:`install_alias` (``python -m hpcdist.horovod`` does).

Example:
    >>> install_alias()
    >>> import horovod.common.exceptions as e
    >>> e.__name__
    'hpcdist.horovod.common.exceptions'
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

_PREFIX = "horovod"
_TARGET = "hpcdist.horovod"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the target module is already executed


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _PREFIX and not fullname.startswith(_PREFIX + "."):
            return None
        real = _TARGET + fullname[len(_PREFIX):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real),
                                              is_package=True)


def install_alias() -> None:
    """Make ``import horovod...`` load ``hpcdist.horovod...`` in this process (idempotent)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    for name in [n for n in sys.modules if n == _PREFIX or n.startswith(_PREFIX + ".")]:
        if not sys.modules[name].__name__.startswith(_TARGET):
            del sys.modules[name]  # a real Horovod imported before: ours from now on
