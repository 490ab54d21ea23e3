"""The process-wide decode thread pools, one per size, recreated after fork."""

from __future__ import annotations

import os
import threading
from typing import Dict

from .._base.threadnames import POOL_THREAD_PREFIX
from .._base.workers import WorkerPool

__all__ = ["get_pool"]

_lock = threading.Lock()
_pools: Dict[int, WorkerPool] = {}
_pid = os.getpid()


def get_pool(threads: int) -> WorkerPool:
    """The shared pool with `threads` workers (threads do not survive fork: new pid, new pools)."""
    global _pid
    with _lock:
        if os.getpid() != _pid:
            _pools.clear()
            _pid = os.getpid()
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = WorkerPool(threads, thread_name_prefix=f"{POOL_THREAD_PREFIX}{threads}")
        return pool


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a lock held by another thread at fork time would stay held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
