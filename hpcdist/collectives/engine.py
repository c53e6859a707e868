"""The collectives engine: allreduce, reduce_scatter, allgather, broadcast and barrier.

:class:`Collectives` runs collective operations among the ranks of one MPI
communicator, on NumPy arrays or device arrays (CuPy): device arrays take
the GPU path of :mod:`hpcdist.collectives.device_path` (NCCL, CUDA-aware
MPI, or pinned host staging) and this module's host path for the rest.

Reductions are *fused*: the tensors of a call are packed, per dtype, into
buckets (:mod:`hpcdist.collectives.fusion`; the layout is built once per
tensor list and cached) and reduced by the first algorithm of the registry
(:mod:`hpcdist.collectives.registry`, one module each under
:mod:`hpcdist.collectives.algorithms`) that applies, within the route that
:mod:`hpcdist.collectives.choice` gives for the implementation asked:

* ``small``: one node, at most 4 KiB, no timeout: copy, one barrier, one fold;
* ``mpi-direct``: AUTO's MPI band on one node of two ranks;
* ``shm``: the node's shared window (:mod:`hpcdist.collectives.shm_backend`),
  Numba kernels for packing and for the reduction;
* ``hierarchical``: shm in each node, MPI between node leaders, shm again;
* ``mpi``: buffer-mode mpi4py on the packed buffer
  (:mod:`hpcdist.collectives.mpi_reduce`).

Device arrays walk the same registry, whose device algorithms (``device-copy``,
``nccl``, ``nccl-hierarchical``, ``mpi-device``, ``device-staged``) come first
and say no to host calls, as the host ones say no to device calls.
reduce_scatter walks it too, asking the algorithms that have a ``reduce_scatter``.

The algorithms and the device path use the engine's public interface:
:meth:`Collectives.topology`, :meth:`Collectives.fused_layout`,
:meth:`Collectives.call_layout`, :meth:`Collectives.count_call`,
:meth:`Collectives.run_agreed`, :meth:`Collectives.run_on_node`,
:meth:`Collectives.run_mpi`, :meth:`Collectives.agreement`,
:meth:`Collectives.report_mismatch`, :meth:`Collectives.pack_group`,
:meth:`Collectives.describe` and :attr:`Collectives.buffers`. Results come
from the buffer pool: a result the caller still holds is never reused.

Every rank receives bitwise the same results, and repeated runs give the
same bits: on a node every element is reduced in one place in rank order;
MPI floating reductions that could differ between ranks use Reduce+Bcast.

Agreement: on one node every operation starts at a shared-memory barrier
that also compares a digest of the call (operation, op, shapes, dtypes,
options), so a mismatch costs nothing until it happens; across nodes a tiny
``Iallreduce`` of the digest precedes each call. Either way, ranks that
passed different calls all raise :class:`~hpcdist.errors.CollectiveMismatchError`
naming which ranks passed what — not a hang, not corrupted data.

Checked mode: with a timeout in effect (from the call, the engine's options,
:func:`~hpcdist.collectives.options.set_default_timeout` or
``HPCDIST_TIMEOUT_SECONDS``) the compared digest also covers the call's
sequence number on the communicator, so a rank that skipped or added a
collective is caught too; each rank records its progress on an
:class:`~hpcdist.collectives.arrivals.ArrivalBoard`, waits sleep instead of
spinning, a long wait warns (:class:`~hpcdist.errors.CollectiveStallWarning`)
and the timeout error names the ranks that have not arrived. Without a
timeout nothing of this runs.

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
import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np

from hpcdist import arrays as interop  # torch/jax/tf arrays in, the caller's type out
from hpcdist.arrays import asarray, device_of, is_array, to_device, to_host
from hpcdist.collectives import choice, compression
from hpcdist.collectives.alltoall import alltoall as alltoall_arrays
from hpcdist.collectives.arrivals import ArrivalBoard, Watch
from hpcdist.collectives.device_path import DevicePath, has_device_arrays
from hpcdist.collectives.fusion import (
    BufferPool,
    Layout,
    addresses,
    build_layout,
    data_address,
    unfuse,
    wire_dtype,
)
from hpcdist.collectives.metadata import (
    check_dtype,
    describe_arrays,
    mismatch_message,
    signature_hash,
)
from hpcdist.collectives.mpi_backend import Call, PendingCollective, Plan, drive, poll
from hpcdist.collectives.ops import ReduceOp, divide_mean
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import (
    CommunicationOptions,
    get_default_timeout,
    stall_warning_seconds,
)
from hpcdist.collectives.options import Default as _DefaultTimeout
from hpcdist.collectives.registry import Where, generation, pick
from hpcdist.collectives.shm import NodeWindow, node_comm_of, shared_window
from hpcdist.collectives.shm_backend import NodePlan, _Mismatch, check_plan, run_node_plan
from hpcdist.errors import (
    CollectiveMismatchError,
    CollectiveStallWarning,
    CollectiveTimeoutError,
)
from hpcdist.kernels import pack_pieces
from hpcdist.observe.recorder import RECORDER, engine_key, recorded
from hpcdist.runtime import mpi, world

log = logging.getLogger("hpcdist")

ALIGN = 16  # byte alignment of each tensor in a broadcast buffer
LAYOUT_CACHE_SIZE = 1024
WHAT_CHARS = 300  # characters of a call's description in a timeout error
_MASK63 = (1 << 63) - 1
_MIX = 0x9E3779B97F4A7C15  # spreads sequence numbers over the digest bits
_NO_ENV: dict[str, str] = {}  # HPCDIST_COLLECTIVES is read once per call, in algorithm_for
_OPS = {op.name: op for op in ReduceOp} | {op.name.lower(): op for op in ReduceOp}


class _Simple(NamedTuple):
    """The signature of a call that needs no fusion layout (allgather, broadcast, barrier)."""

    text: str
    digest: int
    offsets: tuple[int, ...] = ()  # broadcast: byte offset of each tensor
    total: int = 0  # broadcast: bytes in all


class _Sig(NamedTuple):
    """What the ranks compare for one checked call: digest and text with its sequence number."""

    digest: int
    text: str
    watch: Watch


class Topology(NamedTuple):
    """Where the engine's ranks are, found once (collectively) at its first call.

    Part of the engine interface the algorithms and the device path use
    (:meth:`Collectives.topology`).
    """

    nodes: int
    largest_node: int
    window: NodeWindow | None  # this node's shared window (None: one rank per node)
    leaders: Any  # several nodes: the node leaders' communicator on a leader, else None
    node_rank: int
    node: Any = None  # the communicator of this rank's node


_Topology = Topology  # the name before the algorithm registry


def _host_arrays(tensors: Any, operation: str) -> tuple[list[np.ndarray], list[tuple[str, int]]]:
    """C-contiguous host (NumPy) arrays of ``tensors`` and the device each came from."""
    if is_array(tensors) or isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
        raise TypeError(
            f"{operation} takes a list of arrays; got {type(tensors).__name__}. "
            f"Wrap a single array in a list: {operation}([x], ...)"
        )
    items: list[np.ndarray] = []
    places: list[tuple[str, int]] = []
    for i, tensor in enumerate(tensors):
        if type(tensor) is np.ndarray:
            host = tensor
            places.append(("CPU", 0))
        else:
            x = asarray(tensor)
            places.append(device_of(x))
            host = to_host(x)
        _check_dtype(host.dtype, operation, i)
        if not host.dtype.isnative:
            host = host.astype(host.dtype.newbyteorder("="))
        elif not host.flags.c_contiguous:
            host = np.ascontiguousarray(host)
        items.append(host)
    return items, places


_check_dtype = check_dtype  # the name the engine used before metadata.check_dtype


#: Dtypes whose NumPy arrays need no check nor conversion on the way in (native order).
_PLAIN_DTYPES = frozenset(
    np.dtype(c) for c in "?bBhHiIlLqQefdgFDG" if np.dtype(c).isnative
) | {interop.BFLOAT16}
_CPU = ("CPU", 0)


def _plain_host_arrays(tensors: Any) -> list[tuple[str, int]] | None:
    """The places of a plain list of C-contiguous NumPy arrays of native numeric dtypes
    (the common case, checked without the general path's conversions); ``None`` otherwise."""
    if tensors.__class__ is not list:
        return None
    for a in tensors:
        if a.__class__ is not np.ndarray or a.dtype not in _PLAIN_DTYPES or not (
            a.flags.c_contiguous
        ):
            return None
    return [_CPU] * len(tensors)


_ENV_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _steering_env() -> tuple[Any, Any]:
    """``HPCDIST_COLLECTIVES`` and ``HPCDIST_MPI_BAND`` as set now (read on every call, so
    a change takes effect at once; on POSIX straight from ``os.environ``'s own store,
    which ``os.environ[...] = ...`` updates, at a tenth of ``os.environ.get``'s cost)."""
    if _ENV_BYTES is not None:
        return _ENV_BYTES.get(b"HPCDIST_COLLECTIVES"), _ENV_BYTES.get(b"HPCDIST_MPI_BAND")
    env = os.environ
    return env.get(choice.ENV_VAR), env.get(choice.BAND_VAR)


def _place(result: np.ndarray, place: tuple[str, int]) -> Any:
    kind, index = place
    return result if kind == "CPU" else to_device(result, kind, index)


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """A new uint8 buffer of ``nbytes`` whose start is 8-byte aligned."""
    return np.empty(max(1, -(-nbytes // 8)), np.float64).view(np.uint8)[:nbytes]


def _mode(options: CommunicationOptions) -> str:
    return "timeout set" if options.timeout_seconds is not None else "no timeout"


def _message_bytes(opts: CommunicationOptions) -> str:
    text = f", mpi_message_bytes={opts.mpi_message_bytes}" if opts.mpi_message_bytes else ""
    return text + (f", compression={opts.compression}" if opts.compression else "")


def _clip(text: str) -> str:
    return text if len(text) <= WHAT_CHARS else text[: WHAT_CHARS - 1] + "…"


def _split_bounds(rows: int, size: int, row_elems: int) -> list[int]:
    """Element bounds of ``np.array_split``'s ``size`` blocks of ``rows`` rows."""
    base, extra = divmod(rows, size)
    bounds = [0]
    for r in range(size):
        bounds.append(bounds[-1] + (base + (1 if r < extra else 0)) * row_elems)
    return bounds


class Collectives:
    """Collective operations among the ranks of one MPI communicator.

    Args:
        comm: an mpi4py communicator (default: ``hpcdist.runtime.world().comm``).
            Every rank must call the engine's methods in the same order. The
            first call also finds the node layout (collectively) and maps the
            node's shared window, which engines over the same ranks share.
        options: default :class:`CommunicationOptions`; options passed to a
            call are merged over them.

    Results are new arrays (never the inputs; arrays of one call may share
    one buffer), with the inputs' shapes and dtypes (MEAN of integers:
    float64), on the inputs' device kind; every rank gets bitwise the same
    values. With a timeout (``options.timeout_seconds``) the engine waits
    with deadlines and raises :class:`~hpcdist.errors.CollectiveTimeoutError`;
    MPI cannot cancel a collective, so the job should be aborted then.
    With a timeout (also the process default,
    :func:`~hpcdist.collectives.options.set_default_timeout`) calls are
    checked: see the module docstring; :meth:`close` frees what that needs.

    Use an engine from one thread at a time. A communicator of one rank
    returns copies without any MPI traffic.

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
        self._merged_cache: dict[Any, CommunicationOptions] = {}
        self._layouts: dict[tuple[Any, ...], Any] = {}
        self._picked: dict[tuple[Any, ...], Any] = {}  # the algorithm of each call's key
        self._pool = BufferPool()
        self._pending: PendingCollective | None = None
        self._topology: Topology | None = None
        self._generation = -1  # of the process-wide default timeout the cache was built for
        self._seq = 0  # collectives run on the communicator (both modes)
        self._flight_key = engine_key(self._size)  # names the communicator in flight records
        self._board: ArrivalBoard | None = None  # checked mode only
        self._mpi: Any = None
        self._device: DevicePath | None = None  # the device-array path, made on first use
        #: The registered algorithm (its name) that ran the last host allreduce.
        self.last_algorithm: str | None = None
        #: The route of the last call on device arrays (see :mod:`hpcdist.collectives.device_path`).
        self.last_device_route: str | None = None
        if self._size > 1:
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

    def implementation_for(self, options: CommunicationOptions | None = None) -> CI:
        """The backend (MPI, SHM or HIERARCHICAL) an allreduce with ``options`` runs on.

        Collective on the first call of the engine (it finds the topology).
        Example: ``c.implementation_for()`` is ``SHM`` for ranks on one node.
        """
        opts = self._merged(options)
        if self._size == 1:
            return CI.MPI
        top = self.topology()
        return choice.choose(opts.implementation, top.nodes, self._size, top.largest_node)

    # -- public operations -------------------------------------------------

    @recorded
    def allreduce(
        self,
        tensors: Sequence[Any],
        op: ReduceOp | str,
        options: CommunicationOptions | None = None,
        *,
        out: Sequence[np.ndarray] | None = None,
    ) -> list[Any]:
        """Reduce each array element-wise across ranks; every rank gets the result.

        ``op`` is SUM, MEAN (the sum divided by :attr:`size`: floats keep
        their dtype, integers give float64), MIN or MAX. Supported dtypes:
        bool (MIN, MAX), signed and unsigned integers, bfloat16 and float16/32/64
        (the 16-bit floats are summed in float32 and rounded once), complex64/128
        (SUM, MEAN). ``options.compression`` sends float32 sums between nodes as
        16-bit floats (:mod:`hpcdist.collectives.compression`).
        On a node, MIN and MAX follow NumPy (NaN wins); between nodes, the
        MPI library's comparisons.

        ``out``: NumPy arrays (one per tensor, same shapes, result dtypes) to
        write the results into instead of new arrays — they may be the
        inputs themselves (in place, like ``MPI.IN_PLACE``); ``out`` is returned.

        Example: ``c.allreduce([grad_w, grad_b], "MEAN")`` gives the averaged gradients.
        """
        places = _plain_host_arrays(tensors)
        plain = places is not None
        if places is None:
            if interop.has_foreign(tensors) or (out is not None and interop.has_foreign(out)):
                return interop.call_with_native(
                    lambda t, o: self.allreduce(t, op, options, out=o), tensors, out, "allreduce"
                )
        elif out is not None and interop.has_foreign(out):
            return interop.call_with_native(
                lambda t, o: self.allreduce(t, op, options, out=o), tensors, out, "allreduce"
            )
        op = _OPS.get(op, op) if op.__class__ is str else op
        if op.__class__ is not ReduceOp:
            op = ReduceOp.from_any(op)
        opts = self._merged(options)
        if opts.splits_by_filter():  # some tensors compressed, some not: two calls
            return compression.split_allreduce(self, tensors, op, opts, out)
        if places is not None:
            items = cast("list[np.ndarray]", tensors)  # (checked by _plain_host_arrays)
        elif has_device_arrays(tensors):
            return self._device_path().allreduce(tensors, op, opts, out)
        else:
            items, places = _host_arrays(tensors, "allreduce")
        key = (op, opts, *[(a.shape, a.dtype) for a in items])
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._new_layout(key, items, op, opts)
        if out is not None:
            out = self._check_out(out, layout)
        if self._size == 1:
            results: list[Any] = [
                a.copy() if a.dtype.kind in "fcb" or op is not ReduceOp.MEAN
                else np.asarray(divide_mean(a, 1))
                for a in items
            ]
            return self._deliver(results, places, out)
        fused = self._reduce(items, layout, opts, key)
        results = [None] * len(items)
        for group, buf in zip(layout.groups, fused, strict=True):
            if op is ReduceOp.MEAN and group.wire.kind in "iu":
                buf = divide_mean(buf, self._size)
            elif op is ReduceOp.MEAN and self._size == 1:
                buf = divide_mean(buf, 1)
            unfuse(group, buf, layout.shapes, results)
        if plain and out is None:
            return results
        return self._deliver(results, places, out)

    @staticmethod
    def _deliver(results: list[Any], places: list[tuple[str, int]], out: Any) -> list[Any]:
        """The results as asked: copied into ``out``, or on the inputs' devices."""
        if out is not None:
            for target, result in zip(out, results, strict=True):
                if target is not result:
                    np.copyto(target, result)
            return list(out)
        if all(p[0] == "CPU" for p in places):
            return results
        return [_place(r, p) for r, p in zip(results, places, strict=True)]

    @recorded
    def reduce_scatter(
        self, tensor: Any, op: ReduceOp | str, options: CommunicationOptions | None = None
    ) -> Any:
        """This rank's block of the element-wise reduction of ``tensor`` across ranks.

        ``tensor`` has the same shape on every rank; it is split along axis 0
        into :attr:`size` blocks as ``np.array_split`` splits it (the first
        ``len % size`` blocks one row longer) and rank ``r`` receives block
        ``r`` reduced with ``op`` (as :meth:`allreduce`).

        Example: on 2 ranks, ``c.reduce_scatter(np.ones(5), "SUM")`` gives
        ``[2., 2., 2.]`` on rank 0 and ``[2., 2.]`` on rank 1.
        """
        if interop.has_foreign(tensor):  # torch, jax, tf: NumPy/CuPy views in, the type out
            x = interop.import_array(tensor)
            return interop.export_like(tensor, self.reduce_scatter(x, op, options))
        op = _OPS.get(op, op) if op.__class__ is str else op
        if op.__class__ is not ReduceOp:
            op = ReduceOp.from_any(op)
        opts = self._merged(options)
        if has_device_arrays([tensor]):
            return self._device_path().reduce_scatter(tensor, op, opts)
        items, places = _host_arrays([tensor], "reduce_scatter")
        x = items[0]
        if x.ndim == 0:
            raise ValueError(
                "reduce_scatter needs a tensor with at least one dimension to split along "
                "axis 0; got a 0-d array. Reshape it to (1,) or use allreduce"
            )
        key = ("reduce_scatter", op, opts, x.shape, x.dtype)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._new_layout(key, items, op, opts, operation="reduce_scatter")
        group = layout.groups[0]
        row = (math.prod(x.shape[1:]) if x.ndim > 1 else 1) * (
            x.dtype.itemsize // group.wire.itemsize
        )
        bounds = _split_bounds(x.shape[0], self._size, row)
        rows = x.shape[0] // self._size + (1 if self._rank < x.shape[0] % self._size else 0)
        block_shape = (rows, *x.shape[1:])
        if self._size == 1:
            buf = self.pack_group(group, items)
        else:
            buf = self._reduce_scatter(items, layout, opts, bounds)
        if op is ReduceOp.MEAN and group.wire.kind in "iu":
            buf = divide_mean(buf, self._size)
        if group.wire != group.dtype and group.dtype.kind in "bc":
            buf = buf.view(group.dtype)
        return _place(buf.reshape(block_shape), places[0])

    @recorded
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
        if interop.has_foreign(tensor):  # torch, jax, tf: NumPy/CuPy views in, the type out
            x = interop.import_array(tensor)
            return interop.export_like(tensor, self.allgather(x, axis, options))
        opts = self._merged(options)
        if has_device_arrays([tensor]):
            if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
                raise TypeError(f"axis is {axis!r}; expected an int")
            return self._device_path().allgather(tensor, int(axis), opts)
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
        layout = self.call_layout(("allgather", text), text)
        moved = np.ascontiguousarray(np.moveaxis(host, axis, 0))
        what = f"allgather(axis={axis}) of {describe_arrays([host])} on this rank"
        out = self.run_agreed(
            layout, opts, what, lambda check: self._allgather_plan(moved, layout, check)
        )
        if axis != 0:
            out = np.ascontiguousarray(np.moveaxis(out, 0, axis))
        return _place(out, place)

    @recorded
    def allgather_list(
        self, tensors: Sequence[np.ndarray], axis: int = 0,
        options: CommunicationOptions | None = None,
    ) -> list[np.ndarray]:
        """:meth:`allgather` of each NumPy array of ``tensors``, in one engine call.

        One ``Allgather`` of the row counts of every tensor and one
        ``Allgatherv`` of all their bytes, whatever the number of tensors.
        Results come from the engine's buffer pool (all views of one buffer):
        a result the caller still holds is never overwritten by a later call.
        Other array types (device, torch, ...) take :meth:`allgather` one by one.

        Example: ``labels, preds = c.allgather_list([labels, preds])``.
        """
        items = list(tensors)
        if not items or not all(x.__class__ is np.ndarray for x in items):
            return [self.allgather(x, axis, options) for x in items]
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"axis is {axis!r}; expected an int")
        opts = self._merged(options)
        moved = []
        for x in items:
            check_dtype(x.dtype, "allgather")
            host = x.reshape(1) if x.ndim == 0 else x
            if not -host.ndim <= axis < host.ndim:
                raise ValueError(
                    f"axis is {axis} for a tensor of shape {host.shape}; expected "
                    f"{-host.ndim} <= axis < {host.ndim}"
                )
            if not host.dtype.isnative:
                host = host.astype(host.dtype.newbyteorder("="))
            a = int(axis) % host.ndim
            moved.append(np.ascontiguousarray(host if a == 0 else np.moveaxis(host, a, 0)))
        if self._size == 1:
            return [np.array(x.reshape(1) if x.ndim == 0 else x, copy=True) for x in items]
        tails = [(m.dtype, m.shape[1:]) for m in moved]
        text = "allgather(axis={}, [{}], {})".format(
            axis, ", ".join(f"{d}(*, {', '.join(map(str, t))})" for d, t in tails), _mode(opts)
        )
        layout = self.call_layout(("allgather_list", text), text)
        what = f"allgather of {describe_arrays(items)} on this rank"
        gathered = self.run_agreed(
            layout, opts, what, lambda check: self._allgather_list_plan(moved, layout, check)
        )
        out = []
        for x, g in zip(items, gathered, strict=True):
            a = int(axis) % max(x.ndim, 1)
            out.append(g if a == 0 else np.ascontiguousarray(np.moveaxis(g, 0, a)))
        return out

    def _allgather_list_plan(self, moved: list[np.ndarray], layout: _Simple, check: Any) -> Plan:
        MPI = self._mpi
        if check:
            yield from self.agreement(check)
        count = len(moved)
        rows = np.zeros((self._size, count), dtype=np.int64)
        yield Call("Allgather", (np.array([m.shape[0] for m in moved], np.int64), rows))
        row_bytes = [math.prod(m.shape[1:]) * m.dtype.itemsize for m in moved]
        sizes = rows * np.array(row_bytes, np.int64)  # bytes of [rank, tensor]
        counts = sizes.sum(axis=1).tolist()
        total = int(sum(counts))
        # Results, tensor after tensor, in one pooled buffer (8-byte aligned starts).
        starts, end = [], 0
        for t in range(count):
            starts.append(end)
            end += -(-int(sizes[:, t].sum()) // 8) * 8
        key = ("allgather_list", layout.digest, end, rows.tobytes())
        result = self._pool.take(key, max(end, 1), np.dtype(np.uint8))
        if total:
            send = self._pool.take((*key, "send"), max(counts[self._rank], 1), np.dtype(np.uint8))
            lo = 0
            for m in moved:
                send[lo : lo + m.nbytes] = m.reshape(-1).view(np.uint8)
                lo += m.nbytes
            recv = self._pool.take((*key, "recv"), max(total, 1), np.dtype(np.uint8))
            displs = [0, *np.cumsum(counts)[:-1].tolist()]
            mine = [send[: counts[self._rank]], MPI.BYTE]
            yield Call("Allgatherv", (mine, [recv[:total], (counts, displs), MPI.BYTE]))
            for r in range(self._size):  # rank r's block holds its tensors one after another
                src = displs[r]
                for t in range(count):
                    n = int(sizes[r, t])
                    dst = starts[t] + int(sizes[:r, t].sum())
                    result[dst : dst + n] = recv[src : src + n]
                    src += n
        out = []
        for t, m in enumerate(moved):
            n = int(sizes[:, t].sum())
            piece = result[starts[t] : starts[t] + n].view(m.dtype)
            out.append(piece.reshape((int(rows[:, t].sum()), *m.shape[1:])))
        return out

    @recorded
    def broadcast(
        self, tensors: Sequence[Any], root: int = 0, options: CommunicationOptions | None = None
    ) -> list[Any]:
        """Rank ``root``'s arrays, to every rank.

        The other ranks' arrays give the shapes and dtypes to expect (their
        values are ignored); they must match the root's.

        Example: ``weights = c.broadcast(weights, root=0)`` after rank 0 loaded them.
        """
        if interop.has_foreign(tensors):  # torch, jax, tf: NumPy/CuPy views in, the type out
            return interop.call_with_native(
                lambda t, _: self.broadcast(t, root, options), tensors, None, "broadcast"
            )
        opts = self._merged(options)
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise TypeError(f"root is {root!r}; expected an int rank")
        if not 0 <= root < self._size:
            raise ValueError(
                f"root is {root}; expected a rank of the communicator, 0 <= root < {self._size}"
            )
        root = int(root)
        if has_device_arrays(tensors):
            return self._device_path().broadcast(tensors, root, opts)
        items, places = _host_arrays(tensors, "broadcast")
        key = ("broadcast", root, _mode(opts), opts.mpi_message_bytes) + tuple(
            (a.shape, a.dtype) for a in items
        )
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = _broadcast_layout(items, root, opts)
        if self._size == 1:
            results = [np.array(a, copy=True) for a in items]
        else:
            results = self.run_agreed(
                layout,
                opts,
                _clip(layout.text),
                lambda check: self._broadcast_plan(items, root, layout, opts, check),
            )
        return [_place(r, p) for r, p in zip(results, places, strict=True)]

    @recorded
    def alltoall(self, tensor: np.ndarray, splits: Sequence[int] | None = None) -> Any:
        """Rank ``r`` sends rows ``splits[j]`` of ``tensor`` to rank ``j``: returns ``(rows
        received in rank order, rows received from each rank)``; see
        :mod:`hpcdist.collectives.alltoall`. Example: ``out, got = c.alltoall(x, [1, 3])``.
        """
        return alltoall_arrays(self, tensor, splits)

    @recorded
    def barrier(self, options: CommunicationOptions | None = None) -> None:
        """Wait until every rank has reached this barrier.

        Example: ``c.barrier()`` before timing a step.
        """
        opts = self._merged(options)
        if self._size == 1:
            return
        text = f"barrier({_mode(opts)})"
        layout = self.call_layout(("barrier", text), text)
        self.run_agreed(layout, opts, text, lambda check: self.agreement(check) if check else None)

    # -- internals ---------------------------------------------------------

    def device_path(self) -> DevicePath:
        """The engine's device-array half (made on first use): what the device algorithms
        (:mod:`hpcdist.collectives.algorithms`) use, see :class:`DevicePath`.

        Example: ``call = engine.device_path().prepare(items, layout)``.
        """
        if self._device is None:
            self._device = DevicePath(self)
        return self._device

    _device_path = device_path

    def _merged(self, options: CommunicationOptions | None) -> CommunicationOptions:
        if self._generation != _DefaultTimeout.generation or _DefaultTimeout.unset:
            get_default_timeout()  # reads HPCDIST_TIMEOUT_SECONDS on first use
            self._merged_cache.clear()
            self._generation = _DefaultTimeout.generation
        if options is None or options.__class__ is CommunicationOptions:
            opts = self._merged_cache.get(options)
            if opts is not None:
                return opts
        opts = self._options.merge(options)
        default = _DefaultTimeout.timeout
        if opts.timeout_seconds is None and default is not None:
            opts = opts.with_timeout(default)
        if len(self._merged_cache) < 64:
            self._merged_cache[options] = opts
        return opts

    def topology(self, timeout: float | None = None) -> _Topology:
        """The node layout of the communicator (collective on the first call).

        The first call also sets up the arrival board when any rank's call
        has a ``timeout`` (is checked). Its set-up calls block, so with a
        timeout every rank first meets in a polled ``Ibarrier``: a rank that
        never arrives gives a :class:`CollectiveTimeoutError` here too."""
        if self._topology is None:
            comm = self._comm
            checked = timeout is not None
            if timeout is not None and self._size > 1:
                self._meet_before_setup(timeout)
            node, host_ranks = node_comm_of(comm)
            local_rank, local_size = node.Get_rank(), node.Get_size()
            mine = np.array([local_size if local_rank == 0 else 0, int(checked)], np.int64)
            gathered = np.zeros((self._size, 2), np.int64)
            comm.Allgather(mine, gathered)
            counts = gathered[:, 0].tolist()
            if gathered[:, 1].any():
                self._make_board()
            nodes = sum(1 for c in counts if c)
            largest = max(counts)
            window = None
            if largest > 1:
                window = shared_window(node, choice.slot_bytes(largest), host_ranks)
            leaders = None
            if nodes > 1:
                MPI = self._mpi
                color = 0 if local_rank == 0 else MPI.UNDEFINED
                lead = comm.Split(color, key=self._rank)
                leaders = None if lead == MPI.COMM_NULL else lead
            self._topology = Topology(nodes, largest, window, leaders, local_rank, node)
        return self._topology

    def _meet_before_setup(self, timeout: float) -> None:
        request = self._comm.Ibarrier()
        if not poll(request, time.monotonic() + timeout):
            error = CollectiveTimeoutError(
                f"the first collective of this engine did not start within {timeout} s on rank "
                f"{self._rank}: some of the {self._size} ranks never called it (hung, crashed "
                "or skipped it), so the node layout could not be set up. Abort the job"
            )
            error.request = request
            raise error

    @property
    def buffers(self) -> BufferPool:
        """The engine's result buffers, reused once the caller dropped a result.

        Example: ``engine.buffers.take(("mine", layout.digest, 0), n, wire)``.
        """
        return self._pool

    def fused_layout(
        self,
        key: tuple[Any, ...],
        items: list[np.ndarray],
        op: ReduceOp,
        opts: CommunicationOptions,
        operation: str = "allreduce",
    ) -> Layout:
        """The fusion layout of ``items`` cached under ``key`` (built on first use).

        ``key`` must name everything the layout depends on (op, options,
        shapes and dtypes). Example: ``engine.fused_layout(key, items, op, opts)``.
        """
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._new_layout(key, items, op, opts, operation)
        return layout

    def _new_layout(
        self,
        key: tuple[Any, ...],
        items: list[np.ndarray],
        op: ReduceOp,
        opts: CommunicationOptions,
        operation: str = "allreduce",
    ) -> Layout:
        for i, a in enumerate(items):
            try:
                wire_dtype(a.dtype, op)
            except TypeError as err:
                raise TypeError(f"{operation} (tensor {i}): {err}") from None
        bucket = opts.bytes_per_pack or choice.DEFAULT_BUCKET_BYTES
        if self._size > 1:
            window = self.topology(opts.timeout_seconds).window
            if window is not None:
                bucket = min(bucket, window.slot_bytes)
        text = (
            f"{operation}(op={op.name}, {describe_arrays(items)}, {_mode(opts)}, "
            f"bytes_per_pack={opts.bytes_per_pack}, implementation={opts.implementation.name}"
            f"{_message_bytes(opts)})"
        )
        layout = build_layout(items, op, bucket, text)
        if len(self._layouts) >= LAYOUT_CACHE_SIZE:
            self._layouts.clear()
        self._layouts[key] = layout
        return layout

    def call_layout(self, key: tuple[Any, ...], text: str, **extra: Any) -> _Simple:
        """The cached signature (text, digest) of a call that needs no fusion layout.

        Example: ``layout = engine.call_layout(("device", text), text)``.
        """
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = _Simple(text, signature_hash(text), **extra)
        return layout

    def _check_out(self, out: Sequence[np.ndarray], layout: Layout) -> list[np.ndarray]:
        out = list(out)
        if len(out) != len(layout.shapes):
            raise ValueError(
                f"out has {len(out)} arrays for {len(layout.shapes)} tensors; pass one per tensor"
            )
        dtypes = {}
        for g in layout.groups:
            for index, _, _ in g.members:
                dtypes[index] = g.result
        for i, target in enumerate(out):
            if (
                not isinstance(target, np.ndarray)
                or target.shape != layout.shapes[i]
                or target.dtype != dtypes[i]
                or not target.flags.writeable
            ):
                raise ValueError(
                    f"out[{i}] must be a writeable NumPy array of shape {layout.shapes[i]} and "
                    f"dtype {dtypes[i]}; got {type(target).__name__} "
                    f"{getattr(target, 'shape', '')} {getattr(target, 'dtype', '')}"
                )
        return out

    @staticmethod
    def pack_group(
        group: Any, items: Sequence[np.ndarray], buf: np.ndarray | None = None
    ) -> np.ndarray:
        """The group's tensors copied into one flat wire-dtype buffer (``buf``, else a new one).

        Example: ``engine.pack_group(layout.groups[0], items, out)``.
        """
        if buf is None:
            buf = np.empty(group.total, group.wire)
        whole = group.whole
        if whole.tensor.size:
            pack_pieces(
                data_address(buf), addresses(items), whole.tensor, whole.src, whole.nbytes,
                whole.dst,
            )
        return buf

    def run_agreed(
        self, layout: Any, opts: CommunicationOptions, what: str, make_plan: Any
    ) -> Any:
        """Run the MPI plan ``make_plan(check)`` after agreeing on ``layout``.

        On one node the agreement is a node barrier comparing digests (and
        the plan is told not to check); elsewhere the plan checks over MPI.
        """
        top = self.topology(opts.timeout_seconds)
        sig = self.count_call(layout, opts, what)
        if top.nodes == 1 and top.window is not None:
            if sig is None:
                plan = check_plan(
                    top.window, layout.digest, layout.text, self._comm, make_plan(False)
                )
                return self.run_on_node(top.window, plan, opts, layout.text, what)
            plan = check_plan(top.window, sig.digest, sig.text, self._comm, make_plan(False))
            return self.run_on_node(top.window, plan, opts, sig.text, what, sig)
        return self.run_mpi(make_plan(layout if sig is None else sig), opts, what, sig)

    def run_on_node(
        self,
        window: NodeWindow,
        plan: NodePlan,
        opts: CommunicationOptions,
        text: str,
        what: str | None = None,
        sig: _Sig | None = None,
    ) -> Any:
        """Run the node plan ``plan`` on ``window`` (its barriers compare digests; a
        mismatch raises :class:`~hpcdist.errors.CollectiveMismatchError` on every rank).

        ``sig``: the checked call's signature from :meth:`count_call` (``None``
        unchecked). Example: ``engine.run_on_node(w, plan, opts, layout.text)``.
        """
        self._check_pending(plan)
        watch = None
        if sig is not None:
            plan, watch = self._finishing(plan), sig.watch
        try:
            return run_node_plan(window, plan, opts.timeout_seconds, what or _clip(text), watch)
        except _Mismatch:
            pass  # reported below, outside the handler, so the error is not chained to it
        except (CollectiveTimeoutError, CollectiveStallWarning) as err:
            self._pending = err.request
            raise
        self.report_mismatch(window, text)

    def algorithm_for(
        self, layout: Layout, opts: CommunicationOptions, operation: str = "allreduce"
    ) -> Any:
        """The registered algorithm that runs an allreduce (or ``operation``
        ``"reduce_scatter"``) of ``layout`` with ``opts``, on host arrays.

        The first in :func:`hpcdist.collectives.registry.registered` order whose
        ``applies`` says yes. Collective on the engine's first call (topology).
        Example: ``engine.algorithm_for(layout, opts).name``.
        """
        top = self.topology(opts.timeout_seconds)
        asked = opts.implementation
        if asked is CI.AUTO:
            asked = choice.env_implementation()
        route = choice.choose(asked, top.nodes, self._size, top.largest_node, _NO_ENV)
        where = Where(top, layout, opts, route, asked is CI.AUTO, self._size, operation=operation)
        return pick(where)

    def _reduce(
        self, items: list[np.ndarray], layout: Layout, opts: CommunicationOptions, key: Any = None
    ) -> list[np.ndarray]:
        """Run the registered algorithm for this call (remembered per layout key, the
        environment variables that steer AUTO and the registry's generation)."""
        if key is None:
            algorithm = self.algorithm_for(layout, opts)
        else:
            picked_key = (key, *_steering_env(), generation())
            algorithm = self._picked.get(picked_key)
            if algorithm is None:
                algorithm = self.algorithm_for(layout, opts)
                if len(self._picked) >= LAYOUT_CACHE_SIZE:
                    self._picked.clear()
                self._picked[picked_key] = algorithm
        self.last_algorithm = algorithm.name
        fused: list[np.ndarray] = algorithm.allreduce(self, items, layout, opts)
        return fused

    def describe(self, layout: Any) -> str:
        """The call's signature line, clipped for messages. Example: ``engine.describe(lay)``."""
        return _clip(layout.text)

    def report_mismatch(self, window: NodeWindow, text: str) -> None:
        """Raise :class:`~hpcdist.errors.CollectiveMismatchError` on every rank of a node
        whose barrier found different digests (every rank of the node calls it).

        Example: ``if not agreed: engine.report_mismatch(window, layout.text)``.
        """
        window.resync()
        drive(self._comm, self._mismatch(text), None, "the mismatch report")
        raise AssertionError("unreachable")  # pragma: no cover

    def _reduce_scatter(
        self, items: list[np.ndarray], layout: Layout, opts: CommunicationOptions, bounds: list[int]
    ) -> np.ndarray:
        """This rank's block, by the first registered algorithm with a ``reduce_scatter``
        that applies (as :meth:`_reduce` picks for allreduce)."""
        algorithm = self.algorithm_for(layout, opts, "reduce_scatter")
        self.last_algorithm = algorithm.name
        block: np.ndarray = algorithm.reduce_scatter(self, items, layout, opts, bounds)
        return block

    def run_mpi(
        self, plan: Plan, opts: CommunicationOptions, what: str, sig: _Sig | None = None
    ) -> Any:
        """Drive the MPI plan ``plan`` (blocking, or polled against the timeout).

        Example: ``engine.run_mpi(plan, opts, engine.describe(layout))``.
        """
        self._check_pending(plan)
        watch = None
        if sig is not None:
            plan, watch = self._finishing(plan), sig.watch
        try:
            return drive(self._comm, plan, opts.timeout_seconds, what, watch)
        except (CollectiveTimeoutError, CollectiveStallWarning) as err:
            self._pending = err.request  # (a stall warning raised as an error: -W error)
            raise

    # -- checked mode ------------------------------------------------------

    def count_call(self, layout: Any, opts: CommunicationOptions, what: str) -> _Sig | None:
        """Count the call; in checked mode also record it on the board and return what
        the ranks compare (``None`` without a timeout: the layout's digest is enough)."""
        if self._pending is not None:
            self._check_pending(None)  # refused calls are not counted
        self._seq += 1
        if RECORDER.on:  # the flight recorder (closed by @recorded when the call returns)
            RECORDER.begin(self._flight_key, self._seq, layout, self.last_algorithm)
        timeout = opts.timeout_seconds
        if timeout is None:
            return None
        seq = self._seq
        board = self._board
        if board is not None:
            board.enter(seq, layout.text)
        watch = Watch(board, self._rank, seq, what, timeout, stall_warning_seconds(timeout))
        digest = layout.digest ^ ((seq * _MIX) & _MASK63)
        return _Sig(digest, f"{layout.text} [collective #{seq}]", watch)

    def _finishing(self, plan: Any) -> Any:
        """``plan``, then: record on the board that this rank left the call (or set the
        board up: the first checked call that every rank completed). Runs also when a
        timed-out call is finished later with ``err.request.Wait()``."""
        seq = self._seq
        result = yield from plan
        if self._board is None:
            self._make_board()
        else:
            self._board.leave(seq)
        return result

    def _make_board(self) -> None:
        """Create the arrival board (collective), on real MPI communicators only."""
        MPI = self._mpi
        if self._board is None and MPI is not None and isinstance(self._comm, MPI.Intracomm):
            self._board = ArrivalBoard(self._comm)

    def close(self) -> None:
        """Free the engine's arrival board, if checked mode made one (collective).

        Every rank calls it at the same point, before freeing the
        communicator; the engine stays usable (a later checked call sets up a
        new board). Example: ``c.close(); comm.Free()``.
        """
        if self._board is not None:
            board, self._board = self._board, None
            board.free()
        if self._device is not None:
            self._device.close()

    def _check_pending(self, plan: Any) -> None:
        """Refuse a new collective (closing its ``plan``) while a timed-out one is still
        pending on this rank."""
        if self._pending is not None:
            if not self._pending.done:
                error = CollectiveTimeoutError(
                    f"an earlier collective ({self._pending.what}) timed out (or stopped at a "
                    "stall warning raised as an error) and is still pending on this "
                    "communicator; a new one would be matched against it. "
                    "Abort the job, or call err.request.Wait() on the earlier error first"
                )
                error.request = self._pending
                if plan is not None:
                    plan.close()
                raise error
            self._pending = None

    def agreement(self, layout: Any) -> Plan:
        """Check that every rank runs the same call (``layout``: a layout or a checked
        call's :class:`_Sig`, with ``digest`` and ``text``); on every rank raise if not."""
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
        """Gather every rank's signature (error path only) and raise on every rank.

        The ranks also agree on the largest sequence number, so that checked
        calls match again after a caught mismatch."""
        MPI = self._mpi
        mine = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        gathered = np.zeros((self._size, 2), dtype=np.int64)
        sent = np.array([mine.size, self._seq], np.int64)
        yield Call("Allgather", (sent, gathered), nonblocking=True)
        self._seq = max(self._seq, int(gathered[:, 1].max()))
        counts = [int(n) for n in gathered[:, 0]]
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

    def _allgather_plan(self, moved: np.ndarray, layout: _Simple, check: Any) -> Plan:
        MPI = self._mpi
        if check:
            yield from self.agreement(check)
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
        self,
        items: list[np.ndarray],
        root: int,
        layout: _Simple,
        opts: CommunicationOptions,
        check: Any,
    ) -> Plan:
        if check:
            yield from self.agreement(check)
        buf = _aligned_bytes(layout.total)
        views = [
            buf[o : o + a.nbytes].view(a.dtype).reshape(a.shape)
            for a, o in zip(items, layout.offsets, strict=True)
        ]
        if self._rank == root:
            for view, a in zip(views, items, strict=True):
                np.copyto(view, a)
        step = opts.mpi_message_bytes or max(layout.total, 1)
        for lo in range(0, layout.total, step):
            hi = min(lo + step, layout.total)
            yield Call("Bcast", (buf[lo:hi], root))
        return views


def _broadcast_layout(items: list[np.ndarray], root: int, opts: CommunicationOptions) -> _Simple:
    offsets = []
    total = 0
    for a in items:
        offsets.append(total)
        total += -(-a.nbytes // ALIGN) * ALIGN
    text = (
        f"broadcast(root={root}, {describe_arrays(items)}, {_mode(opts)}, "
        f"mpi_message_bytes={opts.mpi_message_bytes})"
    )
    return _Simple(text, signature_hash(text), offsets=tuple(offsets), total=total)
