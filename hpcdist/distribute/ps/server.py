"""The parameter-server loop: variables in NumPy arrays, updated in place, until all clients end.

:func:`serve` receives one request header at a time from any client,
receives its payloads from that client and handles it (protocol in
:mod:`~hpcdist.distribute.ps.protocol`). A request naming a variable that the
initializer has not created yet is parked, with that client's later requests
behind it, and handled once the CREATE arrives. Errors in asynchronous
requests (update, apply) are kept and reported by the client's next
synchronous request. Under ULFM (``mpirun --with-ft ulfm``) a client that
dies counts as done: the server acknowledges the failure and goes on.

Example: ``stats = serve(strategy.extended._ps_comm, roles.clients)`` on a ps rank.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps.optimizer_host import OptimizerHost
from hpcdist.distribute.ps.protocol import Live, Stored
from hpcdist.runtime import mpi
from hpcdist.runtime.failures import note_process_failure

BUCKETS = 32


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


class OpError(Exception):
    """A request that cannot be done; the message goes back to the client."""


class ClientFailed(Exception):
    """An MPI call with client ``rank`` failed because a process died (ULFM)."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.rank = rank


class _Var:
    __slots__ = ("creator", "name", "value", "version")

    def __init__(self, value: np.ndarray, name: str, creator: int) -> None:
        self.value = value
        self.name = name
        self.creator = creator
        self.version = 0

    def describe(self) -> str:
        return f"name {self.name!r}, shape {self.value.shape}, dtype {self.value.dtype}"


class Server:
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
        self.vars: dict[int, _Var] = {}
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
        self._handlers = {
            P.OP_CREATE: self._create,
            P.OP_DECLARE: self._declare,
            P.OP_PULL: self._pull,
            P.OP_UPDATE: self._update,
            P.OP_ADD_FETCH: self._add_fetch,
            P.OP_REGISTER: self._register,
            P.OP_APPLY: self._apply,
            P.OP_GATHER: self._gather,
            P.OP_APPLY_SPARSE: self._apply_sparse,
            P.OP_STATS: self._stats,
            P.OP_DONE: self._done,
        }

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
        pay = Live(self, src, P.num_payloads(h))
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
            msg = str(e) if isinstance(e, (OpError, P.PSError)) else f"{type(e).__name__}: {e}"
            what = "optimizer" if op in (P.OP_REGISTER, P.OP_APPLY) else "variable"
            msg = f"{P.OP_NAMES.get(op, op)} of {what} {int(h[P.ID])}: {msg}"
            pay.drain()
            if op in P.ASYNC_OPS:
                self.sticky.setdefault(src, []).append(msg)
            else:
                self._reply_error(src, msg)

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

    # -- replies --------------------------------------------------------------------------------
    def _reply_ok(self, src: int, version: int = 0, value: np.ndarray | None = None, count: int = 0,
                  nbytes: int = 0) -> None:  # fmt: skip
        r = self._reply
        r[:] = 0
        r[P.VERSION], r[P.COUNT], r[P.NBYTES] = version, count, nbytes
        if value is not None:
            r[P.NBYTES] = value.nbytes
            r[P.DTYPE] = P.dtype_code(value.dtype)
            P.put_shape(r, value.shape)
        self.send(r.view(np.uint8), src)

    def _reply_error(self, src: int, message: str) -> None:
        text = P.to_json_bytes(message)
        r = self._reply
        r[:] = 0
        r[P.STATUS] = 1
        r[P.MSGLEN] = text.nbytes
        self.send(r.view(np.uint8), src)
        self.send(text, src)

    # -- handlers -------------------------------------------------------------------------------
    def _var(self, var_id: int) -> _Var:
        var = self.vars.get(var_id)
        if var is None:
            raise OpError(f"no variable with id {var_id} exists on this parameter server")
        return var  # type: ignore[return-value]

    def _create(self, src: int, h: np.ndarray, pay: Any) -> None:
        vid = int(h[P.ID])
        meta = P.from_json_bytes(pay.next_bytes())
        old = self.vars.get(vid)
        if old is not None:
            raise OpError(
                f"variable id {vid} already exists ({old.describe()}, created by rank "
                f"{old.creator}); only one client (the chief, or worker 0) creates each "
                "variable, the others declare it"
            )
        dtype = P.dtype_of(int(h[P.DTYPE]))
        value = np.empty(tuple(int(x) for x in meta["shape"]), dtype)
        if value.nbytes != int(h[P.NBYTES]):
            raise OpError("the value size does not match its shape")
        pay.into(P.as_bytes(value))
        self.vars[vid] = _Var(value, str(meta["name"]), src)
        self.host.forget(vid)
        self._reply_ok(src)

    def _declare(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        meta = P.from_json_bytes(pay.next_bytes())
        mine = (str(meta["name"]), tuple(int(x) for x in meta["shape"]), P.dtype_of(h[P.DTYPE]))
        theirs = (var.name, var.value.shape, var.value.dtype)
        if mine != theirs:
            raise OpError(
                f"variable id {int(h[P.ID])} mismatch: client rank {src} declares name "
                f"{mine[0]!r}, shape {mine[1]}, dtype {mine[2]}, but the initializer (rank "
                f"{var.creator}) created {var.describe()}. Every client must create the same "
                "variables in the same order"
            )
        self._reply_ok(src, var.version)

    def _pull(self, src: int, h: np.ndarray, pay: Any) -> None:
        n = int(h[P.COUNT])
        if n == 1:
            table = [(int(h[P.ID]), int(h[P.DTYPE]), int(h[P.NBYTES]))]
        else:
            table = pay.next_bytes().view(np.int64).reshape(3, n).T.tolist()
        chosen = []
        for vid, code, nbytes in table:
            var = self._var(int(vid))
            want = P.dtype_of(int(code))
            if not (want == var.value.dtype and int(nbytes) == var.value.nbytes):
                raise OpError(
                    f"pull of variable {int(vid)} ({var.describe()}) into a {want} buffer of "
                    f"{int(nbytes)} bytes; pass an output of the variable's shape and dtype"
                )
            chosen.append(var)
        if n == 1:
            shape = P.get_shape(h)
            if shape is not None and shape != chosen[0].value.shape:
                raise OpError(
                    f"pull of variable {int(h[P.ID])} ({chosen[0].describe()}) into an output of "
                    f"shape {shape}"
                )
        self._reply_ok(src, chosen[0].version, count=n)
        if n != 1:
            self.send(np.array([v.version for v in chosen], np.int64).view(np.uint8), src)
        for var in chosen:
            self.send(P.as_bytes(var.value), src)
        self.counts["pulls"] += n

    def _incoming(self, h: np.ndarray, pay: Any, var: _Var, direct: bool) -> np.ndarray:
        """The value of an update/apply payload, shaped like ``var`` (received in place if
        ``direct`` and the dtype matches)."""
        dtype = P.dtype_of(int(h[P.DTYPE]))
        nbytes = int(h[P.NBYTES])
        shape = P.get_shape(h)
        size = var.value.size
        if not (nbytes == size * dtype.itemsize and (shape is None or shape == var.value.shape)):
            raise OpError(
                f"a value of shape {shape} and dtype {dtype} ({nbytes} bytes) for "
                f"{var.describe()}; the shapes must match"
            )
        if direct and dtype == var.value.dtype:
            pay.into(P.as_bytes(var.value))
            return var.value
        val = self.scratch(nbytes).view(dtype).reshape(var.value.shape)
        pay.into(P.as_bytes(val))
        return val

    def _update(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        mode = int(h[P.A])
        if mode not in P.UPDATE_OPS.values():
            raise OpError(f"unknown update mode {mode}")
        val = self._incoming(h, pay, var, direct=mode == P.UPDATE_OPS["assign"])
        if mode == P.UPDATE_OPS["assign"]:
            if val is not var.value:
                np.copyto(var.value, val, casting="same_kind")
        elif mode == P.UPDATE_OPS["add"]:
            np.add(var.value, val, out=var.value, casting="same_kind")
        else:
            np.subtract(var.value, val, out=var.value, casting="same_kind")
        var.version += 1
        self.counts["updates"] += 1

    def _add_fetch(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        val = self._incoming(h, pay, var, direct=False)
        np.add(var.value, val, out=var.value, casting="same_kind")
        var.version += 1
        self.counts["updates"] += 1
        self._reply_ok(src, var.version, value=var.value)
        self.send(P.as_bytes(var.value), src)

    def _register(self, src: int, h: np.ndarray, pay: Any) -> None:
        meta = P.from_json_bytes(pay.next_bytes())
        self.host.register(int(h[P.ID]), str(meta["class_name"]), meta["config"])
        self._reply_ok(src)

    def _apply(self, src: int, h: np.ndarray, pay: Any) -> None:
        opt_id, n, lr = int(h[P.ID]), int(h[P.COUNT]), P.word_float(int(h[P.A]))
        ids, versions, codes, sizes = pay.next_bytes().view(np.int64).reshape(4, n)
        problems = []
        try:
            self.host.optimizer(opt_id)
        except P.PSError as e:
            raise OpError(str(e)) from None
        for vid, version, code, nbytes in zip(ids, versions, codes, sizes, strict=True):
            var = self.vars[int(vid)]
            buf = self.scratch(int(nbytes))
            pay.into(buf)  # always consumed, so that the next gradient lines up
            try:
                dtype = P.dtype_of(int(code))
                if int(nbytes) != var.value.size * dtype.itemsize:
                    raise OpError(
                        f"a gradient of {int(nbytes)} bytes ({dtype}) for {var.describe()}"
                    )
                self.staleness.record(var.version - int(version))
                self.host.apply_dense(opt_id, int(vid), var.value, buf.view(dtype), lr, var.name)
            except (OpError, P.PSError, TypeError, ValueError) as e:
                problems.append(f"variable {int(vid)}: {e}")
                continue
            var.version += 1
            self.counts["updates"] += 1
            self.counts["applies"] += 1
        if problems:
            raise OpError("; ".join(problems))

    def _gather(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        rows = pay.next_bytes().view(np.int64)
        table = var.value
        if table.ndim == 0:
            raise OpError(f"gather needs a variable with rows; {var.describe()}")
        dtype = P.dtype_of(int(h[P.DTYPE]))
        out_shape = (rows.size, *table.shape[1:])
        nbytes = int(np.prod(out_shape, dtype=np.int64)) * table.dtype.itemsize
        if not (dtype == table.dtype and int(h[P.NBYTES]) == nbytes):
            raise OpError(
                f"gather of {rows.size} rows of {var.describe()} into a {dtype} buffer of "
                f"{int(h[P.NBYTES])} bytes; expected {table.dtype}, shape {out_shape}"
            )
        if rows.size:
            lo, hi = int(rows.min()), int(rows.max())
            if not (lo >= 0 and hi < table.shape[0]):
                raise OpError(
                    f"gather rows must lie in [0, {table.shape[0]}) for {var.describe()}; got rows "
                    f"from {lo} to {hi}"
                )
        out = self.scratch(nbytes).view(table.dtype).reshape(out_shape)
        np.take(table, rows, axis=0, out=out)
        self._reply_ok(src, var.version)
        self.send(P.as_bytes(out), src)

    def _apply_sparse(self, src: int, h: np.ndarray, pay: Any) -> None:
        var = self._var(int(h[P.ID]))
        rows = pay.next_bytes().view(np.int64)
        dtype = P.dtype_of(int(h[P.DTYPE]))
        nbytes = int(h[P.NBYTES])
        if nbytes % dtype.itemsize:
            raise OpError(f"{nbytes} bytes of {dtype} values")
        values = self.scratch(nbytes).view(dtype)
        pay.into(values.view(np.uint8))
        self.staleness.record(var.version - int(h[P.C]))
        lr = P.word_float(int(h[P.B]))
        self.host.apply_sparse(int(h[P.A]), int(h[P.ID]), var.value, rows, values, lr, var.name)
        var.version += 1
        self.counts["updates"] += 1
        self.counts["applies"] += 1

    def _stats(self, src: int, h: np.ndarray, pay: Any) -> None:
        text = P.to_json_bytes(self.stats())
        self._reply_ok(src, nbytes=text.nbytes)
        self.send(text, src)

    def _done(self, src: int, h: np.ndarray, pay: Any) -> None:
        self._finish(src)
        self._reply_ok(src)
        self._maybe_force()

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


__all__ = ["BUCKETS", "Server", "StalenessStats", "serve"]
