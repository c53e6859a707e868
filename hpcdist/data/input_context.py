"""InputContext, InputOptions and InputReplicationMode, re-exported from the distribute layer.

They live in :mod:`hpcdist.distribute.input_context` (a strategy hands an
``InputContext`` to ``dataset_fn``, so the strategy layer defines them, as
``tf.distribute`` does); this module keeps the names where users met them.

Example:
    >>> from hpcdist.data.input_context import InputContext
    >>> InputContext(num_input_pipelines=2, input_pipeline_id=1).input_pipeline_id
    1
"""

from hpcdist.distribute.input_context import (
    InputContext,
    InputOptions,
    InputReplicationMode,
    check_count,
    check_input_options,
)

__all__ = [
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "check_count",
    "check_input_options",
]
