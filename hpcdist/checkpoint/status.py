"""``CheckpointLoadStatus``: what a restore matched, with TF's assertions.

Example:
    >>> status = CheckpointLoadStatus(None, [], [])
    >>> try:
    ...     status.assert_consumed()
    ... except AssertionError as e:
    ...     print(type(e).__name__)
    CheckpointMatchError
"""

from __future__ import annotations

from typing import Any

from hpcdist.errors import CheckpointMatchError

__all__ = ["CheckpointLoadStatus", "CheckpointMatchError"]


class CheckpointLoadStatus:
    """What a restore matched; the assertions raise :class:`CheckpointMatchError`.

    ``matched``: paths restored; ``missing``: tracked paths the checkpoint lacks;
    ``unused``: checkpoint paths no tracked object took; ``pending()``: paths whose
    values still wait for variables to be created (an optimizer not built yet).

    Example: ``ckpt.restore(path).assert_existing_objects_matched()``.
    """

    def __init__(self, save_path: str | None, entries: list, saved: list[str]) -> None:
        self.save_path = save_path
        self.save_counter: int | None = None
        self._entries = entries
        paths = [p for p, _ in entries]
        self.matched = [p for p in paths if p in saved]
        self.missing = [p for p in paths if p not in saved]
        self.unused = [p for p in saved if p not in paths]
        self._partial = False

    def pending(self) -> list[str]:
        """The paths with restored values not yet applied (deferred).

        Example: ``status.pending() == ["optimizer"]`` until the optimizer is built.
        """
        out = []
        for path, adapter in self._entries:
            fn = getattr(adapter, "_checkpoint_pending", None)
            if path in self.matched and callable(fn) and fn():
                out.append(path)
        return out

    def _none(self) -> None:
        if self.save_path is None:
            raise CheckpointMatchError(
                "no checkpoint was given (save_path=None), so nothing was restored"
            )

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Every saved object was matched, every tracked object restored, nothing pending.

        Example: ``ckpt.restore(path).assert_consumed()`` after the optimizer is built.
        """
        self._none()
        problems = []
        if self.missing:
            problems.append(f"tracked objects {self.missing} are not in the checkpoint")
        if self.unused:
            problems.append(f"saved objects {self.unused} were not matched")
        pending = self.pending()
        if pending:
            problems.append(
                f"values of {pending} wait for variables not created yet (build the optimizer: "
                "opt.build(model.trainable_variables) or one apply_gradients)"
            )
        if problems:
            raise CheckpointMatchError(f"restore of {self.save_path!r}: " + "; ".join(problems))
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Every tracked object found its values in the checkpoint.

        Example: ``ckpt.restore(path).assert_existing_objects_matched()``.
        """
        self._none()
        if self.missing:
            raise CheckpointMatchError(
                f"restore of {self.save_path!r}: tracked objects {self.missing} are not in the "
                f"checkpoint (it holds {self.matched + self.unused})"
            )
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """At least one tracked object was restored.

        Example: ``ckpt.restore(path).assert_nontrivial_match()``.
        """
        self._none()
        if not self.matched:
            raise CheckpointMatchError(
                f"restore of {self.save_path!r} matched no tracked object (it holds "
                f"{self.unused}, this Checkpoint tracks {self.missing})"
            )
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Say that a partial restore is intended (hpcdist never warns about it anyway).

        Example: ``ckpt.restore(path).expect_partial()``.
        """
        self._partial = True
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """Nothing to run: values are assigned by ``restore`` (TF 1 compatibility).

        Example: ``status.run_restore_ops()`` does nothing.
        """

    def initialize_or_restore(self, session: Any = None) -> None:
        """Nothing to run: values are assigned by ``restore`` (TF 1 compatibility).

        Example: ``status.initialize_or_restore()`` does nothing.
        """
