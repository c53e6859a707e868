"""Open MPI settings that hpcdist chooses where the user chose none, before MPI starts.

Open MPI's TCP transport opens one connection per pair of ranks by default.
On a 1 Gbit/s link measured side by side (``benchmarks/rig_tcp.py``,
``benchmarks/compression_multihost.py``), two connections
(``btl_tcp_links=2``) bring Open MPI's float32 ``Allreduce`` of 4-16 MiB level with
gloo's (one connection: up to 1.8x slower), and keep ``Sendrecv`` at the link rate
when the cores are busy (one connection: half the rate, at times). So before MPI
is initialised, :func:`apply_mpi_defaults` sets ``OMPI_MCA_btl_tcp_links=2`` in the
process environment (Open MPI reads it there at ``MPI_Init``), unless

* the environment already names the parameter (``OMPI_MCA_btl_tcp_links``, as
  ``mpirun --mca btl_tcp_links N`` and ``export`` do),
* an Open MPI parameter file that hpcdist can find names it (``~/.openmpi/mca-params.conf``,
  ``etc/openmpi-mca-params.conf`` under ``$OPAL_PREFIX`` or ``mpirun``'s installation,
  the files in ``OMPI_MCA_mca_base_param_files``), or
* ``HPCDIST_MPI_DEFAULTS=0``.

Other MPI libraries ignore the variable. Inside one node Open MPI uses shared
memory, not TCP, and the setting changes nothing.

Example:
    >>> env = {}
    >>> apply_mpi_defaults(env, files=())
    {'OMPI_MCA_btl_tcp_links': '2'}
    >>> apply_mpi_defaults({"OMPI_MCA_btl_tcp_links": "1"}, files=())
    {}
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, MutableMapping
from pathlib import Path

from hpcdist.cluster.envparse import env_flag

#: The parameters hpcdist sets, and their values.
DEFAULTS = {"btl_tcp_links": "2"}


def parameter_files(environ: MutableMapping[str, str]) -> list[Path]:
    """The Open MPI parameter files that may set a parameter for this process."""
    listed = environ.get("OMPI_MCA_mca_base_param_files")
    if listed:
        return [Path(p) for p in listed.split(os.pathsep) if p and p != "none"]
    files = []
    if environ.get("HOME"):
        files.append(Path(environ["HOME"]) / ".openmpi" / "mca-params.conf")
    prefixes = [environ.get("OPAL_PREFIX")]
    mpirun = shutil.which("mpirun", path=environ.get("PATH"))
    if mpirun:
        prefixes.append(str(Path(mpirun).resolve().parent.parent))
    files += [Path(p) / "etc" / "openmpi-mca-params.conf" for p in prefixes if p]
    return files


def _named_in(name: str, files: Iterable[Path]) -> bool:
    for path in files:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if any(line.split("=", 1)[0].strip() == name for line in lines if "=" in line):
            return True
    return False


def apply_mpi_defaults(
    environ: MutableMapping[str, str] | None = None, files: Iterable[Path] | None = None
) -> dict[str, str]:
    """Set hpcdist's Open MPI defaults in ``environ`` (default ``os.environ``) where
    nothing sets them; return the variables it set. Call it before MPI starts.

    ``files``: the parameter files to look in (default :func:`parameter_files`).
    Example: see the module docstring.
    """
    env = os.environ if environ is None else environ
    if env_flag(env, "HPCDIST_MPI_DEFAULTS") is False:
        return {}
    found = list(parameter_files(env) if files is None else files)
    chosen = {}
    for name, value in DEFAULTS.items():
        variable = f"OMPI_MCA_{name}"
        if variable in env or _named_in(name, found):
            continue
        env[variable] = chosen[variable] = value
    return chosen
