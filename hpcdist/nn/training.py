"""Keras's built-in loops: ``compile``, ``fit``, ``evaluate`` and ``predict``.

:class:`Trainer` is mixed into :class:`~hpcdist.nn.sequential.Sequential`.
When the model was made inside ``strategy.scope()``, ``fit`` distributes by
itself: it splits every global batch over the replicas
(``strategy.experimental_distribute_dataset``), runs each step with
``strategy.run`` and lets the optimizer sum the gradients of all replicas in
one fused allreduce. The result is the training of one process on the whole
global batch: the loss of a step is the sum of the per-example losses of the
whole global batch divided by its size (so a short last batch, even one that
leaves some replicas empty, weighs its examples exactly as one process does).

Collectives per training step under a multi-worker strategy: the end-of-data
agreement of the input, the example count, the gradients and the metrics (four
small or fused calls, the same on every worker).

Example: see :class:`~hpcdist.nn.sequential.Sequential`.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist import optimizers
from hpcdist.arrays import array_module, to_host
from hpcdist.callbacks import CallbackList
from hpcdist.callbacks.backup import FitState, find_backup
from hpcdist.data.distributed import DistributedDataset
from hpcdist.distribute import context
from hpcdist.nn import data_adapter, losses, mixed_precision
from hpcdist.nn import metrics as metrics_mod
from hpcdist.nn.tape import Traced
from hpcdist.observe import timeline
from hpcdist.observe.timeline import span
from hpcdist.utils.seeding import next_seed

if TYPE_CHECKING:
    from hpcdist.distribute.variables import Variable

_MEAN_REDUCTIONS = ("auto", "sum_over_batch_size", "none")


class Trainer:
    """The ``compile``/``fit``/``evaluate``/``predict`` half of a Keras model."""

    optimizer: Any = None
    loss: Any = None
    compiled_metrics: list[Any] = []
    history: Any = None

    if TYPE_CHECKING:  # what the model class Trainer is mixed with (hpcdist.nn.model.Model) has
        built: bool

        @property
        def distribute_strategy(self) -> Any: ...
        @property
        def output_shape(self) -> tuple: ...
        @property
        def trainable_variables(self) -> list[Variable]: ...
        def build(self, input_shape: Sequence[int | None] | None = None) -> None: ...
        def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]: ...
        def backward(self, caches: Any, dy: Any) -> list[Any]: ...
        def _regularization(self, grads: list[Any] | None, scale: float) -> float: ...
        def _scope(self) -> Any: ...

    # -- compile ------------------------------------------------------------------------------
    def compile(
        self,
        optimizer: Any = "rmsprop",
        loss: Any = None,
        metrics: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Set the optimizer, the loss and the metrics ``fit`` and ``evaluate`` use.

        Strings name Keras's objects (``"adam"``, ``"binary_crossentropy"``,
        ``"accuracy"``). Metric and optimizer state is created in the model's
        strategy scope. Keras arguments with no meaning here (``run_eagerly``,
        ``jit_compile``, ``steps_per_execution=1``) are accepted; others are errors.

        Example: ``model.compile(optimizer="adam", loss="binary_crossentropy",
        metrics=["accuracy"])``.
        """
        for key, value in kwargs.items():
            if key in ("run_eagerly", "jit_compile") or (
                key == "steps_per_execution" and value == 1
            ):
                continue
            raise TypeError(f"compile() got an unsupported argument {key}={value!r}")
        if loss is None:
            raise ValueError("compile needs a loss, e.g. loss='sparse_categorical_crossentropy'")

        with self._scope():
            self.optimizer = (
                optimizer if isinstance(optimizer, mixed_precision.LossScaleOptimizer)
                else optimizers.get(optimizer)
            )
            self.loss = loss
            self._loss_obj = losses.get(loss)
            self._loss_tracker = metrics_mod.Mean(name="loss")
            shape = self._output_shape_or_none()
            self.compiled_metrics = [
                metrics_mod.get(m, loss=loss, output_shape=shape) for m in (metrics or [])
            ]
        self._compile_metrics = list(metrics or [])  # as given (what model.save records)
        self._per_example = copy.copy(self._loss_obj)
        self._per_example.reduction = "none"
        reduction = str(getattr(self._loss_obj, "reduction", "auto")).lower()
        self._mean_loss = reduction.rsplit(".", 1)[-1] in _MEAN_REDUCTIONS
        self._compiled = True

    @property
    def metrics(self) -> list[Any]:
        """The loss tracker and the compiled metrics (what the logs report)."""
        if not getattr(self, "_compiled", False):
            return []
        return [self._loss_tracker, *self.compiled_metrics]

    @property
    def metrics_names(self) -> list[str]:
        """The names of :attr:`metrics`, in log order."""
        return [m.name for m in self.metrics]

    def _output_shape_or_none(self) -> tuple | None:
        try:
            return tuple(self.output_shape) if self.built else None
        except (AttributeError, ValueError):
            return None

    def _require_compiled(self, method: str) -> None:
        if not getattr(self, "_compiled", False):
            raise RuntimeError(
                f"the model must be compiled before {method}(): call "
                "model.compile(optimizer=..., loss=..., metrics=[...]) first"
            )

    # -- steps (run on each replica) ---------------------------------------------------------
    def _per_example_loss(self, y: Any, y_pred: Any, sample_weight: Any) -> Any:
        with losses.builtin_loop():
            if sample_weight is None:
                return self._per_example(y, y_pred)
            return self._per_example(y, y_pred, sample_weight=sample_weight)

    def _track(
        self, per_example_sum: Any, n_local: int, n_global: float, denominator: float,
        regularization: float = 0.0,
    ) -> None:  # fmt: skip
        # The logged loss is the mean of the steps' losses weighted by their example counts
        # (Keras weights by batch size): each replica adds its share of loss * n_global.
        # The regularization penalty (the same on every replica) is added to each share.
        value = 0.0 if n_local == 0 else per_example_sum * (n_global / denominator) / n_local
        value += regularization
        self._loss_tracker.update_state(np.float64(value), sample_weight=np.float64(n_local))

    def train_step(self, data: Any) -> None:
        """One replica's part of a training step: loss, gradients, optimizer, metrics.

        Example: ``strategy.run(model.train_step, args=(batch,))`` is what ``fit`` does.
        """
        x, y, w = data_adapter.unpack(data)
        n_local = int(np.shape(x)[0])
        n_global = _global_count(n_local)
        with span("forward+backward"):
            y_pred, caches = self.forward(x, training=True)
            y_pred = mixed_precision.to_float32(y_pred)  # a mixed model's loss is float32
            per_example = self._per_example_loss(y, Traced.leaf(y_pred), w)
            denominator = max(n_global, 1.0) if self._mean_loss else 1.0
            loss = per_example.sum() / denominator
            scaling = isinstance(self.optimizer, mixed_precision.LossScaleOptimizer)
            loss_scale = float(self.optimizer.loss_scale) if scaling else 1.0
            dy = loss.grad * np.float32(loss_scale) if scaling else loss.grad
            grads = self.backward(caches, dy)
        # Keras adds model.losses scaled by 1 / num_replicas: the summed gradients are one
        # process's (scale_regularization_loss).
        reg = self._regularization(grads, loss_scale / _num_replicas()) / loss_scale
        with span("optimizer"):
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        self._track(float(to_host(per_example.value).sum()), n_local, n_global, denominator,
                    reg * _num_replicas())  # fmt: skip
        for m in self.compiled_metrics:
            m.update_state(y, y_pred, sample_weight=w)

    def test_step(self, data: Any) -> None:
        """One replica's part of an evaluation step: loss and metrics, no update.

        Example: ``strategy.run(model.test_step, args=(batch,))`` is what ``evaluate`` does.
        """
        x, y, w = data_adapter.unpack(data)
        n_local = int(np.shape(x)[0])
        y_pred, _ = self.forward(x, training=False)
        y_pred = mixed_precision.to_float32(y_pred)  # a mixed model's loss is float32
        per_example = self._per_example_loss(y, y_pred, w)
        value = per_example.value if isinstance(per_example, Traced) else per_example
        total = float(to_host(array_module(value).sum(value)))
        reg = self._regularization(None, 1.0)
        if self._mean_loss:
            self._track(total, n_local, 1.0, 1.0, reg)
        else:
            self._track(total, n_local, _global_count(n_local), 1.0, reg)
        for m in self.compiled_metrics:
            m.update_state(y, y_pred, sample_weight=w)

    def predict_step(self, data: Any) -> Any:
        """One replica's predictions for its part of a batch."""
        x, _, _ = data_adapter.unpack(data)
        return self.forward(x, training=False)[0]

    # -- loops ----------------------------------------------------------------------------------
    def _logs(self, prefix: str = "") -> dict[str, float]:
        values = metrics_mod.results(self.metrics)
        return {prefix + m.name: _log_value(v) for m, v in zip(self.metrics, values, strict=True)}

    def _reset_metrics(self) -> None:
        for m in self.metrics:
            m.reset_state()

    def _distributed(self, dataset: Any) -> Any:
        if isinstance(dataset, DistributedDataset):
            return dataset
        return self.distribute_strategy.experimental_distribute_dataset(dataset)

    def _ensure_built(self, dataset: Any) -> None:
        if self.built:
            return
        spec = dataset.element_spec
        x_spec = spec[0] if isinstance(spec, tuple) else spec
        shape = getattr(x_spec, "shape", None)
        if shape is None:
            raise ValueError(
                "cannot infer the input shape from the data; build the model first with "
                "model.build((None, features)) or give the first layer input_shape=(features,)"
            )
        with self._scope():
            self.build(tuple(shape))

    def _shuffle_seed(self) -> int:
        """One random seed, the same on every worker (so every worker shuffles alike).

        From :func:`hpcdist.utils.set_random_seed`'s stream when a seed was set, else from
        NumPy's global generator (so ``np.random.seed`` alone also repeats a run).
        """
        drawn = next_seed()
        if drawn is None:
            drawn = int(np.random.randint(2**31 - 1))
        seed = np.array([drawn], dtype=np.int64)
        ext = self.distribute_strategy.extended
        return int(to_host(ext.broadcast_initial_value(seed))[0])

    def _callbacks(self, callbacks: Any, verbose: int, epochs: int, steps: int | None) -> Any:
        return CallbackList(
            callbacks,
            model=self,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps,
        )

    def fit(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: int | str = "auto",
        callbacks: Sequence[Any] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool = True,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int = 1,
        sample_weight: Any = None,
    ) -> Any:
        """Train for ``epochs`` epochs (Keras's ``Model.fit``); returns the ``History``.

        ``x`` is an array (with ``y``) or a dataset of ``(x, y[, sample_weight])``
        global batches. ``batch_size`` is the global batch size. Inside a
        strategy's scope every worker must call ``fit`` with the same arguments
        (its batches are split over all replicas).

        Example: ``history = model.fit(x, y, batch_size=64, epochs=5,
        validation_data=(xv, yv))``.
        """
        self._require_compiled("fit")
        verbose = 1 if verbose == "auto" else int(verbose)
        if validation_split and validation_data is None:
            (x, y, sample_weight), validation_data = data_adapter.split_validation(
                x, y, sample_weight, validation_split
            )

        def batches(seed: int | None) -> tuple[Any, int | None]:
            return data_adapter.as_dataset(
                x, y, sample_weight, batch_size=batch_size, shuffle=bool(shuffle), seed=seed
            )

        seed = self._shuffle_seed() if shuffle and not data_adapter.is_dataset(x) else None
        dataset, steps = batches(seed)
        val = self._validation_dataset(validation_data, validation_batch_size or batch_size)
        self._ensure_built(dataset)
        if steps_per_epoch is not None:
            steps = int(steps_per_epoch)
        cbs = self._callbacks(callbacks, verbose, epochs, steps)
        backup = find_backup(cbs)
        state = FitState(seed, self._distributed(dataset))
        if backup is not None and backup.begin_fit(self, state):  # resume where the backup is
            initial_epoch = state.epoch
            if state.seed != seed:  # the backup's shuffle order, not this run's new seed
                state.dist = self._distributed(batches(state.seed)[0])
        validation = (None if val is None else self._distributed(val), validation_steps)
        try:
            epoch_range = range(initial_epoch, epochs)
            return self._fit_epochs(state, cbs, backup, validation, validation_freq, epoch_range,
                                    steps_per_epoch)  # fmt: skip
        finally:
            if backup is not None:
                backup.end_fit()

    def _fit_epochs(
        self, state: FitState, cbs: Any, backup: Any, validation: tuple[Any, int | None],
        validation_freq: int, epochs: range, steps_per_epoch: int | None,
    ) -> Any:  # fmt: skip
        """fit's loop. ``state`` says where it is (for ``BackupAndRestore``): a resumed fit
        starts at the saved epoch with its iterator at the saved position (same iteration
        counters, trained batches skipped), so it continues exactly as an uninterrupted one."""
        self.stop_training = False
        strategy = self.distribute_strategy
        dist = state.dist
        iterator = state.position(iter(dist)) if steps_per_epoch is not None else None
        cbs.on_train_begin()
        logs: dict[str, float] = {}
        for epoch in epochs:
            self._reset_metrics()
            cbs.on_epoch_begin(epoch)
            it = iterator if iterator is not None else state.position(iter(dist))
            step = state.begin_epoch(epoch, it)
            ran_out = False
            while steps_per_epoch is None or step < steps_per_epoch:
                if backup is not None:
                    backup.check_preemption()  # may save here and exit on every worker
                began = time.perf_counter()  # timeline: the step, its input and callbacks
                try:
                    with span("input"):
                        batch = next(it)
                except StopIteration:
                    ran_out = steps_per_epoch is not None
                    break
                with span("callbacks"):
                    cbs.on_train_batch_begin(step)
                strategy.run(self.train_step, args=(batch,))
                logs = self._logs()
                state.step = step + 1
                with span("callbacks"):
                    cbs.on_train_batch_end(step, logs)
                if timeline.active:
                    timeline.complete("step", "phases", began, time.perf_counter(), {"step": step})
                step += 1
                if self.stop_training:
                    break
            logs = self._logs()
            if validation[0] is not None and (epoch + 1) % int(validation_freq) == 0:
                logs.update(self._evaluate_dataset(*validation, prefix="val_"))
            state.end_epoch(epoch, keep_iterator=iterator is not None)
            cbs.on_epoch_end(epoch, logs)
            if ran_out and steps_per_epoch is not None:  # (ran_out implies a steps_per_epoch)
                warnings.warn(
                    "your input ran out of data; training stopped. Make sure the dataset can "
                    f"give steps_per_epoch * epochs = {steps_per_epoch * epochs.stop} batches "
                    "(use dataset.repeat())",
                    stacklevel=3,
                )
                break
            if self.stop_training:
                break
        cbs.on_train_end(logs)
        return self.history

    def _validation_dataset(self, validation_data: Any, batch_size: int | None) -> Any:
        if validation_data is None:
            return None
        if data_adapter.is_dataset(validation_data):
            return validation_data
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
            raise ValueError(
                "validation_data must be a dataset or a tuple (x_val, y_val[, sample_weight]); "
                f"got {type(validation_data).__name__}"
            )
        return data_adapter.as_dataset(*validation_data, batch_size=batch_size)[0]

    def _evaluate_dataset(self, dataset: Any, steps: int | None, prefix: str = "") -> dict:
        self._reset_metrics()
        strategy = self.distribute_strategy
        for step, batch in enumerate(self._distributed(dataset)):
            if steps is not None and step >= steps:
                break
            strategy.run(self.test_step, args=(batch,))
        return self._logs(prefix)

    def evaluate(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        verbose: int | str = "auto",
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: Sequence[Any] | None = None,
        return_dict: bool = False,
    ) -> Any:
        """The loss and metrics over ``x`` (Keras's ``Model.evaluate``), aggregated over replicas.

        Returns the scalar loss when there are no metrics, else ``[loss, *metrics]``
        (a dict with ``return_dict=True``). Every worker gets the same numbers.
        """
        self._require_compiled("evaluate")
        verbose = 1 if verbose == "auto" else int(verbose)
        dataset, n_steps = data_adapter.as_dataset(x, y, sample_weight, batch_size=batch_size)
        self._ensure_built(dataset)
        cbs = self._callbacks(callbacks, 0, 1, steps or n_steps)
        cbs.on_test_begin()
        logs = self._evaluate_dataset(dataset, steps)
        cbs.on_test_end(logs)
        if verbose:
            self._print_chief(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()))
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def _print_chief(self, text: str) -> None:
        if self.distribute_strategy.extended.should_checkpoint:
            print(text, flush=True)

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: int | str = 0,
        steps: int | None = None,
        callbacks: Sequence[Any] | None = None,
    ) -> Any:
        """The model's outputs for ``x``, in input order, on every worker (``Model.predict``).

        Under a strategy each replica predicts its part of every batch and the
        parts are gathered, so every worker returns the whole result.
        """
        dataset, _ = data_adapter.as_dataset(x, batch_size=batch_size)
        self._ensure_built(dataset)
        strategy = self.distribute_strategy
        outputs = []
        for step, batch in enumerate(self._distributed(dataset)):
            if steps is not None and step >= steps:
                break
            per_replica = strategy.run(self.predict_step, args=(batch,))
            if strategy.num_replicas_in_sync > 1:
                outputs.append(strategy.gather(per_replica, axis=0))
            else:
                outputs.append(per_replica)
        if not outputs:
            raise ValueError("predict got no data: the input is empty")
        xp = array_module(outputs[0])
        return xp.concatenate(outputs, axis=0)


def _log_value(value: Any) -> Any:
    """A metric's result for the logs: a float, or a list of floats (Precision with several
    thresholds, as Keras logs an array)."""
    if np.ndim(value) == 0:
        return float(value)
    return [float(v) for v in np.ravel(value)]


def _num_replicas() -> int:
    """``num_replicas_in_sync`` of the current replica context (1 outside any strategy)."""
    ctx = context.get_replica_context()
    return 1 if ctx is None else int(ctx.num_replicas_in_sync)


def _global_count(n_local: int) -> float:
    """The number of examples of this step over all replicas (one small all-reduce)."""
    ctx = context.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return float(n_local)
    return float(ctx.all_reduce("sum", np.float64(n_local)))

