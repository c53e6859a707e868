"""Shared libraries mapped into this process.

Example:
    >>> isinstance(mapped_libraries(("libc.",)), list)
    True
"""

from __future__ import annotations

import os


def mapped_libraries(prefixes: tuple[str, ...]) -> list[str]:
    """Paths of the shared libraries mapped into this process whose file names start
    with one of ``prefixes`` (Linux's ``/proc/self/maps``; elsewhere an empty list)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(prefixes))


__all__ = ["mapped_libraries"]
