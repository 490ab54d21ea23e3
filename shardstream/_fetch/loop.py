"""The process-wide event loop on a daemon thread, and the HTTP sessions that live on it.

Network I/O for every shard in flight runs on one loop. The loop
starts lazily on first use and is replaced after fork: a child gets a fresh loop and fresh
sessions, and never touches the parent's (their sockets and epoll set are shared with the parent,
so closing them in the child would break the parent). At interpreter exit an atexit hook cancels
what still runs on the loop and closes the sessions, so aiohttp has nothing to warn about.

The loop is uvloop's when uvloop is installed (`pip install shardstream[fast]`; opt out with
SHARDSTREAM_UVLOOP=0): the same streams cost 5-10% less CPU per sample over HTTP (a raw pass:
0.22 against 0.23-0.25 s per 1,000 samples of 116 KB on 2 cores), CPU the reader and the
decoders get back.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from typing import Any, Awaitable, Callable, Coroutine, Dict, List, Optional, TypeVar

from .._base.cancel import runs_fetch_loop
from .._base.workers import WorkerPool

__all__ = ["add_shutdown_hook", "close_session", "exiting", "get_loop", "get_session",
           "interpreter_exit", "run_coroutine", "shutdown_loop"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# No cap on connections (0), as webdataset's curl per shard has none. A stream that its reader
# has not reached holds its connection while its buffer is full (a server without Range, or
# without a validator, sends a shard over one connection), so with a cap, enough datasets open
# at once (about 30 at the defaults) took every connection with streams opened ahead, and the
# stream being read waited for one for ever. What bounds the connections is the readers: a
# dataset opens `shards_in_flight` streams ahead, and a stream's ranged parts stay within its
# reader's window of bytes (`part_budget`).
CONNECTION_LIMIT = 0
_SHUTDOWN_TIMEOUT_S = 5.0


class _LoopThread:
    """One event loop, the daemon thread running it, and the pid that owns both."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = _new_event_loop()
        # (DNS lookups, blocking reads, the environment's proxy settings: a pool that serves a
        # thread still reading after the main thread returned, as the stdlib's default does not)
        self.loop.set_default_executor(WorkerPool(min(32, (os.cpu_count() or 1) + 4), "shardstream-io"))
        self.thread = threading.Thread(target=self._run, name="shardstream-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        runs_fetch_loop()  # (a finalizer that would block this thread closes elsewhere)
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed and SHARDSTREAM_UVLOOP is not 0, else asyncio's."""
    if os.environ.get("SHARDSTREAM_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def interpreter_exit(message: str) -> BaseException:
    """The error for a transfer ended by the interpreter's exit. The loop is shut down at exit,
    after every non-daemon thread has ended: a thread other than the main one still reading then
    is a daemon, and a SystemExit (exactly: threading prints the traceback of any other error, its
    subclasses included) ends it quietly. The main thread (an atexit handler of the user's) gets
    a RuntimeError, which its own `except Exception` can handle."""
    if threading.current_thread() is threading.main_thread():
        return RuntimeError(message)
    return SystemExit(message)


def exiting() -> bool:
    """Whether the interpreter's exit has shut the loop down."""
    return _exiting


_lock = threading.Lock()
_current: Optional[_LoopThread] = None
_sessions: Dict[asyncio.AbstractEventLoop, Any] = {}  # loop -> aiohttp.ClientSession
_exiting = False
_shutdown_hooks: List[Callable[[], Awaitable[None]]] = []
# Objects inherited from the parent across fork. Kept alive on purpose: their finalizers would
# touch sockets and an epoll set that the child shares with the parent.
_inherited: List[Any] = []


def get_loop() -> asyncio.AbstractEventLoop:
    """The shared event loop, started on first use (and again in a forked child)."""
    global _current
    current = _current
    if current is not None and current.pid == os.getpid():
        return current.loop
    with _lock:
        if _current is not None and _current.pid != os.getpid():
            _forget_parent_state()
        if _current is None:
            if _exiting:
                raise interpreter_exit("shardstream's event loop is shut down (interpreter exit)")
            _current = _LoopThread()
        return _current.loop


def run_coroutine(coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
    """Schedule `coro` on the shared loop from any other thread; return a concurrent Future."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


async def get_session() -> Any:
    """The aiohttp ClientSession of the running loop, created on first use.

    Requests pick their own timeouts; the session only pools connections. Bodies are not
    decompressed and no compression is asked for: shards are fetched byte for byte (as curl
    does), which is also what makes byte offsets for Range resumes meaningful. On a loop of
    your own, `await close_session()` before that loop closes.
    """
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        import aiohttp

        from .heads import TRACE

        connector = aiohttp.TCPConnector(limit=CONNECTION_LIMIT, limit_per_host=0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            headers={"Accept-Encoding": "identity"},
            timeout=aiohttp.ClientTimeout(total=None),
            # HTTP(S)_PROXY, NO_PROXY and netrc are honoured (as curl does for webdataset), but per
            # origin and once a minute (`environ`), not in two executor trips per request
            trust_env=False,
            trace_configs=[TRACE],  # (bounds the response headers' phase: `heads`)
        )
        with _lock:
            _sessions[loop] = session
    return session


async def close_session() -> None:
    """Close the running loop's session, if any (call it before closing a loop of your own)."""
    with _lock:
        session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


def add_shutdown_hook(hook: Callable[[], Awaitable[None]]) -> None:
    """Have `await hook()` run on the shared loop when it shuts down (after its tasks are
    cancelled, before its HTTP session closes): for clients of other protocols (S3) to close."""
    with _lock:
        _shutdown_hooks.append(hook)


async def _close_all_on_loop() -> None:
    """Cancel every other task on this loop, wait for them, run the hooks, close the session."""
    me = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not me]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_SHUTDOWN_TIMEOUT_S / 2)
    for hook in list(_shutdown_hooks):
        try:
            await hook()
        except Exception as exc:  # noqa: BLE001 - one failing hook must not keep others open
            log.warning("shardstream loop shutdown hook %r failed: %r", hook, exc)
    await close_session()
    await asyncio.get_running_loop().shutdown_asyncgens()


def shutdown_loop(timeout: float = _SHUTDOWN_TIMEOUT_S) -> None:
    """Stop the shared loop: cancel its tasks, close its sessions, join its thread.

    Idempotent; the next get_loop() starts a new loop. Must not be called from the loop thread.
    """
    global _current
    with _lock:
        current = _current
        if current is None:
            return
        if current.pid != os.getpid():
            _forget_parent_state()
            return
        if threading.current_thread() is current.thread:
            raise RuntimeError("shutdown_loop() called from the loop thread")
        _current = None
    loop = current.loop
    try:
        asyncio.run_coroutine_threadsafe(_close_all_on_loop(), loop).result(timeout)
    except Exception as exc:  # noqa: BLE001 - shutting down: report, and stop the loop anyway
        log.warning("shardstream loop did not shut down cleanly: %r", exc)
    loop.call_soon_threadsafe(loop.stop)
    current.thread.join(timeout)
    if not current.thread.is_alive():
        loop.close()


def _forget_parent_state() -> None:
    """In a forked child: drop the parent's loop and sessions without closing them (lock held)."""
    global _current
    if _current is not None:
        _inherited.append(_current)
        _current = None
    for session in _sessions.values():
        connector = session.connector
        session.detach()  # no I/O: only marks the session closed, so its finalizer stays quiet
        if connector is not None and hasattr(connector, "_closed"):
            # Otherwise its finalizer closes the pooled transports, which unregisters their
            # sockets from the epoll set shared with the parent: the parent would stop seeing them.
            connector._closed = True
        _inherited.extend((session, connector))
    _sessions.clear()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at fork time
    with _lock:
        _forget_parent_state()


def _at_exit() -> None:
    global _exiting
    _exiting = True
    shutdown_loop()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
