"""Merge the ranks' timeline files into one Chrome trace, clocks aligned.

Each rank's file (``rank-R.json``, :mod:`hpcdist.observe.timeline`) has its
events in its own ``perf_counter`` microseconds and a ``hpcdist_clock``
metadata event with its offset to rank 0's clock. Merging adds the offsets,
shifts every time so that the run starts at 0, keeps one process track per
rank (``pid`` = rank, named ``rank R (host)``), and splits every collective
into ``wait`` (until the last rank arrived, named in the event) and
``transfer``, from the arrivals of all ranks at that collective.

Example:
    >>> merge_events({0: [{"ph": "X", "name": "barrier", "cat": "collectives", "ts": 10.0,
    ...                    "dur": 5.0, "pid": 0, "tid": 1, "args": {"comm": "0/2", "seq": 1}}],
    ...               1: [{"ph": "X", "name": "barrier", "cat": "collectives", "ts": 13.0,
    ...                    "dur": 2.0, "pid": 1, "tid": 1, "args": {"comm": "0/2", "seq": 1}}]},
    ...              {0: 0.0, 1: 0.0})[0]["args"]["wait_us"]
    3.0
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

from hpcdist.errors import TimelineError

_RANK_FILE = re.compile(r"rank-(\d+)\.json$")


def read_rank_file(path: str) -> list[dict[str, Any]]:
    """The events of one rank's file, also if the run died before closing it.

    Example: ``read_rank_file("traces/rank-00000.json")[0]["name"] == "process_name"``.
    """
    with open(path) as f:
        text = f.read().strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = json.loads(text.rstrip(",") + "]")  # a rank that ended without closing its file
    events = data["traceEvents"] if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TimelineError(f"{path} holds {type(events).__name__}; expected a list of events")
    return events


def read_directory(directory: str) -> dict[int, list[dict[str, Any]]]:
    """Every rank's events from ``directory`` (files ``rank-R.json``), by rank.

    Example: ``sorted(read_directory("traces"))`` is ``[0, 1, 2, 3]`` after a 4-rank run.
    """
    ranks: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.json"))):
        found = _RANK_FILE.search(path)
        if found:
            ranks[int(found.group(1))] = read_rank_file(path)
    if not ranks:
        raise TimelineError(
            f"no rank-R.json files in {directory!r}: run with HPCDIST_TIMELINE={directory} "
            "(or hd.experimental.timeline(...)) first"
        )
    return ranks


def clock_offsets(ranks: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Each rank's offset to rank 0's clock, in microseconds (0 when not recorded)."""
    out = {}
    for rank, events in ranks.items():
        out[rank] = 0.0
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "hpcdist_clock":
                out[rank] = float(e["args"].get("clock_offset_us", 0.0))
                break
    return out


def collective_key(event: dict[str, Any]) -> tuple[str, int] | None:
    """``(communicator, sequence number)`` of a collective event, else ``None``."""
    args = event.get("args") or {}
    if event.get("cat") != "collectives" or "seq" not in args:
        return None
    return (str(args.get("comm")), int(args["seq"]))


def merge_events(
    ranks: dict[int, list[dict[str, Any]]], offsets: dict[int, float]
) -> list[dict[str, Any]]:
    """The ranks' timed events on one clock, collectives annotated with their waits.

    Times are aligned (``ts + offset``) and shifted to start at 0. A
    collective event gains ``args.wait_us`` (until the last rank arrived),
    ``args.last_rank`` and ``args.transfer_us``. Metadata events are kept.
    """
    timed: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    for rank, events in ranks.items():
        for e in events:
            if e.get("ph") == "M":
                meta.append(dict(e, pid=rank))
            elif "ts" in e:
                timed.append(dict(e, pid=rank, ts=float(e["ts"]) + offsets.get(rank, 0.0)))
    if timed:
        origin = min(e["ts"] for e in timed)
        for e in timed:
            e["ts"] = round(e["ts"] - origin, 3)
    arrivals: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in timed:
        key = collective_key(e)
        if key is not None:
            arrivals.setdefault(key, []).append(e)
    for group in arrivals.values():
        last = max(group, key=lambda ev: ev["ts"])
        for e in group:
            end = e["ts"] + float(e.get("dur", 0.0))
            wait = min(max(last["ts"] - e["ts"], 0.0), float(e.get("dur", 0.0)))
            e["args"] = dict(e["args"], wait_us=round(wait, 3), last_rank=last["pid"],
                             transfer_us=round(max(end - e["ts"] - wait, 0.0), 3))
    timed.sort(key=lambda e: (e["pid"], e["ts"]))
    return timed + meta


def _split(e: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``wait`` and ``transfer`` slices inside a collective event."""
    args = e["args"]
    out = []
    base = {"cat": "collectives", "ph": "X", "pid": e["pid"], "tid": e.get("tid", 1)}
    if args["wait_us"] > 0:
        out.append(dict(base, name=f"wait for rank {args['last_rank']}", ts=e["ts"],
                        dur=args["wait_us"]))
    if args["transfer_us"] > 0:
        out.append(dict(base, name="transfer", ts=round(e["ts"] + args["wait_us"], 3),
                        dur=args["transfer_us"]))
    return out


def merge_directory(directory: str, output: str) -> dict[str, Any]:
    """Merge ``directory``'s rank files into the Chrome trace ``output``; returns the trace.

    Example: ``merge_directory("traces", "run.json")``.
    """
    ranks = read_directory(directory)
    offsets = clock_offsets(ranks)
    events = merge_events(ranks, offsets)
    out_events: list[dict[str, Any]] = []
    for e in events:
        out_events.append(e)
        if e.get("ph") == "X" and "wait_us" in (e.get("args") or {}):
            out_events.extend(_split(e))
    trace = {
        "traceEvents": out_events,
        "displayTimeUnit": "ms",
        "otherData": {"hpcdist": {"ranks": sorted(ranks), "clock_offsets_us": offsets}},
    }
    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    with open(output, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    return trace
