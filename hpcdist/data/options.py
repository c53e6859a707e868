"""Dataset options: ``Options``, ``DistributeOptions`` and ``AutoShardPolicy`` (as in tf.data).

An :class:`Options` object remembers which fields were set explicitly. Merging
two options (``a.merge(b)``, or ``with_options`` applied twice along a
pipeline) gives a new object where the fields ``b`` set win, fields only ``a``
set are kept, and untouched fields keep their defaults.

Example:
    >>> o = Options()
    >>> o.distribute.auto_shard_policy = AutoShardPolicy.DATA
    >>> merged = Options().merge(o)
    >>> merged.distribute.auto_shard_policy
    <AutoShardPolicy.DATA: 2>
    >>> merged.deterministic is None
    True
"""

from __future__ import annotations

import enum
import operator
from typing import Any


class AutoShardPolicy(enum.IntEnum):
    """How ``experimental_distribute_dataset`` shards the input across workers (TF's values).

    * ``OFF`` (-1): no sharding, every worker reads and feeds the same data.
    * ``AUTO`` (0): ``FILE`` when the input reads files and there are at least as many
      files as workers, else ``DATA``.
    * ``FILE`` (1): shard the file names right after the file source.
    * ``DATA`` (2): every worker reads everything and keeps its share of the elements.
    * ``HINT`` (3): TF's placeholder for explicit shard hints (treated like ``OFF``).

    Example:
        >>> AutoShardPolicy(2).name
        'DATA'
    """

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3

    @classmethod
    def from_any(cls, value: Any) -> AutoShardPolicy:
        """The policy given itself, its integer value or its name in any case.

        Example:
            >>> AutoShardPolicy.from_any("file")
            <AutoShardPolicy.FILE: 1>
        """
        if isinstance(value, cls):
            return value
        names = ", ".join(f"{m.name} ({m.value})" for m in cls)
        if isinstance(value, str) and value.strip().upper() in cls.__members__:
            return cls[value.strip().upper()]
        if not isinstance(value, (bool, str)):
            try:
                return cls(operator.index(value))
            except (TypeError, ValueError):
                pass
        raise ValueError(
            f"auto_shard_policy is {value!r}; expected an AutoShardPolicy: {names} "
            "(the member, its value or its name)"
        )


class _TrackedOptions:
    """Base of option objects: fixed fields, validated on assignment, remembers what was set."""

    _DEFAULTS: dict[str, Any] = {}
    _ALIASES: dict[str, str] = {}

    def __init__(self) -> None:
        object.__setattr__(self, "_set_fields", set())
        for name, default in self._DEFAULTS.items():
            object.__setattr__(self, name, self._default(name, default))

    def _default(self, name: str, default: Any) -> Any:
        return default

    def _validate(self, name: str, value: Any) -> Any:
        return value

    def __getattr__(self, name: str) -> Any:
        alias = type(self)._ALIASES.get(name)
        if alias is not None:
            return getattr(self, alias)
        raise AttributeError(
            f"{type(self).__name__} has no option {name!r}; "
            f"its options are {', '.join(self._DEFAULTS)}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        name = self._ALIASES.get(name, name)
        if name not in self._DEFAULTS:
            raise AttributeError(
                f"{type(self).__name__} has no option {name!r}; "
                f"its options are {', '.join(self._DEFAULTS)}"
            )
        object.__setattr__(self, name, self._validate(name, value))
        self._set_fields.add(name)

    def _is_set(self, name: str) -> bool:
        return name in self._set_fields

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._DEFAULTS)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._DEFAULTS)
        return f"{type(self).__name__}({fields})"


class DistributeOptions(_TrackedOptions):
    """Options for distributing a dataset (``tf.data.experimental.DistributeOptions``).

    ``auto_shard_policy`` (default ``AUTO``) chooses how workers share the input;
    ``num_devices`` (default ``None``) is informational, as in TF. Arguments given
    to the constructor count as explicitly set.

    Example:
        >>> DistributeOptions(auto_shard_policy="data").auto_shard_policy.name
        'DATA'
    """

    _DEFAULTS = {"auto_shard_policy": AutoShardPolicy.AUTO, "num_devices": None}

    def __init__(
        self,
        auto_shard_policy: AutoShardPolicy | int | str | None = None,
        num_devices: int | None = None,
    ) -> None:
        super().__init__()
        if auto_shard_policy is not None:
            self.auto_shard_policy = auto_shard_policy
        if num_devices is not None:
            self.num_devices = num_devices

    def _validate(self, name: str, value: Any) -> Any:
        if name == "auto_shard_policy":
            return AutoShardPolicy.from_any(value)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"num_devices is {value!r}; expected None or a positive integer "
                "(the number of devices the dataset is distributed over)"
            )
        return int(value)

    def merge(self, other: DistributeOptions) -> DistributeOptions:
        """A new object: ``other``'s explicitly set fields win over this one's.

        Example:
            >>> a = DistributeOptions(num_devices=2)
            >>> a.merge(DistributeOptions(auto_shard_policy="FILE"))
            DistributeOptions(auto_shard_policy=<AutoShardPolicy.FILE: 1>, num_devices=2)
        """
        if not isinstance(other, DistributeOptions):
            raise TypeError(
                f"DistributeOptions.merge got {type(other).__name__}; expected DistributeOptions"
            )
        merged = DistributeOptions()
        for name in self._DEFAULTS:
            for source in (self, other):
                if source._is_set(name):
                    setattr(merged, name, getattr(source, name))
        return merged

    def copy(self) -> DistributeOptions:
        """An independent copy that remembers the same explicitly set fields.

        Example: ``DistributeOptions(num_devices=2).copy().num_devices == 2``.
        """
        return DistributeOptions().merge(self)


class Options(_TrackedOptions):
    """Options of a dataset (``tf.data.Options``): ``distribute`` and ``deterministic``.

    Attach them with ``dataset.with_options(options)``; ``dataset.options()``
    gives the options merged along the pipeline (the later ``with_options`` wins
    for the fields it sets). ``experimental_distribute`` and
    ``experimental_deterministic`` are TF's older names of the two fields.

    Example:
        >>> o = Options(deterministic=False)
        >>> o.distribute.auto_shard_policy = "OFF"
        >>> o
        Options(distribute=DistributeOptions(auto_shard_policy=<AutoShardPolicy.OFF: -1>, \
num_devices=None), deterministic=False)
    """

    _DEFAULTS = {"distribute": None, "deterministic": None}
    _ALIASES = {
        "experimental_distribute": "distribute",
        "experimental_deterministic": "deterministic",
    }

    def __init__(
        self, distribute: DistributeOptions | None = None, deterministic: bool | None = None
    ) -> None:
        super().__init__()
        if distribute is not None:
            self.distribute = distribute
        if deterministic is not None:
            self.deterministic = deterministic

    def _default(self, name: str, default: Any) -> Any:
        return DistributeOptions() if name == "distribute" else default

    def _validate(self, name: str, value: Any) -> Any:
        if name == "distribute":
            if not isinstance(value, DistributeOptions):
                raise TypeError(
                    f"Options.distribute is a {type(value).__name__}; expected a "
                    "DistributeOptions (or set its fields: "
                    "options.distribute.auto_shard_policy = AutoShardPolicy.DATA)"
                )
            return value
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"Options.deterministic is {value!r}; expected None, True or False")
        return value

    def _is_set(self, name: str) -> bool:
        if name == "distribute":
            return bool(self.distribute._set_fields)
        return super()._is_set(name)

    def merge(self, other: Options) -> Options:
        """A new Options: ``other``'s explicitly set fields win, this one's set fields stay.

        Example:
            >>> a = Options(deterministic=False)
            >>> b = Options()
            >>> b.distribute.auto_shard_policy = AutoShardPolicy.FILE
            >>> m = a.merge(b)
            >>> m.deterministic, m.distribute.auto_shard_policy.name
            (False, 'FILE')
        """
        if not isinstance(other, Options):
            raise TypeError(f"Options.merge got {type(other).__name__}; expected an Options")
        merged = Options()
        merged.distribute = self.distribute.merge(other.distribute)
        merged._set_fields.discard("distribute")
        for source in (self, other):
            if source._is_set("deterministic"):
                merged.deterministic = source.deterministic
        return merged

    def copy(self) -> Options:
        """An independent copy that remembers the same explicitly set fields.

        Example: ``Options(deterministic=True).copy().deterministic is True``.
        """
        return Options().merge(self)


__all__ = ["AutoShardPolicy", "DistributeOptions", "Options"]
