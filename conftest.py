"""Root conftest: the counts of each pytest run for ``make test``'s summary line, and doctest
collection of hpcdist that skips the adapters of frameworks that are not installed.

``hpcdist.torch``, ``hpcdist.jax`` and ``hpcdist.tensorflow`` import their
framework; ``make unit`` runs before ``make interop-test`` installs them.
"""

import importlib.util

pytest_plugins = ["tests.support.summary"]

collect_ignore = [
    f"hpcdist/{name}" for name in ("torch", "jax", "tensorflow")
    if importlib.util.find_spec(name) is None
] + [
    f"hpcdist/horovod/{name}" for name in ("torch", "tensorflow")
    if importlib.util.find_spec(name) is None
]
