"""Named event counters, thread-safe: the one counter class behind the fetch, S3, source and cache-tier stats.

Fetch streams, the S3 client, source stages and cache tiers each count events (bytes, retries,
hits, ...) from several threads. They all use `Counters`: `add(**counts)` under one lock,
`snapshot()` for a consistent copy, and each field readable as an attribute (`stats.bytes`).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

__all__ = ["Counters"]


class Counters:
    """Thread-safe named counters. Subclasses name their fields in `FIELDS`; `add` may also
    count fields not named there. A pickled copy keeps its counts unless `PICKLE_COUNTS` is
    False (counts that are per process start from zero in the copy)."""

    FIELDS: Tuple[str, ...] = ()
    PICKLE_COUNTS = True

    def __init__(self, fields: Optional[Tuple[str, ...]] = None) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = dict.fromkeys(self.FIELDS if fields is None else fields, 0)
        _EVERY.add(self)

    def add(self, **counts: int) -> None:
        with self._lock:
            for field, n in counts.items():
                self._counts[field] = self._counts.get(field, 0) + n

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __getattr__(self, name: str) -> int:
        counts = self.__dict__.get("_counts")
        if counts is not None and name in counts:
            return counts[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __getstate__(self) -> Dict[str, Any]:  # locks do not pickle
        state = {k: v for k, v in self.__dict__.items() if k != "_lock"}
        counts = self.snapshot()
        state["_counts"] = counts if self.PICKLE_COUNTS else dict.fromkeys(counts, 0)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        _EVERY.add(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.snapshot()})"


_EVERY: "weakref.WeakSet[Counters]" = weakref.WeakSet()


def _fresh_locks_after_fork() -> None:
    """A fork (DataLoader workers) copies each lock as it was: one that a thread of the parent
    held at that moment (a cache writer counting its commit, say) would never be released in
    the child. The child's counters get fresh locks; the counts are the parent's, as copied."""
    for counters in list(_EVERY):
        counters._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_after_fork)
