"""The payloads of one parameter-server request, read as a handler asks for them.

A request header is followed by :func:`~hpcdist.distribute.ps.protocol.num_payloads`
payload messages from the same client. :class:`Live` receives them from MPI on
demand; :class:`Stored` holds those of a parked request. Both offer the same
reading API, so a handler does not care which one it gets.

Example:
    >>> import numpy as np
    >>> Stored([np.zeros(3, np.uint8)]).next_bytes().nbytes
    3
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from hpcdist.errors import MessageSizeError, PSError, PSRequestError
from hpcdist.runtime.messages import check_payload


class Live:
    """The payloads of one request, received from its client as the handler asks for them.

    ``server`` gives ``recv_payload(buf, src)`` (exact size) and
    ``probe_payload(src) -> nbytes``; ``total`` is :func:`num_payloads` of the header and
    ``length`` its ``LENGTH`` word (the payload bytes announced; ``None``: not checked).

    Example: ``Live(server, src, 2).next_bytes()`` receives the first payload.
    """

    def __init__(self, server: Any, src: int, total: int, length: int | None = None) -> None:
        self.server = server
        self.src = src
        self.left = total
        self.budget = length
        self._peeked: np.ndarray | None = None

    def _spend(self, nbytes: int) -> None:
        if self.budget is None:
            return
        try:
            check_payload(nbytes, self.budget, "a parameter-server request")
        except MessageSizeError as e:
            self.left = 0  # the rest cannot be trusted
            raise PSRequestError(str(e)) from None
        self.budget -= nbytes

    def _receive(self) -> np.ndarray:
        if self.left <= 0:
            raise PSError("a request reads more payloads than its client sent (protocol error)")
        n = self.server.probe_payload(self.src)
        self._spend(n)
        self.left -= 1
        buf = np.empty(n, np.uint8)
        self.server.recv_payload(buf, self.src)
        return buf

    def peek_int64(self) -> np.ndarray:
        """The next payload as int64, left in place for :meth:`next_bytes`."""
        if self._peeked is None:
            self._peeked = self._receive()
        return self._peeked.view(np.int64)

    def next_bytes(self) -> np.ndarray:
        """The next payload as a new uint8 array."""
        if self._peeked is not None:
            out, self._peeked = self._peeked, None
            return out
        return self._receive()

    def into(self, buf: np.ndarray) -> None:
        """Receive the next payload straight into the uint8 array ``buf`` (exact size)."""
        if self._peeked is not None:
            _copy_exact(buf, self.next_bytes())
            return
        if self.left <= 0:
            raise PSError("a request reads more payloads than its client sent (protocol error)")
        self._spend(buf.nbytes)
        self.left -= 1
        self.server.recv_payload(buf, self.src)

    def rest(self) -> list[np.ndarray]:
        """Every payload not read yet, as new arrays (to park the request)."""
        out = [] if self._peeked is None else [self._peeked]
        self._peeked = None
        while self.left > 0:
            out.append(self._receive())
        return out

    def drain(self) -> None:
        """Receive and drop the payloads not read yet."""
        self._peeked = None
        while self.left > 0:
            self._receive()


class Stored:
    """The payloads of a parked request, already received (same reading API as :class:`Live`).

    Example:
        >>> s = Stored([np.arange(2, dtype=np.int64).view(np.uint8)])
        >>> s.peek_int64().tolist(), s.next_bytes().nbytes, s.left
        ([0, 1], 16, 0)
    """

    def __init__(self, payloads: list[np.ndarray]) -> None:
        self._items = deque(payloads)

    @property
    def left(self) -> int:
        """How many payloads are still unread."""
        return len(self._items)

    def peek_int64(self) -> np.ndarray:
        """The next payload as int64, left in place."""
        if not self._items:
            raise PSError("a request reads more payloads than its client sent (protocol error)")
        return self._items[0].view(np.int64)

    def next_bytes(self) -> np.ndarray:
        """The next payload (uint8)."""
        if not self._items:
            raise PSError("a request reads more payloads than its client sent (protocol error)")
        return self._items.popleft()

    def into(self, buf: np.ndarray) -> None:
        """Copy the next payload into ``buf`` (exact size)."""
        _copy_exact(buf, self.next_bytes())

    def rest(self) -> list[np.ndarray]:
        """The unread payloads."""
        out = list(self._items)
        self._items.clear()
        return out

    def drain(self) -> None:
        """Drop the unread payloads."""
        self._items.clear()


def _copy_exact(buf: np.ndarray, data: np.ndarray) -> None:
    if data.nbytes != buf.nbytes:
        raise PSError(f"a payload has {data.nbytes} bytes; the header announced {buf.nbytes}")
    buf[...] = data


__all__ = ["Live", "Stored"]
