"""The input-pipeline provider: how a strategy distributes datasets it cannot import.

Strategies sit below :mod:`hpcdist.data` in the layers, yet
``strategy.experimental_distribute_dataset`` must hand back a distributed
dataset. The strategy layer therefore defines the small protocol here, and
:mod:`hpcdist.data` registers its implementation when it is imported
(``import hpcdist`` imports it, so users always have one).

Example:
    >>> import hpcdist  # registers hpcdist.data's provider
    >>> type(input_pipeline()).__name__
    'DataInputPipeline'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from hpcdist.errors import NotRegisteredError

__all__ = ["InputPipelineProvider", "input_pipeline", "register_input_pipeline"]


class InputPipelineProvider(Protocol):
    """What a strategy asks of the input layer.

    ``placement`` is the strategy's view of the job: ``num_workers``,
    ``worker_index``, ``num_replicas_per_worker``, ``collectives`` and ``devices``.
    """

    def distribute_dataset(self, dataset: Any, options: Any, **placement: Any) -> Any:
        """``dataset``'s global batches split over the replicas (a distributed dataset)."""
        ...

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[Any], Any], options: Any, **placement: Any
    ) -> Any:
        """A distributed dataset of ``dataset_fn(InputContext)``'s per-replica batches."""
        ...

    def make_numpy_dataset(self, numpy_input: Any) -> Any:
        """A dataset of the slices of ``numpy_input``."""
        ...


_provider: InputPipelineProvider | None = None


def register_input_pipeline(provider: InputPipelineProvider) -> None:
    """Make ``provider`` the input pipeline every strategy uses (:mod:`hpcdist.data` calls it).

    Example: ``register_input_pipeline(DataInputPipeline())``.
    """
    global _provider
    _provider = provider


def input_pipeline() -> InputPipelineProvider:
    """The registered input pipeline.

    Raises:
        NotRegisteredError: none is registered (``hpcdist.data`` was not imported).

    Example: ``input_pipeline().make_numpy_dataset(([1, 2], [3, 4]))``.
    """
    if _provider is None:
        raise NotRegisteredError(
            "a strategy was asked for a distributed dataset, but no input pipeline is "
            "registered; expected hpcdist.data to be imported (`import hpcdist` imports it): "
            "add `import hpcdist.data`"
        )
    return _provider
