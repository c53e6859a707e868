"""A one-time warning when the global batch is smaller than the number of replicas.

``experimental_distribute_dataset`` (and so ``fit``) splits each global batch
over all replicas; with a global batch of 1 on 2 replicas one replica gets no
examples in every step, yet takes part in every collective: half the machine
idles, without a word unless this says so. Worker 0 warns once per
``(global batch, replicas)`` pair in a process.

Example:
    >>> warn_if_batch_below_replicas(64, 4, 0)
    False
"""

from __future__ import annotations

import logging

log = logging.getLogger("hpcdist")
_warned: set[tuple[int, int]] = set()


def warn_if_batch_below_replicas(global_batch: int, num_replicas: int, worker_index: int) -> bool:
    """Warn (worker 0, once per pair) if ``global_batch < num_replicas``; return whether it did.

    Example: ``warn_if_batch_below_replicas(1, 2, 0)`` logs a warning and returns ``True``.
    """
    if global_batch >= num_replicas or worker_index != 0:
        return False
    key = (int(global_batch), int(num_replicas))
    if key in _warned:
        return False
    _warned.add(key)
    idle = num_replicas - global_batch
    log.warning(
        "hpcdist: the global batch size %d is smaller than the %d replicas in sync, so %d "
        "replica(s) get an empty batch in every step (and still wait in each collective). "
        "batch_size is the GLOBAL batch, split over all replicas: use at least %d "
        "(e.g. per-replica batch x %d).",
        global_batch, num_replicas, idle, num_replicas, num_replicas,
    )  # fmt: skip
    return True
