"""TF device strings: parse ``"/gpu:0"`` and friends into :class:`Device` values.

A strategy's devices are named as in TensorFlow. Every spelling of one device
parses to the same canonical :class:`Device`, whose name is TF's full form:

    >>> parse_device("/gpu:1").name
    '/job:localhost/replica:0/task:0/device:GPU:1'
    >>> parse_device("cpu") == parse_device("/device:CPU:0")
    True

hpcdist runs on CPUs and NVIDIA GPUs, so ``CPU`` and ``GPU`` are the only
device types. CuPy is imported only by :func:`visible_gpu_count`.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hpcdist.cluster.envparse import short
from hpcdist.cluster.gpus import CUDA_VISIBLE_DEVICES, parse_visible_devices
from hpcdist.errors import GpuSetupError, InvalidDeviceError

ACCEPTED_FORMS = (
    "'GPU:0', '/gpu:1', '/CPU:0', '/device:GPU:1', 'cpu' or 'gpu' (index 0), and "
    "'/job:worker/replica:0/task:1/device:GPU:0' (job, replica and task are optional but "
    "come in that order; device type CPU or GPU, in any case)"
)
_PARTS = {  # one full-match pattern per part, with what it expects for messages
    "job": (re.compile(r"job:([A-Za-z][A-Za-z0-9_]*)"), "'job:NAME'"),
    "replica": (re.compile(r"replica:([0-9]{1,9})"), "'replica:N' with N >= 0"),
    "task": (re.compile(r"task:([0-9]{1,9})"), "'task:N' with N >= 0"),
    "device": (re.compile(r"(?:device:)?([A-Za-z_]+)(?::([0-9]{1,9}))?"), "a device like 'GPU:0'"),
}
_ORDER = tuple(_PARTS)


@dataclass(frozen=True)
class Device:
    """One device: ``device_type`` ``"CPU"`` or ``"GPU"`` with ``index``, optionally placed.

    Example:
        >>> d = Device("worker", 0, 1, "GPU", 0)
        >>> d.name, d.short, str(Device(None, None, None, "CPU", 2))
        ('/job:worker/replica:0/task:1/device:GPU:0', 'GPU:0', '/device:CPU:2')
    """

    job: str | None
    replica: int | None
    task: int | None
    device_type: str
    index: int

    def __post_init__(self) -> None:
        job_ok = isinstance(self.job, str) and _PARTS["job"][0].fullmatch(f"job:{self.job}")
        if self.job is not None and not job_ok:
            raise InvalidDeviceError(f"job must be a name like 'worker'; found {short(self.job)}")
        for field in ("replica", "task", "index"):
            value = getattr(self, field)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            if not ok and not (value is None and field != "index"):
                raise InvalidDeviceError(f"{field} must be an int >= 0; found {short(value)}")
        if self.device_type not in ("CPU", "GPU"):
            raise InvalidDeviceError(
                f"device_type must be 'CPU' or 'GPU'; found {short(self.device_type)}"
            )

    @property
    def name(self) -> str:
        """The canonical string, e.g. ``'/job:localhost/replica:0/task:0/device:CPU:0'``."""
        parts = [(key, getattr(self, key)) for key in _ORDER[:3]]
        return "".join(f"/{k}:{v}" for k, v in parts if v is not None) + f"/device:{self.short}"

    @property
    def short(self) -> str:
        """``'GPU:0'``: the type and index alone."""
        return f"{self.device_type}:{self.index}"

    def __str__(self) -> str:
        return self.name


def _fail(spec: object, reason: str) -> InvalidDeviceError:
    return InvalidDeviceError(
        f"cannot read device {short(spec)}: {reason}; accepted forms: {ACCEPTED_FORMS}"
    )


def _parse(spec: str | Device) -> Device:
    """The parts ``spec`` gives, ``None`` where it leaves them out."""
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a device is a string like 'GPU:0' or a Device; found {short(spec)}")
    found: dict[str, Any] = {}
    texts: dict[str, str] = {}
    for part in (spec[1:] if spec.startswith("/") else spec).split("/"):
        if not part:
            raise _fail(spec, "it is empty" if not spec else "it has an empty part ('//' or '/')")
        key = next((k for k in _ORDER[:3] if part.startswith(f"{k}:")), "device")
        if key in found:
            raise _fail(spec, f"it has two {key} parts, {texts[key]!r} and {part!r}")
        later = [texts[k] for k in _ORDER[_ORDER.index(key) + 1 :] if k in found]
        if later:
            raise _fail(spec, f"part {part!r} comes after {later[0]!r}")
        pattern, want = _PARTS[key]
        m = pattern.fullmatch(part)
        if m is None:
            raise _fail(spec, f"part {part!r} is not {want}")
        found[key] = m.group(1) if key == "job" else m.groups() if key == "device" else int(m[1])
        texts[key] = part
    if "device" not in found:
        raise _fail(spec, "it names no device")
    device_type, index = found["device"][0].upper(), int(found["device"][1] or 0)
    if device_type == "TPU":
        raise _fail(spec, "hpcdist targets CPUs and NVIDIA GPUs, TPUs are not supported")
    if device_type not in ("CPU", "GPU"):
        raise _fail(spec, f"unknown device type {device_type!r}, expected CPU or GPU")
    return Device(found.get("job"), found.get("replica"), found.get("task"), device_type, index)


def _fill(d: Device, job: str | None, task: int | None) -> Device:
    job = d.job if d.job is not None else job
    task = d.task if d.task is not None else task
    replica = d.replica if d.replica is not None or job is None else 0
    return Device(job, replica, task, d.device_type, d.index)


def _as_list(devices: object) -> list[Any]:
    if isinstance(devices, (str, Device)) or not isinstance(devices, Iterable):
        raise TypeError(f"devices must be a list like ['/gpu:0', '/gpu:1']; found {short(devices)}")
    return list(devices)


def parse_device(
    spec: str | Device, default_job: str | None = "localhost", default_task: int | None = 0
) -> Device:
    """The :class:`Device` that ``spec`` names; job and task default where it leaves them out.

    A bare ``"cpu"``/``"gpu"`` (or ``"/device:GPU"``) means index 0. Raises
    :class:`InvalidDeviceError` (a ``ValueError``) on anything malformed.

    Example:
        >>> parse_device("/job:worker/task:1/gpu:0").name
        '/job:worker/replica:0/task:1/device:GPU:0'
        >>> parse_device("CPU:3", default_job=None, default_task=None).name
        '/device:CPU:3'
    """
    return _fill(_parse(spec), default_job, default_task)


def canonical_devices(
    devices: Iterable[str | Device], *, job: str | None = None, task: int | None = None
) -> tuple[Device, ...]:
    """Parse ``devices`` (one replica each); no list empty, no device twice.

    ``job``/``task`` (default ``localhost``/``0``) fill in what a spec leaves
    out; a spec naming another job or task is rejected, as it is not a device
    of this process.

    Example:
        >>> [d.short for d in canonical_devices(["/cpu:0", "CPU:1"])]
        ['CPU:0', 'CPU:1']
        >>> canonical_devices(["gpu:0"], job="worker", task=2)[0].name
        '/job:worker/replica:0/task:2/device:GPU:0'
    """
    specs = _as_list(devices)
    if not specs:
        raise InvalidDeviceError("devices is empty; give at least one, e.g. ['/cpu:0']")
    seen: dict[Device, str | Device] = {}
    for spec in specs:
        given = _parse(spec)
        for name, want, has in (("job", job, given.job), ("task", task, given.task)):
            if want is not None and has is not None and has != want:
                raise InvalidDeviceError(
                    f"device {short(spec)} belongs to {name} {has!r}, but this process is "
                    f"{name} {want!r}; a strategy's devices are this process's own: drop the "
                    f"'/job:.../task:...' parts or name {name} {want!r}"
                )
        device = _fill(given, job if job is not None else "localhost", 0 if task is None else task)
        if device in seen:
            raise InvalidDeviceError(
                f"device {device.name} is listed twice (as {short(seen[device])} and "
                f"{short(spec)}); each replica needs its own device, e.g. ['/cpu:0', '/cpu:1']"
            )
        seen[device] = spec
    return tuple(seen)


def visible_gpu_count() -> int:
    """How many GPUs this process can use: 0 without CuPy or without an NVIDIA driver.

    Honours ``CUDA_VISIBLE_DEVICES`` (an empty or ``-1`` value gives 0 without
    starting CUDA); otherwise asks CuPy's ``getDeviceCount()``, which makes CUDA
    read ``CUDA_VISIBLE_DEVICES`` for good, so call it after GPUs are bound.
    A CuPy that is installed but broken, or that the driver is too old for, raises
    :class:`~hpcdist.errors.GpuSetupError` instead of training on the CPU unnoticed.

    Example:
        >>> visible_gpu_count() >= 0
        True
    """
    if parse_visible_devices(os.environ.get(CUDA_VISIBLE_DEVICES)) == []:
        return 0
    try:
        import cupy  # lazy: optional GPU dependency (CuPy)
    except ModuleNotFoundError as exc:
        if exc.name == "cupy":
            return 0  # no CuPy: a CPU install
        raise _broken(f"CuPy fails to import ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:
        raise _broken(f"CuPy fails to import ({type(exc).__name__}: {exc})") from exc
    try:
        return max(0, int(cupy.cuda.runtime.getDeviceCount()))
    except Exception as exc:
        status = getattr(exc, "status", None)
        if status == _NO_DEVICE or (status in _NO_DRIVER and not nvidia_driver_present()):
            return 0  # a machine without GPUs (or without an NVIDIA driver)
        version = getattr(cupy, "__version__", "?")
        raise _broken(
            f"CuPy {version} cannot count the GPUs ({type(exc).__name__}: {exc})"
        ) from exc


_NO_DEVICE = 100  # cudaErrorNoDevice
_NO_DRIVER = (34, 35)  # cudaErrorStubLibrary, cudaErrorInsufficientDriver


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver (its ``libcuda`` loads).

    Example:
        >>> isinstance(nvidia_driver_present(), bool)
        True
    """
    if os.path.exists("/proc/driver/nvidia/version"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _broken(what: str) -> GpuSetupError:
    return GpuSetupError(
        f"{what}. hpcdist does not fall back to the CPU silently: install the CuPy wheel for "
        "this driver (pip install 'hpcdist[gpu]' for CUDA 13: cupy-cuda13x, nvidia-nccl-cu13, "
        "numba-cuda[cu13]; 'hpcdist[gpu-cuda12]' for CUDA 12 drivers), uninstall CuPy, or set "
        "CUDA_VISIBLE_DEVICES='' to run on CPUs on purpose"
    )


def default_devices(*, job: str = "localhost", task: int = 0) -> tuple[Device, ...]:
    """Every visible GPU, else one CPU: TF's ``MirroredStrategy(devices=None)``.

    Example:
        >>> default_devices()[0].device_type in ("CPU", "GPU")
        True
    """
    n = visible_gpu_count()
    kinds = [("GPU", i) for i in range(n)] if n else [("CPU", 0)]
    return tuple(Device(job, 0, task, kind, i) for kind, i in kinds)


def check_devices_exist(devices: Iterable[str | Device]) -> tuple[Device, ...]:
    """Parse ``devices`` and check that each GPU among them is visible to this process.

    CPU devices of any index are accepted: like TF's logical CPU devices (without
    configuring them first), ``/cpu:0`` and ``/cpu:1`` let two replicas share a CPU.

    Example:
        >>> [d.short for d in check_devices_exist(["/cpu:0", "/cpu:7"])]
        ['CPU:0', 'CPU:7']
    """
    parsed = tuple(parse_device(d) for d in _as_list(devices))
    gpus = [d for d in parsed if d.device_type == "GPU"]
    n = visible_gpu_count() if gpus else 0
    bad = [d for d in gpus if d.index >= n]
    if bad:
        env = os.environ.get(CUDA_VISIBLE_DEVICES)
        fix = f"use GPU indices 0..{n - 1}" if n else "use CPU devices such as '/cpu:0'"
        raise InvalidDeviceError(
            f"device {bad[0].name} needs GPU {bad[0].index}, but this process sees {n} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={'unset' if env is None else repr(env)}; GPUs need CuPy and "
            f"a CUDA device, and after GPU binding each rank sees only its own GPUs, numbered "
            f"from 0); {fix}, or ask the scheduler for more GPUs per task"
        )
    return parsed


__all__ = ["ACCEPTED_FORMS", "Device", "InvalidDeviceError", "canonical_devices"]
__all__ += ["check_devices_exist", "default_devices", "nvidia_driver_present", "parse_device"]
__all__ += ["visible_gpu_count"]
