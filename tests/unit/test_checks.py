"""Launch mistakes caught at start-up (hpcdist.runtime.checks)."""

from __future__ import annotations

import logging

import pytest

from hpcdist.errors import LaunchError
from hpcdist.runtime.checks import check_launch
from tests.unit.cluster.captured import fixtures

SRUN_NO_PMI = {  # srun -n 2 without --mpi: task 1 of 2, no PMI variables
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "node1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
}
MPIRUN_4 = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
}
BATCH_STEP = {  # the batch script of `sbatch -n 2`, running python directly
    "SLURM_JOB_ID": "8",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_JOB_NODELIST": "node1",
    "SLURM_TASKS_PER_NODE": "2",
}


def test_plain_python_passes():
    check_launch(1, environ={})


def test_good_launch_passes():
    check_launch(4, environ=MPIRUN_4)


def test_srun_without_pmi_is_the_singleton_trap():
    with pytest.raises(LaunchError) as info:
        check_launch(1, environ=SRUN_NO_PMI)
    text = str(info.value)
    assert "srun started 2 tasks" in text and "world of 1" in text
    assert "--mpi=pmix" in text and "--mpi=pmi2" in text, "the error must name the fix"
    assert "HPCDIST_SKIP_LAUNCH_CHECK" in text


def test_launcher_of_another_mpi_gives_a_world_of_one():
    with pytest.raises(LaunchError, match="different MPI"):
        check_launch(1, environ=MPIRUN_4)


def test_world_sizes_that_disagree():
    with pytest.raises(LaunchError, match=r"disagree.*says 4 processes.*COMM_WORLD has 3"):
        check_launch(3, environ=MPIRUN_4)


def test_batch_step_without_launcher_warns_only(caplog):
    with caplog.at_level(logging.WARNING, logger="hpcdist"):
        check_launch(1, environ=BATCH_STEP)
    assert "allocated 2 tasks" in caplog.text


def test_checks_can_be_skipped():
    check_launch(1, environ={**SRUN_NO_PMI, "HPCDIST_SKIP_LAUNCH_CHECK": "1"})


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f["name"])
def test_captured_launches(fixture):
    """Every captured launch passes, except srun without PMI, which is refused on each task."""
    trap = fixture["launcher"] == "srun"
    for rank in fixture["ranks"]:
        environ, size = rank["environ"], rank["expect"]["size"]
        if trap:
            with pytest.raises(LaunchError, match="--mpi=pmix"):
                check_launch(size, environ=environ)
        else:
            check_launch(size, environ=environ)


def test_at_least_eight_launch_environments_are_covered():
    """Captured for real on this host, not synthesised: 8 distinct launch situations at least."""
    captured = [f for f in fixtures() if f["source"].startswith("captured")]
    situations = {(f["launcher"], f["scheduler"]) for f in captured}
    assert len(situations) >= 8, sorted(situations, key=str)


def test_srun_with_a_plugin_the_mpi_does_not_speak():
    pmix = next(f for f in fixtures() if f["launcher"] == "srun --mpi=pmix")
    with pytest.raises(LaunchError, match="did not join srun's pmix PMI") as info:
        check_launch(1, environ=pmix["ranks"][1]["environ"])
    assert "different MPI" not in str(info.value)


def test_check_everywhere_in_a_world_of_one():
    from hpcdist.runtime import mpi
    from hpcdist.runtime.checks import check_launch_everywhere

    check_launch_everywhere(mpi().COMM_SELF)


def test_ranks_sharing_a_gpu_are_named():
    from hpcdist.runtime.checks import shared_gpu_problems

    views = [("a", ["0", "1"]), ("a", ["1"]), ("b", ["1"]), ("a", ["GPU-uuid"]), ("a", ["1"])]
    assert shared_gpu_problems(views, environ={}) == ["ranks 0, 1, 4 on host a all use GPU 1"]
    assert shared_gpu_problems([("a", ["0"]), ("a", ["1"]), ("a", [])], environ={}) == []
    allowed = {"HPCDIST_ALLOW_SHARED_GPUS": "1"}
    assert shared_gpu_problems(views, environ=allowed) == []


def test_physical_gpu_ids_follow_cuda_visible_devices(monkeypatch):
    import hpcdist.distribute.multi_worker as mw
    from hpcdist.distribute.devices import Device
    from hpcdist.distribute.multi_worker import _physical_gpus

    gpus = [Device(None, None, None, "GPU", 0), Device(None, None, None, "GPU", 1)]
    monkeypatch.setattr(mw, "_pci_bus_id", lambda index: None)  # no CuPy: the visible list
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _physical_gpus(gpus + [Device(None, None, None, "CPU", 0)]) == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _physical_gpus(gpus) == ["0", "1"]


def test_pci_bus_ids_tell_apart_gpus_that_every_task_sees_as_device_0(monkeypatch):
    import hpcdist.distribute.multi_worker as mw
    from hpcdist.distribute.devices import Device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # SLURM ConstrainDevices renumbers to 0
    monkeypatch.setattr(mw, "_pci_bus_id", lambda index: "0000:3B:00.0")
    assert mw._physical_gpus([Device(None, None, None, "GPU", 0)]) == ["0000:3B:00.0"]
