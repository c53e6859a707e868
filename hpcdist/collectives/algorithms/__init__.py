"""Reduction algorithms, one module each; :mod:`hpcdist.collectives.registry` lists them
in the order AUTO asks them (the one place that order is written).

Each module has an ``ALGORITHM`` object that follows
:class:`hpcdist.collectives.where.Algorithm`: it decides from a call's facts
(:class:`~hpcdist.collectives.where.Where`) whether it runs the call, and
runs it on the engine's :class:`~hpcdist.collectives.session.Session`.
"""
