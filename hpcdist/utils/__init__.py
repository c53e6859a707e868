"""Keras's ``keras.utils`` helpers that hpcdist offers: :func:`set_random_seed`.

Example: ``hd.utils.set_random_seed(1337)`` at the top of a training script, on every rank.
"""

from hpcdist.utils.seeding import get_random_seed, set_random_seed

__all__ = ["get_random_seed", "set_random_seed"]
