"""Autosharding: which part of the input each worker reads (TF's ``AutoShardPolicy``).

The policy comes from ``dataset.options().distribute.auto_shard_policy``:

* ``FILE``: each worker reads its own files. A ``ShardDataset(files, W, w)``
  is put right after the file source (``Dataset.list_files`` /
  ``Dataset.from_files``), so worker ``w`` gets files ``w, w + W, ...``.
  Fewer files than workers is an error.
* ``DATA``: every worker runs the whole pipeline and keeps its own
  sub-batches of each global batch. Simple and exact, but each worker reads
  and preprocesses everything.
* ``AUTO`` (the default): ``FILE`` when the pipeline reads files
  (a file source feeding a reader such as ``read_npy``) and there are at
  least as many files as workers, otherwise ``DATA``. The choice and its
  reason are logged once per dataset, by worker 0: a warning where every
  worker reads the same files (redundant reading that more files would
  avoid), one INFO line for input that is already in memory (arrays,
  ranges, generators), where ``DATA`` is the only sensible policy.
* ``OFF``: no sharding; every worker reads the same data.
* ``HINT``: in TF, shards only where the pipeline carries
  ``tf.data.experimental.SHARD_HINT`` placeholders. hpcdist pipelines have no
  such placeholders, so ``HINT`` does nothing, like ``OFF`` (and says so).

With one worker nothing is sharded.

Example:
    >>> from hpcdist.data.dataset import Dataset
    >>> plan = apply_autoshard(Dataset.range(8).batch(2), num_workers=2, worker_index=0)
    >>> plan.policy.name
    'DATA'
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, NamedTuple

from hpcdist.data.options import AutoShardPolicy
from hpcdist.data.passthrough_nodes import ShardDataset
from hpcdist.data.source_nodes import FileListDataset
from hpcdist.data.transform_nodes import FileReaderDataset, ShuffleDataset

log = logging.getLogger("hpcdist")


class ShardPlan(NamedTuple):
    """What autosharding did: the dataset to read and the policy in effect.

    ``policy`` is ``FILE``, ``DATA`` or ``OFF`` (``OFF`` also for one worker
    and for ``HINT``); ``requested`` is the dataset's own option and
    ``reason`` one sentence saying why.
    """

    dataset: Any
    policy: AutoShardPolicy
    requested: AutoShardPolicy
    reason: str


def chain_of(dataset: Any) -> list[Any]:
    """The nodes of ``dataset``'s pipeline, from the source to ``dataset`` itself.

    Example: ``[type(n).__name__ for n in chain_of(Dataset.range(4).batch(2))]`` is
    ``['RangeDataset', 'BatchDataset']``.
    """
    nodes = []
    node = dataset
    while node is not None:
        nodes.append(node)
        node = getattr(node, "_input", None)
    return nodes[::-1]


def requested_policy(dataset: Any) -> AutoShardPolicy:
    """The auto-shard policy the dataset's options ask for (``AUTO`` if unset).

    Example: ``requested_policy(Dataset.range(3))`` is ``AutoShardPolicy.AUTO``.
    """
    options = dataset.options() if hasattr(dataset, "options") else None
    distribute = getattr(options, "distribute", None)
    value = getattr(distribute, "auto_shard_policy", AutoShardPolicy.AUTO)
    return _as_policy(value)


def _as_policy(value: Any) -> AutoShardPolicy:
    return AutoShardPolicy.from_any(value)


def _file_source(chain: list[Any]) -> tuple[int, bool]:
    """(index of the file-name source in ``chain`` or -1, whether a file reader follows it)."""

    if not chain or not isinstance(chain[0], FileListDataset):
        return -1, False
    return 0, any(isinstance(node, FileReaderDataset) for node in chain[1:])


def _describe(chain: list[Any]) -> str:
    return " -> ".join(type(node).__name__ for node in chain)


_logged: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()


def _first_time(dataset: Any, num_workers: int) -> bool:
    """Whether ``dataset``'s choice over ``num_workers`` has not been logged yet (once each)."""
    try:
        seen = _logged.setdefault(dataset, set())
    except TypeError:  # not weak-referenceable: log every time
        return True
    if num_workers in seen:
        return False
    seen.add(num_workers)
    return True


def _unseeded_shuffles(chain: list[Any]) -> list[str]:
    """Nodes that give each worker a different order (no seed): bad for DATA and FILE."""

    found = []
    for node in chain:
        if (
            isinstance(node, ShuffleDataset)
            and getattr(node, "seed", None) is None
            and not getattr(node, "seed_from_stream", False)  # hd.utils.set_random_seed
        ):
            found.append("shuffle() without a seed")
        elif (
            isinstance(node, FileListDataset)
            and getattr(node, "shuffle_files", False)
            and getattr(node, "seed", None) is None
            and not getattr(node, "seed_from_stream", False)
        ):
            found.append("list_files() shuffling without a seed")
    return found


def choose_policy(
    dataset: Any, num_workers: int, requested: AutoShardPolicy | int | str | None = None
) -> tuple[AutoShardPolicy, AutoShardPolicy, str]:
    """``(policy in effect, policy requested, reason)`` for ``dataset`` on ``num_workers``.

    ``requested`` overrides the policy of the dataset's options. Raises
    ``ValueError`` for ``FILE`` when the pipeline has no file source or fewer
    files than workers (the same on every worker, so no hang).

    Example: ``choose_policy(Dataset.range(4).batch(2), 2)[0]`` is ``AutoShardPolicy.DATA``.
    """
    requested = requested_policy(dataset) if requested is None else _as_policy(requested)
    if num_workers == 1:
        return AutoShardPolicy.OFF, requested, "there is one worker, so nothing is sharded"
    if requested is AutoShardPolicy.OFF:
        return (
            AutoShardPolicy.OFF,
            requested,
            ("auto_shard_policy is OFF: every worker reads the same data"),
        )
    if requested is AutoShardPolicy.HINT:
        return (
            AutoShardPolicy.OFF,
            requested,
            (
                "auto_shard_policy is HINT, which shards only at SHARD_HINT placeholders; hpcdist "
                "pipelines have none, so nothing is sharded and every worker reads the same data "
                "(use FILE or DATA to shard)"
            ),
        )
    chain = chain_of(dataset)
    index, has_reader = _file_source(chain)
    n_files = len(chain[index].files) if index >= 0 else 0
    if requested is AutoShardPolicy.FILE:
        if index < 0:
            raise ValueError(
                "auto_shard_policy is FILE, but the pipeline does not start from files "
                f"({_describe(chain)}); FILE needs Dataset.list_files(...) or "
                "Dataset.from_files(...) as its source. Use AutoShardPolicy.DATA (every worker "
                "reads everything and keeps its part) or OFF"
            )
        _check_enough_files(n_files, num_workers)
        return (
            AutoShardPolicy.FILE,
            requested,
            (
                f"auto_shard_policy is FILE: each of the {num_workers} workers reads its own "
                f"files out of {n_files}"
            ),
        )
    if requested is AutoShardPolicy.DATA:
        return (
            AutoShardPolicy.DATA,
            requested,
            (
                "auto_shard_policy is DATA: every worker reads and preprocesses the WHOLE input "
                "and keeps its own part of each global batch"
            ),
        )
    # AUTO
    if index >= 0 and has_reader and n_files >= num_workers:
        return (
            AutoShardPolicy.FILE,
            requested,
            (
                f"auto_shard_policy AUTO chose FILE: the pipeline reads {n_files} files, at least "
                f"one per worker ({num_workers}), so each worker reads its own files"
            ),
        )
    if index >= 0 and has_reader:
        why = (
            f"the pipeline reads {n_files} file(s), fewer than the {num_workers} workers "
            "(FILE needs one file per worker at least)"
        )
    elif index >= 0:
        why = (
            "the file list is not read by a file reader (read_npy/read_npz/read_hdf5) "
            "in the pipeline"
        )
    else:
        return (
            AutoShardPolicy.DATA,
            requested,
            (
                f"auto_shard_policy AUTO uses DATA for input that does not come from files "
                f"({_describe(chain)}): each worker keeps its own part of every global batch"
            ),
        )
    return (
        AutoShardPolicy.DATA,
        requested,
        (
            f"auto_shard_policy AUTO fell back to DATA because {why}: every worker reads and "
            "preprocesses the WHOLE input and keeps its own part of each global batch. To avoid "
            "the redundant work, split the input into at least as many files as workers, or use "
            "distribute_datasets_from_function"
        ),
    )


def _check_enough_files(n_files: int, num_workers: int) -> None:
    if n_files < num_workers:
        raise ValueError(
            f"auto_shard_policy FILE needs at least one input file per worker, but there are "
            f"{n_files} file(s) for {num_workers} workers. Split the data into at least "
            f"{num_workers} files, or use AutoShardPolicy.DATA or OFF "
            "(dataset.with_options(options))"
        )


def shard_files(dataset: Any, num_workers: int, worker_index: int) -> Any:
    """``dataset`` with ``ShardDataset(files, W, w)`` right after its file source.

    Every node after the source is re-attached with ``_with_input``.

    Example: ``shard_files(Dataset.from_files(paths).read_npy().batch(4), 2, 1)``.
    """

    chain = chain_of(dataset)
    index, _ = _file_source(chain)
    if index < 0:
        raise ValueError(f"the pipeline has no file source to shard ({_describe(chain)})")
    _check_enough_files(len(chain[index].files), num_workers)
    node = ShardDataset(chain[index], num_workers, worker_index)
    for downstream in chain[index + 1 :]:
        node = downstream._with_input(node)
    return node


def apply_autoshard(
    dataset: Any,
    num_workers: int,
    worker_index: int,
    policy: AutoShardPolicy | int | str | None = None,
) -> ShardPlan:
    """Choose and apply the auto-shard policy for worker ``worker_index`` of ``num_workers``.

    ``policy`` overrides the dataset's own option. ``FILE`` returns the
    dataset with its files sharded; ``DATA`` and ``OFF`` return it unchanged
    (DATA's per-batch selection happens when rebatching). The choice is
    logged once, by worker 0: a warning when ``AUTO`` falls back to ``DATA`` (or a
    shuffle has no seed), info otherwise.

    Example: ``apply_autoshard(ds, 2, 0).policy`` is ``AutoShardPolicy.DATA`` for a
    ``Dataset.range`` pipeline.
    """
    chosen, requested, reason = choose_policy(dataset, num_workers, policy)
    if num_workers > 1:
        sharded = chosen is not AutoShardPolicy.OFF
        unseeded = _unseeded_shuffles(chain_of(dataset)) if sharded else []
        if unseeded:
            reason += (
                f". WARNING: the pipeline has {' and '.join(sorted(set(unseeded)))}, so the "
                "workers see the data in different orders and may read some elements twice "
                "and others never; give it a seed"
            )
        if worker_index == 0 and _first_time(dataset, num_workers):
            # Falling back to DATA over files is a warning (every worker reads them all); for
            # input in memory DATA is the only choice, and asked for explicitly the user's.
            fell_back = chosen is AutoShardPolicy.DATA and requested is not AutoShardPolicy.DATA
            reads_files = _file_source(chain_of(dataset))[0] >= 0
            level = logging.WARNING if (fell_back and reads_files) or unseeded else logging.INFO
            log.log(level, "hpcdist distributed dataset (%d workers): %s", num_workers, reason)
    if chosen is AutoShardPolicy.FILE:
        dataset = shard_files(dataset, num_workers, worker_index)
    return ShardPlan(dataset, chosen, requested, reason)


__all__ = [
    "ShardPlan",
    "apply_autoshard",
    "chain_of",
    "choose_policy",
    "requested_policy",
    "shard_files",
]
