"""Runtime in one process: lazy MPI, the world of one, virtual nodes, CUDA-awareness."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpcdist.errors import ClusterConfigError
from hpcdist.runtime import build_world, cuda_aware_support, world
from hpcdist.runtime.mpi import THREAD_LEVELS, loaded_mpi_libraries, thread_level_name
from hpcdist.runtime.pmix import start_fence
from hpcdist.runtime.topology import virtual_nodes_from_env


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter without any launcher variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    clean.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=120
    )


def test_import_does_not_start_mpi():
    done = _python("import sys, hpcdist; print('mpi4py.MPI' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_mpi_start_up_runs_the_start_fence_with_the_world_size():
    code = (
        "import sys, hpcdist.runtime.mpi; m = sys.modules['hpcdist.runtime.mpi']; seen = []\n"
        "m.start_fence = lambda size: seen.append(size) or False\n"
        "m.mpi(); m.mpi(); print(seen)"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1]", "once, when MPI starts, with COMM_WORLD's size"


def test_start_fence_skips_a_world_of_one_and_an_opt_out(monkeypatch):
    assert start_fence(1) is False
    monkeypatch.setenv("HPCDIST_START_FENCE", "0")
    assert start_fence(4) is False, "opted out: no fence, whatever the launcher"
    monkeypatch.setenv("HPCDIST_START_FENCE", "sometimes")
    with pytest.raises(ClusterConfigError, match="HPCDIST_START_FENCE"):
        start_fence(4)


def test_plain_python_is_a_world_of_one():
    w = world()
    assert (w.rank, w.size, w.local_rank, w.local_size) == (0, 1, 0, 1)
    assert (w.node_index, w.node_count, w.host_rank, w.host_size) == (0, 1, 0, 1)
    assert w.is_chief and w.is_node_leader
    assert w.leaders_comm is not None and w.leaders_comm.Get_size() == 1
    assert world() is w, "the world is built once per process"


def test_virtual_nodes_on_a_world_of_one():
    w = build_world(virtual_nodes=4)
    assert (w.node_count, w.local_size, w.virtual_nodes) == (1, 1, 4)


@pytest.mark.parametrize("text,expected", [("", 1), ("1", 1), (" 3 ", 3)])
def test_virtual_nodes_variable(text, expected):
    assert virtual_nodes_from_env({"HPCDIST_VIRTUAL_NODES": text}) == expected


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5"])
def test_bad_virtual_nodes_variable_names_it(text):
    with pytest.raises(ClusterConfigError, match="HPCDIST_VIRTUAL_NODES"):
        virtual_nodes_from_env({"HPCDIST_VIRTUAL_NODES": text})


def test_thread_level_is_reported():
    assert thread_level_name() in THREAD_LEVELS


def test_bad_thread_level_is_refused():
    done = _python("import hpcdist; hpcdist.world()", env={"HPCDIST_MPI_THREAD_LEVEL": "turbo"})
    assert done.returncode != 0
    assert "HPCDIST_MPI_THREAD_LEVEL" in done.stderr


def test_cuda_awareness_override():
    assert cuda_aware_support({"HPCDIST_CUDA_AWARE_MPI": "1"}) is True
    assert cuda_aware_support({"HPCDIST_CUDA_AWARE_MPI": "off"}) is False
    with pytest.raises(ClusterConfigError, match="HPCDIST_CUDA_AWARE_MPI"):
        cuda_aware_support({"HPCDIST_CUDA_AWARE_MPI": "maybe"})


def test_cuda_awareness_query_on_the_loaded_library():
    libraries = loaded_mpi_libraries()
    assert libraries, "the MPI library mapped into the process must be found"
    answer = cuda_aware_support({})
    wheel = [p for p in libraries if p.startswith(sys.prefix) and "libmpi.so" in p]
    if wheel:
        # The PyPI Open MPI wheel exports MPIX_Query_cuda_support and is built without CUDA.
        assert answer is False
    else:  # a site MPI: whatever it says, but an answer of the right type
        assert answer in (True, False, None)
