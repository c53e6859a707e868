"""Keras-style training callbacks: hooks called by ``fit``, ``evaluate`` and ``predict``.

``Callback`` (base class), ``CallbackList`` (calls the hooks of many), ``History`` (the
per-epoch logs, returned by ``fit``), ``ProgressBar`` (tqdm bar and epoch lines on the chief),
``CSVLogger``, ``ModelCheckpoint`` (weights only), ``EarlyStopping``, ``BackupAndRestore``
(resume an interrupted ``fit`` exactly, and save on preemption signals),
``LearningRateScheduler``, ``ReduceLROnPlateau``, ``TerminateOnNaN``, ``LambdaCallback`` and
``StepStats`` (per-rank step times and the straggler, per epoch).
Files are written and lines printed by the chief worker only; every worker takes the same
decisions.

Example:
    >>> import hpcdist.callbacks as cb
    >>> callbacks = cb.CallbackList([cb.EarlyStopping(monitor="loss", patience=3)],
    ...                             add_history=True, add_progbar=True, verbose=0, epochs=10)
    >>> [type(c).__name__ for c in callbacks]
    ['ProgressBar', 'EarlyStopping', 'History']
"""

from hpcdist.callbacks.backup import BackupAndRestore
from hpcdist.callbacks.base import Callback, History, is_chief
from hpcdist.callbacks.callback_list import CallbackList
from hpcdist.callbacks.checkpoint import ModelCheckpoint
from hpcdist.callbacks.csv_logger import CSVLogger
from hpcdist.callbacks.early_stopping import EarlyStopping
from hpcdist.callbacks.lambda_callback import LambdaCallback, TerminateOnNaN
from hpcdist.callbacks.learning_rate import LearningRateScheduler, ReduceLROnPlateau
from hpcdist.callbacks.progress import ProgressBar
from hpcdist.callbacks.step_stats import StepStats

__all__ = [
    "BackupAndRestore",
    "CSVLogger",
    "Callback",
    "CallbackList",
    "EarlyStopping",
    "History",
    "LambdaCallback",
    "LearningRateScheduler",
    "ModelCheckpoint",
    "ProgressBar",
    "ReduceLROnPlateau",
    "StepStats",
    "TerminateOnNaN",
    "is_chief",
]
