"""NCCL between GPUs, through CuPy's ``cupy.cuda.nccl``.

:class:`NcclComm` is one NCCL communicator per MPI rank, built over an mpi4py
communicator: rank 0 draws the NCCL unique id and MPI broadcasts its 128 bytes
(buffer-mode ``Bcast``; :func:`share_unique_id`), handing every rank the id in
the form CuPy gave it: ``bytes`` since CuPy 14, a tuple of ints in CuPy 13.
Before that, the ranks check (one ``Allgather``) that no two of them run on one
GPU, which NCCL refuses. :class:`LocalNcclGroup` is NCCL among
several GPUs of one process (``MirroredStrategy``), its calls issued between
``groupStart()`` and ``groupEnd()``.

The *provider* is the module that speaks NCCL: ``cupy.cuda.nccl`` (imported on
first use), or whatever :func:`set_nccl_provider` injected (the test suite's
fake, which runs every call with MPI on host memory). Buffers are device arrays
(``__cuda_array_interface__``); streams are plain ints (CuPy: ``stream.ptr``).
MEAN is not an NCCL op here: the caller sums and divides.

Example:
    >>> ok, reason = nccl_available()
    >>> isinstance(ok, bool) and isinstance(reason, str)
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import BFLOAT16
from hpcdist.collectives.ops import ReduceOp
from hpcdist.errors import NcclCallError, NcclUnavailableError
from hpcdist.runtime.device import (
    DeviceArrayError,
    device_identity,
    is_c_contiguous,
    is_device_array,
    runtime_for,
)

UNIQUE_ID_BYTES = 128

#: NumPy dtype -> name of the provider's NCCL datatype constant.
NCCL_DTYPE_NAMES: dict[np.dtype, str] = {
    np.dtype(np.int8): "NCCL_INT8",
    np.dtype(np.uint8): "NCCL_UINT8",
    np.dtype(np.int32): "NCCL_INT32",
    np.dtype(np.uint32): "NCCL_UINT32",
    np.dtype(np.int64): "NCCL_INT64",
    np.dtype(np.uint64): "NCCL_UINT64",
    np.dtype(np.float16): "NCCL_FLOAT16",
    np.dtype(np.float32): "NCCL_FLOAT32",
    np.dtype(np.float64): "NCCL_FLOAT64",
    BFLOAT16: "NCCL_BFLOAT16",  # ncclBfloat16 (NCCL >= 2.10), in cupy.cuda.nccl
}

#: ReduceOp -> name of the provider's NCCL reduction constant (MEAN has none: sum, then divide).
NCCL_OP_NAMES: dict[ReduceOp, str] = {
    ReduceOp.SUM: "NCCL_SUM",
    ReduceOp.MIN: "NCCL_MIN",
    ReduceOp.MAX: "NCCL_MAX",
}

#: The mpi4py communicator while :meth:`NcclComm.create` builds a communicator (fakes read it).
CREATING_OVER: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hpcdist_nccl_creating_over", default=None
)

_injected: Any | None = None
_real: tuple[Any | None, str] | None = None  # (cupy.cuda.nccl or None, why not), found once


def _unavailable(reason: str) -> NcclUnavailableError:
    return NcclUnavailableError(
        f"NCCL cannot be used: {reason}. Use CommunicationImplementation.AUTO or MPI (they fall "
        "back to CUDA-aware MPI or host staging), or run where CuPy with NCCL sees a GPU"
    )


def _find_real() -> tuple[Any | None, str]:
    """``(cupy.cuda.nccl, "")`` when it can be used, else ``(None, reason)``; never raises."""
    try:
        import cupy  # lazy: optional GPU dependency
    except ImportError as exc:
        return None, (
            f"CuPy is not installed ({exc}); pip install 'hpcdist[gpu]' (cupy-cuda13x, "
            "nvidia-nccl-cu13; 'hpcdist[gpu-cuda12]' with cupy-cuda12x for CUDA 12 drivers)"
        )
    except Exception as exc:
        return None, f"CuPy failed to import ({type(exc).__name__}: {exc})"
    try:
        from cupy.cuda import nccl  # lazy: optional GPU dependency
    except Exception as exc:
        return None, f"cupy.cuda.nccl failed to import ({type(exc).__name__}: {exc})"
    if not getattr(nccl, "available", False):
        return None, (
            f"CuPy {getattr(cupy, '__version__', '?')} has no NCCL (cupy.cuda.nccl.available is "
            "False); pip install nvidia-nccl-cu13 (nvidia-nccl-cu12 with cupy-cuda12x)"
        )
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return None, f"no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return None, "no CUDA device (CuPy sees 0 GPUs; check CUDA_VISIBLE_DEVICES)"
    return nccl, ""


def _version_text(code: int) -> str:
    if code >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def nccl_available() -> tuple[bool, str]:
    """Whether NCCL can be used, and a line saying which NCCL or why not (never raises).

    Example:
        >>> ok, reason = nccl_available()
        >>> ok or len(reason) > 0
        True
    """
    try:
        provider = nccl_provider()
    except NcclUnavailableError:
        return False, _real[1] if _real is not None else "NCCL is unavailable"
    except Exception as exc:
        return False, f"NCCL check failed ({type(exc).__name__}: {exc})"
    via = "CuPy" if _injected is None else getattr(provider, "__name__", type(provider).__name__)
    try:
        return True, f"NCCL {_version_text(int(provider.get_version()))} via {via}"
    except Exception as exc:
        return False, f"NCCL get_version() failed ({type(exc).__name__}: {exc})"


def nccl_provider() -> Any:
    """The provider module: the injected one, else ``cupy.cuda.nccl``.

    Raises :class:`NcclUnavailableError` (saying why) when NCCL cannot be used.
    Example: ``nccl_provider().get_version()`` is e.g. ``22105`` for NCCL 2.21.5.
    """
    global _real
    if _injected is not None:
        return _injected
    if _real is None:
        _real = _find_real()
    if _real[0] is None:
        raise _unavailable(_real[1])
    return _real[0]


def set_nccl_provider(provider: Any | None) -> None:
    """Use ``provider`` instead of ``cupy.cuda.nccl`` (tests inject a fake); ``None`` restores it.
    """
    global _injected
    if provider is not None:
        missing = [
            n for n in ("get_unique_id", "NcclCommunicator", "groupStart", "groupEnd",
                        "get_version", *NCCL_DTYPE_NAMES.values(), *NCCL_OP_NAMES.values())
            if not hasattr(provider, n)
        ]
        if missing:
            raise TypeError(
                f"an NCCL provider needs the names of cupy.cuda.nccl; {provider!r} lacks "
                f"{', '.join(missing)}"
            )
    _injected = provider


def _stream_handle(stream: Any, operation: str) -> int:
    if isinstance(stream, bool) or not isinstance(stream, int | np.integer):
        raise TypeError(
            f"{operation}: stream is {stream!r} ({type(stream).__name__}); expected the stream "
            "handle as an int (CuPy: stream.ptr; 0 is the legacy default stream)"
        )
    return int(stream)


def _buffer(x: Any, what: str, operation: str, device: int) -> tuple[int, int, np.dtype]:
    """``(pointer, count, dtype)`` of a contiguous device array on ``device``."""
    if not is_device_array(x):
        raise TypeError(
            f"{operation}: {what} is {type(x).__name__}; expected a device array (CuPy) with "
            "__cuda_array_interface__"
        )
    if not is_c_contiguous(x):
        raise ValueError(f"{operation}: {what} is not C-contiguous; pass a contiguous copy")
    try:
        where = runtime_for(x).device_id(x)
    except DeviceArrayError:
        where = device  # no runtime for this array type: NCCL itself will check
    if where != device:
        raise ValueError(f"{operation}: {what} is on GPU {where}; expected GPU {device}")
    cai = x.__cuda_array_interface__
    return int(cai["data"][0]), math.prod(cai["shape"]), np.dtype(cai["typestr"])


def _dtype_code(provider: Any, dtype: np.dtype, operation: str) -> int:
    name = NCCL_DTYPE_NAMES.get(dtype)
    if name is None:
        raise TypeError(
            f"{operation}: dtype {dtype} has no NCCL type; expected one of "
            f"{', '.join(str(d) for d in NCCL_DTYPE_NAMES)} (stage other dtypes)"
        )
    return int(getattr(provider, name))


def _op_code(provider: Any, op: Any, operation: str) -> int:
    op = ReduceOp.from_any(op)
    name = NCCL_OP_NAMES.get(op)
    if name is None:
        raise ValueError(
            f"{operation}: op {op.name} is not an NCCL reduction here; expected SUM, MIN or MAX "
            "(for MEAN, reduce with SUM and divide)"
        )
    return int(getattr(provider, name))


def _same(a: tuple[int, int, np.dtype], b: tuple[int, int, np.dtype], count: int,
          names: tuple[str, str], operation: str) -> None:
    if a[2] != b[2]:
        raise TypeError(f"{operation}: {names[0]} is {a[2]} but {names[1]} is {b[2]}; expected "
                        "one dtype")
    if b[1] != count:
        raise ValueError(f"{operation}: {names[1]} has {b[1]} elements; expected {count} "
                         f"({names[0]} has {a[1]})")


# ---- the unique id: what get_unique_id returns, carried byte for byte over MPI ----
_ID_BYTES, _ID_TUPLE = 1, 2  # the form of the id (first byte of the broadcast buffer)


def encode_unique_id(uid: Any) -> np.ndarray:
    """The id as ``1 + 128`` bytes: its form (bytes: CuPy >= 14; tuple of ints: CuPy 13),
    then the 128 bytes themselves. Raises ``TypeError``/``ValueError`` for anything else.

    Example: ``encode_unique_id(bytes(128))[0] == 1``.
    """
    if isinstance(uid, bytes):
        form, raw = _ID_BYTES, np.frombuffer(uid, np.uint8)
    elif isinstance(uid, tuple) and all(isinstance(v, int | np.integer) for v in uid):
        values = np.asarray(uid, np.int64)
        if values.size and (values.min() < -128 or values.max() > 255):
            raise ValueError("an NCCL unique id tuple holds byte values (-128..255)")
        form, raw = _ID_TUPLE, values.astype(np.uint8)  # (two's complement of the signed ones)
    else:
        raise TypeError(
            f"an NCCL unique id is bytes (CuPy >= 14) or a tuple of ints (CuPy 13); "
            f"got {type(uid).__name__}"
        )
    if raw.size != UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes; got {raw.size}")
    return np.concatenate([np.array([form], np.uint8), raw])


def decode_unique_id(buf: np.ndarray) -> bytes | tuple[int, ...]:
    """The inverse of :func:`encode_unique_id`: the id in the form the provider gave it.

    Example: ``decode_unique_id(encode_unique_id(uid)) == uid``.
    """
    raw = np.ascontiguousarray(buf[1:], np.uint8)
    if int(buf[0]) == _ID_BYTES:
        return raw.tobytes()
    if int(buf[0]) == _ID_TUPLE:
        return tuple(int(v) for v in raw.view(np.int8))
    raise ValueError(f"an encoded NCCL unique id starts with 1 or 2; got {int(buf[0])}")


def share_unique_id(mpi_comm: Any, uid: Any) -> bytes | tuple[int, ...]:
    """Collective: rank 0's ``uid`` (what ``get_unique_id()`` returned) on every rank.

    One buffer-mode ``Bcast`` of its 128 bytes (and a byte saying its form), so every
    rank hands ``NcclCommunicator`` exactly what rank 0 drew: ``bytes`` with CuPy >= 14,
    a tuple of ints with CuPy 13. Other ranks pass ``None``.
    Example: ``uid = share_unique_id(comm, nccl.get_unique_id() if rank == 0 else None)``.
    """
    if mpi_comm.Get_rank() == 0:
        buf = encode_unique_id(uid)
    else:
        buf = np.zeros(1 + UNIQUE_ID_BYTES, np.uint8)
    mpi_comm.Bcast(buf, root=0)
    return decode_unique_id(buf)


# ---- whether two ranks would put one GPU in a communicator twice ----
_DIGEST_BYTES = 16


def _digest(identity: str | None, rank: int) -> np.ndarray:
    """16 bytes naming a GPU; an unknown GPU gets one no other rank can have."""
    text = f"gpu:{identity}" if identity is not None else f"unknown:{rank}"
    return np.frombuffer(hashlib.blake2b(text.encode(), digest_size=_DIGEST_BYTES).digest(),
                         np.uint8)


def _sharing(digests: np.ndarray) -> list[int]:
    """The ranks whose GPU another rank also has (rows of equal digests)."""
    seen: dict[bytes, list[int]] = {}
    for r, row in enumerate(digests):
        seen.setdefault(row.tobytes(), []).append(r)
    return sorted(r for ranks in seen.values() if len(ranks) > 1 for r in ranks)


def ranks_share_gpu(mpi_comm: Any, identity: str | None) -> bool:
    """Collective: whether two ranks of ``mpi_comm`` run on one GPU (one ``Allgather``).

    ``identity`` names this rank's GPU (its UUID: :func:`device_identity`); ``None``
    (unknown) never matches. NCCL refuses such a communicator, so AUTO stages instead.
    Example: ``ranks_share_gpu(comm, device_identity(0))`` is True for two ranks on GPU 0.
    """
    size = mpi_comm.Get_size()
    if size == 1:
        return False
    table = np.zeros((size, _DIGEST_BYTES), np.uint8)
    mpi_comm.Allgather(_digest(identity, mpi_comm.Get_rank()), table)
    return bool(_sharing(table))


class NcclComm:
    """An NCCL communicator of this rank over the ranks of an mpi4py communicator.

    Build it with :meth:`create` (collective). ``rank``/``size`` are those of the
    MPI communicator, ``device`` the GPU ordinal. Every call enqueues on ``stream``.
    """

    def __init__(self, communicator: Any, provider: Any, rank: int, size: int,
                 device: int) -> None:
        self._comm = communicator
        self._provider = provider
        self.rank = rank
        self.size = size
        self.device = device

    @classmethod
    def create(cls, mpi_comm: Any, device: int) -> NcclComm:
        """Collective over ``mpi_comm``: an NCCL communicator of its ranks, this one on ``device``.

        Every rank learns whether all ranks can use NCCL, and whether two of them
        would share one GPU (NCCL refuses that), before any waits in NCCL.
        """
        device = operator.index(device)
        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        provider: Any = None
        error: Exception | None = None
        uid: Any = None
        identity: str | None = None
        try:
            provider = nccl_provider()
            if _injected is None or provider is not _injected:
                identity = device_identity(device)
            if rank == 0:
                uid = provider.get_unique_id()
                encode_unique_id(uid)  # refuse a malformed id before anyone waits on it
        except Exception as exc:
            error = exc
        mine = np.zeros(1 + _DIGEST_BYTES, np.uint8)
        mine[0] = error is None
        mine[1:] = _digest(identity, rank)
        table = np.zeros((size, 1 + _DIGEST_BYTES), np.uint8)
        mpi_comm.Allgather(mine, table)
        if error is not None:
            if isinstance(error, NcclUnavailableError):
                raise error
            raise NcclCallError(
                f"NCCL get_unique_id failed on rank {rank} of {size}: {error}"
            ) from error
        if not table[:, 0].all():
            bad = [int(r) for r in np.flatnonzero(table[:, 0] == 0)]
            raise _unavailable(f"rank(s) {bad} of {size} cannot use NCCL (see their errors)")
        shared = _sharing(table[:, 1:])
        if shared:
            raise _unavailable(
                f"ranks {shared} run on one GPU and NCCL refuses a communicator with the same "
                "GPU twice ('Duplicate GPU detected'); give each rank its own GPU (bind GPUs "
                "per local rank), or let AUTO stage through host memory"
            )
        unique_id = share_unique_id(mpi_comm, uid)
        token = CREATING_OVER.set(mpi_comm)
        try:
            with _on_device(provider, device):
                communicator = provider.NcclCommunicator(size, unique_id, rank)
        except Exception as exc:
            raise NcclCallError(
                f"NCCL communicator creation failed on rank {rank} of {size} (GPU {device}): "
                f"{exc}; check that every rank has its own GPU and NCCL_DEBUG=WARN for details"
            ) from exc
        finally:
            CREATING_OVER.reset(token)
        return cls(communicator, provider, rank, size, device)

    @property
    def communicator(self) -> Any:
        """The provider's communicator (a ``cupy.cuda.nccl.NcclCommunicator``); None if closed."""
        return self._comm

    def supports(self, dtype: Any) -> bool:
        """Whether NCCL moves ``dtype`` (int8/uint8/int32/uint32/int64/uint64/float16/32/64).

        Example: ``nc.supports("float32")`` is True, ``nc.supports("complex64")`` False.
        """
        try:
            return np.dtype(dtype) in NCCL_DTYPE_NAMES
        except TypeError:
            return False

    def _live(self, operation: str) -> Any:
        if self._comm is None:
            raise RuntimeError(f"{operation}: this NcclComm is closed; create a new one")
        return self._comm

    def _run(self, operation: str, dtype: np.dtype, count: int, call: Callable[[], Any]) -> None:
        if count == 0:  # equal on every rank (checked sizes), so every rank skips
            return
        try:
            call()
        except Exception as exc:
            raise NcclCallError(
                f"NCCL {operation} failed on rank {self.rank} of {self.size} (GPU {self.device}, "
                f"dtype {dtype}, count {count}): {exc}; check that every rank issues the same "
                "collectives with the same sizes, and set NCCL_DEBUG=WARN for details"
            ) from exc

    def allreduce(self, send: Any, recv: Any, op: Any, stream: int) -> None:
        """``recv = op(send of every rank)`` (``send`` may be ``recv``)."""
        name = "NcclComm.allreduce"
        comm, s = self._live(name), _stream_handle(stream, name)
        a = _buffer(send, "send", name, self.device)
        b = _buffer(recv, "recv", name, self.device)
        _same(a, b, a[1], ("send", "recv"), name)
        dt, code = _dtype_code(self._provider, a[2], name), _op_code(self._provider, op, name)
        self._run("allreduce", a[2], a[1], lambda: comm.allReduce(a[0], b[0], a[1], dt, code, s))

    def reduce(self, send: Any, recv: Any, op: Any, root: int, stream: int) -> None:
        """``recv = op(send of every rank)`` on rank ``root`` only."""
        name = "NcclComm.reduce"
        comm, s, root = self._live(name), _stream_handle(stream, name), self._root(root, name)
        a = _buffer(send, "send", name, self.device)
        b = _buffer(recv, "recv", name, self.device)
        _same(a, b, a[1], ("send", "recv"), name)
        dt, code = _dtype_code(self._provider, a[2], name), _op_code(self._provider, op, name)
        self._run("reduce", a[2], a[1],
                  lambda: comm.reduce(a[0], b[0], a[1], dt, code, root, s))

    def broadcast(self, buf: Any, root: int, stream: int) -> None:
        """``buf`` of rank ``root`` into ``buf`` of every rank (in place)."""
        name = "NcclComm.broadcast"
        comm, s, root = self._live(name), _stream_handle(stream, name), self._root(root, name)
        a = _buffer(buf, "buf", name, self.device)
        dt = _dtype_code(self._provider, a[2], name)
        self._run("broadcast", a[2], a[1],
                  lambda: comm.broadcast(a[0], a[0], a[1], dt, root, s))

    def reduce_scatter(self, send: Any, recv: Any, op: Any, stream: int) -> None:
        """Rank r gets block r of ``op(send of every rank)``; ``send.size == recv.size * size``."""
        name = "NcclComm.reduce_scatter"
        comm, s = self._live(name), _stream_handle(stream, name)
        a = _buffer(send, "send", name, self.device)
        b = _buffer(recv, "recv", name, self.device)
        _same(b, a, b[1] * self.size, ("recv", "send"), name)
        dt, code = _dtype_code(self._provider, a[2], name), _op_code(self._provider, op, name)
        self._run("reduce_scatter", a[2], b[1],
                  lambda: comm.reduceScatter(a[0], b[0], b[1], dt, code, s))

    def allgather(self, send: Any, recv: Any, stream: int) -> None:
        """``recv`` = ``send`` of ranks 0, 1, ... in order; ``recv.size == send.size * size``."""
        name = "NcclComm.allgather"
        comm, s = self._live(name), _stream_handle(stream, name)
        a = _buffer(send, "send", name, self.device)
        b = _buffer(recv, "recv", name, self.device)
        _same(a, b, a[1] * self.size, ("send", "recv"), name)
        dt = _dtype_code(self._provider, a[2], name)
        self._run("allgather", a[2], a[1], lambda: comm.allGather(a[0], b[0], a[1], dt, s))

    def _root(self, root: int, operation: str) -> int:
        root = operator.index(root)
        if not 0 <= root < self.size:
            raise ValueError(f"{operation}: root is {root}; expected a rank in 0..{self.size - 1}")
        return root

    def close(self) -> None:
        """Destroy the NCCL communicator (every rank calls it; calling twice is harmless)."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()

    def __repr__(self) -> str:
        state = "closed" if self._comm is None else "open"
        return f"NcclComm(rank={self.rank}, size={self.size}, device={self.device}, {state})"


def _on_device(provider: Any, device: int) -> contextlib.AbstractContextManager[Any]:
    """``cupy.cuda.Device(device)`` for the real provider; nothing for an injected one."""
    if _injected is not None and provider is _injected:
        return contextlib.nullcontext()
    import cupy  # lazy: optional GPU dependency

    return cupy.cuda.Device(device)


class LocalNcclGroup:
    """NCCL among several GPUs of this process (``initAll``); calls are grouped.

    Entry ``i`` of every list belongs to ``devices[i]``, which is NCCL rank ``i``.
    """

    def __init__(self, devices: Sequence[int]) -> None:
        devs = [operator.index(d) for d in devices]
        if not devs or len(set(devs)) != len(devs):
            raise ValueError(f"LocalNcclGroup: devices are {devs}; expected distinct GPU ordinals")
        self._provider = nccl_provider()
        try:
            comms = list(self._provider.NcclCommunicator.initAll(devs))
        except Exception as exc:
            raise NcclCallError(f"NCCL initAll over GPUs {devs} failed: {exc}") from exc
        self.devices = tuple(devs)
        self._comms: list[Any] | None = comms

    @property
    def size(self) -> int:
        """The number of GPUs in the group."""
        return len(self.devices)

    def _entries(self, operation: str, arrays: Sequence[Any], streams: Sequence[int],
                 what: str) -> tuple[list[Any], list[tuple[int, int, np.dtype]], list[int]]:
        if self._comms is None:
            raise RuntimeError(f"{operation}: this LocalNcclGroup is closed; create a new one")
        if len(arrays) != self.size or len(streams) != self.size:
            raise ValueError(
                f"{operation}: got {len(arrays)} {what} and {len(streams)} streams; expected "
                f"{self.size} of each (one per device {list(self.devices)})"
            )
        bufs = [_buffer(x, f"{what}[{i}]", operation, d)
                for i, (x, d) in enumerate(zip(arrays, self.devices, strict=True))]
        for i, b in enumerate(bufs):
            _same(bufs[0], b, bufs[0][1], (f"{what}[0]", f"{what}[{i}]"), operation)
        return self._comms, bufs, [_stream_handle(s, operation) for s in streams]

    def allreduce(self, sends: Sequence[Any], recvs: Sequence[Any], op: Any,
                  streams: Sequence[int]) -> None:
        """``recvs[i] = op(sends)`` on every device (``sends`` may be ``recvs``)."""
        name = "LocalNcclGroup.allreduce"
        comms, a, s = self._entries(name, sends, streams, "sends")
        _, b, _ = self._entries(name, recvs, streams, "recvs")
        _same(a[0], b[0], a[0][1], ("sends[0]", "recvs[0]"), name)
        dt, code = _dtype_code(self._provider, a[0][2], name), _op_code(self._provider, op, name)
        self._grouped("allreduce", a[0], [
            (comms[i].allReduce, (a[i][0], b[i][0], a[i][1], dt, code, s[i]))
            for i in range(self.size)
        ])

    def broadcast(self, bufs: Sequence[Any], root_index: int, streams: Sequence[int]) -> None:
        """``bufs[root_index]`` into every ``bufs[i]`` (in place)."""
        name = "LocalNcclGroup.broadcast"
        root = operator.index(root_index)
        if not 0 <= root < self.size:
            raise ValueError(f"{name}: root_index is {root}; expected 0..{self.size - 1}")
        comms, a, s = self._entries(name, bufs, streams, "bufs")
        dt = _dtype_code(self._provider, a[0][2], name)
        self._grouped("broadcast", a[0], [
            (comms[i].broadcast, (a[i][0], a[i][0], a[i][1], dt, root, s[i]))
            for i in range(self.size)
        ])

    def _grouped(self, operation: str, first: tuple[int, int, np.dtype],
                 calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        if first[1] == 0:
            return
        failure: tuple[str, BaseException] | None = None
        try:
            self._provider.groupStart()
        except Exception as exc:
            failure = ("groupStart", exc)
        if failure is None:
            for i, (call, args) in enumerate(calls):
                try:
                    call(*args)
                except Exception as exc:
                    failure = (f"device {self.devices[i]}", exc)
                    break
            try:  # always close the group; NCCL reports an enqueue error here, not a hang
                self._provider.groupEnd()
            except Exception as exc:
                failure = failure or ("groupEnd", exc)
        if failure is not None:
            raise NcclCallError(
                f"NCCL {operation} over GPUs {list(self.devices)} failed at {failure[0]} "
                f"(dtype {first[2]}, count {first[1]}): {failure[1]}"
            ) from failure[1]

    def close(self) -> None:
        """Destroy the communicators (calling twice is harmless)."""
        comms, self._comms = self._comms, None
        for comm in comms or ():
            comm.destroy()

    def __repr__(self) -> str:
        return f"LocalNcclGroup(devices={list(self.devices)})"


__all__ = [
    "CREATING_OVER",
    "LocalNcclGroup",
    "NCCL_DTYPE_NAMES",
    "NCCL_OP_NAMES",
    "NcclCallError",
    "NcclComm",
    "NcclUnavailableError",
    "nccl_available",
    "decode_unique_id",
    "encode_unique_id",
    "nccl_provider",
    "ranks_share_gpu",
    "set_nccl_provider",
    "share_unique_id",
]
