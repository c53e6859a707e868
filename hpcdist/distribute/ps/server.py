"""The parameter-server loop: variables in NumPy arrays, updated in place, until all clients end.

:func:`serve` receives one request header at a time from any client,
receives its payloads from that client and handles it (protocol in
:mod:`~hpcdist.distribute.ps.protocol`). A request naming a variable that the
initializer has not created yet is parked, with that client's later requests
behind it, and handled once the CREATE arrives. Errors in asynchronous
requests (update, apply) are kept and reported by the client's next
synchronous request. Under ULFM (``mpirun --with-ft ulfm``) a client that
dies counts as done: the server acknowledges the failure and goes on.
The handlers of the operations are in :mod:`~hpcdist.distribute.ps.handlers`
(checkpoints: SAVE writes this server's shard file, RESTORE loads one).

Example: ``stats = serve(strategy.extended._ps_comm, roles.clients)`` on a ps rank.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps.handlers import Handlers, OpError, Var
from hpcdist.distribute.ps.optimizer_host import OptimizerHost
from hpcdist.distribute.ps.payloads import Live, Stored
from hpcdist.errors import PSClientFailedError
from hpcdist.runtime import mpi
from hpcdist.runtime.failures import note_process_failure

BUCKETS = 32
_CHECKPOINT_OPS = frozenset({P.OP_SYNC, P.OP_LIST, P.OP_SAVE, P.OP_RESTORE})


class StalenessStats:
    """Staleness of applied gradients: count, sum, max and a histogram (last bucket = overflow).

    Example:
        >>> s = StalenessStats(buckets=4)
        >>> for x in (0, 1, 1, 9):
        ...     s.record(x)
        >>> s.as_dict()["staleness_hist"], s.as_dict()["staleness_max"]
        ([1, 2, 0, 1], 9)
    """

    def __init__(self, buckets: int = BUCKETS) -> None:
        self.count = 0
        self.total = 0
        self.max = 0
        self.hist = [0] * buckets

    def record(self, staleness: int) -> None:
        """Count one gradient computed ``staleness`` versions ago (negative counts as 0)."""
        s = max(0, int(staleness))
        self.count += 1
        self.total += s
        self.max = max(self.max, s)
        self.hist[min(s, len(self.hist) - 1)] += 1

    def as_dict(self) -> dict[str, Any]:
        """The ``staleness_*`` entries of the stats."""
        return {
            "staleness_count": self.count,
            "staleness_sum": self.total,
            "staleness_max": self.max,
            "staleness_hist": list(self.hist),
        }


#: An MPI call with client ``rank`` failed because a process died (ULFM).
ClientFailed = PSClientFailedError


class Server(Handlers):
    """One parameter server's state and loop (see :func:`serve`).

    Example: ``Server(comm, clients=[1, 2]).run()`` returns the final stats.
    """

    def __init__(self, comm: Any, clients: Sequence[int]) -> None:
        self.MPI = mpi()
        self.comm = comm
        self.clients = tuple(int(c) for c in clients)
        me = comm.Get_rank()
        size = comm.Get_size()
        bad = [c for c in self.clients if not 0 <= c < size or c == me]
        if not self.clients or bad or len(set(self.clients)) != len(self.clients):
            raise ValueError(
                f"serve: clients must be distinct ranks of the communicator (size {size}) other "
                f"than this server (rank {me}); got {list(self.clients)}"
            )
        comm.Set_errhandler(self.MPI.ERRORS_RETURN)
        self._failed_classes = {self.MPI.ERR_PROC_FAILED, self.MPI.ERR_PROC_FAILED_PENDING}
        self.vars: dict[int, Var] = {}
        self.host = OptimizerHost()
        self.done: set[int] = set()
        self.failed: set[int] = set()
        self.parked: dict[int, deque] = {c: deque() for c in self.clients}
        self.sticky: dict[int, list[str]] = {}
        self.staleness = StalenessStats()
        self.counts = {"updates": 0, "applies": 0, "pulls": 0}
        self._hdr = np.zeros(P.HEADER_WORDS, np.int64)
        self._reply = np.zeros(P.HEADER_WORDS, np.int64)
        self._scratch = np.empty(0, np.uint8)
        self._status = self.MPI.Status()
        self._staged: dict[int, Any] = {}  # checkpoint restores staged per client
        self._handlers = self._handler_table()

    # -- MPI calls that turn a dead peer into ClientFailed --------------------------------------
    def _failure(self, e: Exception) -> bool:
        return isinstance(e, self.MPI.Exception) and e.Get_error_class() in self._failed_classes

    def send(self, buf: np.ndarray, dest: int, tag: int = P.TAG_REPLY) -> None:
        try:
            self.comm.Send([buf, self.MPI.BYTE], dest, tag)
        except self.MPI.Exception as e:
            if self._failure(e):
                raise ClientFailed(dest) from e
            raise

    def recv_payload(self, buf: np.ndarray, src: int) -> None:
        """Receive the next payload of ``src`` into the uint8 array ``buf`` (exact size)."""
        st = self._status
        try:
            self.comm.Recv([buf, self.MPI.BYTE], src, P.TAG_PAYLOAD, st)
        except self.MPI.Exception as e:
            if self._failure(e):
                raise ClientFailed(src) from e
            raise OpError(f"receiving a payload of {buf.nbytes} bytes failed: {e}") from None
        got = st.Get_count(self.MPI.BYTE)
        if got != buf.nbytes:
            raise OpError(f"a payload has {got} bytes; the header announced {buf.nbytes}")

    def probe_payload(self, src: int) -> int:
        """The size in bytes of the next payload of ``src``."""
        try:
            self.comm.Probe(src, P.TAG_PAYLOAD, self._status)
        except self.MPI.Exception as e:
            if self._failure(e):
                raise ClientFailed(src) from e
            raise
        return self._status.Get_count(self.MPI.BYTE)

    def scratch(self, nbytes: int) -> np.ndarray:
        """A reusable uint8 buffer of ``nbytes`` (valid until the next call)."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch[:nbytes]

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Serve until every client sent DONE or failed; returns :meth:`stats`."""
        MPI = self.MPI
        st = MPI.Status()
        while len(self.done) < len(self.clients):
            try:
                self.comm.Recv([self._hdr, MPI.INT64_T], MPI.ANY_SOURCE, P.TAG_HEADER, st)
            except MPI.Exception as e:
                if not self._failure(e):
                    raise
                self._acknowledge_failures(None)
                continue
            self._serve_one(st.Get_source(), self._hdr)
        return self.stats()

    def _serve_one(self, src: int, h: np.ndarray) -> None:
        try:
            head = P.check_request(h)
        except P.MessageError as e:  # no payload count to trust: reply and read nothing more
            self._bad_header(src, h, e)
            return
        pay = Live(self, src, P.num_payloads(h), head.length)
        try:
            if src not in self.parked or src in self.done:
                pay.drain()  # a stray request from a finished or unknown rank
                return
            if self.parked[src] or self._missing(h, pay):
                self.parked[src].append((h.copy(), Stored(pay.rest())))
                self._maybe_force()
                return
            self._execute(src, h, pay)
            if int(h[P.OP]) == P.OP_CREATE:
                self._unpark(force=False)
        except ClientFailed as e:
            self._acknowledge_failures(e.rank)

    def _bad_header(self, src: int, h: np.ndarray, error: Exception) -> None:
        try:
            if src in self.parked and src not in self.done:
                self._reply_error(src, f"malformed request header: {error}")
        except ClientFailed as e:
            self._acknowledge_failures(e.rank)

    def _missing(self, h: np.ndarray, pay: Any) -> list[int]:
        op = int(h[P.OP])
        if op in (P.OP_DECLARE, P.OP_UPDATE, P.OP_ADD_FETCH, P.OP_GATHER, P.OP_APPLY_SPARSE):
            ids = [int(h[P.ID])]
        elif op == P.OP_PULL and int(h[P.COUNT]) == 1:
            ids = [int(h[P.ID])]
        elif op in (P.OP_PULL, P.OP_APPLY):
            ids = [int(i) for i in pay.peek_int64()[: int(h[P.COUNT])]]
        else:
            return []
        return [i for i in ids if i not in self.vars]

    def _execute(self, src: int, h: np.ndarray, pay: Any) -> None:
        op = int(h[P.OP])
        try:
            if op not in self._handlers:
                raise OpError(f"unknown request {op}; the client and server versions differ")
            earlier = self.sticky.pop(src, None)
            if earlier and op not in P.ASYNC_OPS:
                pay.drain()
                if op == P.OP_DONE:
                    self._finish(src)
                    self._maybe_force()
                raise OpError(
                    "an earlier asynchronous request of this client failed on the parameter "
                    "server: " + "; ".join(earlier)
                )
            if earlier:
                self.sticky[src] = earlier
            self._handlers[op](src, h, pay)
        except ClientFailed:
            raise
        except Exception as e:  # the server survives any bad request
            status = P.error_status(e)
            plain = isinstance(e, (OpError, P.PSError)) or status != P.STATUS_ERROR
            msg = str(e) if plain else f"{type(e).__name__}: {e}"
            if op in _CHECKPOINT_OPS:
                msg = f"{P.OP_NAMES[op]}: {msg}"
            else:
                what = "optimizer" if op in (P.OP_REGISTER, P.OP_APPLY) else "variable"
                msg = f"{P.OP_NAMES.get(op, op)} of {what} {int(h[P.ID])}: {msg}"
            pay.drain()
            if op in P.ASYNC_OPS:
                self.sticky.setdefault(src, []).append(msg)
            else:
                self._reply_error(src, msg, status)

    # -- parking --------------------------------------------------------------------------------
    def _unpark(self, force: bool) -> None:
        progress = True
        while progress:
            progress = False
            for src in self.clients:
                queue = self.parked[src]
                while queue:
                    h, pay = queue[0]
                    missing = self._missing(h, pay)
                    if missing and not force:
                        break
                    queue.popleft()
                    progress = True
                    try:
                        if missing:
                            self._never_created(src, h, pay, missing)
                        else:
                            self._execute(src, h, pay)
                    except ClientFailed as e:
                        self._acknowledge_failures(e.rank)
                        break

    def _never_created(self, src: int, h: np.ndarray, pay: Any, missing: list[int]) -> None:
        msg = (
            f"{P.OP_NAMES.get(int(h[P.OP]))}: variable ids {missing} were never created on this "
            "parameter server: the initializing client (the chief, or worker 0) finished or is "
            "waiting without creating them. Every client must create the same variables in the "
            "same order"
        )
        if int(h[P.OP]) in P.ASYNC_OPS:
            self.sticky.setdefault(src, []).append(msg)
        else:
            self._reply_error(src, msg)

    def _maybe_force(self) -> None:
        """Fail parked requests when every live client waits on one: nobody can CREATE any more."""
        live = [c for c in self.clients if c not in self.done]
        if live and all(
            self.parked[c] and int(self.parked[c][-1][0][P.OP]) not in P.ASYNC_OPS for c in live
        ):
            self._unpark(force=True)

    def _acknowledge_failures(self, rank: int | None) -> None:
        """ULFM: acknowledge the failed processes, count failed clients as done."""
        ranks: list[int] = [] if rank is None else [rank]
        try:
            group, everyone = self.comm.Get_failed(), self.comm.Get_group()
            self.comm.Ack_failed()
            note_process_failure()
            ranks += group.Translate_ranks(list(range(group.Get_size())), everyone)
            group.Free()
            everyone.Free()
        except self.MPI.Exception:
            pass
        for r in ranks:
            if r in self.parked and r not in self.done:
                self.failed.add(r)
                self._finish(r)
                self.parked[r].clear()
                self.sticky.pop(r, None)
        self._maybe_force()

    def _finish(self, src: int) -> None:
        self.done.add(src)
        self._staged.pop(src, None)

    # -- replies --------------------------------------------------------------------------------
    def _reply_ok(self, src: int, version: int = 0, value: np.ndarray | None = None, count: int = 0,
                  nbytes: int = 0) -> None:  # fmt: skip
        r = P.M.new_header(P.OP_REPLY, out=self._reply)
        r[P.VERSION], r[P.COUNT], r[P.NBYTES] = version, count, nbytes
        if value is not None:
            r[P.NBYTES] = value.nbytes
            r[P.DTYPE] = P.dtype_code(value.dtype)
            P.put_shape(r, value.shape)
        r[P.LENGTH] = r[P.NBYTES]
        self.send(r.view(np.uint8), src)

    def _reply_json(self, src: int, obj: Any) -> None:
        """A success reply whose data is ``obj`` as a message value (NBYTES says how long)."""
        text = P.to_json_bytes(obj)
        self._reply_ok(src, nbytes=text.nbytes)
        self.send(text, src)

    def _reply_error(self, src: int, message: str, status: int = P.STATUS_ERROR) -> None:
        text = P.to_json_bytes(message)
        r = P.M.new_header(P.OP_REPLY, length=text.nbytes, out=self._reply)
        r[P.STATUS] = status
        r[P.MSGLEN] = text.nbytes
        self.send(r.view(np.uint8), src)
        self.send(text, src)

    def stats(self) -> dict[str, Any]:
        """Counts so far: updates (version increments), applies (optimizer steps), pulls
        (variables read), staleness, variables held and failed clients.

        Example: ``server.stats()["staleness_max"]``.
        """
        return {
            **self.counts,
            **self.staleness.as_dict(),
            "variables": len(self.vars),
            "failed_clients": sorted(self.failed),
        }


def serve(comm: Any, clients: Sequence[int]) -> dict[str, Any]:
    """Run a parameter server on ``comm`` until every client in ``clients`` is done.

    ``comm`` is a communicator used for nothing else (the strategy's
    ``extended._ps_comm``); ``clients`` are its ranks that send requests. A
    client is done when it sent DONE (:meth:`PSClient.close`) or, under ULFM,
    when it failed. Returns the final stats (``updates``, ``applies``,
    ``pulls``, ``staleness_count/sum/max/hist``, ``variables``, ``failed_clients``).

    Example: ``stats = serve(comm, clients=[1, 2, 3])`` on rank 0.
    """
    return Server(comm, clients).run()


__all__ = ["BUCKETS", "ClientFailed", "OpError", "Server", "StalenessStats", "serve"]
