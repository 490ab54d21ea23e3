"""The background-worker skeleton: a bounded channel between threads that knows about stopping.

Items travel in chunks (lists) or as futures of chunks; the end of a stream and exceptions travel
as items too (`END`, `Failure`), so the consumer re-raises an exception in its own thread with
the original traceback. Every blocking wait polls a stop event, so shutdown is prompt.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Optional

from .._base.cancel import Stopped
from .stats import QueueStats

__all__ = ["Channel", "END", "Failure", "Stopped"]

_POLL_S = 0.05


class Failure:
    """An exception shipped through a channel."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _End:
    def __repr__(self) -> str:
        return "END"


END: Any = _End()


class Channel:
    """A bounded FIFO between two threads, with wait/occupancy accounting."""

    def __init__(self, name: str, capacity: int, stop: threading.Event) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=capacity)
        self._stop = stop
        self.stats = QueueStats(name, capacity)

    def put(self, item: Any) -> None:
        """Put, waiting while full; raise Stopped if the run stops meanwhile."""
        q = self._queue
        waited = 0.0
        try:
            q.put_nowait(item)
        except queue.Full:
            start = time.perf_counter()
            while True:
                if self._stop.is_set():
                    raise Stopped()
                try:
                    q.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            waited = time.perf_counter() - start
        self.stats.on_put(q.qsize(), waited)

    def get(self, timeout: Optional[float] = None) -> Any:
        """Get, waiting while empty; raise Stopped if the run stops meanwhile."""
        q = self._queue
        try:
            return q.get_nowait()
        except queue.Empty:
            pass
        start = time.perf_counter()
        try:
            while True:
                if self._stop.is_set():
                    raise Stopped()
                try:
                    return q.get(timeout=_POLL_S)
                except queue.Empty:
                    if timeout is not None and time.perf_counter() - start > timeout:
                        raise
        finally:
            self.stats.on_get(time.perf_counter() - start)

    def drain(self) -> list:
        """Remove and return whatever is queued (used at shutdown)."""
        items = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items
