"""hpcdist.data's input pipeline, registered with the strategy layer when imported.

Strategies cannot import :mod:`hpcdist.data` (it is a layer above them); they
call the provider that :mod:`hpcdist.distribute.input_pipeline` holds, and this
module sets it to :class:`DataInputPipeline`.

Example:
    >>> from hpcdist.distribute.input_pipeline import input_pipeline
    >>> input_pipeline().make_numpy_dataset([1, 2]).cardinality()
    2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcdist.data.dataset import Dataset
from hpcdist.data.distributed import (
    DistributedDataset,
    distribute_dataset,
    distribute_datasets_from_function,
)
from hpcdist.distribute.input_pipeline import register_input_pipeline

__all__ = ["DataInputPipeline"]


class DataInputPipeline:
    """The strategies' input pipeline: rebatch, autoshard and prefetch of :mod:`hpcdist.data`.

    Example: ``DataInputPipeline().make_numpy_dataset((x, y)).batch(32)``.
    """

    def distribute_dataset(
        self, dataset: Any, options: Any, **placement: Any
    ) -> DistributedDataset:
        """:func:`hpcdist.data.distributed.distribute_dataset` for a strategy's placement."""
        return distribute_dataset(dataset, options=options, **placement)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[Any], Any], options: Any, **placement: Any
    ) -> DistributedDataset:
        """:func:`hpcdist.data.distributed.distribute_datasets_from_function` for a placement."""
        return distribute_datasets_from_function(dataset_fn, options=options, **placement)

    def make_numpy_dataset(self, numpy_input: Any) -> Dataset:
        """``Dataset.from_tensor_slices(numpy_input)``."""
        return Dataset.from_tensor_slices(numpy_input)


register_input_pipeline(DataInputPipeline())
