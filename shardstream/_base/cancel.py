"""A thread's stop event, for waits below the layer that stops it.

The engine runs each stream stage on a thread of its own and stops them all with one event
(`set_stop`). A wait inside a lower layer (a stream's buffer waiting for the network) knows
nothing of the engine, so it asks `current_stop()` and, while it waits, raises `Stopped` once the
event is set: closing a pass (a `break`, Ctrl-C) does not wait for a slow or silent transfer.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable, List, Optional

__all__ = ["Stopped", "current_stop", "finalize", "runs_fetch_loop", "set_stop", "start_janitor"]

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


# Finalizers' closes run off the finalizing thread. A finalizer runs wherever a garbage collection
# happens: inside a lock this thread holds that close() takes again (a stage's counters shared by
# every pass, the cache's), or on the thread of the fetchers' event loop, which close() waits on.
# Run there, it deadlocked the thread on itself (a training loop then waited for ever). A finalizer
# puts its close on the janitors' queue (SimpleQueue.put is safe in a finalizer); JANITORS threads,
# started by `start_janitor` from ordinary code, take the closes from it, so one slow close delays
# no other and no thread is started per close (a start needs threading's own lock, which a
# collection inside threading.enumerate() holds).
_janitor_queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
_janitors: List[threading.Thread] = []
_late: List[threading.Event] = []  # closes their finalizer stopped waiting for, not done yet
JANITORS = 4
FINALIZE_WAIT_S = 1.0  # how long a finalizer waits for its close (done at once unless it needs a lock held here)
_start_lock = threading.Lock()


def _clean() -> None:
    _local.closing = True  # (a finalizer run here does not wait: see finalize)
    while True:
        job = _janitor_queue.get()
        if job is None:
            return
        close, done = job
        del job
        try:
            close()
        except BaseException:  # noqa: BLE001 - as a finalizer's: nothing to report it to
            pass
        finally:
            done.set()
            del close, done


def start_janitor() -> None:
    """Make sure the janitors run (called where iterators are made: not in a finalizer)."""
    if len(_janitors) < JANITORS or not all(thread.is_alive() for thread in _janitors):
        with _start_lock:
            _janitors[:] = [thread for thread in _janitors if thread.is_alive()]
            while len(_janitors) < JANITORS:
                thread = threading.Thread(target=_clean, name="shardstream-janitor", daemon=True)
                thread.start()
                _janitors.append(thread)
    if _late:
        _late[:] = [done for done in _late if not done.is_set()]


def _forget_janitor() -> None:
    global _janitor_queue, _start_lock
    _janitor_queue, _start_lock = queue.SimpleQueue(), threading.Lock()  # (a forked child: the parent's threads are not here)
    _janitors.clear()
    _late.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_janitor)


def finalize(close: Callable[[], None]) -> None:
    """A finalizer's `close()`: run by a janitor, waited for up to FINALIZE_WAIT_S here (so a
    dropped iterator is closed by the time `del` or `gc.collect()` returns, unless the close
    needs a lock this thread holds). Not waited for on shardstream's own threads (an event
    loop, a pass's stream or pool thread, a janitor: the close may join or wait on them), nor
    while an earlier close runs late: a collection that finds many iterators under such a lock
    would stall this thread a second for each. Without a janitor (none started in this process
    yet), run now."""
    own = threading.get_ident() in _loop_threads or getattr(_local, "closing", False) or \
        threading.current_thread().name.startswith("shardstream")
    if not any(thread.is_alive() for thread in list(_janitors)):
        if own:  # (iterators start the janitors: not expected)
            threading.Thread(target=close, name="shardstream-finalize", daemon=True).start()
        else:
            close()
        return
    done = threading.Event()
    _janitor_queue.put((close, done))
    if own or any(not late.is_set() for late in _late):
        return
    if not done.wait(FINALIZE_WAIT_S):
        _late.append(done)
