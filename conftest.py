"""Doctest collection of hpcdist skips the adapters of frameworks that are not installed.

``hpcdist.torch``, ``hpcdist.jax`` and ``hpcdist.tensorflow`` import their
framework; ``make unit`` runs before ``make interop-test`` installs them.
"""

import importlib.util

collect_ignore = [
    f"hpcdist/{name}" for name in ("torch", "jax", "tensorflow")
    if importlib.util.find_spec(name) is None
]
