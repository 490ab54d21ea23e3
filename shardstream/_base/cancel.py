"""A thread's stop event, for waits below the layer that stops it.

The engine runs each stream stage on a thread of its own and stops them all with one event
(`set_stop`). A wait inside a lower layer (a stream's buffer waiting for the network) knows
nothing of the engine, so it asks `current_stop()` and, while it waits, raises `Stopped` once the
event is set: closing a pass (a `break`, Ctrl-C) does not wait for a slow or silent transfer.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

__all__ = ["Stopped", "current_stop", "finalize", "runs_fetch_loop", "set_stop"]

_local = threading.local()


class Stopped(BaseException):
    """The run was stopped while this thread waited. (A BaseException, as GeneratorExit is: the
    `except Exception` of an error handler between the wait and the engine must not take it for
    a shard's error and go on to the next shard.)"""


def set_stop(event: Optional[threading.Event]) -> None:
    """The event that stops this thread's waits (None: nothing stops them)."""
    _local.event = event


def current_stop() -> Optional[threading.Event]:
    return getattr(_local, "event", None)


_loop_threads: "set[int]" = set()  # threads that run the fetchers' event loops (see finalize)


def runs_fetch_loop() -> None:
    """Say that this thread runs an event loop that other threads' closes wait on."""
    _loop_threads.add(threading.get_ident())


def finalize(close: Callable[[], None]) -> None:
    """A finalizer's `close()`: now, or on a thread of its own when this thread runs the fetchers'
    event loop (a garbage collection that ran there): a close that joins threads waiting on that
    loop stalled every transfer of the process until its join timed out."""
    if threading.get_ident() not in _loop_threads:
        close()
        return
    threading.Thread(target=close, name="shardstream-finalize", daemon=True).start()
