"""Thread pools that serve until the process ends, for every pool shardstream keeps.

`concurrent.futures.ThreadPoolExecutor` is shut down when the interpreter starts to exit: as
soon as the main thread returns, before the threads still running are joined, every such pool
refuses new work ("cannot schedule new futures after shutdown"). A training loop that runs in a
thread of its own while the main thread has returned would fail in the middle of its epoch, in
our decode pool, in the event loop's executor (DNS lookups, blocking reads, proxy settings) or
in sample counting. `WorkerPool` is a ThreadPoolExecutor to the code that uses it (asyncio's
`set_default_executor` takes nothing else), with its own queue and daemon threads, which no
exit hook stops: work submitted while any thread still runs is done, and nothing waits for the
pool at exit (a daemon consumer and its pool end with the process).
"""

from __future__ import annotations

import functools
import queue
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, List, Optional

__all__ = ["WorkerPool"]


class WorkerPool(ThreadPoolExecutor):
    """Up to `max_workers` daemon threads named `thread_name_prefix_N`, started as work waits
    and none is idle. `shutdown()` stops them after the work already queued (with
    `cancel_futures=True`, that work is cancelled)."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        super().__init__(max_workers, thread_name_prefix)  # (attributes only: no thread starts there)
        self._limit, self._prefix = max_workers, thread_name_prefix
        self._todo: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._workers: List[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._guard = threading.Lock()
        self._closed = False
        # A pool dropped without shutdown() lets its threads go (they hold this, not the pool).
        self._on_drop = weakref.ref(self, functools.partial(_stop_workers, self._todo))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "Future[Any]":  # type: ignore[override]
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: "Future[Any]" = Future()
            self._todo.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._workers) < self._limit:
                worker = threading.Thread(target=_work, args=(self._todo, self._idle, self._on_drop),
                                          name=f"{self._prefix}_{len(self._workers)}", daemon=True)
                worker.start()
                self._workers.append(worker)
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._guard:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._todo.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            self._todo.put(None)
            workers = list(self._workers)
        if wait:
            for worker in workers:
                if worker is not threading.current_thread():
                    worker.join()


def _work(todo: "queue.SimpleQueue[Optional[tuple]]", idle: threading.Semaphore, on_drop: Any) -> None:
    """A worker's loop. It holds the pool's weak reference `on_drop` (not the pool): a weak
    reference that dies with its object, in a garbage cycle, would not call back."""
    while True:
        item = todo.get()
        if item is None:
            todo.put(None)  # (for the next worker)
            return
        future, fn, args, kwargs = item
        del item
        if not future.set_running_or_notify_cancel():
            del future, fn, args, kwargs
            idle.release()
            continue
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the future, as the stdlib pool does
            idle.release()  # (before the future wakes a submitter: its next task finds this thread idle)
            future.set_exception(exc)
            del exc
        else:
            idle.release()
            future.set_result(result)
            del result
        del future, fn, args, kwargs  # (nothing of the last task stays alive while idle)


def _stop_workers(todo: "queue.SimpleQueue[Optional[tuple]]", _dropped: Any) -> None:
    todo.put(None)  # (each worker passes it on)
