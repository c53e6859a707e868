"""One seed for every random number a training run draws, as Keras's ``set_random_seed``.

:func:`set_random_seed` seeds Python's ``random``, NumPy's global generator
(``np.random.seed``: the initial weights of layers without an initializer seed,
the seeds of ``Dropout`` layers) and hpcdist's own seed stream, from which
the random choices that used to come from fresh operating-system entropy now
draw: the shuffle of ``fit(shuffle=True)``, and of ``Dataset.shuffle()`` and
``Dataset.list_files(shuffle=True)`` without a ``seed``. Frameworks already
imported (CuPy, PyTorch, TensorFlow; JAX has no global state) are seeded too;
none is imported for it.

The stream is a counter: the ``k``-th seed drawn after ``set_random_seed(s)``
is a hash of ``(s, k)``. Every rank runs the same program and so draws the
same seeds in the same order: call ``set_random_seed`` with the same value on
every rank (before building the model), as Keras's multi-worker guide asks.

Example: ``set_random_seed(7)``; then ``next_seed()`` gives the same sequence in every
run and on every rank (``tests/unit/utils/test_seeding.py`` checks it).
"""

from __future__ import annotations

import random
import sys
import threading

import numpy as np

_seed: int | None = None
_drawn = 0
_lock = threading.Lock()


def set_random_seed(seed: int) -> None:
    """Seed Python, NumPy, already imported frameworks and hpcdist's generators with ``seed``.

    ``seed`` is a non-negative integer below ``2**32`` (NumPy's limit). After
    it, a program that builds and trains the same model on the same data
    draws the same initial weights, dropout masks and shuffles on every run.

    Example: ``hd.utils.set_random_seed(1337)`` at the top of the training script.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(
            f"set_random_seed expects an integer seed; got {seed!r} ({type(seed).__name__})"
        )
    seed = int(seed)
    if not 0 <= seed < 2**32:
        raise ValueError(
            f"set_random_seed: seed {seed} is out of range; expected 0 <= seed < 2**32"
        )
    global _seed, _drawn
    with _lock:
        _seed, _drawn = seed, 0
    random.seed(seed)
    np.random.seed(seed)
    _seed_frameworks(seed)


def get_random_seed() -> int | None:
    """The seed of the last :func:`set_random_seed` call (``None`` if none)."""
    return _seed


def next_seed() -> int | None:
    """The next seed of hpcdist's stream (below ``2**62``), or ``None`` when no seed was set.

    Callers that get ``None`` draw from fresh entropy as before.
    Example: ``seed = next_seed(); rng = np.random.default_rng(seed)``.
    """
    global _drawn
    with _lock:
        if _seed is None:
            return None
        k = _drawn
        _drawn += 1
        base = _seed
    state = np.random.SeedSequence([base, k]).generate_state(1, np.uint64)[0]
    return int(state) >> 2


def _seed_frameworks(seed: int) -> None:
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.random.seed(seed)
        except Exception:  # no usable GPU: nothing of CuPy's to seed
            pass
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "manual_seed"):
        torch.manual_seed(seed)
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(getattr(tf, "random", None), "set_seed"):
        tf.random.set_seed(seed)
