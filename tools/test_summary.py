#!/usr/bin/env python3
"""Add up the counts that tests/support/summary.py recorded into one line.

Usage: ``tools/test_summary.py build/test-summary.jsonl`` prints, e.g.,
``4512 passed, 0 failed, 338 skipped``. A test run on every rank of an MPI job
counts once (the largest count over the job's ranks); a missing or empty file
prints ``0 passed, 0 failed`` and exits 1, since then no test ran.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

KEYS = ("passed", "failed", "skipped")


def summarize(lines: list[str]) -> dict[str, int]:
    jobs: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(KEYS, 0))
    for text in lines:
        if not text.strip():
            continue
        row = json.loads(text)
        counts = jobs[(row["job"], row["args"])]
        for key in KEYS:
            counts[key] = max(counts[key], int(row[key]))
    return {key: sum(c[key] for c in jobs.values()) for key in KEYS}


def main(argv: list[str]) -> int:
    try:
        with open(argv[1], encoding="utf-8") as f:
            total = summarize(f.readlines())
    except FileNotFoundError:
        total = dict.fromkeys(KEYS, 0)
    line = f"{total['passed']} passed, {total['failed']} failed"
    if total["skipped"]:
        line += f", {total['skipped']} skipped"
    print(line)
    return 0 if total["passed"] + total["failed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
