"""The error scheme: every public error class lives in ``hpcdist.errors``.

Each derives from ``HpcdistError`` and from the built-in exception it stands
for (so ``except ValueError`` written for ``tf.distribute`` keeps working);
warnings derive from a built-in ``Warning``. The modules where users met an
error before re-export it, and the API reference lists every one in one table.

The source scan is exact: a new exception class anywhere else in ``hpcdist/``
fails it, unless it is private, listed in ``PRIVATE`` with the ``except`` that
catches it, and so never reaches users.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

import hpcdist
import hpcdist as hd
from hpcdist import errors

ROOT = Path(hpcdist.__file__).resolve().parent
REPO = ROOT.parent
ERRORS_FILE = ROOT / "errors.py"
DOCS_PAGE = REPO / "docs" / "api" / "errors.md"

BUILTIN_EXCEPTIONS = {
    name: obj
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, BaseException)
}

#: Private exception classes allowed outside errors.py: control flow inside hpcdist.
#: (file, class) -> (file, name in the ``except`` clause that catches it before users see it).
PRIVATE = {
    ("collectives/shm_backend.py", "_Mismatch"): ("collectives/session.py", "_Mismatch"),
    ("data/structure.py", "_TraceFailed"): ("data/transform_nodes.py", "Exception"),
    ("distribute/replica_threads.py", "_Stopped"): ("distribute/replica_threads.py", "_Stopped"),
}

#: Every error moved into errors.py, where users met it before, and its built-in base(s)
#: then (the scheme keeps them, so existing ``except`` clauses keep catching).
OLD_PATHS = [
    ("hpcdist.runtime.device", "DeviceArrayError", (TypeError,)),
    ("hpcdist.collectives.nccl", "NcclUnavailableError", (RuntimeError,)),
    ("hpcdist.collectives.nccl", "NcclCallError", (RuntimeError,)),
    ("hpcdist.data.distributed", "DistributedInputError", (RuntimeError,)),
    ("hpcdist.checkpoint", "CheckpointNotFoundError", (ValueError, FileNotFoundError)),
    ("hpcdist.checkpoint.format", "CheckpointNotFoundError", (ValueError, FileNotFoundError)),
    ("hpcdist.checkpoint", "CheckpointMatchError", (ValueError, AssertionError)),
    ("hpcdist.checkpoint.checkpoint", "CheckpointMatchError", (ValueError, AssertionError)),
    ("hpcdist.checkpoint.status", "CheckpointMatchError", (ValueError, AssertionError)),
    ("hpcdist.distribute.devices", "InvalidDeviceError", (ValueError,)),
    ("hpcdist.bench.allreduce", "BenchmarkError", ()),
    ("hpcdist.bench.strategy", "BenchmarkError", ()),
    # moved by the wire-protocol branch (i23-wire): these fail until it is merged
    ("hpcdist.distribute.coordinator", "CancelledError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator", "OutOfRangeError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator", "RemoteError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator", "ProgramsDivergedError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator", "UnavailableError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator.remote_value", "CancelledError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator.remote_value", "OutOfRangeError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator.remote_value", "RemoteError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator.remote_value", "ProgramsDivergedError", (RuntimeError,)),
    ("hpcdist.distribute.coordinator.remote_value", "UnavailableError", (RuntimeError,)),
    ("hpcdist.distribute.ps.protocol", "PSError", (RuntimeError,)),
    ("hpcdist.distribute.ps.protocol", "PSTypeError", (RuntimeError, TypeError)),
]

#: The built-in each ``tf.errors`` name stands for; a class in errors.py that takes a TF
#: name must derive from it. (TF's own classes derive from ``OpError`` only.) Where the
#: Python type is not an obvious match, ``RuntimeError``, the type the coordinator's
#: errors have had from the start.
TF_ERRORS = {
    "CancelledError": RuntimeError,
    "UnknownError": RuntimeError,
    "InvalidArgumentError": ValueError,
    "DeadlineExceededError": TimeoutError,
    "NotFoundError": FileNotFoundError,
    "AlreadyExistsError": FileExistsError,
    "PermissionDeniedError": PermissionError,
    "UnauthenticatedError": PermissionError,
    "ResourceExhaustedError": RuntimeError,
    "FailedPreconditionError": RuntimeError,
    "AbortedError": RuntimeError,
    "OutOfRangeError": RuntimeError,
    "UnimplementedError": NotImplementedError,
    "InternalError": RuntimeError,
    "UnavailableError": RuntimeError,
    "DataLossError": RuntimeError,
}


def builtin_bases(cls: type) -> set[type]:
    """The most specific built-in exception types ``cls`` derives from, beyond ``Exception``."""
    found = {
        c
        for c in cls.__mro__
        if c in BUILTIN_EXCEPTIONS.values() and c not in (BaseException, Exception, Warning)
    }
    return {c for c in found if not any(o is not c and issubclass(o, c) for o in found)}


def errors_classes() -> dict[str, type]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and obj.__module__ == errors.__name__
    }


def exception_classes_in_source() -> list[tuple[str, str, int]]:
    """(file relative to hpcdist/, class name, line) of every class deriving from BaseException.

    A class counts when a base is a built-in exception, another such class of hpcdist, or
    a name ending in Error/Exception/Warning (exceptions of other libraries).
    """
    defined: list[tuple[str, str, int, list[str]]] = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                defined.append((str(path.relative_to(ROOT)), node.name, node.lineno, bases))
    known = set(BUILTIN_EXCEPTIONS)
    found: list[tuple[str, str, int]] = []
    grown = True
    while grown:
        grown = False
        for file, name, line, bases in defined:
            if (file, name, line) in found:
                continue
            if any(b in known or b.endswith(("Error", "Exception", "Warning")) for b in bases):
                found.append((file, name, line))
                known.add(name)
                grown = True
    return found


def handlers_in(file: str) -> set[str]:
    """The type names caught by the ``except`` clauses of ``hpcdist/<file>``."""
    tree = ast.parse((ROOT / file).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            names.update(ast.unparse(t).split(".")[-1] for t in types)
    return names


def test_the_scan_finds_exception_classes() -> None:
    found = {(f, n) for f, n, _ in exception_classes_in_source()}
    # the scan's own check: classes known to derive from BaseException are found,
    # directly (RuntimeError), through hpcdist classes, and in errors.py itself
    assert ("errors.py", "CheckpointCorruptError") in found
    assert ("errors.py", "CollectiveStallWarning") in found
    assert ("distribute/replica_threads.py", "_Stopped") in found
    assert ("nn/losses.py", "MeanSquaredError") not in found  # a loss, not an exception


def test_no_public_exception_class_outside_errors_py() -> None:
    outside = [
        f"hpcdist/{f}:{line} {name}"
        for f, name, line in exception_classes_in_source()
        if f != "errors.py" and not name.startswith("_")
    ]
    assert not outside, (
        "exception classes defined outside hpcdist/errors.py; move them there (deriving "
        "from HpcdistError and their built-in) and re-export them from the old module: "
        + ", ".join(outside)
    )


def test_private_exception_classes_are_listed_and_caught_inside_hpcdist() -> None:
    private = {(f, n) for f, n, _ in exception_classes_in_source() if n.startswith("_")}
    assert private == set(PRIVATE), (
        "a private exception class is new or gone: list it in PRIVATE with the except that "
        "keeps it from users, or move it to hpcdist/errors.py as a public error"
    )
    for (file, name), (catcher, caught) in PRIVATE.items():
        assert caught in handlers_in(catcher), f"{name} of {file} is not caught in {catcher}"


def test_every_class_in_errors_py_derives_from_hpcdist_error_and_a_builtin() -> None:
    classes = errors_classes()
    assert len(classes) >= 20
    for name, cls in classes.items():
        if issubclass(cls, Warning):
            assert builtin_bases(cls), f"{name} is a Warning without a built-in warning type"
            continue
        assert issubclass(cls, errors.HpcdistError), f"{name} does not derive from HpcdistError"
        if cls is not errors.HpcdistError:
            assert builtin_bases(cls), f"{name} derives from no built-in type beyond Exception"
        assert name not in BUILTIN_EXCEPTIONS, f"{name} shadows the built-in of that name"


def test_errors_all_lists_exactly_its_classes() -> None:
    assert sorted(errors.__all__) == sorted(errors_classes())
    assert len(set(errors.__all__)) == len(errors.__all__)


def test_tf_names_map_to_the_builtin_they_stand_for() -> None:
    for name, cls in errors_classes().items():
        if name in TF_ERRORS:
            assert issubclass(cls, TF_ERRORS[name]), f"{name} is not a {TF_ERRORS[name]}"


def test_hd_errors_reaches_every_error() -> None:
    assert hd.errors is errors
    for name in errors.__all__:
        assert getattr(hd.errors, name) is getattr(errors, name)


@pytest.mark.parametrize(
    ("module", "name", "builtin"), OLD_PATHS, ids=[f"{m}.{n}" for m, n, _ in OLD_PATHS]
)
def test_old_import_paths_still_work(module: str, name: str, builtin: tuple[type, ...]) -> None:
    assert hasattr(errors, name), f"{name} is not in hpcdist.errors"
    cls = getattr(importlib.import_module(module), name)
    assert cls is getattr(errors, name)
    assert issubclass(cls, errors.HpcdistError)
    for b in builtin:
        assert issubclass(cls, b), f"{module}.{name} is no longer a {b.__name__}"


def test_raised_errors_are_caught_as_their_builtin() -> None:
    # what the scheme is for: except clauses written for the built-in keep working
    from hpcdist.checkpoint.format import read_manifest
    from hpcdist.distribute.devices import parse_device

    with pytest.raises(FileNotFoundError) as info:
        read_manifest(str(REPO / "no-such-checkpoint"))
    assert type(info.value) is errors.CheckpointNotFoundError
    with pytest.raises(ValueError) as info2:
        parse_device("/job:worker/device:TPU:x")
    assert type(info2.value) is errors.InvalidDeviceError


def test_gpu_binding_with_too_few_gpus_raises_the_public_error() -> None:
    from hpcdist.cluster.gpus import bind_among_peers

    with pytest.raises(errors.TooFewGPUsError, match="2 ranks on this host see the same 1 GPU"):
        bind_among_peers([("0",), ("0",)], 0, gpus_per_task=1)
    with pytest.raises(ValueError):  # a GPUBindingError, so a ValueError
        bind_among_peers([("0",), ("0",)], 1, gpus_per_task=1)


def docs_table() -> dict[str, tuple[str, str]]:
    """``{class: (built-in column, when-raised column)}`` from the API reference's table."""
    rows = {}
    for line in DOCS_PAGE.read_text().splitlines():
        m = re.match(r"^\|\s*`(\w+)`\s*\|(.*?)\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return rows


def test_api_reference_lists_every_error_with_its_builtin() -> None:
    rows = docs_table()
    assert sorted(rows) == sorted(errors.__all__), "docs/api/errors.md's table is not complete"
    for name, (bases, when) in rows.items():
        cls = getattr(errors, name)
        listed = set(re.findall(r"`(\w+)`", bases))
        expected = {b.__name__ for b in builtin_bases(cls)}
        if cls is not errors.HpcdistError:
            assert listed == expected, f"{name}: the page says {listed}, the class has {expected}"
        assert len(when) > 10, f"{name}: say when it is raised"
