"""What the collective algorithms need of one communicator: the engine's session.

A :class:`Session` belongs to one :class:`~hpcdist.collectives.Collectives`
(the user's front) and holds the per-communicator state and services the
algorithms (:mod:`hpcdist.collectives.algorithms`) and the device path run
on; they receive the session, never the front (as Horovod's operations
receive its global state, never its operation manager):

* where the ranks are (:meth:`Session.topology`: nodes, the node's shared
  window, the node leaders' communicator), found collectively on first use;
* the caches: fusion layouts (:meth:`Session.fused_layout`), call signatures
  (:meth:`Session.call_layout`) and result buffers (:attr:`Session.buffers`:
  a result the caller still holds is never reused);
* running MPI and node plans after the ranks agree on the call
  (:meth:`Session.run_agreed`, :meth:`Session.run_on_node`, :meth:`Session.run_mpi`,
  :meth:`Session.agreement`, :meth:`Session.report_mismatch`);
* call counting and checked mode (:meth:`Session.count_call`, the arrival board);
* the device half (:meth:`Session.device_path`: NCCL communicators, pinned buffers).

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
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from hpcdist.collectives import choice
from hpcdist.collectives.arrivals import ArrivalBoard, Watch
from hpcdist.collectives.device_path import DevicePath
from hpcdist.collectives.fusion import BufferPool, Layout, addresses, build_layout, data_address
from hpcdist.collectives.fusion import wire_dtype as _wire_dtype
from hpcdist.collectives.metadata import describe_arrays, mismatch_message, signature_hash
from hpcdist.collectives.mpi_backend import Call, PendingCollective, Plan, drive, poll
from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.options import CommunicationOptions, stall_warning_seconds
from hpcdist.collectives.shm import NodeWindow, node_comm_of, shared_window
from hpcdist.collectives.shm_backend import NodePlan, _Mismatch, check_plan, run_node_plan
from hpcdist.errors import CollectiveMismatchError, CollectiveStallWarning, CollectiveTimeoutError
from hpcdist.kernels import pack_pieces
from hpcdist.observe.recorder import RECORDER, engine_key
from hpcdist.runtime import mpi

LAYOUT_CACHE_SIZE = 1024
WHAT_CHARS = 300  # characters of a call's description in a timeout error
_MASK63 = (1 << 63) - 1
_MIX = 0x9E3779B97F4A7C15  # spreads sequence numbers over the digest bits


class SimpleLayout(NamedTuple):
    """The signature of a call that needs no fusion layout (allgather, broadcast, barrier)."""

    text: str
    digest: int
    offsets: tuple[int, ...] = ()  # broadcast: byte offset of each tensor
    total: int = 0  # broadcast: bytes in all


class Signature(NamedTuple):
    """What the ranks compare for one checked call: digest and text with its sequence number."""

    digest: int
    text: str
    watch: Watch


class Topology(NamedTuple):
    """Where the session's ranks are, found once (collectively) at its first call."""

    nodes: int
    largest_node: int
    window: NodeWindow | None  # this node's shared window (None: one rank per node)
    leaders: Any  # several nodes: the node leaders' communicator on a leader, else None
    node_rank: int
    node: Any = None  # the communicator of this rank's node


class HostPath(Protocol):
    """The host (NumPy) operations the device path stages through: the engine's front."""

    def allreduce(self, tensors: Sequence[Any], op: Any, options: Any = None, *,
                  out: Any = None) -> list[Any]: ...

    def broadcast(self, tensors: Sequence[Any], root: int = 0, options: Any = None) -> list[Any]:
        ...

    def allgather(self, tensor: Any, axis: int = 0, options: Any = None) -> Any: ...

    def reduce_scatter(self, tensor: Any, op: Any, options: Any = None) -> Any: ...


def mode(options: CommunicationOptions) -> str:
    """``"timeout set"`` or ``"no timeout"``: the part of a signature the mode adds."""
    return "timeout set" if options.timeout_seconds is not None else "no timeout"


def clip(text: str) -> str:
    """``text`` cut to :data:`WHAT_CHARS` characters for messages."""
    return text if len(text) <= WHAT_CHARS else text[: WHAT_CHARS - 1] + "…"


class Session:
    """The state and services of one communicator that the algorithms run on.

    Args:
        comm: an mpi4py communicator (or one with ``Get_rank``/``Get_size``).
        host: the host operations device calls stage through (the engine's front).
    """

    def __init__(self, comm: Any, host: HostPath) -> None:
        self.comm = comm
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())
        self.host = host
        self.mpi: Any = mpi() if self.size > 1 else None
        #: Collectives run on the communicator (both modes); ranks compare it when checked.
        self.seq = 0
        #: Fusion layouts and call signatures, by the key of the call they belong to.
        self.layouts: dict[tuple[Any, ...], Any] = {}
        self._pool = BufferPool()
        self._pending: PendingCollective | None = None
        self._topology: Topology | None = None
        self._board: ArrivalBoard | None = None  # checked mode only
        self._device: DevicePath | None = None  # the device-array half, made on first use
        #: The device transport of the last call on device arrays.
        self.last_device_route: str | None = None
        #: The algorithm the front picked for the last allreduce or reduce_scatter.
        self.last_algorithm: str | None = None
        self.flight_key = engine_key(self.size)  # names the communicator in flight records

    # -- where the ranks are -----------------------------------------------------------

    def topology(self, timeout: float | None = None) -> Topology:
        """The node layout of the communicator (collective on the first call).

        The first call also sets up the arrival board when any rank's call
        has a ``timeout`` (is checked). Its set-up calls block, so with a
        timeout every rank first meets in a polled ``Ibarrier``: a rank that
        never arrives gives a :class:`CollectiveTimeoutError` here too."""
        if self._topology is None:
            comm = self.comm
            checked = timeout is not None
            if timeout is not None and self.size > 1:
                self._meet_before_setup(timeout)
            node, host_ranks = node_comm_of(comm)
            local_rank, local_size = node.Get_rank(), node.Get_size()
            mine = np.array([local_size if local_rank == 0 else 0, int(checked)], np.int64)
            gathered = np.zeros((self.size, 2), np.int64)
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
                MPI = self.mpi
                color = 0 if local_rank == 0 else MPI.UNDEFINED
                lead = comm.Split(color, key=self.rank)
                leaders = None if lead == MPI.COMM_NULL else lead
            self._topology = Topology(nodes, largest, window, leaders, local_rank, node)
        return self._topology

    def assume_topology(self, topology: Topology) -> None:
        """Use ``topology`` instead of finding it (tests on fake communicators)."""
        self._topology = topology

    def _meet_before_setup(self, timeout: float) -> None:
        request = self.comm.Ibarrier()
        if not poll(request, time.monotonic() + timeout):
            error = CollectiveTimeoutError(
                f"the first collective of this engine did not start within {timeout} s on rank "
                f"{self.rank}: some of the {self.size} ranks never called it (hung, crashed "
                "or skipped it), so the node layout could not be set up. Abort the job"
            )
            error.request = request
            raise error

    def device_path(self) -> DevicePath:
        """The device-array half (made on first use), see :class:`DevicePath`."""
        if self._device is None:
            self._device = DevicePath(self)
        return self._device

    # -- caches --------------------------------------------------------------------------

    @property
    def buffers(self) -> BufferPool:
        """The result buffers, reused once the caller dropped a result."""
        return self._pool

    def fused_layout(
        self,
        key: tuple[Any, ...],
        items: Sequence[Any],
        op: ReduceOp,
        opts: CommunicationOptions,
        operation: str = "allreduce",
    ) -> Layout:
        """The fusion layout of ``items`` cached under ``key`` (built on first use).

        ``key`` must name everything the layout depends on (op, options,
        shapes and dtypes)."""
        layout = self.layouts.get(key)
        if layout is not None:
            return layout
        for i, a in enumerate(items):
            try:
                _wire_dtype(a.dtype, op)
            except TypeError as err:
                raise TypeError(f"{operation} (tensor {i}): {err}") from None
        bucket = opts.bytes_per_pack or choice.DEFAULT_BUCKET_BYTES
        if self.size > 1:
            window = self.topology(opts.timeout_seconds).window
            if window is not None:
                bucket = min(bucket, window.slot_bytes)
        message = f", mpi_message_bytes={opts.mpi_message_bytes}" if opts.mpi_message_bytes else ""
        if opts.compression:
            message += f", compression={opts.compression}"
        text = (
            f"{operation}(op={op.name}, {describe_arrays(items)}, {mode(opts)}, "
            f"bytes_per_pack={opts.bytes_per_pack}, implementation={opts.implementation.name}"
            f"{message})"
        )
        layout = build_layout(items, op, bucket, text)
        if len(self.layouts) >= LAYOUT_CACHE_SIZE:
            self.layouts.clear()
        self.layouts[key] = layout
        return layout

    def call_layout(self, key: tuple[Any, ...], text: str, **extra: Any) -> SimpleLayout:
        """The cached signature (text, digest) of a call that needs no fusion layout."""
        layout = self.layouts.get(key)
        if layout is None:
            layout = self.layouts[key] = SimpleLayout(text, signature_hash(text), **extra)
        return layout

    @staticmethod
    def pack_group(
        group: Any, items: Sequence[np.ndarray], buf: np.ndarray | None = None
    ) -> np.ndarray:
        """The group's tensors copied into one flat wire-dtype buffer (``buf``, else a new one)."""
        if buf is None:
            buf = np.empty(group.total, group.wire)
        whole = group.whole
        if whole.tensor.size:
            pack_pieces(
                data_address(buf), addresses(items), whole.tensor, whole.src, whole.nbytes,
                whole.dst,
            )
        return buf

    @staticmethod
    def describe(layout: Any) -> str:
        """The call's signature line, clipped for messages."""
        return clip(layout.text)

    # -- running plans ---------------------------------------------------------------------

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
                    top.window, layout.digest, layout.text, self.comm, make_plan(False)
                )
                return self.run_on_node(top.window, plan, opts, layout.text, what)
            plan = check_plan(top.window, sig.digest, sig.text, self.comm, make_plan(False))
            return self.run_on_node(top.window, plan, opts, sig.text, what, sig)
        return self.run_mpi(make_plan(layout if sig is None else sig), opts, what, sig)

    def run_on_node(
        self,
        window: NodeWindow,
        plan: NodePlan,
        opts: CommunicationOptions,
        text: str,
        what: str | None = None,
        sig: Signature | None = None,
    ) -> Any:
        """Run the node plan ``plan`` on ``window`` (its barriers compare digests; a
        mismatch raises :class:`~hpcdist.errors.CollectiveMismatchError` on every rank).

        ``sig``: the checked call's signature from :meth:`count_call` (``None`` unchecked)."""
        self._check_pending(plan)
        watch = None
        if sig is not None:
            plan, watch = self._finishing(plan), sig.watch
        try:
            return run_node_plan(window, plan, opts.timeout_seconds, what or clip(text), watch)
        except _Mismatch:
            pass  # reported below, outside the handler, so the error is not chained to it
        except (CollectiveTimeoutError, CollectiveStallWarning) as err:
            self._pending = err.request
            raise
        self.report_mismatch(window, text)

    def run_mpi(
        self, plan: Plan, opts: CommunicationOptions, what: str, sig: Signature | None = None
    ) -> Any:
        """Drive the MPI plan ``plan`` (blocking, or polled against the timeout)."""
        self._check_pending(plan)
        watch = None
        if sig is not None:
            plan, watch = self._finishing(plan), sig.watch
        try:
            return drive(self.comm, plan, opts.timeout_seconds, what, watch)
        except (CollectiveTimeoutError, CollectiveStallWarning) as err:
            self._pending = err.request  # (a stall warning raised as an error: -W error)
            raise

    def report_mismatch(self, window: NodeWindow, text: str) -> None:
        """Raise :class:`~hpcdist.errors.CollectiveMismatchError` on every rank of a node
        whose barrier found different digests (every rank of the node calls it)."""
        window.resync()
        drive(self.comm, self._mismatch(text), None, "the mismatch report")
        raise AssertionError("unreachable")  # pragma: no cover

    def agreement(self, layout: Any) -> Plan:
        """Check that every rank runs the same call (``layout``: a layout or a checked
        call's :class:`Signature`, with ``digest`` and ``text``); on every rank raise if not."""
        MPI = self.mpi
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
        MPI = self.mpi
        mine = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        gathered = np.zeros((self.size, 2), dtype=np.int64)
        sent = np.array([mine.size, self.seq], np.int64)
        yield Call("Allgather", (sent, gathered), nonblocking=True)
        self.seq = max(self.seq, int(gathered[:, 1].max()))
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

    # -- checked mode ------------------------------------------------------------------------

    @property
    def board(self) -> ArrivalBoard | None:
        """The arrival board of checked mode (``None`` until a checked call completed)."""
        return self._board

    def count_call(self, layout: Any, opts: CommunicationOptions, what: str) -> Signature | None:
        """Count the call; in checked mode also record it on the board and return what
        the ranks compare (``None`` without a timeout: the layout's digest is enough)."""
        if self._pending is not None:
            self._check_pending(None)  # refused calls are not counted
        self.seq += 1
        if RECORDER.on:  # the flight recorder (closed by the front's @recorded on return)
            RECORDER.begin(self.flight_key, self.seq, layout, self.last_algorithm)
        timeout = opts.timeout_seconds
        if timeout is None:
            return None
        seq = self.seq
        board = self._board
        if board is not None:
            board.enter(seq, layout.text)
        watch = Watch(board, self.rank, seq, what, timeout, stall_warning_seconds(timeout))
        digest = layout.digest ^ ((seq * _MIX) & _MASK63)
        return Signature(digest, f"{layout.text} [collective #{seq}]", watch)

    def _finishing(self, plan: Any) -> Any:
        """``plan``, then: record on the board that this rank left the call (or set the
        board up: the first checked call that every rank completed). Runs also when a
        timed-out call is finished later with ``err.request.Wait()``."""
        seq = self.seq
        result = yield from plan
        if self._board is None:
            self._make_board()
        else:
            self._board.leave(seq)
        return result

    def _make_board(self) -> None:
        """Create the arrival board (collective), on real MPI communicators only."""
        MPI = self.mpi
        if self._board is None and MPI is not None and isinstance(self.comm, MPI.Intracomm):
            self._board = ArrivalBoard(self.comm)

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

    def close(self) -> None:
        """Free the arrival board, if checked mode made one, and the device half (collective)."""
        if self._board is not None:
            board, self._board = self._board, None
            board.free()
        if self._device is not None:
            self._device.close()
