"""Which GPUs a rank uses: ``CUDA_VISIBLE_DEVICES`` parsing and binding among a host's ranks.

One rule decides (:func:`bind_among_peers`): the ranks of one host that saw
the same ``CUDA_VISIBLE_DEVICES`` list form a group and split that list among
themselves in rank order; a rank alone with its list keeps all of it. That
needs every host-local rank's list, which hpcdist's runtime gathers over MPI;
no scheduler variable is read. :func:`bind_gpus` is the fallback for one
process that cannot ask its peers: it guesses their lists from its own view.

Pure functions of an ``environ`` mapping (``os.environ`` by default); only
:func:`count_gpus` looks at the machine. Nothing beyond the standard library
and hpcdist's own pure modules is imported here.

Example:
    >>> parse_visible_devices("0, 1,GPU-8932f937-d72c-4106-c12f-20bd9faed9f6")
    ['0', '1', 'GPU-8932f937-d72c-4106-c12f-20bd9faed9f6']
    >>> same = [("4", "5", "6", "7")] * 2          # two ranks saw the same four GPUs
    >>> bind_among_peers(same, 1).visible
    ('6', '7')
    >>> own = [("0",), ("1",), ("2",), ("3",)]     # srun gave each rank its own GPU
    >>> bind_among_peers(own, 2).visible
    ('2',)
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from hpcdist.cluster.envparse import MAX_DIGITS, check_int_arg, environ_or_default, short
from hpcdist.cluster.launchers import SrunLauncher, find_launcher
from hpcdist.errors import GPUBindingError, TooFewGPUsError

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: The most GPUs accepted for one host (``num_gpus``) or one rank (``gpus_per_task``).
MAX_GPUS = 65_536
#: The most ranks accepted on one host.
MAX_TASKS = 1_000_000
#: What :func:`apply_binding` set ``CUDA_VISIBLE_DEVICES`` to, and what it was before
#: (absent when it was unset): binding again reads the value from before.
BOUND_MARK = "HPCDIST_BOUND_CUDA_VISIBLE_DEVICES"
BEFORE_MARK = "HPCDIST_CUDA_VISIBLE_DEVICES_BEFORE"

_ORDINAL = re.compile(r"[0-9]+")
_HEX = r"[0-9a-fA-F]+(?:-[0-9a-fA-F]+)*"
_GPU_UUID = re.compile(rf"GPU-{_HEX}")
_MIG_OLD = re.compile(rf"MIG-GPU-{_HEX}/[0-9]+/[0-9]+")
_MIG_NEW = re.compile(rf"MIG-{_HEX}")
# srun's per-task GPU bindings, as --gpu-bind (map_gpu, ...) or --tres-bind=gres/gpu: (map, ...)
_PER_TASK_BIND = re.compile(r"(?:^|[,:])\s*(?:per_task|single|map_gpu|mask_gpu|map|mask)\s*:")


def _entry(text: str) -> str | None:
    """The normalised device entry, or ``None`` when CUDA would reject it."""
    if _ORDINAL.fullmatch(text):
        ordinal = text.lstrip("0") or "0"
        return ordinal if len(ordinal) <= MAX_DIGITS else None  # no such device
    if _GPU_UUID.fullmatch(text) or _MIG_OLD.fullmatch(text) or _MIG_NEW.fullmatch(text):
        return text
    return None


def parse_visible_devices(value: str | None) -> list[str] | None:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value, as CUDA reads them.

    ``None`` when the variable is unset (every GPU is visible). Entries are
    ordinals (``"0"``), GPU UUIDs (``"GPU-8932f937-..."``), or MIG devices
    (``"MIG-GPU-<uuid>/1/0"`` before CUDA 11.8 and ``"MIG-<uuid>"`` after).
    White space around entries is dropped and ordinals are normalised
    (``"01"`` -> ``"1"``).

    Like CUDA (whose documented rule is that only the devices listed before an
    invalid entry are visible), reading stops at the first invalid entry
    rather than raising: ``"0,1,x,2"`` gives ``["0", "1"]``, and ``""``,
    ``"-1"`` and SLURM's ``"NoDevFiles"`` give ``[]`` (no GPU). An entry
    listed twice counts as invalid, so ``"0,0"`` gives ``["0"]``.

    Example:
        >>> parse_visible_devices(None), parse_visible_devices("-1")
        (None, [])
        >>> parse_visible_devices("2,MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0,x,3")
        ['2', 'MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0']
    """
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = _entry(raw.strip())
        if entry is None or entry in entries:
            break
        entries.append(entry)
    return entries


@dataclass(frozen=True)
class GPUBinding:
    """The GPUs one rank uses.

    Attributes:
        visible: the ``CUDA_VISIBLE_DEVICES`` entries of this rank (ordinals,
            UUIDs or MIG ids); empty when the rank runs on the CPU.
        ordinals: the device indices the process uses once
            ``CUDA_VISIBLE_DEVICES`` equals :meth:`cuda_visible_devices`,
            that is ``0 .. len(visible) - 1``.
        narrowed: ``True`` when the rank keeps its whole list as given (it was
            its own, or one GPU shared by all): binding changes nothing.
        source: where the list came from, for messages.
        shared: ``True`` when other ranks of the host use the same GPUs
            (fewer GPUs than ranks, and no ``gpus_per_task`` asked for).

    Example:
        >>> b = GPUBinding(("2", "3"), (0, 1), False, "CUDA_VISIBLE_DEVICES")
        >>> b.cuda_visible_devices(), b.describe()
        ('2,3', 'GPUs 2,3 (CUDA_VISIBLE_DEVICES), used as devices 0,1')
    """

    visible: tuple[str, ...]
    ordinals: tuple[int, ...]
    narrowed: bool
    source: str
    shared: bool = False

    def cuda_visible_devices(self) -> str:
        """The value to give ``CUDA_VISIBLE_DEVICES`` (``""`` hides every GPU)."""
        return ",".join(self.visible)

    def describe(self) -> str:
        """One line for logs, e.g. ``"GPUs 2,3 (CUDA_VISIBLE_DEVICES), used as devices 0,1"``."""
        if not self.visible:
            return f"no GPU, CPU only ({self.source})"
        noun = "GPU" if len(self.visible) == 1 else "GPUs"
        ordinals = ",".join(str(i) for i in self.ordinals)
        notes = [self.source]
        if self.narrowed:
            notes.append("kept as given")
        if self.shared:
            notes.append("shared with other ranks")
        where = ", ".join(notes)
        return f"{noun} {self.cuda_visible_devices()} ({where}), used as devices {ordinals}"


def visible_devices_before_binding(environ: Mapping[str, str] | None = None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` as it was before :func:`apply_binding` changed it.

    The current value when hpcdist did not set it (or someone changed it since).

    Example:
        >>> env = {"CUDA_VISIBLE_DEVICES": "0,1"}
        >>> apply_binding(bind_gpus(1, 2, environ=env), env)
        >>> env["CUDA_VISIBLE_DEVICES"], visible_devices_before_binding(env)
        ('1', '0,1')
    """
    environ = environ_or_default(environ)
    current = environ.get(CUDA_VISIBLE_DEVICES)
    if current is not None and environ.get(BOUND_MARK) == current:
        return environ.get(BEFORE_MARK)
    return current


def apply_binding(binding: GPUBinding, environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``CUDA_VISIBLE_DEVICES`` to ``binding`` (before CUDA starts in this process).

    Also records the previous value (:data:`BEFORE_MARK`), so that binding
    again, in this process or a child, starts from the scheduler's value and
    gives the same GPUs instead of splitting an already split list.

    Example:
        >>> env = {}
        >>> apply_binding(bind_gpus(1, 2, environ=env, num_gpus=4), env)
        >>> env["CUDA_VISIBLE_DEVICES"], bind_gpus(1, 2, environ=env, num_gpus=4).visible
        ('2,3', ('2', '3'))
    """
    if environ is None:
        environ = os.environ
    before = visible_devices_before_binding(environ)
    if before is None:
        environ.pop(BEFORE_MARK, None)
    else:
        environ[BEFORE_MARK] = before
    value = binding.cuda_visible_devices()
    environ[CUDA_VISIBLE_DEVICES] = value
    environ[BOUND_MARK] = value


def _int_arg(name: str, value: object, minimum: int, maximum: int) -> int:
    value = check_int_arg(name, value, minimum, GPUBindingError)
    if value > maximum:
        raise GPUBindingError(
            f"{name}={short(value)} is more than one host holds (at most {maximum:,} here); "
            f"pass the number for this host"
        )
    return value


def _rank_list(index: int, entries: object) -> tuple[str, ...] | None:
    if entries is None:
        return None
    if (
        not isinstance(entries, Sequence)
        or isinstance(entries, (str, bytes))
        or not all(isinstance(e, str) for e in entries)
    ):
        raise GPUBindingError(
            f"lists[{index}] must be None or a tuple of CUDA_VISIBLE_DEVICES entries (as "
            f"parse_visible_devices gives them); found {short(entries)}"
        )
    return tuple(entries)


def _too_few(members: int, n: int, g: int, where: str) -> TooFewGPUsError:
    if members == 1:
        return TooFewGPUsError(
            f"gpus_per_task={g}, but this rank sees only {n} GPU(s) ({where}); pass "
            f"gpus_per_task={n} (or None to use what it sees), or ask the scheduler for {g} "
            f"GPUs per task (e.g. srun --gpus-per-task={g})"
        )
    fixes = [
        f"run at most {n // g} rank(s) per node"
        if n >= g
        else f"ask the scheduler for {members * g} GPUs per node",
        f"pass gpus_per_task={n // members}"
        if n >= members
        else "pass gpus_per_task=None to let them share",
        f"let the scheduler give each rank its own GPUs (e.g. srun --gpus-per-task={g})",
    ]
    return TooFewGPUsError(
        f"{members} ranks on this host see the same {n} GPU(s) ({where}) and need "
        f"{members * g} for gpus_per_task={g}; {', '.join(fixes[:2])}, or {fixes[2]}"
    )


def bind_among_peers(
    lists: Sequence[Sequence[str] | None],
    rank: int,
    gpus_per_task: int | None = None,
    num_gpus: int | None = None,
) -> GPUBinding:
    """The GPUs of host-local rank ``rank``, given what every rank of the host saw.

    ``lists[i]`` is the tuple of ``CUDA_VISIBLE_DEVICES`` entries that
    host-local rank ``i`` saw before any binding (:func:`parse_visible_devices`
    of :func:`visible_devices_before_binding`), ``None`` where it was unset:
    then the host's GPUs, ordinals ``0 .. num_gpus - 1`` (``num_gpus``
    defaulting to :func:`count_gpus`). Pure otherwise: no variable is read.

    Ranks whose lists are equal form a group and split their list in rank
    order: with ``g = gpus_per_task`` (else ``max(1, len(list) // group size)``)
    the ``k``-th rank of the group gets entries ``[k*g, (k+1)*g)``. So a rank
    alone with its list (the scheduler bound GPUs to tasks) keeps all of it,
    and ranks that share a list (no binding, or srun ``--gpu-bind=closest``
    giving each NUMA domain's tasks that domain's GPUs) divide it. Groups whose
    lists differ but overlap are not reconciled.

    Too few entries for the group: with ``gpus_per_task`` given, an error;
    without it, the ranks share them round-robin (rank ``k`` gets entry
    ``k % len``, ``shared=True``). No entry at all gives a CPU binding, as
    does ``gpus_per_task=0``.

    Raises:
        GPUBindingError: bad arguments; ``gpus_per_task >= 1`` asked for but
            no GPU is visible, or fewer entries than the group needs (the
            message names both numbers and the fixes); more than one MIG
            device for one rank (a CUDA process can use only one).

    Example:
        >>> closest = [("0", "1"), ("0", "1"), ("2", "3"), ("2", "3")]
        >>> [bind_among_peers(closest, r).visible for r in range(4)]
        [('0',), ('1',), ('2',), ('3',)]
        >>> bind_among_peers([None, None], 1, gpus_per_task=2, num_gpus=4).visible
        ('2', '3')
        >>> b = bind_among_peers([("5",)] * 3, 2)
        >>> b.visible, b.shared
        (('5',), True)
    """
    if isinstance(lists, (str, bytes)) or not isinstance(lists, Sequence):
        raise GPUBindingError(
            f"lists must be a sequence with one entry per host-local rank; found {short(lists)}"
        )
    if not 1 <= len(lists) <= MAX_TASKS:
        raise GPUBindingError(
            f"lists has {len(lists)} entries; expected one per host-local rank (1 to {MAX_TASKS:,})"
        )
    rank = _int_arg("rank", rank, 0, MAX_TASKS)
    if rank >= len(lists):
        raise GPUBindingError(
            f"rank {rank} is not below len(lists) = {len(lists)}; rank indexes lists"
        )
    if gpus_per_task is not None:
        gpus_per_task = _int_arg("gpus_per_task", gpus_per_task, 0, MAX_GPUS)
    if num_gpus is not None:
        num_gpus = _int_arg("num_gpus", num_gpus, 0, MAX_GPUS)
    given = [_rank_list(i, x) for i, x in enumerate(lists)]
    host: tuple[str, ...] = ()
    if any(x is None for x in given):
        host = tuple(str(i) for i in range(count_gpus() if num_gpus is None else num_gpus))
    resolved = [host if x is None else x for x in given]
    if given[rank] is not None:
        source = CUDA_VISIBLE_DEVICES
        where = f"CUDA_VISIBLE_DEVICES={short(','.join(resolved[rank]))}"
    elif num_gpus is None:
        source, where = "count_gpus()", f"count_gpus() found {len(host)}"
    else:
        source = where = f"num_gpus={num_gpus}"
    entries = resolved[rank]
    group = [i for i, x in enumerate(resolved) if x == entries]
    members, k, n = len(group), group.index(rank), len(entries)

    if gpus_per_task == 0:
        return GPUBinding((), (), not entries, "gpus_per_task=0")
    if not entries:
        if gpus_per_task is not None:
            raise GPUBindingError(
                f"gpus_per_task={gpus_per_task} was asked for, but no GPU is visible ({where}); "
                f"request GPUs from the scheduler (e.g. srun --gpus-per-task={gpus_per_task}) "
                f"or pass gpus_per_task=None to run on the CPU"
            )
        return GPUBinding((), (), True, source)
    g = max(1, n // members) if gpus_per_task is None else gpus_per_task
    shared = n < members * g
    if not shared:
        mine = entries[k * g : (k + 1) * g]
    elif gpus_per_task is not None:
        raise _too_few(members, n, g, where)
    else:
        mine = (entries[k % n],)
    migs = [e for e in mine if e.startswith("MIG-")]
    if len(migs) > 1:
        raise GPUBindingError(
            f"host-local rank {rank} would get {len(migs)} MIG devices ({short(','.join(migs))}) "
            f"from {where}, but a CUDA process can use only one MIG device; run one rank per "
            f"MIG device, or pass gpus_per_task=1"
        )
    return GPUBinding(mine, tuple(range(len(mine))), mine == entries, source, shared)


def _count_entries(value: str | None) -> int:
    """The number of ordinals in a SLURM GPU list (``"0,1,2"``); 0 when unset or unreadable."""
    if value is None or not re.fullmatch(r"\s*[0-9]+\s*(?:,\s*[0-9]+\s*)*", value):
        return 0
    return len(value.split(","))


def _count(value: str | None) -> int:
    text = (value or "").strip()
    ok = text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS
    return int(text) if ok else 0


def _srun_bound_this_task(n_visible: int, environ: Mapping[str, str]) -> bool:
    """srun started this task and gave it its own GPUs, as far as the variables show.

    Either the step has more GPUs on this node than the task sees (the larger
    of the ``SLURM_STEP_GPUS`` entries and ``SLURM_GPUS_ON_NODE``: binding may
    rewrite ``SLURM_STEP_GPUS`` to the task's own), or srun was asked for a
    per-task binding (``per_task``, ``single``, ``map_gpu``, ``mask_gpu`` in
    ``SLURM_GPU_BIND``; ``gres/gpu:`` with those or ``map``/``mask`` in
    ``SLURM_TRES_BIND``).
    """
    if not isinstance(find_launcher(environ), SrunLauncher):
        return False
    on_node = max(
        _count_entries(environ.get("SLURM_STEP_GPUS")), _count(environ.get("SLURM_GPUS_ON_NODE"))
    )
    if on_node > n_visible:
        return True
    texts = [environ.get("SLURM_GPU_BIND", "")] + [
        part
        for part in environ.get("SLURM_TRES_BIND", "").split("+")
        if part.strip().lower().startswith("gres/gpu:")
    ]
    return any(_PER_TASK_BIND.search(text.lower()) for text in texts)


def bind_gpus(
    local_rank: int,
    local_size: int,
    gpus_per_task: int | None = None,
    environ: Mapping[str, str] | None = None,
    num_gpus: int | None = None,
) -> GPUBinding:
    """The GPUs of ``local_rank`` among ``local_size`` ranks of this host, from this rank alone.

    The fallback where the other ranks' lists are unknown (no MPI): it builds
    the lists for :func:`bind_among_peers` from this rank's view. Its own list
    is ``CUDA_VISIBLE_DEVICES`` as it was before :func:`apply_binding` (so
    binding twice gives the same GPUs), or the host's ``num_gpus`` GPUs when
    unset. When srun visibly gave this task its own GPUs (see
    ``_srun_bound_this_task``: the step has more GPUs on this node than the task
    sees, or a per-task ``--gpu-bind``/``--tres-bind``), the list is the
    task's alone and kept; otherwise every rank of the host is *assumed* to
    see the same list, and it is split by ``local_rank``.

    The assumption fails where ranks see different lists without such a
    sign (``--gpu-bind=closest``, or a launcher that sets
    ``CUDA_VISIBLE_DEVICES`` per rank): the runtime's path, which gathers
    every rank's list over MPI and calls :func:`bind_among_peers`, is the
    reliable one.

    Raises:
        GPUBindingError: as :func:`bind_among_peers`, and bad ``local_rank``/
            ``local_size``.
        LauncherConfigError: a malformed ``SLURM_STEP_ID`` (read to tell
            whether srun started this task).

    Example:
        >>> bind_gpus(1, 2, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}).visible
        ('6', '7')
        >>> bind_gpus(3, 4, gpus_per_task=2, environ={}, num_gpus=8).visible
        ('6', '7')
        >>> bind_gpus(0, 2, environ={}, num_gpus=0).describe()
        'no GPU, CPU only (num_gpus=0)'
    """
    local_size = _int_arg("local_size", local_size, 1, MAX_TASKS)
    local_rank = _int_arg("local_rank", local_rank, 0, MAX_TASKS)
    if local_rank >= local_size:
        raise GPUBindingError(
            f"local_rank {local_rank} is not below local_size {local_size}; "
            f"a host with {local_size} ranks has local ranks 0..{local_size - 1}"
        )
    environ = environ_or_default(environ)
    visible = parse_visible_devices(visible_devices_before_binding(environ))
    own = None if visible is None else tuple(visible)
    if own is not None and _srun_bound_this_task(len(own), environ):
        return bind_among_peers([own], 0, gpus_per_task, num_gpus)
    try:
        return bind_among_peers([own] * local_size, local_rank, gpus_per_task, num_gpus)
    except TooFewGPUsError as e:
        if own is None:
            raise
        raise GPUBindingError(
            f"{e}. This assumed that all {local_size} ranks of the host see this same list, as "
            f"nothing shows that srun gave each task its own GPUs; if each rank sees its own, "
            f"bind with every rank's list (bind_among_peers; hpcdist's runtime gathers them "
            f"over MPI)"
        ) from None


def _count_with_nvidia_smi() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


#: Device files of the GPU drivers CuPy runs on: NVIDIA's (``/dev/nvidia0``...), Jetson's,
#: WSL 2's and AMD's (ROCm builds of CuPy). With none of them there is no GPU to count.
GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/nvhost-ctrl-gpu", "/dev/dxg", "/dev/kfd")


def _has_gpu_driver() -> bool:
    return any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES)


def _count_with_cupy() -> int | None:
    try:
        if importlib.util.find_spec("cupy") is None:
            return None
    except (ImportError, ValueError):
        return None
    if not _has_gpu_driver():
        return 0  # no driver: not worth a child that imports CuPy (about 1.5 s of CPU)
    code = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    ok = out.returncode == 0 and text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS
    return int(text) if ok else None


@functools.lru_cache(maxsize=1)
def count_gpus() -> int:
    """The number of GPUs on this machine; 0 when none can be found. Never raises.

    Asks ``nvidia-smi -L`` first (5 s timeout; MIG instances are not counted,
    their parent GPUs are), then, where there is no ``nvidia-smi`` but a GPU driver's
    device file (:data:`GPU_DEVICE_FILES`), CuPy's
    ``cupy.cuda.runtime.getDeviceCount()`` in a child process. Neither
    initialises CUDA in this process: CUDA reads ``CUDA_VISIBLE_DEVICES``
    once, when it starts, so a count taken in-process before a resolver sets
    that variable would pin every task to the same devices. The answer is
    cached for the life of the process (``count_gpus.cache_clear()`` forgets it).

    Example:
        >>> count_gpus() >= 0
        True
    """
    for probe in (_count_with_nvidia_smi, _count_with_cupy):
        try:
            found = probe()
        except Exception:  # noqa: BLE001 - a probe must never break resolution
            found = None
        if found is not None:
            return found
    return 0


__all__ = [
    "BEFORE_MARK",
    "BOUND_MARK",
    "CUDA_VISIBLE_DEVICES",
    "GPUBinding",
    "MAX_GPUS",
    "MAX_TASKS",
    "apply_binding",
    "bind_among_peers",
    "bind_gpus",
    "count_gpus",
    "parse_visible_devices",
    "visible_devices_before_binding",
]
