"""Horovod scripts on hpcdist: ``horovod.torch``'s API (:mod:`hpcdist.horovod.torch`) and
a runner that makes ``import horovod.torch as hvd`` resolve to it.

``python -m hpcdist.horovod train.py [args]`` (also under ``mpirun``) runs an
unchanged Horovod script; or change one line: ``import hpcdist.horovod.torch as hvd``.

Example:
    >>> import sys
    >>> install_alias()
    >>> import horovod
    >>> horovod.__name__, horovod.__version__
    ('hpcdist.horovod', '0.28.1')
"""

from hpcdist.horovod.alias import install_alias

__version__ = "0.28.1"  # the Horovod release whose API this follows

__all__ = ["__version__", "install_alias"]
