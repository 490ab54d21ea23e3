"""One aiobotocore S3 client per (event loop, timeouts, AWS configuration): created on first use,
shared by every stream on that loop, closed with the loop or at exit, and left alone in a forked
child (the parent's connections are not ours to close). The endpoint and credentials come from the
standard AWS configuration (AWS_ENDPOINT_URL, profiles); without credentials, requests go unsigned.

botocore reads that configuration once, when a client is made, while a loop (the shared one) may
outlive it: a client keyed by loop and timeouts alone went on serving an endpoint or credentials
the environment no longer named. So the key also holds a digest of what a client is made from
(`_configuration`), and a client whose configuration is no longer the process's is retired: taken
out of the table at once, and closed as soon as the last stream reading through it lets go.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import logging
import os
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import UNSIGNED
from botocore.loaders import create_loader

from .._base.logredact import redact_loggers

logger = logging.getLogger("shardstream._fetch.s3")

__all__ = ["ClientLease", "close_s3_clients", "lease_client", "preload"]

_MAX_POOL_CONNECTIONS = 64  # botocore's default of 10 would cap the shards in flight per loop
# The shared files botocore reads at client creation, and the variables that move them.
_AWS_FILES = (("AWS_CONFIG_FILE", "~/.aws/config"), ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))


def _configuration() -> str:
    """A digest of what botocore reads from the process when it makes a client: every AWS_*
    variable (endpoint, credentials, profile, region, CA bundle, ...), the proxy variables, and
    which shared config and credentials files exist and when they last changed. A digest, so that
    the client table holds (and shows) no secret."""
    digest = hashlib.blake2b(digest_size=16)
    environ = os.environ
    for name in sorted(n for n in environ if n.startswith("AWS_") or n.upper().endswith("_PROXY")):
        digest.update(f"{name}={environ[name]}\0".encode("utf-8", "surrogateescape"))
    for variable, default in _AWS_FILES:
        path = os.path.expanduser(environ.get(variable, default))
        try:
            stat = os.stat(path)
            state = f"{stat.st_mtime_ns}:{stat.st_size}"
        except OSError:
            state = "absent"
        digest.update(f"{path}:{state}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


# ---- botocore's data, read once per process --------------------------------------------------

_loaders: Dict[Optional[str], Any] = {}  # botocore's data loaders by data path, shared by every session
_loading = threading.Lock()  # held while a shared loader is made or data read into it
# What making an S3 client reads: (loader method, arguments, keywords), as botocore calls them (the
# loader caches each call by its arguments; a data file read by one call is not read by another).
_CLIENT_DATA: Tuple[Tuple[str, Tuple[str, ...], Dict[str, Any]], ...] = (
    ("load_data_with_path", ("endpoints",), {}),
    ("load_data_with_path", ("sdk-default-configuration",), {}),
    ("load_data_with_path", ("partitions",), {}),
    ("load_data_with_path", ("_retry",), {}),
    ("load_service_model", ("s3", "service-2"), {"api_version": None}),
    ("load_service_model", ("s3", "endpoint-rule-set-1"), {"api_version": None}),
)


def _read_client_data(data_path: Optional[str]) -> Any:
    """botocore's data loader for `data_path`, one per process, holding what making an S3 client
    reads. A session (we make one per client) otherwise reads the S3 model, its endpoint rules,
    the endpoints and the partitions again: ~0.1 s of the 0.16-0.2 s a client took to make here,
    in every process and on every loop. One session's clients share its loader the same way.

    Read under a lock, before any session gets the loader: botocore merges a model's extras into
    the cached model the first time it loads it, and a session reading that model on another
    thread meanwhile could see it change (botocore does not make one session's loader safe
    across threads either). Once read, creating a client only looks the data up. A failure
    (another botocore layout) leaves the reading to the client."""
    with _loading:
        loader = _loaders.get(data_path)
        if loader is None:
            loader = create_loader(data_path)
            try:
                for method, args, keywords in _CLIENT_DATA:
                    getattr(loader, method)(*args, **keywords)
            except Exception as exc:  # noqa: BLE001
                logger.debug("reading botocore's S3 data ahead failed: %r", exc)
            _loaders[data_path] = loader  # (published once read: a reader of `_loaders` needs no lock)
    return loader


def preload() -> None:
    """Read what making an S3 client reads into the loader of the default data path. The
    registry's warming thread calls it after importing the S3 fetcher, so the first client finds
    it read, and so does every DataLoader worker forked after it."""
    _read_client_data(os.environ.get("AWS_DATA_PATH"))


# ---- one client per (event loop, timeouts, configuration) -------------------------------------

_ClientKey = Tuple[asyncio.AbstractEventLoop, Any, Any, str]


class _Client:
    """One client's holder task, the future the client is handed out through, and its leases."""

    __slots__ = ("key", "task", "ready", "users")

    def __init__(self, key: _ClientKey, task: "asyncio.Task[None]", ready: "asyncio.Future[Any]") -> None:
        self.key = key
        self.task = task
        self.ready = ready
        self.users = 0  # leases held (streams and listings reading through it)


_clients: Dict[_ClientKey, _Client] = {}
_retired: Set[_Client] = set()  # out of the table, still in use (or closing)
_clients_lock = threading.Lock()  # loops in several threads may share this module
_atexit_registered = False
# Clients inherited from the parent across fork, kept alive on purpose (see _after_fork_in_child).
_inherited: List[Any] = []


class ClientLease:
    """A client held for a stream or a listing: `release()` when done with it (idempotent). A
    retired client is closed when its last lease is released."""

    __slots__ = ("client", "_entry")

    def __init__(self, client: Any, entry: _Client) -> None:
        self.client = client
        self._entry: Optional[_Client] = entry

    def release(self) -> None:
        entry, self._entry = self._entry, None
        if entry is None:
            return
        with _clients_lock:
            entry.users -= 1
            close = entry.users == 0 and entry in _retired  # (not a parent's, after fork)
        if close:
            _cancel(entry)


async def lease_client(options: Any) -> ClientLease:
    """The S3 client of the running loop for these timeouts and the current AWS configuration,
    created on first use, held until the lease is released: a change of configuration meanwhile
    retires the client but does not close it under the holder."""
    entry = _entry_for(options)
    try:
        client = await _client_of(entry)
    except BaseException:
        ClientLease(None, entry).release()
        raise
    return ClientLease(client, entry)


def _entry_for(options: Any) -> _Client:
    """The table's entry for the running loop, these timeouts and the current configuration (a
    new one, its client being made, if there is none), with one more user; the loop's entries
    made from another configuration are retired."""
    global _atexit_registered
    loop = asyncio.get_running_loop()
    key = (loop, options.connect_timeout, options.stall_timeout, _configuration())
    idle: List[_Client] = []
    with _clients_lock:
        entry = _clients.get(key)
        if entry is None:
            for stale in [k for k in _clients if k[0].is_closed()]:  # loops closed without cleanup
                del _clients[stale]
            _retired.difference_update([e for e in _retired if e.key[0].is_closed()])
            for old in [k for k in _clients if k[0] is loop and k[3] != key[3]]:
                retired = _clients.pop(old)
                _retired.add(retired)
                if not retired.users:
                    idle.append(retired)
            ready: asyncio.Future[Any] = loop.create_future()
            task = loop.create_task(_hold_client(key, ready), name="shardstream-s3-client")
            # If the loop is closed without cancelling this task, it is dropped without a word:
            # nothing can be awaited then, and the sockets go with the loop (asyncio does the same
            # for its own helper futures).
            task._log_destroy_pending = False  # type: ignore[attr-defined]
            entry = _clients[key] = _Client(key, task, ready)
            if not _atexit_registered:
                atexit.register(_close_at_exit)
                _atexit_registered = True
        entry.users += 1
    if idle:
        logger.debug("the AWS configuration changed: a new S3 client; closing %d unused old one(s)", len(idle))
    for retired in idle:
        _cancel(retired)
    return entry


async def _client_of(entry: _Client) -> Any:
    ready = entry.ready
    if ready.done() and not ready.cancelled() and ready.exception() is None:
        return ready.result()
    return await asyncio.shield(ready)  # a cancelled caller must not cancel the shared future


def _cancel(entry: _Client) -> None:
    """Close a client: cancel its holder task, on its own loop (from any thread)."""
    loop = entry.key[0]
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        entry.task.cancel()
    else:
        loop.call_soon_threadsafe(entry.task.cancel)


async def _hold_client(key: _ClientKey, ready: "asyncio.Future[Any]") -> None:
    """Create a client, hand it out through `ready`, and keep it open until this task is cancelled.

    Living in a task ties the client's life to the loop: shutdown cancels every task (asyncio.run
    does; so does `close_s3_clients`), and the cancellation closes its connections cleanly.
    """
    try:
        redact_loggers("botocore", "aiobotocore")  # (their DEBUG lines hold the session token; made by now)
        session = get_session()
        data_path = session.get_config_variable("data_path")
        loader = _loaders.get(data_path)
        if loader is None:  # (read off the loop's thread when the warming thread has not: ~0.1 s of JSON)
            loader = await asyncio.get_running_loop().run_in_executor(None, _read_client_data, data_path)
        session.register_component("data_loader", loader)
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
        # botocore reads AWS_DEFAULT_REGION and profiles, not AWS_REGION (what the other AWS SDKs
        # and most container platforms set): it counts where nothing else names a region.
        region = None if session.get_config_variable("region") else os.environ.get("AWS_REGION") or None
        context = session.create_client("s3", config=config, region_name=region)
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
    """Drop the entry whose client this was, from the table or the retired set."""
    with _clients_lock:
        entry = _clients.get(key)
        if entry is not None and entry.ready is ready:
            del _clients[key]
        for retired in [e for e in _retired if e.ready is ready]:
            _retired.discard(retired)


def _entries_on(loop: Optional[asyncio.AbstractEventLoop] = None) -> List[_Client]:
    """Every entry (in the table or retired) on `loop`, or on any loop (lock held)."""
    entries = list(_clients.values()) + list(_retired)
    return [e for e in entries if loop is None or e.key[0] is loop]


async def close_s3_clients() -> None:
    """Close the running loop's S3 clients; the loop's owner awaits this before stopping it."""
    loop = asyncio.get_running_loop()
    with _clients_lock:
        tasks = [entry.task for entry in _entries_on(loop)]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _close_at_exit() -> None:
    """Last resort at interpreter exit: close clients whose loops are still alive."""
    with _clients_lock:
        loops = {entry.key[0] for entry in _entries_on()}
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
    global _clients_lock, _loading
    _clients_lock = threading.Lock()  # another thread may have held it at fork time
    _loading = threading.Lock()
    for entry in _entries_on():
        ready = entry.ready
        _inherited.append(entry)
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
    _retired.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


