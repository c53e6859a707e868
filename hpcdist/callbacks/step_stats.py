"""``StepStats``: where each rank's step time goes and whom the others waited for, per epoch.

``model.fit(..., callbacks=[hd.callbacks.StepStats()])`` listens to the
timeline's events in memory (no files; see :mod:`hpcdist.observe.timeline`)
and, at the end of every epoch, gathers them on the chief, which prints the
per-rank table of ``hpcdist timeline report``: mean step time, time in each
phase, time waiting for peers in collectives, and the straggler (the rank
the others waited on most). Every rank must use it (the gathering is
collective over the world).
"""

from __future__ import annotations

import sys
from typing import Any

from hpcdist.callbacks.base import Callback, is_chief
from hpcdist.observe import timeline
from hpcdist.observe.analysis import format_step_report, step_report
from hpcdist.observe.merge import merge_events
from hpcdist.runtime import world


class StepStats(Callback):
    """Print the per-rank step and straggler summary of every epoch on the chief.

    Args:
        stream: where the chief writes (default ``sys.stdout``).

    After each epoch :attr:`last_report` holds the report (a dict, see
    :func:`hpcdist.observe.analysis.step_report`) on the chief, ``None`` elsewhere.
    """

    def __init__(self, stream: Any = None) -> None:
        super().__init__()
        self.stream = stream
        self.last_report: dict[str, Any] | None = None
        self._events: list[dict[str, Any]] = []
        self._offset_us = 0.0

    def on_train_begin(self, logs: Any = None) -> None:
        w = world()
        self._offset_us = timeline.estimate_offset(w.comm) * 1e6
        self._events = []
        timeline.add_sink(self._events, w.rank)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        w = world()
        mine, self._events[:] = list(self._events), []
        gathered = w.comm.gather((w.rank, self._offset_us, mine), root=0)
        if gathered is None or w.rank != 0:
            return
        ranks = {rank: events for rank, _, events in gathered}
        offsets = {rank: offset for rank, offset, _ in gathered}
        self.last_report = step_report(merge_events(ranks, offsets))
        if is_chief(self.model):
            stream = self.stream if self.stream is not None else sys.stdout
            stream.write(f"epoch {epoch + 1} step stats:\n{format_step_report(self.last_report)}\n")
            stream.flush()

    def on_train_end(self, logs: Any = None) -> None:
        timeline.remove_sink(self._events)
