"""Allreduce and reduce-scatter through a node's shared window (and MPI between nodes).

Per bucket of a fused group, on the window's next set ``s``:

1. every rank packs its tensors' bytes for the bucket into its own slot
   (:func:`hpcdist.kernels.gather_bytes`, one call for all pieces);
2. barrier, which also compares the digest of the call across the node;
3. *small* buckets: every rank reduces the whole bucket from all slots,
   in rank order, straight into its result buffer — one barrier in all;
   *large* buckets: rank ``r`` reduces chunk ``r`` into the set's result
   area (reduce-scatter), barrier, then every rank copies the result out;
4. ``hierarchical``: after the reduce-scatter, the node's leader reduces the
   node's sums with the other leaders over MPI in place, and a third barrier
   releases the node. 16-bit floats (SUM, MEAN) keep the node sums in
   float32 and the leaders round once (:mod:`hpcdist.collectives.wire16`);
   with ``compression`` float32 node sums travel as 16-bit floats.

Every element is summed in one place in rank order, so all ranks receive
the same bits, run after run. Sets alternate between buckets: a rank can
only reuse a set once every rank has passed the barrier after its last use.

Each algorithm is a *node plan* (a generator that yields the barriers to
wait at and the leaders' MPI steps), run by :func:`run_node_plan`, so a
timed-out call can still be finished later, like an MPI one.

Example:
    ``run_node_plan(window, allreduce_plan(window, layout, items, n), None, "allreduce")``
    is what :class:`hpcdist.collectives.Collectives` runs for ``SHM``.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple

import numpy as np

from hpcdist.collectives.fusion import OP_CODES, BufferPool, Layout, addresses
from hpcdist.collectives.mpi_backend import (
    FIRST_SLEEP_S,
    LONGEST_SLEEP_S,
    PendingCollective,
    Plan,
    drive,
)
from hpcdist.collectives.mpi_reduce import reduce_calls
from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.shm import ALIGN, NodeWindow
from hpcdist.collectives.wire16 import compression_dtype, reduce_plan
from hpcdist.errors import CollectiveStallWarning, CollectiveTimeoutError
from hpcdist.kernels import pack_pieces, reduce_slots
from hpcdist.kernels.fold16 import fold_rows16, is_half

#: Checked mode: a node barrier spins (yielding the CPU) this long before it sleeps.
YIELDING_S = 100e-6

#: Checked mode: a waiting rank sleeps this share of the time it has waited, between checks.
SLEEP_SHARE = 0.125

#: Buckets up to this many bytes are reduced whole by every rank (one barrier).
SMALL_BUCKET_BYTES = 64 * 1024


class _Mismatch(Exception):
    """Raised inside the backend when the node's ranks passed different calls.

    Private control flow: :meth:`~hpcdist.collectives.session.Session.run_on_node` catches it
    and raises :class:`~hpcdist.errors.CollectiveMismatchError` instead.
    """


class MpiStep(NamedTuple):
    """A step of a node plan: run an MPI plan on ``comm``; its result is sent back."""

    comm: Any
    plan: Plan


#: A node plan: a generator that yields a node barrier (the call's digest,
#: an ``int``; ``agreed = yield digest``) or an :class:`MpiStep`
#: (``result = yield MpiStep(...)``), and returns its result.
NodePlan = Generator[Any, None, Any]


def _timeout_error(what: str, timeout: float | None, detail: str) -> CollectiveTimeoutError:
    return CollectiveTimeoutError(
        f"{what} did not complete within {timeout} s on this rank ({detail}): some rank has "
        "not joined it (it may have hung, crashed or skipped the call). A collective cannot "
        "be cancelled, so abort the job. Only if every rank is known to join eventually, "
        "call err.request.Wait() before the next collective"
    )


class PendingNodeCollective:
    """A node collective that timed out on this rank and may still complete.

    ``Wait()`` finishes it (blocking) and returns its result; ``Test()``
    makes progress without blocking.
    """

    def __init__(self, window: NodeWindow, plan: NodePlan, step: Any, what: str) -> None:
        self._window = window
        self._plan: NodePlan | None = plan
        self._step = step  # the barrier seq or the pending MPI collective it stopped at
        self.what = what
        self.result: Any = None

    @property
    def done(self) -> bool:
        """Whether the collective has completed on this rank."""
        return self._plan is None

    def _step_done(self, block: bool) -> tuple[bool, Any]:
        """Whether the step it stopped at is complete, and the value to send on."""
        step = self._step
        if isinstance(step, tuple):  # a node barrier: (seq, digest)
            seq, digest = step
            if not self._window.wait(seq, None if block else 0.0):
                return False, None
            return True, self._window.agreed(seq, digest)
        if block:
            step.Wait()
        elif not step.Test():
            return False, None
        return True, step.result

    def _finish(self, block: bool) -> bool:
        window = self._window
        while self._plan is not None:
            done, sent = self._step_done(block)
            if not done:
                return False
            try:
                step, value = _advance(self._plan, sent)
                while isinstance(step, int):  # further barriers: wait for them here
                    agreed, seq = window.sync(step, None if block else 0.0)
                    if agreed is None:
                        self._step = (seq, step)
                        return False
                    step, value = _advance(self._plan, agreed)
            except BaseException:
                self._plan = None
                raise
            if step is None:
                self._plan, self.result = None, value
            else:
                self._step = PendingCollective(step.comm, step.plan, _Done(), self.what)
        return True

    def Test(self) -> bool:
        """Progress without blocking; ``True`` once complete."""
        return self._finish(block=False)

    def Wait(self) -> Any:
        """Block until complete on this rank; return the result."""
        self._finish(block=True)
        return self.result

    def __repr__(self) -> str:
        return f"PendingNodeCollective({self.what}, done={self.done})"


def _advance(plan: NodePlan, sent: Any = None) -> tuple[Any, Any]:
    try:
        return plan.send(sent), None
    except StopIteration as stop:
        return None, stop.value


class _Done:
    """A request that is already complete: resuming an MPI plan that has not started."""

    def Test(self) -> bool:
        return True

    def Wait(self) -> None:
        return None


def _sync_sleeping(window: NodeWindow, digest: int, watch: Any) -> tuple[bool | None, int]:
    """A node barrier that sleeps while it waits (after :data:`YIELDING_S` of spinning),
    ticking ``watch``; ``(None, seq)`` at its deadline. The checked-mode barrier.

    Each sleep is :data:`SLEEP_SHARE` of the time waited so far (50 µs to 10 ms):
    a rank wakes at most that share late after the last rank arrives (doubling
    sleeps could oversleep by the whole wait), in a few dozen wake-ups.
    """
    start = time.monotonic()
    agreed, seq = window.sync(digest, start + YIELDING_S)  # arrive, spin briefly
    while agreed is None:
        now = time.monotonic()
        left = watch.deadline - now
        if left <= 0:
            return None, seq
        delay = min(max(FIRST_SLEEP_S, (now - start) * SLEEP_SHARE), LONGEST_SLEEP_S)
        time.sleep(min(delay, left))
        try:
            watch.tick()
        except CollectiveStallWarning as warning:  # raised as an error: -W error
            warning.at = (seq, digest)
            raise
        if window.wait(seq, 0.0):
            agreed = window.agreed(seq, digest)
    return agreed, seq


def run_node_plan(
    window: NodeWindow, plan: NodePlan, timeout: float | None, what: str, watch: Any = None
) -> Any:
    """Run ``plan``: wait at its barriers and run its leaders' steps, within ``timeout`` s.

    On a timeout raise :class:`~hpcdist.errors.CollectiveTimeoutError`
    whose ``request`` (:class:`PendingNodeCollective`) can finish the call.
    With a ``watch`` (:class:`hpcdist.collectives.arrivals.Watch`, checked
    mode) barriers sleep while they wait, stalls are reported and the
    error names the ranks that have not arrived.
    """
    if watch is not None:
        deadline: float | None = watch.deadline
    else:
        deadline = None if timeout is None else time.monotonic() + timeout
    step, value = _advance(plan)
    while step is not None:
        if isinstance(step, int):
            if watch is None:
                sent, seq = window.sync(step, deadline)
            else:
                try:
                    sent, seq = _sync_sleeping(window, step, watch)
                except CollectiveStallWarning as warning:  # raised as an error: -W error
                    warning.request = PendingNodeCollective(window, plan, warning.at, what)
                    raise
            if sent is None:
                where = f"at a node barrier, local ranks {window.missing(seq)} late"
                if watch is None:
                    error = _timeout_error(what, timeout, where)
                else:
                    error = watch.timeout_error(where)
                error.request = PendingNodeCollective(window, plan, (seq, step), what)
                raise error
        else:
            left = None if deadline is None else max(1e-6, deadline - time.monotonic())
            try:
                sent = drive(step.comm, step.plan, left, what, watch)
            except CollectiveStallWarning as warning:  # raised as an error: -W error
                warning.request = PendingNodeCollective(window, plan, warning.request, what)
                raise
            except CollectiveTimeoutError as err:
                if watch is None:
                    error = _timeout_error(what, timeout, "in an MPI step")
                else:
                    error = CollectiveTimeoutError(str(err))
                error.request = PendingNodeCollective(window, plan, err.request, what)
                raise error from None
        step, value = _advance(plan, sent)
    return value


def _chunk(m: int, n: int, itemsize: int) -> int:
    """Elements per rank in a reduce-scatter of ``m`` elements, rounded up to 64 bytes."""
    per = -(-m // n)
    unit = max(1, ALIGN // itemsize)
    return -(-per // unit) * unit


def kernel_op(op: ReduceOp, wire: np.dtype, hierarchical: bool) -> int:
    """The kernel op code (``fusion.OP_CODES``): MEAN sums first for integers (divided
    by the engine) and for the hierarchical path (divided once, after the leaders' sum)."""
    if op is ReduceOp.MEAN and (hierarchical or not (wire.kind == "f" or is_half(wire))):
        return OP_CODES[ReduceOp.SUM]
    return OP_CODES[op]


def allreduce_plan(
    window: NodeWindow,
    layout: Layout,
    items: Sequence[np.ndarray],
    divisor: int,
    leaders: Any = None,
    hierarchical: bool = False,
    first_step: MpiStep | None = None,
    pool: BufferPool | None = None,
    digest: int | None = None,
    compression: str | None = None,
) -> NodePlan:
    """The node plan reducing ``items`` (C-contiguous host arrays) across the node.

    With ``hierarchical``, node sums are combined between node leaders
    (``leaders``: their communicator on a leader, ``None`` elsewhere).
    Returns one fused wire-dtype buffer per group of ``layout``; ``divisor``
    divides MEAN sums. Raises :class:`_Mismatch` on every rank of the node
    when their digests differ. ``first_step`` (the MPI agreement check
    between nodes) runs before anything else. ``digest`` (default: the
    layout's) is what the node barriers compare. ``compression``: the
    leaders' transport of float32 sums (``CommunicationOptions.compression``).
    """
    if first_step is not None:
        yield first_step
    me, n = window.rank, window.size
    base = addresses(items)
    first = True
    out: list[np.ndarray] = []
    digest = layout.digest if digest is None else digest
    for index, group in enumerate(layout.groups):
        if pool is None:
            fused = np.empty(group.total, group.wire)
        else:
            fused = pool.take((layout.digest, index), group.total, group.wire)
        wire = group.wire
        code = kernel_op(layout.op, wire, hierarchical)
        summed = layout.op in (ReduceOp.SUM, ReduceOp.MEAN)
        wide = hierarchical and summed and is_half(wire)  # float32 node sums, one rounding
        for bucket in group.buckets:
            which = window.next_set()
            if bucket.tensor.size:
                pack_pieces(
                    window.slot_addresses[which][me], base, bucket.tensor, bucket.src,
                    bucket.nbytes, bucket.dst,
                )
            agreed = yield digest
            if first and not agreed:
                raise _Mismatch(layout.text)
            first = False
            m = bucket.hi - bucket.lo
            typed = window.slots(which, wire)
            if not hierarchical and m * wire.itemsize <= SMALL_BUCKET_BYTES:
                reduce_slots(typed, 0, m, fused, bucket.lo, code, divisor)
                continue
            result = window.result(which, wire)
            step = _chunk(m, n, wire.itemsize)
            lo, hi = me * step, min(m, (me + 1) * step)
            if wide:  # the bucket's float32 sums fit the area (fusion counts 4 bytes each)
                sums = window.result(which, np.float32)
                if lo < hi:
                    fold_rows16(typed[:, lo:hi], sums[lo:hi], code, 1)
            elif lo < hi:
                reduce_slots(typed, lo, hi, result, lo, code, divisor)
            yield digest
            if hierarchical:
                if leaders is not None and wide:
                    send = compression_dtype(compression) or np.dtype(np.float32)
                    mean = divisor if layout.op is ReduceOp.MEAN else 0
                    yield MpiStep(leaders, reduce_plan(
                        leaders, sums[:m], layout.op, send, wire, mean, out=result[:m]
                    ))
                elif leaders is not None:
                    yield MpiStep(leaders, reduce_calls(
                        leaders, result[:m], layout.op, 0, compression
                    ))
                yield digest
            np.copyto(fused[bucket.lo : bucket.hi], result[:m])
        if hierarchical and layout.op is ReduceOp.MEAN and wire.kind == "f" and not wide:
            np.divide(fused, np.asarray(divisor, dtype=wire), out=fused)
        out.append(fused)
    return out


def reduce_scatter_plan(
    window: NodeWindow,
    layout: Layout,
    item: np.ndarray,
    bounds: Sequence[int],
    divisor: int,
    digest: int | None = None,
) -> NodePlan:
    """This rank's block ``[bounds[me], bounds[me+1])`` (wire elements) of the node's reduction.

    The whole tensor goes through one slot (the caller checks that it fits):
    pack, one barrier (comparing ``digest``, default the layout's), reduce
    only the own block.
    """
    me = window.rank
    group = layout.groups[0]
    bucket = group.whole
    which = window.next_set()
    if bucket.tensor.size:
        pack_pieces(
            window.slot_addresses[which][me], addresses([item]), bucket.tensor, bucket.src,
            bucket.nbytes, bucket.dst,
        )
    agreed = yield (layout.digest if digest is None else digest)
    if not agreed:
        raise _Mismatch(layout.text)
    lo, hi = bounds[me], bounds[me + 1]
    out = np.empty(hi - lo, group.wire)
    if hi > lo:
        code = kernel_op(layout.op, group.wire, False)
        reduce_slots(window.slots(which, group.wire), lo, hi, out, 0, code, divisor)
    return out


def blocked_reduce_scatter_plan(
    window: NodeWindow,
    layout: Layout,
    item: np.ndarray,
    bounds: Sequence[int],
    divisor: int,
    digest: int | None = None,
) -> NodePlan:
    """:func:`reduce_scatter_plan` for a tensor of any size: rounds of one slot each.

    Round ``k`` carries, from every rank's block ``r``, its ``k``-th chunk of
    ``c`` elements (``c``: a slot's ``1/n``): each rank copies those chunks
    into its slot (chunk of block ``r`` at ``r * c``), one barrier, and rank
    ``r`` folds only the chunk of its own block, in rank order, straight into
    its result. So every rank reads and folds ``1/n`` of the bytes (a real
    reduce-scatter, balanced in every round), and the bits are those of the
    allreduce's fold. The sets alternate: a set is written again only after
    the next round's barrier, which every rank reaches after its fold.
    """
    me, n = window.rank, window.size
    group = layout.groups[0]
    wire = group.wire
    unit = max(1, ALIGN // wire.itemsize)
    c = max(unit, (window.slot_bytes // wire.itemsize // n) // unit * unit)
    flat = item.reshape(-1).view(np.uint8)
    size = wire.itemsize
    lengths = [bounds[r + 1] - bounds[r] for r in range(n)]
    rounds = max(1, -(-max(lengths) // c))
    code = kernel_op(layout.op, wire, False)
    out = np.empty(lengths[me], wire)
    digest = layout.digest if digest is None else digest
    for k in range(rounds):
        which = window.next_set()
        mine = window.slots(which)[me]
        for r in range(n):
            lo = bounds[r] + k * c
            hi = min(bounds[r + 1], lo + c)
            if hi > lo:
                mine[r * c * size : (r * c + hi - lo) * size] = flat[lo * size : hi * size]
        agreed = yield digest
        if k == 0 and not agreed:
            raise _Mismatch(layout.text)
        lo = k * c
        hi = min(lengths[me], lo + c)
        if hi > lo:
            at = me * c
            reduce_slots(window.slots(which, wire), at, at + hi - lo, out, lo, code, divisor)
    return out


def check_plan(
    window: NodeWindow, digest: int, text: str, comm: Any = None, then: Plan | None = None
) -> NodePlan:
    """A node barrier that checks every rank passed ``digest`` (else :class:`_Mismatch`),
    then, if given, the MPI plan ``then`` on ``comm``, whose result it returns.
    """
    agreed = yield digest
    if not agreed:
        if then is not None:
            then.close()
        raise _Mismatch(text)
    if then is not None:
        return (yield MpiStep(comm, then))
    return None
