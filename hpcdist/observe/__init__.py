"""Seeing inside a run: the flight recorder, the timeline, and their offline analysis.

A low layer (it imports nothing of hpcdist but :mod:`hpcdist.errors`), so the
collectives engine, the strategies, ``fit``, checkpoints, the parameter server
and the framework adapters can all report to it.

* :mod:`hpcdist.observe.recorder`: the always-on flight recorder (the last
  ``N`` collectives of this process), dumped to a file on a collective
  timeout or mismatch, an abort, ``SIGUSR1`` or ``SIGTERM``;
* :mod:`hpcdist.observe.timeline`: the opt-in per-rank Chrome trace
  (``HPCDIST_TIMELINE=DIR``), spans and the clock offset estimate;
* :mod:`hpcdist.observe.merge`: one trace from the ranks' files, clocks aligned;
* :mod:`hpcdist.observe.analysis`: the step and straggler report, and the
  divergence of flight-recorder dumps.

See the "Observing a run" page of the docs.
"""
