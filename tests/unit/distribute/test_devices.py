"""TF device strings (hpcdist.distribute.devices): parsing, canonical lists, visible GPUs."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.distribute import devices
from hpcdist.distribute.devices import (
    Device,
    InvalidDeviceError,
    canonical_devices,
    check_devices_exist,
    default_devices,
    parse_device,
    visible_gpu_count,
)
from hpcdist.errors import GpuSetupError, HpcdistError

LOCAL = "/job:localhost/replica:0/task:0/device:"


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("/gpu:0", LOCAL + "GPU:0"),
        ("GPU:0", LOCAL + "GPU:0"),
        ("gpu:1", LOCAL + "GPU:1"),
        ("/cpu:0", LOCAL + "CPU:0"),
        ("/CPU:0", LOCAL + "CPU:0"),
        ("/device:CPU:0", LOCAL + "CPU:0"),
        ("/device:GPU:1", LOCAL + "GPU:1"),
        ("device:gpu:3", LOCAL + "GPU:3"),
        ("/Gpu:12", LOCAL + "GPU:12"),
        ("cpu", LOCAL + "CPU:0"),
        ("gpu", LOCAL + "GPU:0"),
        ("/device:GPU", LOCAL + "GPU:0"),
        ("/gpu:007", LOCAL + "GPU:7"),
        ("/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:0"),
        ("/job:worker/task:1/gpu:0", "/job:worker/replica:0/task:1/device:GPU:0"),
        ("job:chief/cpu:0", "/job:chief/replica:0/task:0/device:CPU:0"),
        ("/task:3/cpu:1", "/job:localhost/replica:0/task:3/device:CPU:1"),
        ("/replica:2/gpu:0", "/job:localhost/replica:2/task:0/device:GPU:0"),
        ("/job:ps_2/device:CPU:0", "/job:ps_2/replica:0/task:0/device:CPU:0"),
    ],
)
def test_parse_device_accepts_every_tf_spelling(spec: str, name: str) -> None:
    device = parse_device(spec)
    assert device.name == name
    assert str(device) == name
    assert parse_device(device.name) == device  # the canonical name reads back the same


def test_parse_device_fields_and_short() -> None:
    d = parse_device("/job:worker/task:1/gpu:2")
    assert (d.job, d.replica, d.task, d.device_type, d.index) == ("worker", 0, 1, "GPU", 2)
    assert d.short == "GPU:2"


def test_parse_device_defaults() -> None:
    assert parse_device("gpu:1", default_job="worker", default_task=4).name == (
        "/job:worker/replica:0/task:4/device:GPU:1"
    )
    assert parse_device("CPU:3", default_job=None, default_task=None).name == "/device:CPU:3"
    assert parse_device("/task:2/cpu:0", default_job=None).name == "/task:2/device:CPU:0"
    # explicit parts win over the defaults
    assert parse_device("/job:a/task:5/cpu:0", default_job="b", default_task=1).task == 5


def test_parse_device_takes_a_device() -> None:
    d = Device(None, None, None, "GPU", 1)
    assert parse_device(d).name == LOCAL + "GPU:1"
    full = Device("worker", 0, 2, "CPU", 0)
    assert parse_device(full) == full


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("", "it is empty"),
        ("/", "empty part"),
        ("//gpu:0", "empty part"),
        ("/gpu:0/", "empty part"),
        ("gpu0", "'gpu0' is not a device"),
        ("/gpu:-1", "'gpu:-1' is not a device"),
        ("/gpu:1.5", "is not a device"),
        ("/gpu:", "is not a device"),
        ("/gpu:0:1", "is not a device"),
        (" gpu:0", "is not a device"),
        ("/job:", "'job:' is not 'job:NAME'"),
        ("/job:1abc/gpu:0", "is not 'job:NAME'"),
        ("/job:worker", "names no device"),
        ("/job:worker/task:1", "names no device"),
        ("/gpu:0/cpu:0", "two device parts, 'gpu:0' and 'cpu:0'"),
        ("/job:a/job:b/gpu:0", "two job parts"),
        ("/task:1/job:w/gpu:0", "'job:w' comes after 'task:1'"),
        ("/gpu:0/task:0", "'task:0' comes after 'gpu:0'"),
        ("/task:-1/gpu:0", "'task:-1' is not 'task:N' with N >= 0"),
        ("/task:x/gpu:0", "is not 'task:N'"),
        ("/task:1.0/gpu:0", "is not 'task:N'"),
        ("/replica:/gpu:0", "is not 'replica:N'"),
        ("XLA_GPU:0", "unknown device type 'XLA_GPU'"),
        ("/device:XPU:0", "unknown device type 'XPU'"),
        ("/gpu:99999999999", "is not a device"),
    ],
)
def test_parse_device_rejects_malformed(spec: str, reason: str) -> None:
    with pytest.raises(InvalidDeviceError) as info:
        parse_device(spec)
    message = str(info.value)
    assert reason in message
    assert repr(spec) in message  # quotes the string it could not read
    assert "accepted forms" in message and "/job:worker/replica:0/task:1/device:GPU:0" in message


@pytest.mark.parametrize("spec", ["TPU:0", "/device:TPU:1", "/job:worker/tpu"])
def test_tpu_gets_its_own_message(spec: str) -> None:
    with pytest.raises(ValueError, match="CPUs and NVIDIA GPUs, TPUs are not supported"):
        parse_device(spec)


def test_invalid_device_error_is_a_value_error_and_hpcdist_error() -> None:
    with pytest.raises(InvalidDeviceError) as info:
        parse_device("gpu0")
    assert isinstance(info.value, ValueError) and isinstance(info.value, HpcdistError)


@pytest.mark.parametrize("spec", [0, None, b"/gpu:0", ["gpu:0"]])
def test_parse_device_rejects_non_strings(spec: object) -> None:
    with pytest.raises(TypeError, match="a string like 'GPU:0' or a Device"):
        parse_device(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device_type": "TPU"},
        {"device_type": "gpu"},
        {"index": -1},
        {"index": True},
        {"index": 1.0},
        {"task": -2},
        {"replica": "0"},
        {"job": ""},
        {"job": "a/b"},
        {"job": 3},
    ],
)
def test_device_constructor_validates(kwargs: dict[str, object]) -> None:
    fields = {"job": "localhost", "replica": 0, "task": 0, "device_type": "CPU", "index": 0}
    with pytest.raises(InvalidDeviceError):
        Device(**{**fields, **kwargs})  # type: ignore[arg-type]


def test_device_is_frozen_and_hashable() -> None:
    d = parse_device("gpu:0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.index = 1  # type: ignore[misc]
    assert len({d, parse_device("/device:GPU:0"), parse_device("gpu:1")}) == 2


@settings(deadline=None, max_examples=100)
@given(
    job=st.none() | st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True),
    replica=st.none() | st.integers(0, 99),
    task=st.none() | st.integers(0, 999),
    device_type=st.sampled_from(["CPU", "GPU"]),
    index=st.integers(0, 64),
)
def test_name_parses_back(
    job: str | None, replica: int | None, task: int | None, device_type: str, index: int
) -> None:
    d = Device(job, replica, task, device_type, index)
    # a named job always has a replica: 0 where none was given, as TF names devices
    want = dataclasses.replace(d, replica=0) if job is not None and replica is None else d
    assert parse_device(d.name, default_job=None, default_task=None) == want
    assert parse_device(d.name).name == parse_device(want).name


def test_canonical_devices_parses_in_order() -> None:
    got = canonical_devices(["/gpu:1", "GPU:0", Device(None, None, None, "CPU", 0)])
    assert [d.name for d in got] == [LOCAL + "GPU:1", LOCAL + "GPU:0", LOCAL + "CPU:0"]
    assert canonical_devices(("/cpu:0", "/cpu:1")) == (parse_device("cpu:0"), parse_device("cpu:1"))
    assert canonical_devices(d for d in ["cpu"]) == (parse_device("cpu"),)


@pytest.mark.parametrize(
    "specs",
    [
        ["/cpu:0", "CPU:0"],
        ["/gpu:0", "/device:GPU:0"],
        ["cpu", "/job:localhost/replica:0/task:0/device:CPU:0"],
        ["gpu:1", "gpu:2", "/GPU:1"],
    ],
)
def test_canonical_devices_rejects_duplicates(specs: list[str]) -> None:
    with pytest.raises(InvalidDeviceError, match="is listed twice") as info:
        canonical_devices(specs)
    assert parse_device(specs[-1]).name in str(info.value)
    assert repr(specs[-1]) in str(info.value)


def test_canonical_devices_rejects_empty_and_non_lists() -> None:
    with pytest.raises(InvalidDeviceError, match="devices is empty"):
        canonical_devices([])
    with pytest.raises(TypeError, match="must be a list"):
        canonical_devices("/gpu:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a list"):
        canonical_devices(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidDeviceError, match="gpu0"):
        canonical_devices(["gpu:0", "gpu0"])


def test_canonical_devices_fills_job_and_task() -> None:
    got = canonical_devices(["gpu:0", "/job:worker/gpu:1", "/task:3/cpu:0"], job="worker", task=3)
    assert [d.name for d in got] == [
        "/job:worker/replica:0/task:3/device:GPU:0",
        "/job:worker/replica:0/task:3/device:GPU:1",
        "/job:worker/replica:0/task:3/device:CPU:0",
    ]
    # without job/task the spec's own parts stay, the rest is localhost / task 0
    other = canonical_devices(["/job:worker/task:1/gpu:0", "gpu:0"])
    assert [d.name for d in other] == ["/job:worker/replica:0/task:1/device:GPU:0", LOCAL + "GPU:0"]
    # a filled-in spec equal to an explicit one is a duplicate
    with pytest.raises(InvalidDeviceError, match="listed twice"):
        canonical_devices(["gpu:0", "/job:worker/task:1/gpu:0"], job="worker", task=1)


@pytest.mark.parametrize(
    ("spec", "kwargs", "text"),
    [
        ("/job:chief/gpu:0", {"job": "worker"}, "belongs to job 'chief'"),
        ("/job:worker/task:0/gpu:0", {"job": "worker", "task": 1}, "belongs to task 0"),
        ("/task:2/cpu:0", {"task": 1}, "this process is task 1"),
        (Device("ps", 0, 0, "CPU", 0), {"job": "worker"}, "belongs to job 'ps'"),
    ],
)
def test_canonical_devices_rejects_other_processes(spec: object, kwargs: dict, text: str) -> None:
    with pytest.raises(InvalidDeviceError, match=text):
        canonical_devices([spec], **kwargs)  # type: ignore[list-item]


def _fake_cupy(count: int | Exception) -> types.ModuleType:
    def get_device_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count)
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=runtime)  # type: ignore[attr-defined]
    return module


def test_visible_gpu_count_without_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    assert visible_gpu_count() == 0


def test_visible_gpu_count_asks_cupy_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(3))
    assert visible_gpu_count() == 3
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    assert visible_gpu_count() == 1  # nothing cached
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(_CudaError(100)))  # no device
    assert visible_gpu_count() == 0


class _CudaError(RuntimeError):
    """What CuPy's CUDARuntimeError carries: the cudaError_t in ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


def test_visible_gpu_count_refuses_a_broken_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    # hd.MirroredStrategy() with a broken CuPy used to train on the CPU without a word
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "nvidia_driver_present", lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(_CudaError(35)))
    assert visible_gpu_count() == 0  # no NVIDIA driver at all: a CPU machine
    monkeypatch.setattr(devices, "nvidia_driver_present", lambda: True)
    with pytest.raises(GpuSetupError, match="cupy-cuda13x.*gpu-cuda12.*CUDA_VISIBLE_DEVICES"):
        visible_gpu_count()  # a driver too old for this CuPy wheel
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(AttributeError("no runtime")))
    with pytest.raises(GpuSetupError, match="cannot count the GPUs.*AttributeError"):
        visible_gpu_count()
    broken = types.ModuleType("cupy")
    monkeypatch.setitem(sys.modules, "cupy", broken)  # "import cupy" gives a module lacking .cuda
    with pytest.raises(GpuSetupError):
        visible_gpu_count()
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr("builtins.__import__", _failing_import)
    with pytest.raises(GpuSetupError, match="fails to import.*libcudart"):
        visible_gpu_count()


_real_import = __import__


def _failing_import(name: str, *args: object, **kwargs: object) -> object:
    if name == "cupy":
        raise ImportError("libcudart.so.13: cannot open shared object file")
    return _real_import(name, *args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles"])
def test_visible_gpu_count_hidden_gpus_do_not_start_cuda(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    fake = _fake_cupy(4)
    asked: list[int] = []
    fake.cuda.runtime.getDeviceCount = lambda: asked.append(1) or 4  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert visible_gpu_count() == 0
    assert asked == []  # CUDA was not started
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(2))
    assert visible_gpu_count() == 2


def test_default_devices_cpu_when_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert default_devices() == (parse_device("/cpu:0"),)
    assert [d.name for d in default_devices(job="worker", task=2)] == [
        "/job:worker/replica:0/task:2/device:CPU:0"
    ]


def test_default_devices_on_this_machine() -> None:
    got = default_devices()
    n = visible_gpu_count()
    assert [d.short for d in got] == ([f"GPU:{i}" for i in range(n)] if n else ["CPU:0"])


def test_default_devices_all_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "visible_gpu_count", lambda: 2)
    assert default_devices() == (parse_device("gpu:0"), parse_device("gpu:1"))


def test_check_devices_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "visible_gpu_count", lambda: 2)
    assert check_devices_exist(["/gpu:0", "GPU:1", "/cpu:5"]) == (
        parse_device("gpu:0"),
        parse_device("gpu:1"),
        parse_device("cpu:5"),
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(InvalidDeviceError) as info:
        check_devices_exist(["/gpu:0", "/gpu:2"])
    message = str(info.value)
    assert "needs GPU 2" in message and "sees 2 GPU(s)" in message
    assert "CUDA_VISIBLE_DEVICES='4,5'" in message and "0..1" in message


def test_check_devices_exist_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "visible_gpu_count", lambda: 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # logical CPU devices: any index, so several replicas run on one CPU
    assert [d.short for d in check_devices_exist(["/cpu:0", "/cpu:1", "/cpu:63"])] == [
        "CPU:0",
        "CPU:1",
        "CPU:63",
    ]
    with pytest.raises(InvalidDeviceError, match="sees 0 GPU") as info:
        check_devices_exist(["/cpu:0", "/gpu:0"])
    assert "CUDA_VISIBLE_DEVICES=unset" in str(info.value) and "'/cpu:0'" in str(info.value)
    with pytest.raises(TypeError, match="must be a list"):
        check_devices_exist("/gpu:0")  # type: ignore[arg-type]


def test_check_devices_exist_asks_gpu_count_only_for_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> int:
        raise AssertionError("GPU count asked for CPU devices")

    monkeypatch.setattr(devices, "visible_gpu_count", boom)
    assert len(check_devices_exist(["cpu:0", "cpu:1"])) == 2
