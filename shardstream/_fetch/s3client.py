"""One aiobotocore S3 client per (event loop, timeouts): created on first use, shared by every
stream on that loop, closed with the loop or at exit, and left alone in a forked child (the
parent's connections are not ours to close). The endpoint and credentials come from the standard
AWS configuration (AWS_ENDPOINT_URL, profiles); without credentials, requests go unsigned.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from typing import Any, Dict, List, Tuple

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import UNSIGNED

logger = logging.getLogger("shardstream._fetch.s3")

__all__ = ["client_for", "close_s3_clients"]

_MAX_POOL_CONNECTIONS = 64  # botocore's default of 10 would cap the shards in flight per loop


# ---- one client per (event loop, timeouts) --------------------------------------------------

_ClientKey = Tuple[asyncio.AbstractEventLoop, Any, Any]
_clients: Dict[_ClientKey, Tuple["asyncio.Task[None]", "asyncio.Future[Any]"]] = {}
_clients_lock = threading.Lock()  # loops in several threads may share this module
_atexit_registered = False
# Clients inherited from the parent across fork, kept alive on purpose (see _after_fork_in_child).
_inherited: List[Any] = []


async def client_for(options: Any) -> Any:
    """The S3 client of the running loop for these timeouts, created on first use."""
    global _atexit_registered
    loop = asyncio.get_running_loop()
    key = (loop, options.connect_timeout, options.stall_timeout)
    with _clients_lock:
        entry = _clients.get(key)
        if entry is None:
            for stale in [k for k in _clients if k[0].is_closed()]:  # loops closed without cleanup
                del _clients[stale]
            ready: asyncio.Future[Any] = loop.create_future()
            task = loop.create_task(_hold_client(key, ready), name="shardstream-s3-client")
            # If the loop is closed without cancelling this task, it is dropped without a word:
            # nothing can be awaited then, and the sockets go with the loop (asyncio does the same
            # for its own helper futures).
            task._log_destroy_pending = False  # type: ignore[attr-defined]
            entry = _clients[key] = (task, ready)
            if not _atexit_registered:
                atexit.register(_close_at_exit)
                _atexit_registered = True
    ready = entry[1]
    if ready.done() and not ready.cancelled() and ready.exception() is None:
        return ready.result()
    return await asyncio.shield(ready)  # a cancelled caller must not cancel the shared future


async def _hold_client(key: _ClientKey, ready: "asyncio.Future[Any]") -> None:
    """Create a client, hand it out through `ready`, and keep it open until this task is cancelled.

    Living in a task ties the client's life to the loop: shutdown cancels every task (asyncio.run
    does; so does `close_s3_clients`), and the cancellation closes its connections cleanly.
    """
    try:
        session = get_session()
        # Resolving credentials here (not on the first request) lets public buckets work unsigned.
        anonymous = await session.get_credentials() is None
        config = AioConfig(
            connect_timeout=key[1],
            read_timeout=key[2],  # aiohttp's sock_read: the longest silence between reads, a stall
            retries={"total_max_attempts": 1},  # we retry (and resume) ourselves
            max_pool_connections=_MAX_POOL_CONNECTIONS,
            # Whole-object checksums cannot cover a resumed stream; length + ETag checks do.
            response_checksum_validation="when_required",
            signature_version=UNSIGNED if anonymous else None,
        )
        context = session.create_client("s3", config=config)
        client = await context.__aenter__()
    except asyncio.CancelledError:
        _forget(key, ready)
        ready.cancel()
        raise
    except Exception as exc:  # handed to the callers waiting on `ready`, not lost in the task
        _forget(key, ready)
        ready.set_exception(exc)
        return
    ready.set_result(client)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        # Only a cancellation closes the client. A task destroyed with its loop already closed
        # gets GeneratorExit instead, and must not await anything.
        _forget(key, ready)
        try:
            await context.__aexit__(None, None, None)
        except Exception as exc:
            logger.debug("closing the S3 client failed: %r", exc)
        raise


def _forget(key: _ClientKey, ready: "asyncio.Future[Any]") -> None:
    with _clients_lock:
        if _clients.get(key, (None, ready))[1] is ready:
            _clients.pop(key, None)


async def close_s3_clients() -> None:
    """Close the running loop's S3 clients; the loop's owner awaits this before stopping it."""
    loop = asyncio.get_running_loop()
    with _clients_lock:
        tasks = [task for (owner, *_), (task, _) in _clients.items() if owner is loop]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _close_at_exit() -> None:
    """Last resort at interpreter exit: close clients whose loops are still alive."""
    with _clients_lock:
        loops = {key[0] for key in _clients}
    for loop in loops:
        try:
            if loop.is_closed():
                continue
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(close_s3_clients(), loop).result(timeout=5)
            else:
                loop.run_until_complete(close_s3_clients())
        except Exception as exc:  # exit must go on
            logger.debug("closing S3 clients at exit failed: %r", exc)


def _after_fork_in_child() -> None:
    """Set the parent's clients aside in a forked child, never to be closed or finalised there.

    Their sockets and epoll set are shared with the parent: closing them here, or letting aiohttp's
    finalisers do it, would unregister the parent's sockets. The child makes its own clients on
    its own loop. (Best effort on aiobotocore internals, as shardstream._fetch.loop does for its own.)
    """
    global _clients_lock
    _clients_lock = threading.Lock()  # another thread may have held it at fork time
    for task, ready in _clients.values():
        _inherited.append((task, ready))
        if not ready.done() or ready.cancelled() or ready.exception() is not None:
            continue
        http = getattr(getattr(ready.result(), "_endpoint", None), "http_session", None)
        for session in list((getattr(http, "_sessions", None) or {}).values()):
            connector = session.connector
            session.detach()  # marks it closed without I/O, so its finaliser stays quiet
            if connector is not None and hasattr(connector, "_closed"):
                connector._closed = True
            _inherited.append((session, connector))
    _clients.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


