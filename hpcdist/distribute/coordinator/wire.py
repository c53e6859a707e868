"""What the coordinator and its workers send each other, as :mod:`hpcdist.runtime.messages`.

Every message is a typed message header (:func:`header`: the kind, two protocol words and
the payload length) and, when the length is not zero, one payload: a result (or an error)
encoded by :func:`~hpcdist.runtime.messages.encode_value`, so nothing is pickled and
nothing but data can come out of a message. Supported values: ``None``,
``bool``/``int``/``float``/``complex``/``str``/``bytes``, NumPy arrays and
scalars (any dtype but ``object`` and structured ones; CuPy arrays come back
as NumPy arrays), and ``list``/``tuple``/``dict``/namedtuple nests of them;
``PerReplica`` and ``Mirrored`` values travel as their components (extension nodes).
An error travels as its type's module and name, its arguments when they are
plain JSON values, its message and its traceback text; :func:`rebuild_error`
makes an exception of the same type again (or a :class:`RemoteError`).

Example:
    >>> import numpy as np
    >>> ok, value = decode_message(encode_message(True, {"loss": np.float32(0.5), "n": [1, 2]}))
    >>> ok, value
    (True, {'loss': np.float32(0.5), 'n': [1, 2]})
"""

from __future__ import annotations

import builtins
import sys
import time
import traceback
import zlib
from typing import Any

import numpy as np

from hpcdist.arrays import is_cupy, to_host
from hpcdist.distribute.values import Mirrored, PerReplica
from hpcdist.errors import (  # noqa: F401 (re-exported: users met them here)
    CancelledError,
    MessageEncodeError,
    MessageError,
    OutOfRangeError,
    ProgramsDivergedError,
    RemoteError,
    UnavailableError,
)
from hpcdist.runtime import messages as M
from hpcdist.runtime.failures import note_process_failure
from hpcdist.runtime.mpi import mpi

# Tags of the coordination communicator.
TAG_CTRL = 11  # chief -> worker: message header (RUN / SYNC / EXIT)
TAG_CTRL_DATA = 12  # chief -> worker: the SYNC payload
TAG_RESULT = 13  # worker -> chief: message header (RESULT)
TAG_RESULT_DATA = 14  # worker -> chief: the encoded result or error

# Message kinds (the TYPE word of a header).
RUN, SYNC, EXIT, RESULT = 1, 2, 3, 4
# Sync points (word b of a SYNC header).
JOIN, DONE, FETCH = 1, 2, 3
SYNC_NAMES = {JOIN: "join()", DONE: "done()", FETCH: "fetch()"}

KINDS = frozenset({RUN, SYNC, EXIT, RESULT})
HEADER_LEN = M.HEADER_WORDS


def header(kind: int, a: int, b: int, nbytes: int) -> np.ndarray:
    """A message header of ``kind`` (RUN, SYNC, EXIT, RESULT) with words ``a``, ``b``.

    Example:
        >>> read_header(header(RUN, 3, 7, 0))
        (1, 3, 7, 0)
    """
    return M.new_header(kind, length=nbytes, args=(a, b))


def read_header(head: np.ndarray) -> tuple[int, int, int, int]:
    """``(kind, a, b, nbytes)`` of a received header, checked (magic, version, kind, size).

    Raises a :class:`~hpcdist.errors.MessageError` subclass for a malformed header.

    Example:
        >>> read_header(header(RESULT, 2, 1, 16))
        (4, 2, 1, 16)
    """
    h = M.check_header(head, types=KINDS, what="a coordinator message")
    return h.type, h.args[0], h.args[1], h.length


def name_hash(fn: Any) -> int:
    """A 32-bit hash of ``fn.__qualname__`` (the same in every process, unlike ``hash``).

    Example:
        >>> name_hash(len) == name_hash(len) and name_hash(len) != name_hash(abs)
        True
    """
    return zlib.crc32(qualname_of(fn).encode())


def qualname_of(fn: Any) -> str:
    """``fn.__qualname__``, or its type's for callables without one (``functools.partial``)."""
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


_HINT = (
    "a scheduled function cannot return it: return NumPy arrays, numbers, strings, None, "
    "or lists/tuples/dicts of them (e.g. v.numpy() for a variable)"
)


class _Failure:
    """The error-info dict of a failed closure or sync point, in a message."""

    def __init__(self, info: Any) -> None:
        self.info = info


def _extend(x: Any) -> tuple[str, Any] | None:
    if isinstance(x, _Failure):
        return "error", x.info
    if is_cupy(x):
        return "", to_host(x)  # encoded in place as the NumPy array
    if isinstance(x, PerReplica):
        return "PerReplica", list(x.values)
    if isinstance(x, Mirrored):
        return "Mirrored", list(x.values)
    if isinstance(x, tuple) and isinstance(getattr(type(x), "_fields", None), tuple):
        cls = type(x)
        return "namedtuple", [cls.__module__, cls.__qualname__, list(x)]
    return None


def _namedtuple(module: str, qualname: str) -> type | None:
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    ok = isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")
    return obj if ok else None


def _make_namedtuple(v: Any) -> tuple[Any, ...]:
    module, qualname, items = v
    cls = _namedtuple(str(module), str(qualname))
    return tuple(items) if cls is None else cls(*items)


_EXTENSIONS: dict[str, Any] = {
    "PerReplica": lambda v: PerReplica(list(v)),
    "Mirrored": lambda v: Mirrored(list(v)),
    "namedtuple": _make_namedtuple,
    "error": _Failure,
}


def encode_message(ok: bool, payload: Any) -> np.ndarray:
    """One ``uint8`` buffer: ``payload`` is the value (``ok``) or an error-info dict (not ok).

    Raises :class:`~hpcdist.errors.MessageEncodeError` (a ``TypeError``) naming the part of
    the value that cannot be sent.

    Example: ``decode_message(encode_message(True, [1, "a"]))`` is ``(True, [1, 'a'])``.
    """
    value = payload if ok else _Failure(payload)
    return M.encode_value(value, extend=_extend, what="the result", hint=_HINT)


def decode_message(buf: Any) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, error_info)`` from a buffer :func:`encode_message` made.

    Raises :class:`~hpcdist.errors.MessageError` (a ``ValueError``) for a buffer that is not
    such a message.

    Example: ``decode_message(encode_message(False, {"message": "x"}))[0]`` is ``False``.
    """
    try:
        doc = M.decode_value(buf, extensions=_EXTENSIONS)
    except MessageError as e:
        raise MessageError(
            f"not a coordinator message ({e}); were the chief and the workers started from "
            "the same hpcdist?"
        ) from e
    if not isinstance(doc, _Failure):
        return True, doc
    if not isinstance(doc.info, dict):
        raise MessageError(
            f"not a coordinator message (an error whose info is a {type(doc.info).__name__}; "
            "expected a dict); were the chief and the workers started from the same hpcdist?"
        )
    return False, doc.info


def _plain(args: tuple[Any, ...]) -> list[Any] | None:
    ok = all(isinstance(a, (str, int, float, bool)) or a is None for a in args)
    return list(args) if ok else None


def error_info(exc: BaseException, *, closure: int = -1, worker: int = -1, name: str = "") -> dict:
    """A JSON-able description of ``exc`` (type, arguments, message, traceback text).

    A ``StopIteration`` (an exhausted iterator) is described as :class:`OutOfRangeError`.

    Example:
        >>> error_info(ValueError("bad", 3))["args"]
        ['bad', 3]
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, StopIteration):
        exc = OutOfRangeError(
            f"end of sequence: {name or 'the scheduled function'} called next() on an "
            "exhausted iterator (StopIteration); create a new per-worker iterator for the "
            "next epoch, e.g. iter(per_worker_dataset)"
        )
    cls = type(exc)
    return {
        "module": cls.__module__,
        "qualname": cls.__qualname__,
        "args": _plain(exc.args),
        "message": str(exc),
        "traceback": tb,
        "closure": closure,
        "worker": worker,
        "name": name,
    }


def _error_class(module: str, qualname: str) -> type | None:
    if module == "builtins":
        obj: Any = getattr(builtins, qualname, None)
    else:
        obj = sys.modules.get(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Exception):
        return obj
    return None


def rebuild_error(info: dict) -> Exception:
    """An exception of the type :func:`error_info` described (a :class:`RemoteError` when
    that type cannot be found or made here), with the worker's traceback as a note and
    the ``remote_traceback``, ``closure`` and ``worker`` attributes.

    Example:
        >>> e = rebuild_error(error_info(KeyError("k")))
        >>> type(e).__name__, e.args
        ('KeyError', ('k',))
    """
    cls = _error_class(info.get("module", ""), info.get("qualname", ""))
    exc: Exception | None = None
    if cls is not None:
        args = info.get("args")
        try:
            exc = cls(*args) if args is not None else cls(info.get("message", ""))
        except Exception:
            exc = None
        if exc is not None and type(exc) is not cls:
            exc = None
    if exc is None:
        exc = RemoteError(f"{info.get('module')}.{info.get('qualname')}: {info.get('message')}")
    where = []
    if info.get("name"):
        where.append(f"scheduled function {info['name']!r}")
    if info.get("closure", -1) >= 0:
        where.append(f"closure {info['closure']}")
    if info.get("worker", -1) >= 0:
        where.append(f"worker {info['worker']}")
    text = info.get("traceback", "")
    extra: Any = exc  # attributes added to an exception of any type
    extra.remote_traceback = text
    extra.closure = info.get("closure", -1)
    extra.worker = info.get("worker", -1)
    if text and hasattr(exc, "add_note"):
        exc.add_note(f"hpcdist: raised in {', '.join(where) or 'a worker'}; its traceback there:")
        exc.add_note(text.rstrip())
    return exc


class Backoff:
    """Polls a few times without sleeping, then sleeps longer and longer (capped).

    Example: ``b = Backoff(); while not req.Test(): b.idle()``.
    """

    def __init__(self, spins: int = 20, first: float = 5e-5, cap: float = 1e-3) -> None:
        self._spins, self._first, self._cap = spins, first, cap
        self.reset()

    def reset(self) -> None:
        """After an event: poll fast again."""
        self._empty = 0
        self._sleep = self._first

    def idle(self) -> None:
        """After an empty poll: sleep once the spins are used up."""
        self._empty += 1
        if self._empty > self._spins:
            time.sleep(self._sleep)
            self._sleep = min(self._sleep * 2, self._cap)


def wait(req: Any) -> None:
    """Wait for an MPI request with :class:`Backoff` (no core burnt on a long wait).

    Example: ``wait(comm.Irecv(buf, source=0, tag=TAG_CTRL))``.
    """
    backoff = Backoff()
    while not req.Test():
        backoff.idle()


def is_proc_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the ULFM error of a failed peer (``ERR_PROC_FAILED[_PENDING]``).

    Example: ``except MPI.Exception as e: if is_proc_failed(e): ...``.
    """
    get = getattr(exc, "Get_error_class", None)
    if get is None:
        return False
    MPI = mpi()
    failed = (getattr(MPI, "ERR_PROC_FAILED", 75), getattr(MPI, "ERR_PROC_FAILED_PENDING", 76))
    return get() in failed


def failed_ranks(comm: Any) -> set[int]:
    """Acknowledge the failures ``comm`` has seen and return the failed ranks of ``comm``.

    Example: ``dead = failed_ranks(comm)`` after an ``ERR_PROC_FAILED``.
    """
    MPI = mpi()
    comm.Ack_failed()
    note_process_failure()
    failed = comm.Get_failed()
    group = comm.Get_group()
    try:
        n = failed.Get_size()
        ranks = MPI.Group.Translate_ranks(failed, list(range(n)), group) if n else []
    finally:
        group.Free()
        if failed != MPI.GROUP_EMPTY:
            failed.Free()
    return {int(r) for r in ranks if r != MPI.UNDEFINED}


__all__ = [
    "Backoff",
    "CancelledError",
    "OutOfRangeError",
    "ProgramsDivergedError",
    "RemoteError",
    "UnavailableError",
    "decode_message",
    "encode_message",
    "header",
    "read_header",
    "error_info",
    "failed_ranks",
    "is_proc_failed",
    "name_hash",
    "rebuild_error",
    "wait",
]
