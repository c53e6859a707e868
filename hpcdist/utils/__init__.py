"""Keras's ``keras.utils`` helpers that hpcdist offers: :func:`set_random_seed`.

Example:
    >>> import hpcdist as hd
    >>> hd.utils.set_random_seed(0)
    >>> hd.utils.get_random_seed()
    0
"""

from hpcdist.utils.seeding import get_random_seed, set_random_seed

__all__ = ["get_random_seed", "set_random_seed"]
