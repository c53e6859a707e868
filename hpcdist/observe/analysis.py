"""The step and straggler report from a timeline, and the divergence of flight-recorder dumps.

:func:`step_report` reads the merged events (:func:`hpcdist.observe.merge.merge_events`)
and gives, per rank, the mean step time, the time in each ``fit`` phase, the
time spent waiting for peers in collectives, and for how long the others
waited on it (the rank that arrived last at a collective is the one every
other rank waited for: its "blame" is the sum of their waits). The ranks
with the most blame are the stragglers.

:func:`divergence` reads the flight-recorder dumps of the ranks of one job
and finds the first collective (per communicator, in sequence order) where
the ranks' records disagree (different calls) or some rank has no record
(it did not arrive).

Example:
    >>> d = divergence([
    ...     {"rank": 0, "size": 2, "job": "j", "time": 1, "records": [
    ...         {"comm": "0/2", "seq": 1, "what": "barrier()", "done": True},
    ...         {"comm": "0/2", "seq": 2, "what": "barrier()", "done": False}]},
    ...     {"rank": 1, "size": 2, "job": "j", "time": 1, "records": [
    ...         {"comm": "0/2", "seq": 1, "what": "barrier()", "done": True}]}])
    >>> d["seq"], d["kind"], d["missing"]
    (2, 'not arrived', [1])
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from typing import Any

from hpcdist.errors import TimelineError
from hpcdist.observe.merge import clock_offsets, collective_key, merge_events, read_directory

PHASES = ("input", "forward+backward", "gradient reduction", "optimizer", "callbacks")


def step_report(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-rank step time, phase times, waits and blame from merged ``events``.

    Returns ``{"ranks": {rank: {...}}, "stragglers": [ranks], "collectives": n}``;
    times in milliseconds. Example: ``step_report(merge_events(ranks, offsets))``.
    """
    per: dict[int, dict[str, Any]] = defaultdict(
        lambda: {"steps": 0, "step_ms": 0.0, "phases_ms": defaultdict(float), "wait_ms": 0.0,
                 "collective_ms": 0.0, "blame_ms": 0.0, "last_arrivals": 0, "collectives": 0}
    )
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        row = per[int(e["pid"])]
        dur_ms = float(e.get("dur", 0.0)) / 1e3
        key = collective_key(e)
        if key is not None:
            groups[key].append(e)
            row["collectives"] += 1
            row["collective_ms"] += dur_ms
            row["wait_ms"] += float(e["args"].get("wait_us", 0.0)) / 1e3
        elif e.get("cat") == "phases":
            if e["name"] == "step":
                row["steps"] += 1
                row["step_ms"] += dur_ms
            else:
                row["phases_ms"][e["name"]] += dur_ms
    for group in groups.values():
        if len(group) < 2:
            continue
        last = max(group, key=lambda ev: ev["ts"])
        row = per[int(last["pid"])]
        row["last_arrivals"] += 1
        row["blame_ms"] += sum(float(e["args"].get("wait_us", 0.0)) for e in group) / 1e3
    ranks = {}
    for rank in sorted(per):
        row = per[rank]
        steps = row["steps"]
        ranks[rank] = {
            "steps": steps,
            "step_ms": row["step_ms"] / steps if steps else None,
            "phases_ms": {k: v / steps if steps else v for k, v in row["phases_ms"].items()},
            "collectives": row["collectives"],
            "collective_ms": row["collective_ms"],
            "wait_ms": row["wait_ms"],
            "blame_ms": row["blame_ms"],
            "last_arrivals": row["last_arrivals"],
        }
    return {"ranks": ranks, "stragglers": stragglers(ranks), "collectives": len(groups)}


def stragglers(ranks: dict[int, dict[str, Any]], share: float = 0.67) -> list[int]:
    """The ranks the others waited on most: blame at least ``share`` (2/3) of the largest,
    and that largest well above an even spread (else none: nobody stands out).

    Example: ``stragglers({0: {"blame_ms": 1.0}, 1: {"blame_ms": 90.0}})`` is ``[1]``.
    """
    blame = {r: float(v["blame_ms"]) for r, v in ranks.items()}
    if len(blame) < 2:
        return []
    top = max(blame.values())
    total = sum(blame.values())
    if top <= 0 or top < 1.5 * total / len(blame):
        return []
    return sorted(r for r, b in blame.items() if b >= share * top)


def format_step_report(report: dict[str, Any]) -> str:
    """The report as a table. Example: ``print(format_step_report(step_report(events)))``."""
    ranks = report["ranks"]
    phases = [p for p in PHASES if any(p in v["phases_ms"] for v in ranks.values())]
    head = ["rank", "steps", "step ms", *[f"{p} ms" for p in phases], "coll.", "wait ms",
            "others waited on it ms"]
    rows = []
    for rank, v in ranks.items():
        step = "-" if v["step_ms"] is None else f"{v['step_ms']:.2f}"
        rows.append([str(rank), str(v["steps"]), step,
                     *[f"{v['phases_ms'].get(p, 0.0):.2f}" for p in phases],
                     str(v["collectives"]), f"{v['wait_ms']:.1f}", f"{v['blame_ms']:.1f}"])
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    slow = report["stragglers"]
    if slow:
        names = ", ".join(str(r) for r in slow)
        lines.append(f"straggler: rank {names} (the others waited on it most; "
                     f"{report['collectives']} collectives compared)")
    else:
        lines.append(f"straggler: none stands out ({report['collectives']} collectives compared)")
    lines.append("(phase times are per step; waits and blame are totals over the run)")
    return "\n".join(lines)


def report_directory(directory: str) -> dict[str, Any]:
    """:func:`step_report` of the timeline files in ``directory``.

    Example: ``report_directory("traces")["stragglers"]``.
    """
    ranks = read_directory(directory)
    return step_report(merge_events(ranks, clock_offsets(ranks)))


def plot_ranks(events: list[dict[str, Any]], path: str, title: str = "") -> str:
    """A PNG of the merged ``events``: one row per rank, phases and collectives over time.

    Example: ``plot_ranks(merge_events(ranks, offsets), "ranks.png")``.
    """
    import matplotlib  # lazy: optional plotting dependency (Matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: optional plotting dependency (Matplotlib)

    colors = {"input": "#9ecae1", "forward+backward": "#3182bd", "optimizer": "#fdae6b",
              "gradient reduction": "#e6550d", "callbacks": "#a1d99b", "wait": "#de2d26",
              "transfer": "#31a354", "checkpoint": "#756bb1", "ps": "#636363"}
    ranks = sorted({int(e["pid"]) for e in events if e.get("ph") == "X"})
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(ranks) + 1.6))
    for e in events:
        if e.get("ph") != "X" or e.get("name") == "step":
            continue
        y = int(e["pid"])
        start, width = e["ts"] / 1e3, float(e.get("dur", 0.0)) / 1e3
        args = e.get("args") or {}
        if "wait_us" in args:
            wait = args["wait_us"] / 1e3
            ax.barh(y + 0.2, wait, left=start, height=0.35, color=colors["wait"])
            ax.barh(y + 0.2, width - wait, left=start + wait, height=0.35,
                    color=colors["transfer"])
        else:
            color = colors.get(e["name"], colors.get(e.get("cat", ""), "#bdbdbd"))
            ax.barh(y - 0.2, width, left=start, height=0.35, color=color)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), ncol=5, fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.18))
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms), clocks aligned")
    ax.set_title(title or "hpcdist timeline: phases (lower bar), collectives wait/transfer (upper)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- flight-recorder dumps -----------------------------------------------------


def read_dumps(directory: str) -> list[dict[str, Any]]:
    """The flight-recorder dumps in ``directory`` of its most recent job, one per rank.

    Example: ``[d["rank"] for d in read_dumps("/tmp/hpcdist-flight")]``.
    """
    dumps = []
    for path in glob.glob(os.path.join(directory, "*.json")):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("hpcdist_flight_recorder"):
            data["path"] = path
            dumps.append(data)
    if not dumps:
        return []
    latest = max(dumps, key=lambda d: d.get("time", 0))["job"]
    return sorted((d for d in dumps if d["job"] == latest), key=lambda d: d["rank"])


def divergence(dumps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first collective where the ranks' records disagree or someone did not arrive.

    Where the dumps agree but some call never completed (ranks without a dump
    are then the ones to suspect), the kind is ``"not completed"``.
    Returns ``{"comm", "seq", "kind" ("mismatch" | "not arrived" | "not completed"), "missing",
    "calls": {rank: description or None}, "ranks_without_dump"}``, or ``None``
    when every rank recorded the same calls. Example: see the module docstring.
    """
    if not dumps:
        return None
    size = max(int(d.get("size") or 0) for d in dumps) or len(dumps)
    have = {int(d["rank"]) for d in dumps}
    by_comm: dict[str, dict[int, dict[int, dict[str, Any]]]] = defaultdict(dict)
    for d in dumps:
        for rec in d["records"]:
            by_comm[rec["comm"]].setdefault(int(d["rank"]), {})[int(rec["seq"])] = rec
    found: list[dict[str, Any]] = []
    for comm, ranks in by_comm.items():
        lo = max(min(seqs) for seqs in ranks.values())  # older records may have left the ring
        hi = max(max(seqs) for seqs in ranks.values())
        for seq in range(lo, hi + 1):
            calls = {r: (ranks[r][seq]["what"] if seq in ranks[r] else None) for r in ranks}
            missing = sorted(r for r, what in calls.items() if what is None)
            texts = {what for what in calls.values() if what is not None}
            if missing or len(texts) > 1:
                found.append({
                    "comm": comm, "seq": seq, "missing": missing, "calls": calls,
                    "kind": "mismatch" if len(texts) > 1 else "not arrived",
                })
                break
    if not found:  # the ranks with dumps agree: the first call one of them never finished
        for comm, ranks in by_comm.items():
            open_calls = [(seq, r) for r, recs in ranks.items() for seq, rec in recs.items()
                          if not rec.get("done")]
            if open_calls:
                seq = min(open_calls)[0]
                found.append({
                    "comm": comm, "seq": seq, "missing": [], "kind": "not completed",
                    "calls": {r: (recs[seq]["what"] if seq in recs else None)
                              for r, recs in ranks.items()},
                })
    if not found:
        return None
    first = min(found, key=lambda f: (f["kind"] != "mismatch", f["seq"]))
    first["ranks_without_dump"] = sorted(set(range(size)) - have)
    return first


def format_divergence(dumps: list[dict[str, Any]], found: dict[str, Any] | None) -> str:
    """The flight-recorder part of the report. Example: ``print(format_divergence(d, f))``."""
    if not dumps:
        return "flight recorder: no dumps"
    reasons = sorted({d.get("reason", "?").split(":")[0] for d in dumps})
    lines = [f"flight recorder: {len(dumps)} dumps of job {dumps[0]['job']} "
             f"(ranks {', '.join(str(d['rank']) for d in dumps)}; {', '.join(reasons)})"]
    if found is None:
        lines.append("  every rank recorded the same collectives")
        return "\n".join(lines)
    lines.append(f"  first divergence: collective #{found['seq']} on communicator "
                 f"{found['comm']} ({found['kind']})")
    if found["missing"]:
        lines.append(f"  did not arrive: rank {', '.join(map(str, found['missing']))}")
    for rank, what in sorted(found["calls"].items()):
        lines.append(f"  rank {rank}: {what if what is not None else '-- no record --'}")
    if found["ranks_without_dump"]:
        lines.append(f"  no dump from rank {', '.join(map(str, found['ranks_without_dump']))} "
                     "(it never reached the error: ended, or killed while busy elsewhere)")
    for d in dumps:
        if d.get("reason", "").startswith("Collective"):
            lines.append(f"  rank {d['rank']} reported: {d['reason']}")
    return "\n".join(lines)


def report(directory: str, png: str | None = None) -> str:
    """The whole ``hpcdist timeline report`` text for ``directory`` (timeline files,
    flight-recorder dumps, or both); writes the PNG when asked and there is a timeline.

    Example: ``print(report("traces", png="ranks.png"))``.
    """
    parts = []
    has_timeline = bool(glob.glob(os.path.join(directory, "rank-*.json")))
    if has_timeline:
        ranks = read_directory(directory)
        events = merge_events(ranks, clock_offsets(ranks))
        parts.append(format_step_report(step_report(events)))
        if png:
            plot_ranks(events, png)
            parts.append(f"(plot: {png})")
    dumps = read_dumps(directory)
    if dumps:
        parts.append(format_divergence(dumps, divergence(dumps)))
    if not parts:
        raise TimelineError(
            f"{directory!r} has no timeline files (rank-R.json) and no flight-recorder dumps; "
            "run with HPCDIST_TIMELINE=DIR, or point at HPCDIST_FLIGHT_DIR"
        )
    return "\n\n".join(parts)
