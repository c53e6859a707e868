"""A fake ``cupy.cuda.nccl`` for tests without a GPU: NCCL calls run with MPI on host memory.

This module is itself the provider: ``set_nccl_provider(fake_nccl)``. Buffers
are pointers to host memory (the memory behind :class:`FakeGpuArray`), viewed
with NumPy through ``ctypes``; every call is run at once (a stream is only an
int, and anything else is refused, as CuPy's ``intptr_t`` would).

* ``NcclCommunicator(ndev, uid, rank)`` must be created inside
  ``NcclComm.create``: it reads ``CREATING_OVER`` for the MPI communicator,
  ``Dup()``s it (``destroy()`` frees it) and checks with an ``Allgather`` that
  every rank passed the same uid and a rank/ndev that match the MPI ranks.
* ``NcclCommunicator.initAll(devices)`` gives in-process communicators whose
  calls are recorded between ``groupStart()`` and ``groupEnd()`` and run at
  ``groupEnd()`` across the group's buffers.
* float16 is reduced in float32 and rounded, as NCCL's half sums read.
* Unique ids are ``bytes`` and ``NcclCommunicator`` refuses anything else as
  CuPy 14 does (``ID_FORM = "tuple"`` gives CuPy 13's tuples instead);
  ``tests/unit/gpu_contract`` checks these rules against the installed CuPy.

``calls`` counts what was called (``get_unique_id``, ``allReduce``, ...);
``unique_ids`` lists the ids this process drew.

Example:
    >>> len(get_unique_id())
    128
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import Counter
from typing import Any

import ml_dtypes
import numpy as np

from hpcdist.collectives.nccl import CREATING_OVER
from hpcdist.runtime import mpi

available = True

NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64 = 0, 1, 2, 3, 4
NCCL_UINT64, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 5, 6, 7, 8
NCCL_BFLOAT16 = 9

DTYPES = {
    NCCL_INT8: np.dtype(np.int8), NCCL_UINT8: np.dtype(np.uint8),
    NCCL_INT32: np.dtype(np.int32), NCCL_UINT32: np.dtype(np.uint32),
    NCCL_INT64: np.dtype(np.int64), NCCL_UINT64: np.dtype(np.uint64),
    NCCL_FLOAT16: np.dtype(np.float16), NCCL_FLOAT32: np.dtype(np.float32),
    NCCL_FLOAT64: np.dtype(np.float64), NCCL_BFLOAT16: np.dtype(ml_dtypes.bfloat16),
}
_NUMPY_OPS = {NCCL_SUM: np.add, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum}

calls: Counter[str] = Counter()
unique_ids: list[bytes | tuple[int, ...]] = []
#: The form of unique ids: "bytes" (CuPy >= 14, the default) or "tuple" (CuPy 13).
ID_FORM = "bytes"


class NcclError(RuntimeError):
    """What the fake raises for a misuse real NCCL would reject or hang on."""


def get_version() -> int:
    """A made-up NCCL 2.21.5."""
    return 22105


def get_unique_id() -> bytes | tuple[int, ...]:
    """128 random bytes, as CuPy >= 14 returns them (``ID_FORM = "tuple"``: CuPy 13's tuple of
    ints in -128..127)."""
    calls["get_unique_id"] += 1
    raw = os.urandom(128)
    uid: bytes | tuple[int, ...] = raw
    if ID_FORM == "tuple":
        uid = tuple(int(b) for b in np.frombuffer(raw, np.int8))
    unique_ids.append(uid)
    return uid


def _check_comm_id(commId: Any) -> np.ndarray:  # noqa: N803 - CuPy's name
    """The id's bytes; refused as CuPy refuses it (the type first, then the length)."""
    if ID_FORM == "tuple":
        if not isinstance(commId, tuple) or len(commId) != 128:
            raise TypeError(f"fake NCCL: commId must be a tuple of 128 ints; got {commId!r:.60}")
        if not all(isinstance(v, int) and -128 <= v <= 127 for v in commId):
            raise ValueError("fake NCCL: commId entries must be ints in -128..127")
        return np.array(commId, np.int64).astype(np.uint8)
    if type(commId) is not bytes:  # CuPy's typed argument "bytes commId"
        raise TypeError(
            f"Argument 'commId' has incorrect type (expected bytes, got {type(commId).__name__})"
        )
    if len(commId) != 128:
        raise ValueError(f"commId length {len(commId)} != 128.")
    return np.frombuffer(commId, np.uint8)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"fake NCCL: {what} is {value!r} ({type(value).__name__}); expected an int")
    return int(value)


def _view(ptr: int, count: int, dtype: np.dtype) -> np.ndarray:
    """The host memory at ``ptr`` as ``count`` elements of ``dtype`` (writable)."""
    if count == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, np.uint8).view(dtype)


def _dtype(code: int) -> np.dtype:
    if code not in DTYPES:
        raise NcclError(f"fake NCCL: datatype {code} is not one of {sorted(DTYPES)}")
    return DTYPES[code]


def _wide(x: np.ndarray) -> np.ndarray:
    """A copy to reduce in: float16 goes to float32."""
    return x.astype(np.float32) if x.dtype == np.float16 else x.copy()


def _mpi_op(op: int) -> Any:
    MPI = mpi()
    table = {NCCL_SUM: MPI.SUM, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}
    if op not in table:
        raise NcclError(f"fake NCCL: op {op} is not SUM, MAX or MIN")
    return table[op]


class NcclCommunicator:
    """One rank of an NCCL communicator, run over a Dup of the creating MPI communicator."""

    def __init__(self, ndev: int, commId: bytes, rank: int) -> None:  # noqa: N803
        raw = _check_comm_id(commId)
        ndev, rank = _int(ndev, "ndev"), _int(rank, "rank")
        mpi_comm = CREATING_OVER.get()
        if mpi_comm is None:
            raise NcclError("fake NCCL: NcclCommunicator created outside NcclComm.create "
                            "(CREATING_OVER is unset)")
        mine = np.array([ndev, rank, *raw], np.int64)
        calls["NcclCommunicator"] += 1
        self._mpi = mpi_comm.Dup()
        everyone = np.empty((self._mpi.Get_size(), mine.size), np.int64)
        self._mpi.Allgather(mine, everyone)
        size = self._mpi.Get_size()
        problems = [
            f"rank {r} passed ndev={row[0]} rank={row[1]}" for r, row in enumerate(everyone)
            if row[0] != size or row[1] != r
        ] + [f"rank {r} passed another uid" for r, row in enumerate(everyone)
             if not np.array_equal(row[2:], everyone[0, 2:])]
        if problems:  # every rank sees the same table, so every rank raises
            self._mpi.Free()
            raise NcclError(f"fake NCCL: communicator of {size} MPI ranks: {'; '.join(problems)}")
        self.uid = commId
        self._rank, self._size = rank, size

    @staticmethod
    def initAll(devices: list[int]) -> list[_LocalCommunicator]:  # noqa: N802
        """In-process communicators, one per entry of ``devices`` (CuPy: a list)."""
        if not isinstance(devices, list):
            raise TypeError(f"fake NCCL: initAll takes a list of ints; got {devices!r}")
        calls["initAll"] += 1
        group = _LocalGroup(len(devices))
        return [_LocalCommunicator(group, i, _int(d, "device")) for i, d in enumerate(devices)]

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def _live(self, name: str, stream: Any) -> Any:
        _int(stream, "stream")
        if self._mpi is None:
            raise NcclError(f"fake NCCL: {name} on a destroyed communicator")
        calls[name] += 1
        return self._mpi

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  op: int, stream: int) -> None:
        comm, dt = self._live("allReduce", stream), _dtype(datatype)
        src = _wide(_view(sendbuf, count, dt))
        out = np.empty_like(src)
        comm.Allreduce(src, out, op=_mpi_op(op))
        _view(recvbuf, count, dt)[:] = out

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
               root: int, stream: int) -> None:
        comm, dt = self._live("reduce", stream), _dtype(datatype)
        src = _wide(_view(sendbuf, count, dt))
        out = np.empty_like(src)
        comm.Reduce(src, out, op=_mpi_op(op), root=_int(root, "root"))
        if self._rank == root:
            _view(recvbuf, count, dt)[:] = out

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        comm, dt = self._live("broadcast", stream), _dtype(datatype)
        data = _view(sendbuff, count, dt).copy() if self._rank == root else np.empty(count, dt)
        comm.Bcast(data.view(np.uint8), root=_int(root, "root"))
        _view(recvbuff, count, dt)[:] = data

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int,  # noqa: N802
                      datatype: int, op: int, stream: int) -> None:
        comm, dt = self._live("reduceScatter", stream), _dtype(datatype)
        src = _wide(_view(sendbuf, recvcount * self._size, dt))
        out = np.empty(recvcount, src.dtype)
        comm.Reduce_scatter_block(src, out, op=_mpi_op(op))
        _view(recvbuf, recvcount, dt)[:] = out

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  stream: int) -> None:
        comm, dt = self._live("allGather", stream), _dtype(datatype)
        src = _view(sendbuf, count, dt).copy()
        out = np.empty(count * self._size, dt)
        comm.Allgather(src.view(np.uint8), out.view(np.uint8))
        _view(recvbuf, count * self._size, dt)[:] = out

    def destroy(self) -> None:
        comm, self._mpi = self._mpi, None
        if comm is not None:
            comm.Free()


# ---- in-process groups (initAll): record between groupStart/groupEnd, run at groupEnd ----

_state = threading.local()


def groupStart() -> None:  # noqa: N802
    calls["groupStart"] += 1
    _state.depth = getattr(_state, "depth", 0) + 1
    if _state.depth == 1:
        _state.pending = []


def groupEnd() -> None:  # noqa: N802
    calls["groupEnd"] += 1
    depth = getattr(_state, "depth", 0)
    if depth == 0:
        raise NcclError("fake NCCL: groupEnd without groupStart")
    _state.depth = depth - 1
    if _state.depth == 0:
        pending, _state.pending = _state.pending, []
        for group in {id(c.group): c.group for c, _, _ in pending}.values():
            group.run([(c, kind, args) for c, kind, args in pending if c.group is group])


class _LocalGroup:
    def __init__(self, size: int) -> None:
        self.size = size

    def run(self, pending: list[tuple[_LocalCommunicator, str, tuple[Any, ...]]]) -> None:
        """Run the k-th call of every member together (as NCCL would); refuse a partial group."""
        per_member: list[list[tuple[str, tuple[Any, ...]]]] = [[] for _ in range(self.size)]
        for comm, kind, args in pending:
            per_member[comm.index].append((kind, args))
        if len({len(m) for m in per_member}) != 1:
            counts = [len(m) for m in per_member]
            raise NcclError(f"fake NCCL: calls per device {counts} differ; real NCCL would hang")
        for step in zip(*per_member, strict=True):
            kinds = {(k, _meta(k, a)[2:-1]) for k, a in step}  # streams may differ
            if len(kinds) != 1:
                raise NcclError(f"fake NCCL: devices issued different calls together: {kinds}")
            _run_local(step)


def _meta(kind: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``(ptr, ptr, ...everything else)`` of a recorded call: what must agree across devices."""
    if kind == "bcast":
        return (args[0], args[0], *args[1:])
    return args


def _run_local(step: tuple[tuple[str, tuple[Any, ...]], ...]) -> None:
    kind = step[0][0]
    metas = [_meta(k, a) for k, a in step]
    send = [m[0] for m in metas]
    recv = [m[1] for m in metas]
    count, dt = metas[0][2], _dtype(metas[0][3])
    n = len(step)
    if kind in ("allReduce", "reduce", "reduceScatter"):
        op = _NUMPY_OPS[metas[0][4]]
        total_count = count * n if kind == "reduceScatter" else count
        inputs = [_wide(_view(p, total_count, dt)) for p in send]
        total = inputs[0]
        for x in inputs[1:]:
            total = op(total, x)
        if kind == "allReduce":
            for p in recv:
                _view(p, count, dt)[:] = total
        elif kind == "reduce":
            _view(recv[metas[0][5]], count, dt)[:] = total
        else:
            for i, p in enumerate(recv):
                _view(p, count, dt)[:] = total[i * count:(i + 1) * count]
    elif kind in ("broadcast", "bcast"):
        data = _view(send[metas[0][4]], count, dt).copy()
        for p in recv:
            _view(p, count, dt)[:] = data
    elif kind == "allGather":
        data = np.concatenate([_view(p, count, dt) for p in send])
        for p in recv:
            _view(p, count * n, dt)[:] = data


class _LocalCommunicator:
    """One device's communicator of an ``initAll`` group; its calls wait for ``groupEnd``."""

    def __init__(self, group: _LocalGroup, index: int, device: int) -> None:
        self.group, self.index, self.device = group, index, device
        self.destroyed = False

    def rank_id(self) -> int:
        return self.index

    def size(self) -> int:
        return self.group.size

    def device_id(self) -> int:
        return self.device

    def _record(self, kind: str, args: tuple[Any, ...]) -> None:
        for i, v in enumerate(args):
            _int(v, f"{kind} argument {i}")
        if self.destroyed:
            raise NcclError(f"fake NCCL: {kind} on a destroyed communicator")
        if getattr(_state, "depth", 0) == 0:
            raise NcclError(f"fake NCCL: {kind} on an initAll communicator outside "
                            "groupStart()/groupEnd() would deadlock one thread")
        if kind in ("allReduce", "reduce", "reduceScatter") and args[4] not in _NUMPY_OPS:
            raise NcclError(f"fake NCCL: op {args[4]} is not SUM, MAX or MIN")
        calls[kind] += 1
        _state.pending.append((self, kind, args))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        self._record("allReduce", (sendbuf, recvbuf, count, datatype, op, stream))

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        self._record("reduce", (sendbuf, recvbuf, count, datatype, op, root, stream))

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._record("broadcast", (sendbuff, recvbuff, count, datatype, root, stream))

    def bcast(self, buff, count, datatype, root, stream):
        self._record("bcast", (buff, count, datatype, root, stream))

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        self._record("reduceScatter", (sendbuf, recvbuf, recvcount, datatype, op, stream))

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        self._record("allGather", (sendbuf, recvbuf, count, datatype, stream))

    def destroy(self) -> None:
        self.destroyed = True
