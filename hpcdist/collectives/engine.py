"""The collectives engine's front: allreduce, reduce_scatter, allgather, broadcast, barrier.

:class:`Collectives` runs collective operations among the ranks of one MPI
communicator, on NumPy arrays or device arrays (CuPy), in four steps per
call: normalise the inputs (framework tensors as NumPy/CuPy views, dtypes
checked, a cached fusion layout: the tensors packed per dtype into buckets,
:mod:`hpcdist.collectives.fusion`), pick the algorithm (the first of the
ordered registry, :mod:`hpcdist.collectives.registry`, whose ``applies``
says yes to the call's facts, :class:`~hpcdist.collectives.where.Where`),
run it on the engine's :class:`~hpcdist.collectives.session.Session` (which
holds what the algorithms need per communicator, agreement and checked mode
included), and deliver the results (unfused, on the inputs' devices, or
into ``out``).

Every rank receives bitwise the same results, and repeated runs give the
same bits: on a node every element is reduced in one place in rank order;
MPI floating reductions that could differ between ranks use Reduce+Bcast.
Ranks that pass different calls all raise
:class:`~hpcdist.errors.CollectiveMismatchError`; with a timeout, calls are
checked (see :mod:`hpcdist.collectives.session`).

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

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from hpcdist import arrays as interop  # torch/jax/tf arrays in, the caller's type out
from hpcdist.arrays import asarray, device_of, to_host
from hpcdist.collectives import choice, compression
from hpcdist.collectives.alltoall import alltoall as alltoall_arrays
from hpcdist.collectives.choice import ENV_CHANGES
from hpcdist.collectives.device_path import has_device_arrays
from hpcdist.collectives.fusion import Layout, unfuse
from hpcdist.collectives.inputs import check_axis, check_out, deliver, place, split_bounds
from hpcdist.collectives.inputs import host_arrays as _host_arrays
from hpcdist.collectives.inputs import plain_host_arrays as _plain_host_arrays
from hpcdist.collectives.metadata import check_dtype, describe_arrays
from hpcdist.collectives.nccl import nccl_available
from hpcdist.collectives.ops import ReduceOp, divide_mean
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions, get_default_timeout
from hpcdist.collectives.options import Default as _DefaultTimeout
from hpcdist.collectives.plans import (
    allgather_list_plan,
    allgather_plan,
    broadcast_layout,
    broadcast_plan,
)
from hpcdist.collectives.registry import Algorithm, Where, generation, pick, remembered_pick
from hpcdist.collectives.session import Session, clip, mode
from hpcdist.observe.recorder import recorded
from hpcdist.runtime import world
from hpcdist.runtime.device import is_device_array, runtime_for

_OPS = {op.name: op for op in ReduceOp} | {op.name.lower(): op for op in ReduceOp}
#: Device transports the device path knows (other algorithms' calls stage through the host).
_TRANSPORTS = frozenset({"copy", "nccl", "hierarchical", "mpi-device", "staged"})


def _reduce_op(op: Any) -> ReduceOp:
    op = _OPS.get(op, op) if op.__class__ is str else op
    return op if op.__class__ is ReduceOp else ReduceOp.from_any(op)


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
    values. With a timeout (``options.timeout_seconds``, or the process
    default, :func:`~hpcdist.collectives.options.set_default_timeout`) calls
    are checked and waits have deadlines: a
    :class:`~hpcdist.errors.CollectiveTimeoutError` then means the job should
    be aborted (MPI cannot cancel a collective); :meth:`close` frees what
    checked mode needs. Use an engine from one thread at a time.
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
        self._session = Session(comm, self)
        self._layouts = self._session.layouts  # (read here first: the hot path's one lookup)
        self._rank = self._session.rank
        self._size = self._session.size
        self._options = options if options is not None else CommunicationOptions()
        self._merged_cache: dict[Any, CommunicationOptions] = {}
        self._generation = -1  # of the process-wide default timeout the cache was built for
        self._picked: dict[int, Any] = {}  # per call digest: algorithm, what it depended on
        choice.watch_environment()  # (counts environment changes: see _reduce)

    @property
    def comm(self) -> Any:
        """The MPI communicator the collectives run on."""
        return self._session.comm

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

    @property
    def session(self) -> Session:
        """What the algorithms run on: topology, caches, agreement, checked mode."""
        return self._session

    @property
    def last_algorithm(self) -> str | None:
        """The registered algorithm (its name) that ran the last allreduce or reduce_scatter."""
        return self._session.last_algorithm

    @property
    def last_device_route(self) -> str | None:
        """The device algorithm (transport) of the last call on device arrays."""
        return self._session.last_device_route

    def __repr__(self) -> str:
        return f"Collectives(rank={self._rank}, size={self._size}, options={self._options!r})"

    def implementation_for(self, options: CommunicationOptions | None = None) -> CI:
        """The host backend (MPI, SHM or HIERARCHICAL) an allreduce with ``options`` comes
        to. Collective on the first call of the engine (it finds the topology)."""
        return self._where(None, self._merged(options)).backend

    # -- the operations --------------------------------------------------------------------

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
        """
        places = _plain_host_arrays(tensors)
        plain = places is not None
        if (not plain and interop.has_foreign(tensors)) or (
            out is not None and interop.has_foreign(out)
        ):
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
            return self._device_allreduce(tensors, op, opts, out)
        else:
            items, places = _host_arrays(tensors, "allreduce")
        if len(items) == 1:  # (the same key as the general form, without its list)
            a = items[0]
            key: tuple[Any, ...] = (op, opts, (a.shape, a.dtype))
        else:
            key = (op, opts, *[(a.shape, a.dtype) for a in items])
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._session.fused_layout(key, items, op, opts)
        if out is not None:
            out = check_out(out, layout)
        fused = self._reduce(items, layout, opts)
        results: list[Any] = [None] * len(items)
        for group, buf in zip(layout.groups, fused, strict=True):
            if op is ReduceOp.MEAN and group.wire.kind in "iu":
                buf = divide_mean(buf, self._size)
            unfuse(group, buf, layout.shapes, results)
        if plain and out is None:
            return results
        return deliver(results, places, out)

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
        op = _reduce_op(op)
        opts = self._merged(options)
        if has_device_arrays([tensor]):
            path = self._session.device_path()
            return path.reduce_scatter(tensor, op, opts, self._transport(opts, [tensor]))
        items, places = _host_arrays([tensor], "reduce_scatter")
        x = items[0]
        if x.ndim == 0:
            raise ValueError(
                "reduce_scatter needs a tensor with at least one dimension to split along "
                "axis 0; got a 0-d array. Reshape it to (1,) or use allreduce"
            )
        key = ("reduce_scatter", op, opts, x.shape, x.dtype)
        layout = self._session.fused_layout(key, items, op, opts, "reduce_scatter")
        group = layout.groups[0]
        row = (math.prod(x.shape[1:]) if x.ndim > 1 else 1) * (
            x.dtype.itemsize // group.wire.itemsize
        )
        bounds = split_bounds(x.shape[0], self._size, row)
        rows = x.shape[0] // self._size + (1 if self._rank < x.shape[0] % self._size else 0)
        algorithm = pick(self._where(layout, opts, "reduce_scatter"))
        self._session.last_algorithm = algorithm.name
        buf = algorithm.reduce_scatter(self._session, items, layout, opts, bounds)  # type: ignore[attr-defined]
        if op is ReduceOp.MEAN and group.wire.kind in "iu":
            buf = divide_mean(buf, self._size)
        if group.wire != group.dtype and group.dtype.kind in "bc":
            buf = buf.view(group.dtype)
        return place(buf.reshape((rows, *x.shape[1:])), places[0])

    @recorded
    def allgather(
        self, tensor: Any, axis: int = 0, options: CommunicationOptions | None = None
    ) -> Any:
        """Concatenate every rank's ``tensor`` along ``axis``, in rank order.

        Sizes along ``axis`` may differ between ranks (zero included); the
        other dimensions and the dtype must match. A 0-d tensor counts as
        shape ``(1,)``, so gathering scalars gives a vector of :attr:`size`
        values. ``axis`` may be negative.
        """
        if interop.has_foreign(tensor):  # torch, jax, tf: NumPy/CuPy views in, the type out
            x = interop.import_array(tensor)
            return interop.export_like(tensor, self.allgather(x, axis, options))
        opts = self._merged(options)
        if has_device_arrays([tensor]):
            check_axis(axis)
            path = self._session.device_path()
            return path.allgather(tensor, int(axis), opts, self._transport(opts, [tensor]))
        x = asarray(tensor)
        where = device_of(x)
        host = to_host(x)
        check_dtype(host.dtype, "allgather")
        if host.ndim == 0:
            host = host.reshape(1)
        check_axis(axis, host.ndim, host.shape)
        axis = int(axis) % host.ndim
        if self._size == 1:
            return place(np.array(host, copy=True), where)
        dims = ", ".join("*" if d == axis else str(n) for d, n in enumerate(host.shape))
        text = f"allgather(axis={axis}, {host.dtype}({dims}), {mode(opts)})"
        layout = self._session.call_layout(("allgather", text), text)
        moved = np.ascontiguousarray(np.moveaxis(host, axis, 0))
        what = f"allgather(axis={axis}) of {describe_arrays([host])} on this rank"
        out = self._session.run_agreed(
            layout, opts, what, lambda check: allgather_plan(self._session, moved, check)
        )
        if axis != 0:
            out = np.ascontiguousarray(np.moveaxis(out, 0, axis))
        return place(out, where)

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
        """
        items = list(tensors)
        if not items or not all(x.__class__ is np.ndarray for x in items):
            return [self.allgather(x, axis, options) for x in items]
        check_axis(axis)
        opts = self._merged(options)
        moved = []
        for x in items:
            check_dtype(x.dtype, "allgather")
            host = x.reshape(1) if x.ndim == 0 else x
            check_axis(axis, host.ndim, host.shape)
            if not host.dtype.isnative:
                host = host.astype(host.dtype.newbyteorder("="))
            a = int(axis) % host.ndim
            moved.append(np.ascontiguousarray(host if a == 0 else np.moveaxis(host, a, 0)))
        if self._size == 1:
            return [np.array(x.reshape(1) if x.ndim == 0 else x, copy=True) for x in items]
        tails = [(m.dtype, m.shape[1:]) for m in moved]
        text = "allgather(axis={}, [{}], {})".format(
            axis, ", ".join(f"{d}(*, {', '.join(map(str, t))})" for d, t in tails), mode(opts)
        )
        layout = self._session.call_layout(("allgather_list", text), text)
        what = f"allgather of {describe_arrays(items)} on this rank"
        gathered = self._session.run_agreed(
            layout, opts, what,
            lambda check: allgather_list_plan(self._session, moved, layout, check),
        )
        out = []
        for x, g in zip(items, gathered, strict=True):
            a = int(axis) % max(x.ndim, 1)
            out.append(g if a == 0 else np.ascontiguousarray(np.moveaxis(g, 0, a)))
        return out

    @recorded
    def broadcast(
        self, tensors: Sequence[Any], root: int = 0, options: CommunicationOptions | None = None
    ) -> list[Any]:
        """Rank ``root``'s arrays, to every rank.

        The other ranks' arrays give the shapes and dtypes to expect (their
        values are ignored); they must match the root's.
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
            path = self._session.device_path()
            return path.broadcast(tensors, root, opts, self._transport(opts, tensors))
        items, places = _host_arrays(tensors, "broadcast")
        if self._size == 1:
            results = [np.array(a, copy=True) for a in items]
        else:
            key = ("broadcast", root, mode(opts), opts.mpi_message_bytes) + tuple(
                (a.shape, a.dtype) for a in items
            )
            layout = self._layouts.get(key)
            if layout is None:
                layout = self._layouts[key] = broadcast_layout(items, root, opts)
            results = self._session.run_agreed(
                layout, opts, clip(layout.text),
                lambda check: broadcast_plan(self._session, items, root, layout, opts, check),
            )
        return [place(r, p) for r, p in zip(results, places, strict=True)]

    @recorded
    def alltoall(self, tensor: np.ndarray, splits: Sequence[int] | None = None) -> Any:
        """Rank ``r`` sends rows ``splits[j]`` of ``tensor`` to rank ``j``: returns ``(rows
        received in rank order, rows received from each rank)``; see
        :mod:`hpcdist.collectives.alltoall`.
        """
        return alltoall_arrays(self, tensor, splits)

    @recorded
    def barrier(self, options: CommunicationOptions | None = None) -> None:
        """Wait until every rank has reached this barrier."""
        opts = self._merged(options)
        if self._size == 1:
            return
        session = self._session
        text = f"barrier({mode(opts)})"
        layout = session.call_layout(("barrier", text), text)
        session.run_agreed(
            layout, opts, text, lambda check: session.agreement(check) if check else None
        )

    def close(self) -> None:
        """Free the engine's arrival board, if checked mode made one, and its device
        resources (collective).

        Every rank calls it at the same point, before freeing the
        communicator; the engine stays usable (a later checked call sets up a
        new board).
        """
        self._session.close()

    # -- picking -------------------------------------------------------------------------------

    def _where(
        self, layout: Layout | None, opts: CommunicationOptions, operation: str = "allreduce",
        device: Any = None,
    ) -> Where:
        """The facts of a call (collective on the engine's first call: the topology);
        ``device``: a device array of the call, for a device call."""
        size = self._size
        asked = opts.implementation
        if asked is CI.AUTO:
            asked = choice.env_implementation()
        top, nodes, largest = None, 1, 1
        if size > 1:
            top = self._session.topology(opts.timeout_seconds)
            nodes, largest = top.nodes, top.largest_node
        nccl = cuda_aware = False
        if device is not None and size > 1:
            path = self._session.device_path()
            cuda_aware = path.cuda_aware
            if asked in (CI.AUTO, CI.HIERARCHICAL):  # (NCCL refuses two ranks on one GPU)
                rt = runtime_for(device)
                nccl = not path.shares_gpu(rt, rt.device_id(device)) and nccl_available()[0]
        return Where(
            layout, opts, asked, size, nodes, largest, top, device is not None, nccl, cuda_aware,
            operation,
        )

    def _reduce(
        self, items: list[np.ndarray], layout: Layout, opts: CommunicationOptions
    ) -> list[np.ndarray]:
        """Run the registered algorithm for this call, remembered per call signature (see
        :func:`~hpcdist.collectives.registry.remembered_pick`): one lookup and two
        comparisons while the registry and the environment are unchanged."""
        known = self._picked.get(layout.digest)
        if known is None or known[1] != generation() or known[2] != ENV_CHANGES[0]:
            known = remembered_pick(
                self._picked, layout.digest, known, opts.implementation is CI.AUTO,
                lambda: self._where(layout, opts),
            )
        algorithm = known[0]
        self._session.last_algorithm = algorithm.name
        fused: list[np.ndarray] = algorithm.allreduce(self._session, items, layout, opts)
        return fused

    def _device_allreduce(
        self, tensors: Sequence[Any], op: ReduceOp, opts: CommunicationOptions, out: Any
    ) -> list[Any]:
        def choose(layout: Layout, device: Any) -> Algorithm:
            return pick(self._where(layout, opts, device=device))

        path = self._session.device_path()
        algorithm, results = path.allreduce(tensors, op, opts, out, choose)
        self._session.last_algorithm = algorithm.name  # (after: staging runs a host one)
        return results

    def _transport(self, opts: CommunicationOptions, tensors: Sequence[Any]) -> str:
        """The device algorithm the registry picks for a device call of ``opts`` without a
        layout: the transport of a device broadcast, allgather or reduce_scatter."""
        device = next(t for t in tensors if t.__class__ is not np.ndarray and is_device_array(t))
        name = pick(self._where(None, opts, device=device)).name
        return name if name in _TRANSPORTS else "staged"

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
