"""The collectives engine: allreduce, allgather, broadcast and barrier over MPI ranks.

:class:`Collectives` runs collective operations among the ranks of one MPI
communicator, on NumPy or CuPy arrays. This first version is simple and
correct: every call

1. checks, with one tiny ``Iallreduce`` of a 63-bit hash, that every rank
   passed the same operation, op, shapes, dtypes, root and mode; if not,
   every rank raises :class:`~hpcdist.errors.CollectiveMismatchError` naming
   which ranks passed what (no hang, no corrupted data);
2. packs the arrays into one contiguous buffer per dtype (a simple fusion) and
   moves it with buffer-mode mpi4py calls (never pickle);
3. unpacks into new arrays on the device kind of the inputs (CuPy arrays go
   through host memory for now).

Determinism: integer and boolean reductions use ``Allreduce`` (exact, so every
rank gets the same bits). Floating-point and complex reductions use
``Reduce`` to rank 0 followed by ``Bcast``: the MPI standard does not promise
that ``Allreduce`` gives bitwise-equal floating results on every rank, while
one rank computing and broadcasting does. ``float16`` is reduced in
``float32`` (MPI has no portable half-precision sum) and rounded once on rank 0.

Example:
    >>> import numpy as np
    >>> from hpcdist.runtime import mpi
    >>> c = Collectives(mpi().COMM_SELF)
    >>> c.allreduce([np.array([1.0, 2.0]), np.arange(3)], "SUM")
    [array([1., 2.]), array([0, 1, 2])]
    >>> c.allgather(np.float32(7.0))
    array([7.], dtype=float32)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from hpcdist.arrays import asarray, device_of, is_array, to_device, to_host
from hpcdist.collectives.metadata import describe_arrays, mismatch_message, signature_hash
from hpcdist.collectives.mpi_backend import Call, PendingCollective, Plan, drive
from hpcdist.collectives.ops import ReduceOp, divide_mean
from hpcdist.collectives.options import CommunicationImplementation, CommunicationOptions
from hpcdist.errors import CollectiveMismatchError, CollectiveTimeoutError

log = logging.getLogger("hpcdist")

ALIGN = 16  # byte alignment of each tensor in a broadcast buffer
LAYOUT_CACHE_SIZE = 1024
WHAT_CHARS = 300  # characters of a call's description in a timeout error
_FALLBACK_WARNED: set[CommunicationImplementation] = set()


class _Group(NamedTuple):
    """Tensors of one dtype fused into one buffer for a reduction."""

    comm_dtype: np.dtype  # dtype the reduction runs in
    wire_dtype: np.dtype  # dtype of the reduced buffer (float16 for float16 inputs)
    result_dtype: np.dtype  # the inputs' dtype, or divide_mean's for MEAN
    members: tuple[tuple[int, int, int], ...]  # (tensor index, offset, elements)
    total: int


class _Layout(NamedTuple):
    text: str  # the call's signature, compared across ranks
    digest: int  # its 63-bit hash
    groups: tuple[_Group, ...] = ()
    offsets: tuple[int, ...] = ()  # broadcast: byte offset of each tensor
    total: int = 0  # broadcast: bytes in all


def _host_arrays(tensors: Any, operation: str) -> tuple[list[np.ndarray], list[tuple[str, int]]]:
    """Host (NumPy) arrays of ``tensors`` and the device each came from."""
    if is_array(tensors) or isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
        raise TypeError(
            f"{operation} takes a list of arrays; got {type(tensors).__name__}. "
            f"Wrap a single array in a list: {operation}([x], ...)"
        )
    items: list[np.ndarray] = []
    places: list[tuple[str, int]] = []
    for i, tensor in enumerate(tensors):
        x = asarray(tensor)
        places.append(device_of(x))
        host = to_host(x)
        _check_dtype(host.dtype, operation, i)
        items.append(host)
    return items, places


def _check_dtype(dtype: np.dtype, operation: str, index: int | None = None) -> None:
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
        where = "" if index is None else f" (tensor {index})"
        raise TypeError(
            f"{operation} got an array of dtype {dtype}{where}; expected a boolean, integer, "
            "floating or complex dtype. Convert it with .astype(...) first"
        )


def _place(result: np.ndarray, place: tuple[str, int]) -> Any:
    kind, index = place
    return result if kind == "CPU" else to_device(result, kind, index)


def _reduce_dtypes(dtype: np.dtype, op: ReduceOp) -> tuple[np.dtype, np.dtype]:
    """(dtype the reduction runs in, dtype of the reduced buffer) for inputs of ``dtype``."""
    kind, size = dtype.kind, dtype.itemsize
    if kind == "b" and op in (ReduceOp.SUM, ReduceOp.MEAN):
        raise TypeError(
            f"allreduce {op.name} of boolean arrays is not defined; cast to an integer "
            "dtype first, or use MIN (all) or MAX (any)"
        )
    if kind == "c" and op in (ReduceOp.MIN, ReduceOp.MAX):
        raise TypeError(f"allreduce {op.name} of complex arrays is not defined; use SUM or MEAN")
    if kind == "f" and size == 2:
        return np.dtype(np.float32), np.dtype(np.float16)
    if kind in "biu" or (kind == "f" and size in (4, 8)) or (kind == "c" and size in (8, 16)):
        native = dtype.newbyteorder("=")
        return native, native
    raise TypeError(
        f"allreduce of {dtype} arrays is not supported; use bool, (u)int8-64, float16, "
        "float32, float64, complex64 or complex128"
    )


def _result_dtype(dtype: np.dtype, op: ReduceOp) -> np.dtype:
    """The inputs' dtype; for MEAN whatever :func:`divide_mean` gives (float64 for integers)."""
    if op is ReduceOp.MEAN:
        return divide_mean(np.zeros(0, dtype), 1).dtype
    return dtype


def _chunks(total: int, itemsize: int, bytes_per_pack: int) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` element ranges of at most ``bytes_per_pack`` bytes (0: one range)."""
    step = total if bytes_per_pack <= 0 else max(1, bytes_per_pack // itemsize)
    for lo in range(0, total, max(step, 1)):
        yield lo, min(lo + step, total)


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """A new uint8 buffer of ``nbytes`` whose start is 8-byte aligned."""
    return np.empty(max(1, -(-nbytes // 8)), np.float64).view(np.uint8)[:nbytes]


def _mode(options: CommunicationOptions) -> str:
    return "timeout set" if options.timeout_seconds is not None else "no timeout"


def _clip(text: str) -> str:
    return text if len(text) <= WHAT_CHARS else text[: WHAT_CHARS - 1] + "…"


class Collectives:
    """Collective operations among the ranks of one MPI communicator.

    Args:
        comm: an mpi4py communicator (default: ``hpcdist.runtime.world().comm``).
            The engine issues its collectives on it as given; every rank must
            call the engine's methods in the same order.
        options: default :class:`CommunicationOptions`; options passed to a
            call are merged over them.

    Results are always new arrays (never the inputs), with the inputs' shapes
    and dtypes (MEAN of integers: :func:`~hpcdist.collectives.ops.divide_mean`'s
    dtype), on the inputs' device kind; every rank gets bitwise the same
    values. With a timeout (``options.timeout_seconds``) the engine uses
    nonblocking MPI calls and raises :class:`~hpcdist.errors.CollectiveTimeoutError`
    when a call is not done in time; MPI cannot cancel a collective, so the
    communicator is unusable afterwards and the caller should abort the job.
    The error's ``request.Wait()`` finishes the call where every rank will
    still join it; until then the engine refuses new calls.

    Use an engine from one thread at a time (it keeps per-call state, and MPI
    needs every rank's calls in one order anyway). A communicator of one rank
    returns copies without any MPI traffic. ``implementation`` NCCL and SHM
    run on MPI in this version.

    Example:
        >>> import numpy as np
        >>> from hpcdist.runtime import mpi
        >>> c = Collectives(mpi().COMM_SELF)
        >>> c.rank, c.size
        (0, 1)
        >>> c.broadcast([np.arange(3)], root=0)
        [array([0, 1, 2])]
    """

    def __init__(self, comm: Any = None, options: CommunicationOptions | None = None) -> None:
        if comm is None:
            from hpcdist.runtime import world

            comm = world().comm
        if not (hasattr(comm, "Get_rank") and hasattr(comm, "Get_size")):
            raise TypeError(
                f"comm is {comm!r}; expected an mpi4py communicator (or None for the world)"
            )
        if options is not None and not isinstance(options, CommunicationOptions):
            raise TypeError(
                f"options is {options!r}; expected hpcdist.CommunicationOptions or None"
            )
        self._comm = comm
        self._rank = int(comm.Get_rank())
        self._size = int(comm.Get_size())
        self._options = options if options is not None else CommunicationOptions()
        self._layouts: dict[tuple[Any, ...], _Layout] = {}
        self._pending: PendingCollective | None = None
        self._mpi: Any = None
        if self._size > 1:
            from hpcdist.runtime import mpi

            self._mpi = mpi()

    @property
    def comm(self) -> Any:
        """The MPI communicator the collectives run on."""
        return self._comm

    @property
    def rank(self) -> int:
        """This process's rank in :attr:`comm`."""
        return self._rank

    @property
    def size(self) -> int:
        """The number of ranks in :attr:`comm`."""
        return self._size

    @property
    def options(self) -> CommunicationOptions:
        """The engine's default options (call options are merged over them)."""
        return self._options

    def __repr__(self) -> str:
        return f"Collectives(rank={self._rank}, size={self._size}, options={self._options!r})"

    # -- public operations -------------------------------------------------

    def allreduce(
        self,
        tensors: Sequence[Any],
        op: ReduceOp | str,
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Reduce each array element-wise across ranks; every rank gets the result.

        ``op`` is SUM, MEAN (the sum divided by :attr:`size` with
        :func:`~hpcdist.collectives.ops.divide_mean`: floats keep their dtype,
        integers give its dtype, float64), MIN or MAX. Supported dtypes: bool
        (MIN, MAX), signed and unsigned integers, float16/32/64, complex64/128
        (SUM, MEAN). MIN and MAX of NaNs follow the MPI library's comparisons.

        Example: ``c.allreduce([grad_w, grad_b], "MEAN")`` gives the averaged gradients.
        """
        op = ReduceOp.from_any(op)
        opts = self._merged(options)
        items, places = _host_arrays(tensors, "allreduce")
        key = ("allreduce", op, _mode(opts), opts.bytes_per_pack) + tuple(
            (a.shape, a.dtype) for a in items
        )
        layout = self._layout(key, lambda: self._reduce_layout(items, op, opts))
        if self._size == 1:
            results = [np.array(a, copy=True) for a in items]
            if op is ReduceOp.MEAN:
                results = [np.asarray(divide_mean(r, 1)) for r in results]
        else:
            plan = self._allreduce_plan(items, op, layout, opts)
            results = self._run(plan, opts, _clip(layout.text))
        return [_place(r, p) for r, p in zip(results, places, strict=True)]

    def allgather(
        self, tensor: Any, axis: int = 0, options: CommunicationOptions | None = None
    ) -> Any:
        """Concatenate every rank's ``tensor`` along ``axis``, in rank order.

        Sizes along ``axis`` may differ between ranks (zero included); the
        other dimensions and the dtype must match. A 0-d tensor counts as
        shape ``(1,)``, so gathering scalars gives a vector of :attr:`size`
        values. ``axis`` may be negative.

        Example: with rank ``r`` passing ``np.full((r + 1, 2), r)`` on 2 ranks,
        ``c.allgather(x)`` has shape ``(3, 2)``.
        """
        opts = self._merged(options)
        x = asarray(tensor)
        place = device_of(x)
        host = to_host(x)
        _check_dtype(host.dtype, "allgather")
        if host.ndim == 0:
            host = host.reshape(1)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"axis is {axis!r}; expected an int")
        if not -host.ndim <= axis < host.ndim:
            raise ValueError(
                f"axis is {axis} for a tensor of shape {host.shape}; expected "
                f"{-host.ndim} <= axis < {host.ndim}"
            )
        axis = int(axis) % host.ndim
        dims = ", ".join("*" if d == axis else str(n) for d, n in enumerate(host.shape))
        if self._size == 1:
            return _place(np.array(host, copy=True), place)
        text = f"allgather(axis={axis}, {host.dtype}({dims}), {_mode(opts)})"
        layout = self._layout(("allgather", text), lambda: _Layout(text, signature_hash(text)))
        moved = np.ascontiguousarray(np.moveaxis(host, axis, 0))
        what = f"allgather(axis={axis}) of {describe_arrays([host])} on this rank"
        out = self._run(self._allgather_plan(moved, layout), opts, what)
        if axis != 0:
            out = np.ascontiguousarray(np.moveaxis(out, 0, axis))
        return _place(out, place)

    def broadcast(
        self, tensors: Sequence[Any], root: int = 0, options: CommunicationOptions | None = None
    ) -> list[Any]:
        """Rank ``root``'s arrays, to every rank.

        The other ranks' arrays give the shapes and dtypes to expect (their
        values are ignored); they must match the root's.

        Example: ``weights = c.broadcast(weights, root=0)`` after rank 0 loaded them.
        """
        opts = self._merged(options)
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise TypeError(f"root is {root!r}; expected an int rank")
        if not 0 <= root < self._size:
            raise ValueError(
                f"root is {root}; expected a rank of the communicator, 0 <= root < {self._size}"
            )
        root = int(root)
        items, places = _host_arrays(tensors, "broadcast")
        key = ("broadcast", root, _mode(opts), opts.bytes_per_pack) + tuple(
            (a.shape, a.dtype) for a in items
        )
        layout = self._layout(key, lambda: _broadcast_layout(items, root, opts))
        if self._size == 1:
            results = [np.array(a, copy=True) for a in items]
        else:
            plan = self._broadcast_plan(items, root, layout, opts)
            results = self._run(plan, opts, _clip(layout.text))
        return [_place(r, p) for r, p in zip(results, places, strict=True)]

    def barrier(self, options: CommunicationOptions | None = None) -> None:
        """Wait until every rank has reached this barrier.

        Example: ``c.barrier()`` before timing a step.
        """
        opts = self._merged(options)
        if self._size == 1:
            return
        text = f"barrier({_mode(opts)})"
        layout = self._layout(("barrier", text), lambda: _Layout(text, signature_hash(text)))
        self._run(self._agree(layout), opts, text)

    # -- internals ---------------------------------------------------------

    def _merged(self, options: CommunicationOptions | None) -> CommunicationOptions:
        opts = self._options.merge(options)
        impl = opts.implementation
        if impl in (CommunicationImplementation.NCCL, CommunicationImplementation.SHM):
            if impl not in _FALLBACK_WARNED:
                _FALLBACK_WARNED.add(impl)
                log.warning(
                    "implementation %s is not available in this version of the collectives "
                    "engine; using MPI",
                    impl.name,
                )
        return opts

    def _layout(self, key: tuple[Any, ...], build: Callable[[], _Layout]) -> _Layout:
        layout = self._layouts.get(key)
        if layout is None:
            layout = build()
            if len(self._layouts) >= LAYOUT_CACHE_SIZE:
                self._layouts.clear()
            self._layouts[key] = layout
        return layout

    def _run(self, plan: Plan, opts: CommunicationOptions, what: str) -> Any:
        if self._pending is not None:
            if not self._pending.done:
                error = CollectiveTimeoutError(
                    f"an earlier collective ({self._pending.what}) timed out and is still "
                    "pending on this communicator; a new one would be matched against it. "
                    "Abort the job, or call err.request.Wait() on the earlier error first"
                )
                error.request = self._pending
                plan.close()
                raise error
            self._pending = None
        try:
            return drive(self._comm, plan, opts.timeout_seconds, what)
        except CollectiveTimeoutError as err:
            self._pending = err.request
            raise

    def _reduce_layout(
        self, items: list[np.ndarray], op: ReduceOp, opts: CommunicationOptions
    ) -> _Layout:
        members: dict[np.dtype, list[tuple[int, int, int]]] = {}
        totals: dict[np.dtype, int] = {}
        for index, a in enumerate(items):
            _reduce_dtypes(a.dtype, op)
            offset = totals.get(a.dtype, 0)
            members.setdefault(a.dtype, []).append((index, offset, a.size))
            totals[a.dtype] = offset + a.size
        groups = tuple(
            _Group(
                *_reduce_dtypes(dtype, op), _result_dtype(dtype, op), tuple(found), totals[dtype]
            )
            for dtype, found in members.items()
        )
        text = (
            f"allreduce(op={op.name}, {describe_arrays(items)}, {_mode(opts)}, "
            f"bytes_per_pack={opts.bytes_per_pack})"
        )
        return _Layout(text, signature_hash(text), groups=groups)

    def _agree(self, layout: _Layout) -> Plan:
        """Check that every rank runs the same call; on every rank raise if not."""
        MPI = self._mpi
        flags = np.array([layout.digest, -layout.digest], dtype=np.int64)
        yield Call(
            "Allreduce",
            (MPI.IN_PLACE, flags, MPI.MAX),
            nonblocking=True,
            label="the metadata check, where every rank joins the call",
        )
        if flags[0] != -flags[1]:  # max(h) != min(h)
            yield from self._mismatch(layout.text)

    def _mismatch(self, text: str) -> Plan:
        """Gather every rank's signature (error path only) and raise on every rank."""
        MPI = self._mpi
        mine = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        lengths = np.zeros(self._size, dtype=np.int64)
        yield Call("Allgather", (np.array([mine.size], np.int64), lengths), nonblocking=True)
        counts = [int(n) for n in lengths]
        displs = [0, *np.cumsum(counts)[:-1].tolist()]
        everything = np.empty(max(1, sum(counts)), dtype=np.uint8)
        yield Call(
            "Allgatherv",
            ([mine, MPI.BYTE], [everything, (counts, displs), MPI.BYTE]),
            nonblocking=True,
        )
        texts = [
            bytes(everything[d : d + n]).decode("utf-8", "replace")
            for d, n in zip(displs, counts, strict=True)
        ]
        operation = text.split("(", 1)[0]
        raise CollectiveMismatchError(mismatch_message(operation, texts))

    def _allreduce_plan(
        self, items: list[np.ndarray], op: ReduceOp, layout: _Layout, opts: CommunicationOptions
    ) -> Plan:
        MPI = self._mpi
        yield from self._agree(layout)
        mpi_op = MPI.MIN if op is ReduceOp.MIN else MPI.MAX if op is ReduceOp.MAX else MPI.SUM
        is_root = self._rank == 0
        results: list[Any] = [None] * len(items)
        for group in layout.groups:
            buf = np.empty(group.total, dtype=group.comm_dtype)
            for index, offset, n in group.members:
                buf[offset : offset + n] = items[index].reshape(-1)
            ranges = list(_chunks(group.total, group.comm_dtype.itemsize, opts.bytes_per_pack))
            if group.comm_dtype.kind in "biu":
                # Exact arithmetic: Allreduce gives every rank the same bits.
                wire = buf.view(np.uint8) if group.comm_dtype.kind == "b" else buf
                for lo, hi in ranges:
                    yield Call("Allreduce", (MPI.IN_PLACE, wire[lo:hi], mpi_op))
                out = divide_mean(buf, self._size) if op is ReduceOp.MEAN else buf
            else:
                # Floating point: rank 0 reduces and rounds, everyone receives its bits.
                narrow = group.wire_dtype != group.comm_dtype
                out = np.empty(group.total, group.wire_dtype) if narrow else buf
                for lo, hi in ranges:
                    if is_root:
                        yield Call("Reduce", (MPI.IN_PLACE, buf[lo:hi], mpi_op, 0))
                        part = buf[lo:hi]
                        if op is ReduceOp.MEAN:
                            part = divide_mean(part, self._size)
                        if narrow or op is ReduceOp.MEAN:
                            out[lo:hi] = part
                    else:
                        yield Call("Reduce", (buf[lo:hi], None, mpi_op, 0))
                    wire = out[lo:hi].view(np.uint16) if narrow else out[lo:hi]
                    yield Call("Bcast", (wire, 0))
            for index, offset, n in group.members:
                result = out[offset : offset + n].reshape(items[index].shape)
                wanted = group.result_dtype
                results[index] = result if result.dtype == wanted else result.astype(wanted)
        return results

    def _allgather_plan(self, moved: np.ndarray, layout: _Layout) -> Plan:
        MPI = self._mpi
        yield from self._agree(layout)
        rows = np.zeros(self._size, dtype=np.int64)
        yield Call("Allgather", (np.array([moved.shape[0]], np.int64), rows))
        rest = moved.shape[1:]
        row_bytes = math.prod(rest) * moved.dtype.itemsize
        out = np.empty((int(rows.sum()), *rest), dtype=moved.dtype)
        counts = [int(r) * row_bytes for r in rows]
        if sum(counts):
            displs = [0, *np.cumsum(counts)[:-1].tolist()]
            send = moved.reshape(-1).view(np.uint8)
            recv = out.reshape(-1).view(np.uint8)
            yield Call("Allgatherv", ([send, MPI.BYTE], [recv, (counts, displs), MPI.BYTE]))
        return out

    def _broadcast_plan(
        self, items: list[np.ndarray], root: int, layout: _Layout, opts: CommunicationOptions
    ) -> Plan:
        yield from self._agree(layout)
        buf = _aligned_bytes(layout.total)
        views = [
            buf[o : o + a.nbytes].view(a.dtype).reshape(a.shape)
            for a, o in zip(items, layout.offsets, strict=True)
        ]
        if self._rank == root:
            for view, a in zip(views, items, strict=True):
                np.copyto(view, a)
        for lo, hi in _chunks(layout.total, 1, opts.bytes_per_pack):
            yield Call("Bcast", (buf[lo:hi], root))
        return views


def _broadcast_layout(items: list[np.ndarray], root: int, opts: CommunicationOptions) -> _Layout:
    offsets = []
    total = 0
    for a in items:
        offsets.append(total)
        total += -(-a.nbytes // ALIGN) * ALIGN
    text = (
        f"broadcast(root={root}, {describe_arrays(items)}, {_mode(opts)}, "
        f"bytes_per_pack={opts.bytes_per_pack})"
    )
    return _Layout(text, signature_hash(text), offsets=tuple(offsets), total=total)
