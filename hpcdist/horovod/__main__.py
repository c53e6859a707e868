"""``python -m hpcdist.horovod train.py [args]``: run a Horovod script unchanged.

``import horovod`` and ``import horovod.torch as hvd`` in the script (and in
what it imports) give :mod:`hpcdist.horovod`'s modules; the script runs as
``__main__`` with ``sys.argv`` = ``[train.py, args...]``. Also
``python -m hpcdist.horovod -m package.module [args]``.
Under ``mpirun -np 4 python -m hpcdist.horovod train.py`` each rank does the same.
"""

from __future__ import annotations

import os
import runpy
import sys

from hpcdist.horovod.alias import install_alias

USAGE = "usage: python -m hpcdist.horovod SCRIPT.py [args...] | -m MODULE [args...]"


def main(argv: list[str]) -> int:
    """Run the script or module ``argv`` names, with the alias installed."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 0 if argv else 2
    install_alias()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
