"""hpcdist's Open MPI defaults: set before MPI starts, only where nothing else sets them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.errors import ClusterConfigError
from hpcdist.runtime.mpi_defaults import DEFAULTS, apply_mpi_defaults, parameter_files

LINKS = "OMPI_MCA_btl_tcp_links"


def test_sets_two_tcp_links_where_nothing_sets_them() -> None:
    env: dict[str, str] = {}
    assert apply_mpi_defaults(env, files=()) == {LINKS: "2"}
    assert env == {LINKS: "2"}
    assert DEFAULTS == {"btl_tcp_links": "2"}


def test_the_users_environment_wins() -> None:
    env = {LINKS: "1"}  # export, or mpirun --mca btl_tcp_links 1
    assert apply_mpi_defaults(env, files=()) == {}
    assert env == {LINKS: "1"}


def test_a_parameter_file_that_names_it_wins(tmp_path) -> None:
    other = tmp_path / "other.conf"
    other.write_text("# tuning\nbtl_tcp_if_include = eth0\n")
    assert apply_mpi_defaults({}, files=[other]) == {LINKS: "2"}
    named = tmp_path / "mca-params.conf"
    named.write_text("# tuning\n btl_tcp_links = 4\n")
    assert apply_mpi_defaults({}, files=[other, named, tmp_path / "missing.conf"]) == {}


def test_the_files_open_mpi_reads(tmp_path) -> None:
    home = {"HOME": str(tmp_path), "PATH": "", "OPAL_PREFIX": "/opt/ompi"}
    assert parameter_files(home) == [
        tmp_path / ".openmpi" / "mca-params.conf",
        Path("/opt/ompi/etc/openmpi-mca-params.conf"),
    ]
    listed = {"OMPI_MCA_mca_base_param_files": f"{tmp_path}/a.conf{os.pathsep}{tmp_path}/b.conf"}
    assert parameter_files(listed) == [tmp_path / "a.conf", tmp_path / "b.conf"]
    (tmp_path / ".openmpi").mkdir()
    (tmp_path / ".openmpi" / "mca-params.conf").write_text("btl_tcp_links=1\n")
    assert apply_mpi_defaults(dict(home)) == {}  # found through HOME


def test_opt_out_and_a_bad_value() -> None:
    assert apply_mpi_defaults({"HPCDIST_MPI_DEFAULTS": "0"}, files=()) == {}
    with pytest.raises(ClusterConfigError, match="HPCDIST_MPI_DEFAULTS"):
        apply_mpi_defaults({"HPCDIST_MPI_DEFAULTS": "maybe"}, files=())


def _started(env: dict[str, str]) -> str:
    code = (
        "import os; from hpcdist.runtime import mpi; mpi().COMM_WORLD.Barrier(); "
        f"print(os.environ.get({LINKS!r}))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_MCA_btl", "PMIX"))}
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
        timeout=120, check=True,
    )
    return proc.stdout.strip().splitlines()[-1]


def test_starting_mpi_through_hpcdist_applies_them(tmp_path) -> None:
    """The bootstrap sets the variable before MPI_Init (in a fresh process, a world of
    one), and leaves a user's value and the opt-out alone."""
    base = {"HOME": str(tmp_path), "OMPI_MCA_mca_base_param_files": "none"}
    assert _started(base) == "2"
    assert _started({**base, LINKS: "3"}) == "3"
    assert _started({**base, "HPCDIST_MPI_DEFAULTS": "off"}) == "None"
