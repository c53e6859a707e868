"""Strategy construction, device strings, repr, extended properties and single-replica semantics."""

from __future__ import annotations

import importlib
import threading

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute import devices
from hpcdist.distribute.single_process import INDEPENDENT_VAR, check_single_process
from hpcdist.errors import HpcdistError, LaunchError
from tests.unit.distribute.conftest import rid

LOCAL = "/job:localhost/replica:0/task:0/device:"
OMPI_4 = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this process sees ``n`` GPUs (without CuPy): ``gpus(2)``."""

    def set_count(n: int) -> None:
        monkeypatch.setattr(devices, "visible_gpu_count", lambda: n)

    set_count(0)
    return set_count


@pytest.fixture(scope="module")
def mwms():
    """A one-process MultiWorkerMirroredStrategy with two local CPU replicas (starts MPI)."""
    return hd.MultiWorkerMirroredStrategy(devices=["/cpu:0", "/cpu:1"])


# -- MirroredStrategy: devices ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["/cpu:0", "/cpu:1"], ["CPU:0", "CPU:1"]),
        (("CPU:0", "CPU:1"), ["CPU:0", "CPU:1"]),
        (["/device:CPU:0", "cpu:1", "/CPU:2"], ["CPU:0", "CPU:1", "CPU:2"]),
        (["cpu"], ["CPU:0"]),
        (["/cpu:5"], ["CPU:5"]),  # logical CPU devices need no configuration
    ],
)
def test_mirrored_device_strings(given, expected):
    s = hd.MirroredStrategy(given)
    assert s.extended.worker_devices == tuple(LOCAL + d for d in expected)
    assert s.num_replicas_in_sync == len(expected)


def test_mirrored_devices_of_another_named_task():
    s = hd.MirroredStrategy(["/job:worker/task:1/cpu:0", "/job:worker/task:1/cpu:1"])
    assert s.extended.worker_devices == (
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:1",
    )


def test_mirrored_without_devices_uses_the_cpu_when_there_is_no_gpu(gpus):
    s = hd.MirroredStrategy()
    assert s.extended.worker_devices == (LOCAL + "CPU:0",)
    assert hd.MirroredStrategy(None).num_replicas_in_sync == 1


def test_mirrored_without_devices_uses_every_visible_gpu(gpus):
    gpus(2)
    s = hd.MirroredStrategy()
    assert s.extended.worker_devices == (LOCAL + "GPU:0", LOCAL + "GPU:1")
    assert type(s.extended._cross_device_ops) is hd.NcclAllReduce


def test_mirrored_accepts_visible_gpus(gpus):
    gpus(2)
    s = hd.MirroredStrategy(["/gpu:0", "GPU:1"])
    assert s.extended.worker_devices == (LOCAL + "GPU:0", LOCAL + "GPU:1")
    assert repr(s) == "<MirroredStrategy devices=[GPU:0, GPU:1]>"


@pytest.mark.parametrize(("count", "spec"), [(0, "/gpu:0"), (2, "/gpu:2"), (1, "GPU:1")])
def test_mirrored_refuses_gpus_that_do_not_exist(gpus, count, spec):
    gpus(count)
    with pytest.raises(ValueError, match=f"sees {count} GPU") as info:
        hd.MirroredStrategy(["/cpu:0", spec])
    assert isinstance(info.value, HpcdistError)


@pytest.mark.parametrize(
    "given",
    [
        ["/cpu:0", "/cpu:0"],
        ["/cpu:0", "/device:CPU:0"],
        ["cpu", "CPU:0"],
        ["/cpu:1", "/cpu:0", "cpu:1"],
    ],
)
def test_mirrored_refuses_duplicate_devices(given):
    with pytest.raises(ValueError, match="is listed twice"):
        hd.MirroredStrategy(given)


@pytest.mark.parametrize("given", [["bogus"], ["/tpu:0"], ["/cpu:x"], ["//cpu:0"], [5]])
def test_mirrored_refuses_bad_device_strings(given):
    with pytest.raises((ValueError, TypeError)):
        hd.MirroredStrategy(given)


def test_mirrored_refuses_an_unknown_device_type_with_a_value_error():
    with pytest.raises(ValueError, match="unknown device type 'BOGUS'"):
        hd.MirroredStrategy(["bogus"])
    with pytest.raises(ValueError, match="TPUs are not supported"):
        hd.MirroredStrategy(["/tpu:0"])


def test_mirrored_refuses_a_single_string():
    # TF raises ValueError here (it parses the string's characters); hpcdist says what to write.
    with pytest.raises(TypeError, match=r"write \['cpu:0'\]"):
        hd.MirroredStrategy("cpu:0")


def test_mirrored_empty_device_list_means_default_devices():
    # As TF: [] like None is every visible GPU, else the CPU (no GPU here).
    assert hd.MirroredStrategy([]).extended.worker_devices == (
        "/job:localhost/replica:0/task:0/device:CPU:0",
    )


def test_mirrored_refuses_devices_of_several_tasks():
    with pytest.raises(ValueError, match="MultiWorkerMirroredStrategy"):
        hd.MirroredStrategy(["/job:w/task:0/cpu:0", "/job:w/task:1/cpu:0"])


def test_mirrored_repr():
    assert (
        repr(hd.MirroredStrategy(["/cpu:0", "/cpu:1"]))
        == "<MirroredStrategy devices=[CPU:0, CPU:1]>"
    )
    assert repr(hd.MirroredStrategy(["/cpu:3"])) == "<MirroredStrategy devices=[CPU:3]>"


# -- OneDeviceStrategy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "short"), [("/cpu:0", "CPU:0"), ("cpu:1", "CPU:1"), ("CPU", "CPU:0")]
)
def test_one_device_strings(given, short):
    s = hd.OneDeviceStrategy(given)
    assert s.extended.worker_devices == (LOCAL + short,)
    assert s.extended.parameter_devices == (LOCAL + short,)
    assert s.num_replicas_in_sync == 1
    assert repr(s) == f"<OneDeviceStrategy device={short}>"


@pytest.mark.parametrize("given", [["/cpu:0"], 5, None])
def test_one_device_needs_one_device_string(given):
    with pytest.raises(TypeError, match="device must be a device string"):
        hd.OneDeviceStrategy(given)


def test_one_device_refuses_bad_and_missing_devices(gpus):
    with pytest.raises(ValueError, match="cannot read device 'bogus'"):
        hd.OneDeviceStrategy("bogus")
    with pytest.raises(ValueError, match="sees 0 GPU"):
        hd.OneDeviceStrategy("/gpu:0")
    gpus(1)
    assert hd.OneDeviceStrategy("/gpu:0").extended.worker_devices == (LOCAL + "GPU:0",)


# -- TPUStrategy -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"tpu_cluster_resolver": object()}])
def test_tpu_strategy_is_not_available(kwargs):
    with pytest.raises(ValueError, match="TPUStrategy is not available") as info:
        hd.TPUStrategy(**kwargs)
    for name in ("MultiWorkerMirroredStrategy", "MirroredStrategy", "OneDeviceStrategy"):
        assert name in str(info.value)
    assert issubclass(hd.TPUStrategy, hd.Strategy)


# -- the single-process check ----------------------------------------------------------------------


@pytest.fixture
def no_mpi(monkeypatch):
    """Make the check read launcher variables even if MPI started in this test process."""
    check = importlib.import_module("hpcdist.distribute.single_process")  # where it is used
    monkeypatch.setattr(check, "is_initialized", lambda: False)
    for name in (*OMPI_4, INDEPENDENT_VAR):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_single_process_check_passes_outside_a_job(no_mpi):
    check_single_process("MirroredStrategy", environ={})
    one = dict(OMPI_4, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1")
    one.update(OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="1")
    check_single_process("MirroredStrategy", environ=one)


def test_single_process_check_in_a_multi_rank_job(no_mpi):
    with pytest.raises(LaunchError) as info:
        check_single_process("MirroredStrategy", environ=OMPI_4)
    text = str(info.value)
    assert "MirroredStrategy" in text and "rank 1 of 4" in text
    assert "MultiWorkerMirroredStrategy" in text and INDEPENDENT_VAR + "=1" in text
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, HpcdistError)


def test_single_process_check_in_an_srun_step(no_mpi):
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    with pytest.raises(LaunchError, match="rank 0 of 2"):
        check_single_process("OneDeviceStrategy", environ=env)


@pytest.mark.parametrize("flag", ["1", "true", "yes", "on"])
def test_independent_workers_allow_it(no_mpi, flag):
    check_single_process("MirroredStrategy", environ={**OMPI_4, INDEPENDENT_VAR: flag})


@pytest.mark.parametrize("flag", ["0", "false", ""])
def test_independent_workers_off(no_mpi, flag):
    with pytest.raises(LaunchError):
        check_single_process("MirroredStrategy", environ={**OMPI_4, INDEPENDENT_VAR: flag})


def test_independent_workers_must_be_a_flag(no_mpi):
    with pytest.raises(ValueError, match=INDEPENDENT_VAR):
        check_single_process("MirroredStrategy", environ={**OMPI_4, INDEPENDENT_VAR: "maybe"})


@pytest.mark.parametrize(
    "make",
    [lambda: hd.MirroredStrategy(["/cpu:0", "/cpu:1"]), lambda: hd.OneDeviceStrategy("/cpu:0")],
)
def test_single_process_strategies_refuse_a_multi_rank_job(no_mpi, make):
    for name, value in OMPI_4.items():
        no_mpi.setenv(name, value)
    with pytest.raises(LaunchError, match="rank 1 of 4"):
        make()
    no_mpi.setenv(INDEPENDENT_VAR, "1")
    assert make().num_replicas_in_sync >= 1


# -- extended properties ---------------------------------------------------------------------------


def test_mirrored_extended_properties():
    ext = hd.MirroredStrategy(["/cpu:0", "/cpu:1"]).extended
    assert isinstance(ext, hd.StrategyExtended)
    assert ext.worker_devices == (LOCAL + "CPU:0", LOCAL + "CPU:1")
    assert ext.parameter_devices == ext.worker_devices
    assert ext.should_checkpoint is True
    assert ext.should_save_summary is True
    assert ext.experimental_between_graph is False
    assert ext.experimental_require_static_shapes is False
    assert ext.experimental_should_init is True


def test_strategy_properties():
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    assert isinstance(s, hd.Strategy)
    assert s.num_replicas_in_sync == 3
    assert s.cluster_resolver is None
    assert s.extended._strategy is s


def test_one_device_extended_properties():
    ext = hd.OneDeviceStrategy("/cpu:0").extended
    assert ext.worker_devices == (LOCAL + "CPU:0",)
    assert (ext.should_checkpoint, ext.should_save_summary) == (True, True)
    assert ext.experimental_between_graph is False


# -- MultiWorkerMirroredStrategy in one process ----------------------------------------------------


def test_multi_worker_in_one_process(mwms):
    assert mwms.num_replicas_in_sync == 2
    assert repr(mwms) == "<MultiWorkerMirroredStrategy worker=0/1 local_devices=[CPU:0, CPU:1]>"
    ext = mwms.extended
    assert ext.experimental_between_graph is True
    assert [d.rsplit("/", 1)[1] for d in ext.worker_devices] == ["device:CPU:0", "device:CPU:1"]
    assert ext.should_checkpoint is True and ext.should_save_summary is True
    assert mwms.cluster_resolver is not None


@pytest.mark.timeout(20)
def test_multi_worker_runs_and_mirrors(mwms):
    out = mwms.run(lambda: hd.get_replica_context().all_reduce("sum", np.float64(rid() + 1)))
    assert mwms.experimental_local_results(out) == (3.0, 3.0)
    assert mwms.experimental_local_results(mwms.run(rid)) == (0, 1)
    with mwms.scope():
        v = hd.Variable(1.0, aggregation="SUM")
    assert type(v) is hd.MirroredVariable
    mwms.run(lambda: v.assign_add(1.0))
    assert [c.numpy() for c in v.values] == [3.0, 3.0]
    assert mwms.reduce("SUM", out, axis=None) == 6.0


def test_multi_worker_one_local_device(mwms):
    s = hd.MultiWorkerMirroredStrategy(devices=["/cpu:0"])
    assert s.num_replicas_in_sync == 1
    assert s.run(lambda: 5.0) == 5.0
    three = hd.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1", "/cpu:2"])
    assert three.num_replicas_in_sync == 3


def test_multi_worker_argument_errors(mwms, gpus):
    with pytest.raises(ValueError, match="listed twice"):
        hd.MultiWorkerMirroredStrategy(devices=["/cpu:0", "/cpu:0"])
    with pytest.raises(ValueError, match="sees 0 GPU"):
        hd.MultiWorkerMirroredStrategy(devices=["/gpu:0"])
    with pytest.raises(ValueError, match="NCCL needs GPU devices"):
        hd.MultiWorkerMirroredStrategy(devices=["/cpu:0"], communication="NCCL")
    with pytest.raises(TypeError, match="communication_options must be"):
        hd.MultiWorkerMirroredStrategy(communication_options=5, devices=["/cpu:0"])


# -- run arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [5, None, {"x": 1}, "ab"])
def test_run_args_must_be_a_tuple_or_list(args):
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(ValueError, match="positional args must be a tuple or list"):
        s.run(lambda x: x, args=args)


@pytest.mark.timeout(20)
def test_run_args_and_kwargs():
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert s.experimental_local_results(s.run(lambda x: x * 2, args=[1.5])) == (3.0, 3.0)
    assert s.run(lambda x, y: x + y, args=(1,), kwargs={"y": 2}) == 3  # a cached small int
    assert s.run(lambda: "none", kwargs=None) == "none"
    with pytest.raises(TypeError, match="kwargs must be a dict"):
        s.run(lambda x: x, kwargs=[("x", 1)])
    assert s.experimental_run_v2(lambda x: x + 1, args=(1,)) == 2


# -- OneDevice, one-device Mirrored and the default strategy ---------------------------------------


def test_one_device_semantics():
    o = hd.OneDeviceStrategy("/cpu:0")
    x = np.ones(2)
    assert o.run(lambda: x) is x  # not wrapped
    assert o.run(lambda a: a + 1, args=(1,)) == 2
    assert o.reduce("SUM", 3.0, axis=None) == 3.0  # one replica: a plain value is its own sum
    assert o.reduce("MEAN", o.run(lambda: np.float32(3.0)), axis=None) == 3.0
    assert o.reduce("SUM", np.array([1.0, 2.0]), axis=0) == 3.0
    assert o.experimental_local_results(x)[0] is x
    assert o.gather(np.ones(2), axis=0).tolist() == [1.0, 1.0]
    rc = o.run(hd.get_replica_context)
    assert (rc.replica_id_in_sync_group, rc.num_replicas_in_sync) == (0, 1)


@pytest.mark.timeout(20)
def test_one_device_all_reduce():
    o = hd.OneDeviceStrategy("/cpu:0")
    out = o.run(lambda: hd.get_replica_context().all_reduce("SUM", 1.5))
    assert out == 1.5
    # MEAN of integers is float64 on every strategy (TF keeps int32 with one replica)
    mean = o.run(lambda: hd.get_replica_context().all_reduce("MEAN", np.int32(3)))
    assert mean == 3.0 and mean.dtype == np.float64


@pytest.mark.timeout(20)
def test_one_replica_mirrored_semantics():
    m1 = hd.MirroredStrategy(["/cpu:0"])
    x = np.ones(1)
    assert m1.run(lambda: x) is x
    assert m1.reduce("SUM", np.float64(3.0), axis=None) == 3.0
    assert m1.run(lambda: threading.current_thread()) is threading.current_thread()


def test_a_plain_value_cannot_be_summed_over_several_replicas():
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(ValueError, match="cannot be SUM-reduced over 2 local replicas"):
        s.reduce("SUM", 3.0, axis=None)
    assert s.reduce("MEAN", 3.0, axis=None) == 3.0
    assert s.reduce("SUM", np.zeros(2), axis=None).tolist() == [0.0, 0.0]


def test_default_strategy_semantics():
    d = hd.get_strategy()
    assert isinstance(d, hd.DefaultStrategy) and repr(d) == "<DefaultStrategy>"
    assert d.num_replicas_in_sync == 1
    assert d.extended.worker_devices == (LOCAL + "CPU:0",)
    assert d.extended.should_checkpoint is True
    assert d.run(lambda x: x + 1, args=(1,)) == 2
    assert d.reduce("SUM", 3.0, axis=None) == 3.0
    assert d.experimental_local_results(4) == (4,)
    assert d.experimental_distribute_values_from_function(lambda c: c.replica_id_in_sync_group) == 0


def test_default_replica_context_collectives_outside_run():
    rc = hd.get_replica_context()
    assert rc.all_reduce("SUM", np.float32(2.0)) == 2.0
    assert rc.all_gather(np.array([1.0, 2.0]), axis=0).tolist() == [1.0, 2.0]
    assert rc.merge_call(lambda st: st is hd.get_strategy()) is True


def test_default_strategy_run_keeps_the_current_context():
    d = hd.get_strategy()
    before = hd.get_replica_context()
    assert d.run(hd.get_replica_context) is before
    assert d.run(hd.in_cross_replica_context) is False
