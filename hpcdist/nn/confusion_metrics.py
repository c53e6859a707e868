"""Metrics from confusion counts: ``Precision``, ``Recall`` and ``AUC`` (Keras's formulas).

Each keeps per-threshold counts of true/false positives/negatives in
sync-on-read SUM variables (as the other metrics of :mod:`hpcdist.nn.metrics`):
under a strategy every replica counts its own examples and ``result()`` in
the cross-replica context sums the counts of all replicas and workers before
dividing, so the metric is that of the whole data set, not a mean of
per-replica ratios.

A prediction is positive at threshold ``th`` when ``y_pred > th``; labels are
cast to booleans. Sample weights weigh the counts.

Example:
    >>> import numpy as np
    >>> m = Precision()
    >>> m.update_state(np.array([0, 1, 1, 1]), np.array([1.0, 1.0, 0.0, 0.6]))
    >>> m.result()  # 2 true positives, 1 false positive
    0.6666666666666666
    >>> auc = AUC(num_thresholds=3)
    >>> auc.update_state(np.array([0, 0, 1, 1]), np.array([0.0, 0.5, 0.3, 0.9]))
    >>> auc.result()
    0.75
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hpcdist.arrays import array_module, to_host
from hpcdist.nn import backend
from hpcdist.nn.metrics import Metric, accumulate, plain_value, register_metric_class, same_rank

__all__ = ["AUC", "Precision", "Recall"]


def _thresholds(thresholds: Any, default: float = 0.5) -> tuple[np.ndarray, bool]:
    """``(thresholds as a float64 array, whether one value was given)``."""
    if thresholds is None:
        return np.array([default]), True
    single = np.ndim(thresholds) == 0
    values = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
    if values.size == 0 or not np.all((values >= 0) & (values <= 1)):
        raise ValueError(f"thresholds are {thresholds!r}; expected values in [0, 1]")
    return values, single


def _top_k(p: np.ndarray, k: int) -> np.ndarray:
    """``p`` with every entry outside the ``k`` largest of its last axis set to -inf."""
    order = np.argsort(-p, axis=-1, kind="stable")
    keep = np.zeros(p.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :k], True, axis=-1)
    return np.where(keep, p, -np.inf)


def confusion_counts(
    y_true: Any,
    y_pred: Any,
    thresholds: np.ndarray,
    sample_weight: Any = None,
    top_k: int | None = None,
    class_id: int | None = None,
) -> dict[str, Any]:
    """Weighted ``tp``, ``fp``, ``tn``, ``fn`` per threshold (float64 arrays of ``thresholds``'
    length) of one batch (Keras's ``update_confusion_matrix_variables``).

    Example: ``confusion_counts(np.array([1, 0]), np.array([0.9, 0.8]), np.array([0.5]))["fp"]``
    is ``array([1.])``.
    """
    t, p = same_rank(y_true, y_pred)
    t, p = to_host(t), to_host(p)  # small counts: computed on the host, added to host state
    xp = np
    p = p.astype(np.float64, copy=False)
    if tuple(t.shape) != tuple(p.shape):
        raise ValueError(
            f"y_true has shape {tuple(t.shape)} but y_pred has shape {tuple(p.shape)}; "
            "confusion metrics need labels of the predictions' shape"
        )
    if top_k is not None:
        p = _top_k(p, int(top_k))
    if class_id is not None:
        t, p = t[..., class_id], p[..., class_id]
    t = t.astype(bool)
    w: Any  # a NumPy or CuPy array
    if sample_weight is None:
        w = xp.ones(p.shape, np.float64)
    else:
        w = np.asarray(to_host(plain_value(sample_weight))).astype(np.float64)
        if w.ndim == p.ndim + 1 and w.shape[-1] == 1:
            w = w[..., 0]
        while w.ndim < p.ndim:
            w = xp.expand_dims(w, -1)
        w = xp.broadcast_to(w, p.shape)
    th = xp.asarray(thresholds)
    positive = p.reshape(-1, 1) > th.reshape(1, -1)  # (elements, thresholds)
    t, w = t.reshape(-1, 1), w.reshape(-1, 1)
    return {
        "tp": xp.sum(w * (positive & t), axis=0),
        "fp": xp.sum(w * (positive & ~t), axis=0),
        "tn": xp.sum(w * (~positive & ~t), axis=0),
        "fn": xp.sum(w * (~positive & t), axis=0),
    }


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` with 0 where ``den`` is 0 (Keras's ``divide_no_nan``)."""
    out = np.zeros_like(num, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


class _ThresholdMetric(Metric):
    """Precision and Recall: two count vectors per threshold and one ratio of them."""

    _counts: tuple[str, str] = ("tp", "fp")

    def __init__(
        self,
        thresholds: Any = None,
        top_k: int | None = None,
        class_id: int | None = None,
        name: str | None = None,
        dtype: DTypeLike | None = None,
    ) -> None:
        super().__init__(name=name, dtype=dtype)
        self.init_thresholds = thresholds
        self.top_k = None if top_k is None else int(top_k)
        self.class_id = None if class_id is None else int(class_id)
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"{type(self).__name__} top_k is {top_k!r}; expected >= 1 or None")
        self.thresholds, self._single = _thresholds(thresholds)
        if thresholds is None and self.top_k is not None:
            self.thresholds = np.array([-np.inf])  # Keras: with top_k alone, the top k count
        n = self.thresholds.shape[0]
        self._state = [self.add_weight(c, (n,)) for c in self._counts]

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Add this batch's counts (one all-replica sum happens at ``result()``)."""
        counts = confusion_counts(y_true, y_pred, self.thresholds, sample_weight, self.top_k,
                                  self.class_id)  # fmt: skip
        for name, var in zip(self._counts, self._state, strict=True):
            accumulate(var, counts[name])

    def _result(self, state: list[np.ndarray]) -> Any:
        a, b = (np.asarray(to_host(s), np.float64) for s in state)
        value = _ratio(a, a + b)
        return float(value[0]) if self._single else value

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "thresholds": self.init_thresholds, "top_k": self.top_k,
                "class_id": self.class_id}  # fmt: skip


@register_metric_class
class Precision(_ThresholdMetric):
    """``tp / (tp + fp)``: the fraction of positive predictions that are right
    (``keras.metrics.Precision``). ``thresholds`` (default 0.5; a list gives one value per
    threshold), ``top_k`` (only the ``k`` largest predictions of each example count as
    positive), ``class_id`` (one class of a multi-label output).

    Example: ``model.compile(..., metrics=[Precision(), Recall()])``.
    """

    _counts = ("tp", "fp")

    def __init__(self, thresholds: Any = None, top_k: int | None = None,
                 class_id: int | None = None, name: str = "precision",
                 dtype: DTypeLike | None = None) -> None:  # fmt: skip
        super().__init__(thresholds, top_k, class_id, name, dtype)


@register_metric_class
class Recall(_ThresholdMetric):
    """``tp / (tp + fn)``: the fraction of true labels predicted positive
    (``keras.metrics.Recall``); arguments as :class:`Precision`.

    Example: ``Recall(thresholds=[0.3, 0.5, 0.7]).result()`` is an array of three.
    """

    _counts = ("tp", "fn")

    def __init__(self, thresholds: Any = None, top_k: int | None = None,
                 class_id: int | None = None, name: str = "recall",
                 dtype: DTypeLike | None = None) -> None:  # fmt: skip
        super().__init__(thresholds, top_k, class_id, name, dtype)


@register_metric_class
class AUC(Metric):
    """The area under the ROC or precision-recall curve (``keras.metrics.AUC``).

    ``num_thresholds`` evenly spaced thresholds in ``[0, 1]`` (the first just
    below 0, the last just above 1, as Keras); the curve's points are the
    summed confusion counts at each, and the area is a Riemann sum:
    ``summation_method`` ``"interpolation"`` (trapezoids; for ``curve="PR"``
    Davis and Goadrich's interpolation), ``"minoring"`` or ``"majoring"``.
    ``from_logits=True`` applies a sigmoid to the predictions first. Labels and
    predictions are flattened (``multi_label=False``, Keras's default; one curve
    per label is not offered).

    Example: ``model.compile(..., metrics=[AUC(), AUC(curve="PR", name="pr_auc")])``.
    """

    def __init__(
        self,
        num_thresholds: int = 200,
        curve: str = "ROC",
        summation_method: str = "interpolation",
        name: str = "auc",
        dtype: DTypeLike | None = None,
        thresholds: Any = None,
        multi_label: bool = False,
        from_logits: bool = False,
    ) -> None:
        super().__init__(name=name, dtype=dtype)
        self.curve = str(curve).upper()
        if self.curve not in ("ROC", "PR"):
            raise ValueError(f"AUC curve is {curve!r}; expected 'ROC' or 'PR'")
        self.summation_method = str(summation_method).lower()
        if self.summation_method not in ("interpolation", "minoring", "majoring"):
            raise ValueError(
                f"AUC summation_method is {summation_method!r}; expected 'interpolation', "
                "'minoring' or 'majoring'"
            )
        if multi_label:
            raise ValueError(
                "AUC(multi_label=True) is not supported: hpcdist's AUC flattens all labels into "
                "one curve (multi_label=False); make one AUC per label with a sliced output instead"
            )
        self.multi_label = False
        self.from_logits = bool(from_logits)
        eps = backend.epsilon()
        if thresholds is not None:
            inner = np.sort(_thresholds(thresholds)[0])
            self.num_thresholds = inner.shape[0] + 2
        else:
            if isinstance(num_thresholds, bool) or int(num_thresholds) <= 1:
                raise ValueError(f"AUC num_thresholds is {num_thresholds!r}; expected > 1")
            self.num_thresholds = int(num_thresholds)
            n = self.num_thresholds
            inner = np.array([(i + 1) / (n - 1) for i in range(n - 2)])
        self._init_thresholds = thresholds
        self.thresholds = np.concatenate([[0.0 - eps], inner, [1.0 + eps]])
        n = self.thresholds.shape[0]
        self._state = [self.add_weight(c, (n,)) for c in ("tp", "fp", "tn", "fn")]

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Add this batch's counts at every threshold."""
        p = plain_value(y_pred)
        if self.from_logits:
            xp = array_module(p)
            p = 1.0 / (1.0 + xp.exp(-p.astype(np.float64)))
        counts = confusion_counts(y_true, p, self.thresholds, sample_weight)
        for name, var in zip(("tp", "fp", "tn", "fn"), self._state, strict=True):
            accumulate(var, counts[name])

    def _result(self, state: list[np.ndarray]) -> float:
        tp, fp, tn, fn = (np.asarray(to_host(s), np.float64) for s in state)
        if self.curve == "PR" and self.summation_method == "interpolation":
            return _interpolate_pr_auc(tp, fp, fn)
        recall = _ratio(tp, tp + fn)
        if self.curve == "ROC":
            x, y = _ratio(fp, fp + tn), recall
        else:
            x, y = recall, _ratio(tp, tp + fp)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / 2.0
        elif self.summation_method == "minoring":
            heights = np.minimum(y[:-1], y[1:])
        else:
            heights = np.maximum(y[:-1], y[1:])
        return float(np.sum((x[:-1] - x[1:]) * heights))

    def get_config(self) -> dict[str, Any]:
        config = {
            **super().get_config(),
            "curve": self.curve,
            "summation_method": self.summation_method,
            "from_logits": self.from_logits,
        }
        if self._init_thresholds is not None:
            config["thresholds"] = self._init_thresholds
        else:
            config["num_thresholds"] = self.num_thresholds
        return config


def _interpolate_pr_auc(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> float:
    """The PR-AUC by Davis and Goadrich's interpolation (as Keras's ``interpolate_pr_auc``)."""
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    dp = p[:-1] - p[1:]
    slope = _ratio(dtp, np.maximum(dp, 0))
    intercept = tp[1:] - slope * p[1:]
    both = (p[:-1] > 0) & (p[1:] > 0)
    p_ratio = np.where(both, _ratio(p[:-1], np.maximum(p[1:], 0)), 1.0)
    with np.errstate(divide="ignore"):
        logs = np.where(p_ratio > 0, np.log(np.where(p_ratio > 0, p_ratio, 1.0)), 0.0)
    increments = _ratio(slope * (dtp + intercept * logs), np.maximum(tp[1:] + fn[1:], 0))
    return float(np.sum(increments))
