"""The timeline: every rank writes a Chrome trace of its collectives, phases and I/O.

Off by default; on with ``HPCDIST_TIMELINE=DIR`` (from the start of the run),
``hd.experimental.timeline(DIR)`` (a context manager) or
``hd.experimental.start_timeline(DIR)`` / ``stop_timeline()``. Then rank ``R``
writes ``DIR/rank-R.json`` (Chrome trace event JSON: open it in
https://ui.perfetto.dev or ``chrome://tracing``) with:

* every collective (track ``collectives``): name, bytes, description
  (dtypes, shapes), algorithm, sequence number;
* ``fit`` phases (track ``phases``): ``step``, ``input``,
  ``forward+backward``, ``optimizer`` (with ``gradient reduction`` inside),
  ``callbacks``;
* adapter buckets (``hook fired`` -> ``bucket ready`` -> ``reduced``),
  checkpoint writes and parameter-server requests.

``hpcdist timeline merge DIR -o run.json`` merges the ranks into one trace
(one track per rank, clocks aligned) and splits each collective into the
time it waited for the last rank to arrive and the transfer; ``hpcdist
timeline report DIR`` prints where each rank's step time goes and which
ranks the others waited for (:mod:`hpcdist.observe.analysis`).

When off, the cost is one flag check per collective and per phase
(``if timeline.active``). Times are ``time.perf_counter`` in microseconds;
each file records its rank's clock offset to rank 0 (estimated by MPI
ping-pongs with rank 0 when the timeline starts) and its wall-clock pairing.

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> path = start(d, rank=0, size=1)
    >>> with span("input"):
    ...     pass
    >>> stop() == path
    True
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from typing import Any

ENV_VAR = "HPCDIST_TIMELINE"
FLUSH_EVENTS = 4096  # buffered events before a write

#: Whether the timeline is on (the one check callers make).
active = False

TRACKS = {"collectives": 1, "phases": 2, "buckets": 3, "checkpoint": 4, "ps": 5}


class _Writer:
    """The open trace file of this rank."""

    def __init__(self, path: str, rank: int, size: int, offset: float) -> None:
        self.path = path
        self.rank = rank
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.file = open(path, "w")  # noqa: SIM115 (closed by close())
        self.first = True
        self.file.write("[\n")
        meta = {
            "rank": rank, "size": size, "host": socket.gethostname(), "pid": os.getpid(),
            "clock_offset_us": offset * 1e6,
            "wall_minus_perf_us": (time.time() - time.perf_counter()) * 1e6,
        }
        self.add({"name": "process_name", "ph": "M", "pid": rank,
                  "args": {"name": f"rank {rank} ({meta['host']})"}})
        self.add({"name": "process_sort_index", "ph": "M", "pid": rank,
                  "args": {"sort_index": rank}})
        self.add({"name": "hpcdist_clock", "ph": "M", "pid": rank, "args": meta})
        for name, tid in TRACKS.items():
            self.add({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                      "args": {"name": name}})
        self.flush()

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if len(self.events) >= FLUSH_EVENTS:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            events, self.events = self.events, []
            parts = []
            for e in events:
                parts.append(("" if self.first else ",\n") + json.dumps(e, separators=(",", ":")))
                self.first = False
            self.file.write("".join(parts))
            self.file.flush()

    def close(self) -> None:
        self.flush()
        self.file.write("\n]\n")
        self.file.close()


_writer: _Writer | None = None
_sinks: list[list[dict[str, Any]]] = []  # in-memory listeners (hd.callbacks.StepStats)
_rank = 0


def _set_active() -> None:
    global active
    active = _writer is not None or bool(_sinks)


def add_sink(sink: list[dict[str, Any]], rank: int) -> None:
    """Also append every event to ``sink`` (turns the timeline on; no file unless started).

    Example: ``events = []; add_sink(events, world.rank)``.
    """
    global _rank
    _rank = int(rank)
    _sinks.append(sink)
    _set_active()


def remove_sink(sink: list[dict[str, Any]]) -> None:
    """Stop appending events to ``sink``. Example: ``remove_sink(events)``."""
    if any(s is sink for s in _sinks):
        _sinks[:] = [s for s in _sinks if s is not sink]
    _set_active()


def estimate_offset(comm: Any, rounds: int = 8) -> float:
    """Seconds to add to this rank's ``perf_counter`` to read rank 0's clock (collective).

    Ranks all on one host share the clock (offset 0). Otherwise, after a
    barrier, rank 0 exchanges ``rounds`` ping-pongs with each rank in turn;
    each rank keeps the round with the shortest round trip (the one least
    disturbed by scheduling) and takes rank 0's reading minus the midpoint
    of its own two. Example: ``estimate_offset(comm)``.
    """
    if comm is None or comm.Get_size() == 1:
        return 0.0
    import numpy as np  # lazy: keeps this module stdlib-only until a timeline starts

    rank, size = comm.Get_rank(), comm.Get_size()
    host = socket.gethostname()
    if all(h == host for h in comm.allgather(host)):
        return 0.0  # one host: CLOCK_MONOTONIC (perf_counter) is the same clock for all
    buf = np.zeros(1, np.float64)
    best, offset = float("inf"), 0.0
    comm.Barrier()
    if rank == 0:
        for peer in range(1, size):
            for _ in range(rounds):
                comm.Recv(buf, source=peer, tag=7301)
                buf[0] = time.perf_counter()
                comm.Send(buf, dest=peer, tag=7302)
    else:
        for _ in range(rounds):
            t0 = time.perf_counter()
            comm.Send(buf, dest=0, tag=7301)
            comm.Recv(buf, source=0, tag=7302)
            t1 = time.perf_counter()
            if t1 - t0 < best:
                best, offset = t1 - t0, float(buf[0]) - (t0 + t1) / 2
    comm.Barrier()
    return offset


def start(directory: str, rank: int, size: int, comm: Any = None) -> str:
    """Start this rank's trace in ``directory``; returns its file (``rank-R.json``).

    With ``comm`` (every rank of it calls this) the clock offset to its rank 0
    is estimated first. Starting twice keeps the first trace.
    Example: ``start("traces", world.rank, world.size, world.comm)``.
    """
    global _writer, _rank
    offset = estimate_offset(comm)
    if _writer is not None:
        return _writer.path
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank-{rank:05d}.json")
    _writer = _Writer(path, rank, size, offset)
    _rank = int(rank)
    _set_active()
    return path


def stop() -> str | None:
    """Stop the trace and close its file; returns its path (``None``: it was off).

    Example: ``stop()``.
    """
    global _writer
    writer, _writer = _writer, None
    _set_active()
    if writer is None:
        return None
    writer.close()
    return writer.path


def start_from_environment(rank: int, size: int, comm: Any = None) -> str | None:
    """Start if ``HPCDIST_TIMELINE`` names a directory (collective over ``comm``).

    Example: ``start_from_environment(world.rank, world.size, world.comm)``.
    """
    directory = os.environ.get(ENV_VAR)
    if not directory:
        return None
    path = start(directory, rank, size, comm)
    atexit.register(stop)
    return path


def complete(
    name: str, track: str, t0: float, t1: float, args: dict[str, Any] | None = None
) -> None:
    """Write one finished event from ``t0`` to ``t1`` (``perf_counter`` seconds) on ``track``.

    Example: ``complete("write", "checkpoint", t0, time.perf_counter(), {"bytes": n})``.
    """
    if not active:
        return
    event: dict[str, Any] = {
        "name": name, "cat": track, "ph": "X", "pid": _rank, "tid": TRACKS.get(track, 9),
        "ts": round(t0 * 1e6, 3), "dur": round((t1 - t0) * 1e6, 3),
    }
    if args:
        event["args"] = args
    _emit(event)


def _emit(event: dict[str, Any]) -> None:
    writer = _writer
    if writer is not None:
        writer.add(event)
    for sink in _sinks:
        sink.append(event)


def instant(name: str, track: str, args: dict[str, Any] | None = None) -> None:
    """Write an instant event now on ``track``. Example: ``instant("hook fired", "buckets")``."""
    if not active:
        return
    event: dict[str, Any] = {
        "name": name, "cat": track, "ph": "i", "s": "t", "pid": _rank,
        "tid": TRACKS.get(track, 9), "ts": round(time.perf_counter() * 1e6, 3),
    }
    if args:
        event["args"] = args
    _emit(event)


def describe(call: Any) -> tuple[str, int]:
    """The description and byte count of a record's ``call`` (a string or an engine layout).

    Example: ``describe("barrier()") == ("barrier()", 0)``.
    """
    if isinstance(call, str):
        return call, 0
    nbytes: Any = getattr(call, "nbytes", None)
    if nbytes is None:
        nbytes = getattr(call, "total", 0)
    return str(call.text), int(nbytes or 0)


def collective(entry: list[Any]) -> None:
    """Write a collective from its (closed) flight-recorder entry."""
    comm, seq, call, algorithm, t0, t1 = entry
    what, nbytes = describe(call)
    complete(what.split("(", 1)[0], "collectives", t0, t1, {
        "comm": comm, "seq": seq, "bytes": nbytes, "algorithm": algorithm, "what": what,
    })


def bucket_progress(index: int, waiting: int, size: int) -> None:
    """An adapter bucket's gradients arriving: ``hook fired`` at its first, ``bucket ready``
    when none is ``waiting`` any more. Example: ``bucket_progress(0, 0, 12)``."""
    if waiting == size - 1:
        instant("hook fired", "buckets", {"bucket": index})
    if waiting == 0:
        instant("bucket ready", "buckets", {"bucket": index})


class _Span:
    """A timed block: written as one event when it ends."""

    __slots__ = ("name", "track", "args", "t0")

    def __init__(self, name: str, track: str, args: dict[str, Any] | None) -> None:
        self.name, self.track, self.args = name, track, args

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        complete(self.name, self.track, self.t0, time.perf_counter(), self.args)


class _Off:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


def span(name: str, track: str = "phases", args: dict[str, Any] | None = None) -> Any:
    """A context manager timing its block as event ``name`` (a shared no-op when off).

    Example: ``with span("forward+backward"): grads = model.backward(...)``.
    """
    if not active:
        return _OFF
    return _Span(name, track, args)
