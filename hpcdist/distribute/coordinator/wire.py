"""What the coordinator and its workers send each other: small int64 headers and encoded results.

A result (or an error) travels as ONE ``uint8`` buffer: a JSON description of
the value followed by the raw bytes of its arrays, so nothing is pickled and
nothing but data can come out of a message. Supported values: ``None``,
``bool``/``int``/``float``/``complex``/``str``/``bytes``, NumPy arrays and
scalars (any dtype but ``object`` and structured ones; CuPy arrays come back
as NumPy arrays), and ``list``/``tuple``/``dict``/namedtuple nests of them;
``PerReplica`` and ``Mirrored`` values travel as their components.
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
import json
import sys
import time
import traceback
import zlib
from typing import Any

import numpy as np

from hpcdist.arrays import is_cupy, to_host
from hpcdist.distribute.coordinator.remote_value import (  # noqa: F401 (re-exported)
    CancelledError,
    OutOfRangeError,
    ProgramsDivergedError,
    RemoteError,
    UnavailableError,
)

# Tags of the coordination communicator.
TAG_CTRL = 11  # chief -> worker: int64[4] header (RUN / SYNC / EXIT)
TAG_CTRL_DATA = 12  # chief -> worker: the SYNC payload
TAG_RESULT = 13  # worker -> chief: int64[4] header (RESULT)
TAG_RESULT_DATA = 14  # worker -> chief: the encoded result or error

# Message kinds (first int64 of a header).
RUN, SYNC, EXIT, RESULT = 1, 2, 3, 4
# Sync points (third int64 of a SYNC header).
JOIN, DONE, FETCH = 1, 2, 3
SYNC_NAMES = {JOIN: "join()", DONE: "done()", FETCH: "fetch()"}
HEADER_LEN = 4

_MAGIC = b"HDW1"
_ALIGN = 8


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


def _pad(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Encoder:
    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.offset = 0
        self.path: list[int] = []

    def buffer(self, arr: np.ndarray) -> tuple[int, int]:
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        at = self.offset
        self.chunks.append(data)
        self.offset += _pad(data.nbytes)
        return at, int(data.nbytes)

    def array(self, x: np.ndarray, where: str) -> list[Any]:
        if x.dtype.kind in "OV":
            raise TypeError(
                f"{where} is an array of dtype {x.dtype}, which cannot be sent back without "
                "pickle; return arrays of numbers, booleans, strings or dates"
            )
        return ["a", x.dtype.str, list(x.shape), *self.buffer(x)]

    def node(self, x: Any, where: str) -> Any:
        if x is None:
            return ["n"]
        if isinstance(x, np.generic):  # before float/complex/str: np.float64 is a float
            node = self.array(np.asarray(x), where)
            return ["g", node[1], *node[3:]]
        if isinstance(x, bool):
            return ["b", x]
        if isinstance(x, int):
            return ["i", int(x)]
        if isinstance(x, float):
            return ["f", float(x)]
        if isinstance(x, complex):
            return ["c", x.real, x.imag]
        if isinstance(x, str):
            return ["s", x]
        if isinstance(x, (bytes, bytearray)):
            return ["y", *self.buffer(np.frombuffer(bytes(x), np.uint8))]
        if isinstance(x, np.ndarray) or is_cupy(x):
            return self.array(to_host(x), where)
        if id(x) in self.path:
            raise TypeError(f"{where} contains itself; return a structure without cycles")
        self.path.append(id(x))
        try:
            return self.container(x, where)
        finally:
            self.path.pop()

    def container(self, x: Any, where: str) -> Any:
        from hpcdist.distribute.values import Mirrored, PerReplica

        if isinstance(x, (PerReplica, Mirrored)):
            kind = "pr" if isinstance(x, PerReplica) else "mi"
            return [kind, [self.node(v, f"{where}.values[{i}]") for i, v in enumerate(x.values)]]
        if isinstance(x, tuple) and isinstance(getattr(type(x), "_fields", None), tuple):
            cls = type(x)
            items = [self.node(v, f"{where}.{f}") for f, v in zip(cls._fields, x, strict=True)]
            return ["nt", cls.__module__, cls.__qualname__, items]
        if isinstance(x, (list, tuple)):
            items = [self.node(v, f"{where}[{i}]") for i, v in enumerate(x)]
            return ["l" if isinstance(x, list) else "t", items]
        if isinstance(x, dict):
            return [
                "d",
                [
                    [self.node(k, f"{where} key"), self.node(v, f"{where}[{k!r}]")]
                    for k, v in x.items()
                ],
            ]
        raise TypeError(
            f"{where} is a {type(x).__module__}.{type(x).__qualname__}, which a scheduled "
            "function cannot return: return NumPy arrays, numbers, strings, None, or "
            "lists/tuples/dicts of them (e.g. v.numpy() for a variable)"
        )


def encode_message(ok: bool, payload: Any) -> np.ndarray:
    """One ``uint8`` buffer: ``payload`` is the value (``ok``) or an error-info dict (not ok).

    Raises ``TypeError`` naming the part of the value that cannot be sent.

    Example: ``decode_message(encode_message(True, [1, "a"]))`` is ``(True, [1, 'a'])``.
    """
    enc = _Encoder()
    doc = {"ok": True, "v": enc.node(payload, "the result")} if ok else {"ok": False, "e": payload}
    text = json.dumps(doc, separators=(",", ":")).encode()
    start = _pad(8 + len(text))
    out = np.zeros(start + enc.offset, np.uint8)
    out[:4] = np.frombuffer(_MAGIC, np.uint8)
    out[4:8] = np.frombuffer(np.uint32(len(text)).tobytes(), np.uint8)
    out[8 : 8 + len(text)] = np.frombuffer(text, np.uint8)
    at = start
    for chunk in enc.chunks:
        out[at : at + chunk.nbytes] = chunk
        at += _pad(chunk.nbytes)
    return out


def _array(data: memoryview, start: int, dtype: str, shape: list[int], at: int, n: int) -> Any:
    dt = np.dtype(dtype)
    if n == 0:
        return np.empty(shape, dt)
    return np.frombuffer(data, dt, count=n // dt.itemsize, offset=start + at).reshape(shape).copy()


def _namedtuple(module: str, qualname: str) -> type | None:
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    ok = isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")
    return obj if ok else None


def _decode(node: list[Any], data: memoryview, start: int) -> Any:
    kind = node[0]
    if kind == "n":
        return None
    if kind in ("b", "i", "f", "s"):
        return node[1]
    if kind == "c":
        return complex(node[1], node[2])
    if kind == "y":
        return bytes(data[start + node[1] : start + node[1] + node[2]])
    if kind == "a":
        return _array(data, start, *node[1:])
    if kind == "g":
        return _array(data, start, node[1], [], node[2], node[3])[()]
    if kind in ("l", "t", "pr", "mi"):
        items = [_decode(v, data, start) for v in node[1]]
        if kind == "l":
            return items
        if kind == "t":
            return tuple(items)
        from hpcdist.distribute.values import Mirrored, PerReplica

        return (PerReplica if kind == "pr" else Mirrored)(items)
    if kind == "nt":
        items = [_decode(v, data, start) for v in node[3]]
        cls = _namedtuple(node[1], node[2])
        return tuple(items) if cls is None else cls(*items)
    if kind == "d":
        return {_decode(k, data, start): _decode(v, data, start) for k, v in node[1]}
    raise ValueError(f"unknown node kind {kind!r} in a coordinator message")


def decode_message(buf: Any) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, error_info)`` from a buffer :func:`encode_message` made.

    Raises ``ValueError`` for a buffer that is not such a message.

    Example: ``decode_message(encode_message(False, {"message": "x"}))[0]`` is ``False``.
    """
    data = memoryview(np.ascontiguousarray(buf, dtype=np.uint8)).cast("B")
    if len(data) < 8 or bytes(data[:4]) != _MAGIC:
        raise ValueError(
            f"not a coordinator message (expected {_MAGIC!r} and a JSON header, found "
            f"{bytes(data[:8])!r}); were the chief and the workers started from the same hpcdist?"
        )
    size = int(np.frombuffer(data[4:8], np.uint32)[0])
    doc = json.loads(bytes(data[8 : 8 + size]))
    if not doc["ok"]:
        return False, doc["e"]
    return True, _decode(doc["v"], data, _pad(8 + size))


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
    exc.remote_traceback = text  # type: ignore[attr-defined]
    exc.closure = info.get("closure", -1)  # type: ignore[attr-defined]
    exc.worker = info.get("worker", -1)  # type: ignore[attr-defined]
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
    from hpcdist.runtime.mpi import mpi

    MPI = mpi()
    failed = (getattr(MPI, "ERR_PROC_FAILED", 75), getattr(MPI, "ERR_PROC_FAILED_PENDING", 76))
    return get() in failed


def failed_ranks(comm: Any) -> set[int]:
    """Acknowledge the failures ``comm`` has seen and return the failed ranks of ``comm``.

    Example: ``dead = failed_ranks(comm)`` after an ``ERR_PROC_FAILED``.
    """
    from hpcdist.runtime.failures import note_process_failure
    from hpcdist.runtime.mpi import mpi

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
    "error_info",
    "failed_ranks",
    "is_proc_failed",
    "name_hash",
    "rebuild_error",
    "wait",
]
