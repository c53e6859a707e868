"""Input pipelines and their distribution over replicas (``tf.data`` and tf.distribute input).

* :class:`Dataset`: a streaming pipeline (``from_tensor_slices``, ``range``,
  ``from_generator``, ``list_files`` + ``read_npy``/``read_npz``/``read_hdf5``;
  ``batch``, ``shuffle``, ``repeat``, ``map``, ``filter``, ``take``, ``skip``,
  ``shard``, ``prefetch``, ``cardinality``, ``options``/``with_options``).
* ``strategy.experimental_distribute_dataset(dataset)``: TF's rebatch (the
  global batch split over all replicas, sizes differing by at most one) and
  autoshard across workers (:class:`AutoShardPolicy` FILE, DATA, AUTO, OFF, HINT).
* ``strategy.distribute_datasets_from_function(fn)`` with :class:`InputContext`.

Example:
    >>> import hpcdist as hd
    >>> s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> dist = s.experimental_distribute_dataset(hd.data.Dataset.range(4).batch(2))
    >>> [s.experimental_local_results(s.run(lambda x: x * 2, args=(b,))) for b in dist]
    [(array([0]), array([2])), (array([4]), array([6]))]
"""

# Imported for what they register: the dataset nodes (with Dataset) and the strategies'
# input pipeline (with hpcdist.distribute.input_pipeline).
from hpcdist.data import passthrough_nodes as passthrough_nodes
from hpcdist.data import provider as provider
from hpcdist.data import source_nodes as source_nodes
from hpcdist.data import transform_nodes as transform_nodes
from hpcdist.data.dataset import AUTOTUNE, INFINITE, UNKNOWN, Dataset, TensorSpec
from hpcdist.data.distributed import DistributedDataset, DistributedIterator
from hpcdist.data.options import AutoShardPolicy, DistributeOptions, Options
from hpcdist.distribute.input_context import InputContext, InputOptions, InputReplicationMode

__all__ = [
    "AUTOTUNE",
    "INFINITE",
    "UNKNOWN",
    "AutoShardPolicy",
    "Dataset",
    "DistributeOptions",
    "DistributedDataset",
    "DistributedIterator",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "Options",
    "TensorSpec",
]
