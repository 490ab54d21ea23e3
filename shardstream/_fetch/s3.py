"""Native async S3: stream one object with retries and Range resume; list prefixes and globs.

Built on aiobotocore directly rather than s3fs: a stream is a thin loop over the response body,
and retry / resume follow our rules. botocore's own retries are switched off, so one request here
is one HTTP request, and every retry is counted in `s3_stats` and logged.

Credentials, region and endpoint come from the standard AWS configuration, resolved by botocore
itself: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and the
~/.aws files, AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, container
and instance roles. When no credentials are found at all, requests go unsigned (public buckets).

There is one client per event loop (and timeout pair), created on first use. It is closed by
`close_s3_clients()`, by the task cancellation a loop gets at shutdown (as in `asyncio.run` and
`shardstream._fetch.loop.shutdown_loop`), or at interpreter exit if its loop is still alive. A forked
child sets the parent's clients aside untouched and makes its own.
"""

from __future__ import annotations

import asyncio
import atexit
import fnmatch
import logging
import os
import re
import threading
from typing import Any, AsyncGenerator, Awaitable, Callable, Dict, List, Optional, Tuple

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import UNSIGNED
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from .._base.counters import Counters
from .._base.errors import FetchError, FetchTimeout, NetworkError, ShardNotFound, UsageError
from .options import FetchOptions, note_fetch
from .retries import backoff_delay, log_retry

__all__ = ["S3Stats", "close_s3_clients", "s3_list", "s3_stats", "s3_stream"]

logger = logging.getLogger(__name__)

_MAX_POOL_CONNECTIONS = 64  # botocore's default of 10 would cap the shards in flight per loop
_GLOB_CHARS = re.compile(r"[*?\[]")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")

_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "404"}
_TIMEOUT_CODES = {"RequestTimeout", "RequestTimeoutException"}
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
    "InternalError", "ServiceUnavailable", "500", "502", "503", "504",
}

# Test hook, off by default: byte counts after which successive GetObject bodies break with a
# connection error (each response consumes one entry). Only tests set it.
_test_break_bodies: List[int] = []


class S3Stats(Counters):
    """Process-wide S3 counters: bytes, requests, retries, resumes, failures.

    Retries and resumes also go to `note_fetch`, which feeds the fetch layer's global and
    per-stream counters; `requests` is what only this module knows.
    """

    FIELDS = ("bytes", "requests", "retries", "resumes", "errors")


s3_stats = S3Stats()


def _translate(exc: BaseException, *, url: str, offset: Optional[int]) -> Optional[FetchError]:
    """Map a botocore / aiohttp / OS failure into the error tree (the one place that does).

    NetworkError and FetchTimeout are retried; that includes throttling and 5xx replies, which
    are transient like a dropped connection. Returns None for anything else (a bug: re-raise it).
    """
    where: Dict[str, Any] = {"url": url, "offset": offset}
    if isinstance(exc, FetchError):
        return exc.with_location(**where)
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        message = f"S3 {code or 'error'} (HTTP {status}): {error.get('Message') or exc}"
        if code in _NOT_FOUND_CODES or status == 404:
            return ShardNotFound(message, **where)
        if code in _TIMEOUT_CODES:
            return FetchTimeout(message, **where)
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return NetworkError(message, **where)
        if code == "PreconditionFailed" or status == 412:
            return FetchError(f"S3 object changed while it was read (ETag mismatch): {message}", **where)
        return FetchError(message, **where)  # AccessDenied, InvalidRange, bad credentials, ...
    if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError, asyncio.TimeoutError)):
        return FetchTimeout(f"S3 timeout: {exc}", **where)
    if isinstance(exc, (HTTPClientError, BotoConnectionError, IncompleteReadError)):
        return NetworkError(f"S3 connection failed: {exc}", **where)
    if isinstance(exc, BotoCoreError):  # NoCredentialsError, ProfileNotFound, ParamValidationError
        return FetchError(f"S3 request failed: {exc}", **where)
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return NetworkError(f"S3 connection failed: {exc!r}", **where)
    return None


async def _retrying(call: Callable[[], Awaitable[Any]], *, url: str, options: Any,
                    offset: Callable[[], Optional[int]] = lambda: None) -> Any:
    """Await `call()`, retrying transient failures with capped exponential backoff, full jitter.

    `options.retries` bounds the failures in a row; progress (a moved `offset`) refills it.
    """
    failures = 0
    reached = offset()
    while True:
        try:
            return await call()
        except Exception as exc:
            error = _translate(exc, url=url, offset=offset())
            if error is None:
                raise
            if offset() != reached:
                failures, reached = 0, offset()
            if not isinstance(error, (NetworkError, FetchTimeout)) or failures >= options.retries:
                s3_stats.add(errors=1)
                raise error from exc
            failures += 1
            s3_stats.add(retries=1)
            note_fetch(retries=1)
            delay = backoff_delay(options, failures)
            log_retry(failures, options, url, offset(), delay, str(error))
            await asyncio.sleep(delay)


# ---- one client per (event loop, timeouts) --------------------------------------------------

_ClientKey = Tuple[asyncio.AbstractEventLoop, Any, Any]
_clients: Dict[_ClientKey, Tuple["asyncio.Task[None]", "asyncio.Future[Any]"]] = {}
_clients_lock = threading.Lock()  # loops in several threads may share this module
_atexit_registered = False
# Clients inherited from the parent across fork, kept alive on purpose (see _after_fork_in_child).
_inherited: List[Any] = []


async def _client(options: Any) -> Any:
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


# ---- streaming ------------------------------------------------------------------------------


def _split(url: str) -> Tuple[str, str]:
    if not url.startswith("s3://"):
        raise UsageError("not an s3:// URL", url=url)
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise UsageError("S3 URL without a bucket", url=url)
    return bucket, key


class _ObjectReader:
    """Reads one object from an offset in chunks; after a failure, the next read reopens it with
    a Range GET from the last byte received and IfMatch on the first response's ETag."""

    def __init__(self, client: Any, url: str, start: int, chunk_size: int) -> None:
        self._client = client
        self._url = url
        self._bucket, self._key = _split(url)
        self._start = start
        self._chunk_size = chunk_size
        self.received = start  # the next byte to ask for
        self._size: Optional[int] = None
        self._etag: Optional[str] = None
        self._body: Any = None
        self._parts: List[bytes] = []  # received, not yet handed out (kept across a resume)
        self._have = 0
        self._break_after: Optional[int] = None  # test hook, see _test_break_bodies

    async def _open(self) -> None:
        request: Dict[str, Any] = {"Bucket": self._bucket, "Key": self._key}
        if self.received:  # never for offset 0: "bytes=0-" on an empty object is a 416
            request["Range"] = f"bytes={self.received}-"
        if self._etag:
            request["IfMatch"] = self._etag
        if self.received > self._start:
            s3_stats.add(resumes=1)
            note_fetch(resumes=1)
            logger.info("S3 resuming %s at byte %d", self._url, self.received)
        s3_stats.add(requests=1)
        try:
            response = await self._client.get_object(**request)
        except ClientError as exc:
            if self._size is None and exc.response.get("Error", {}).get("Code") == "InvalidRange":
                await self._check_start_at_end()
                return
            raise
        match = _CONTENT_RANGE.fullmatch(response.get("ContentRange") or "")
        if match:
            first, size = int(match[1]), int(match[3])
        else:
            first, size = 0, int(response["ContentLength"])
        self._body = response["Body"]
        if first != self.received:
            raise FetchError(f"S3 answered from byte {first}, asked for {self.received}",
                             url=self._url, offset=self.received)
        etag = response.get("ETag")
        if self._size is None:
            self._size, self._etag = size, etag
        elif size != self._size or (etag and self._etag and etag != self._etag):
            raise FetchError(f"S3 object changed while it was read (size {self._size} -> {size}, "
                             f"ETag {self._etag} -> {etag})", url=self._url, offset=self.received)
        if _test_break_bodies:
            self._break_after = _test_break_bodies.pop(0)

    async def _check_start_at_end(self) -> None:
        """A 416 for the first request: an empty stream if `start` is exactly the object's size."""
        head = await self._client.head_object(Bucket=self._bucket, Key=self._key)
        size = int(head["ContentLength"])
        if self._start != size:
            raise FetchError(f"start {self._start} is past the end of the object ({size} bytes)",
                             url=self._url, offset=self._start)
        self._size = size

    async def read(self) -> bytes:
        """The next `chunk_size` bytes (fewer at the end); b"" once the object is done."""
        try:
            while self._size is None or self.received < self._size:
                if self._body is None:
                    await self._open()
                    continue
                data = await self._body.read(self._chunk_size - self._have)
                if not data:
                    raise NetworkError(f"S3 body ended early ({self._size} bytes expected)",
                                       url=self._url, offset=self.received)
                if self._break_after is not None:
                    data = self._test_break(data)
                self._parts.append(data)
                self._have += len(data)
                self.received += len(data)
                if self._have >= self._chunk_size:
                    break
        except BaseException:
            self.close()
            raise
        chunk = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts, self._have = [], 0
        s3_stats.add(bytes=len(chunk))
        return chunk

    def _test_break(self, data: bytes) -> bytes:
        assert self._break_after is not None
        if len(data) < self._break_after:
            self._break_after -= len(data)
            return data
        kept, self._break_after = data[: self._break_after], None
        self._parts.append(kept)
        self._have += len(kept)
        self.received += len(kept)
        raise ResponseStreamingError(error=aiohttp.ServerDisconnectedError("test hook: body broken"))

    def close(self) -> None:
        """Drop the current response; a half-read connection cannot go back to the pool."""
        if self._body is not None:
            self._body.close()
            self._body = None
        self._break_after = None


async def s3_stream(url: str, *, options: FetchOptions, start: int = 0) -> AsyncGenerator[bytes, None]:
    """Stream the object `s3://bucket/key` from byte `start` in chunks of `options.chunk_size`.

    Transient failures (connection errors, timeouts, throttling, 5xx) are retried up to
    `options.retries` times in a row with capped exponential backoff and full jitter; any bytes
    received in between refill the budget. A broken body resumes with a Range GET from the last byte
    received, checking that the length and ETag did not change. Read-ahead is the caller's job:
    this stream reads only when pulled (plus aiohttp's socket buffer).

    Raises:
        ShardNotFound: no such key or bucket (never retried).
        FetchError: access denied, object changed mid-stream, `start` past the end, retries spent
            (NetworkError / FetchTimeout then). Every error carries the URL and the offset reached.
        UsageError: `url` is not `s3://bucket/key`.
    """
    _split(url)  # a malformed URL is a usage error, before any client is made
    if start < 0:
        raise UsageError(f"negative start {start}", url=url)
    client = await _retrying(lambda: _client(options), url=url, options=options, offset=lambda: start)
    reader = _ObjectReader(client, url, start, max(1, options.chunk_size))
    try:
        while True:
            chunk = await _retrying(reader.read, url=url, options=options, offset=lambda: reader.received)
            if not chunk:
                return
            yield chunk
    finally:
        reader.close()


# ---- listing --------------------------------------------------------------------------------


def _glob_match(pattern: str, key: str) -> bool:
    """fnmatch per path segment: `*`, `?` and `[...]` never cross a `/` (as in a shell, fsspec)."""
    parts, names = pattern.split("/"), key.split("/")
    return len(parts) == len(names) and all(map(fnmatch.fnmatchcase, names, parts))


async def s3_list(url: str, *, options: Optional[FetchOptions] = None, page_size: int = 1000) -> List[str]:
    """Expand `s3://bucket/prefix/` (every object under it) or a glob such as
    `s3://bucket/train-*.tar` into sorted `s3://bucket/key` URLs.

    A URL without glob characters is a prefix (a `/` is added); a glob lists the keys under its
    longest literal prefix, page by page (`page_size` keys a request), and keeps the matches.
    Keys ending in `/` (folder markers) are skipped. No match gives an empty list. Pass the
    stream's `options` so that listing and streaming share one client.

    Raises:
        ShardNotFound: no such bucket. FetchError: access denied, retries spent, ...
    """
    options = options or FetchOptions()  # the defaults of a stream: the same client serves both
    bucket, pattern = _split(url)
    magic = _GLOB_CHARS.search(pattern)
    request: Dict[str, Any] = {"Bucket": bucket, "MaxKeys": page_size}
    if magic:
        request["Prefix"] = pattern[: magic.start()]
        if "/" not in pattern[magic.start():]:
            request["Delimiter"] = "/"  # only one level can match: do not list the subtrees
    else:
        request["Prefix"] = pattern if not pattern or pattern.endswith("/") else pattern + "/"
    client = await _retrying(lambda: _client(options), url=url, options=options)

    async def list_page() -> Dict[str, Any]:
        s3_stats.add(requests=1)
        return await client.list_objects_v2(**request)

    keys: List[str] = []
    while True:
        page = await _retrying(list_page, url=url, options=options)
        for item in page.get("Contents", ()):
            key = item["Key"]
            if not key.endswith("/") and (not magic or _glob_match(pattern, key)):
                keys.append(key)
        if not page.get("IsTruncated"):
            break
        request["ContinuationToken"] = page["NextContinuationToken"]
    return [f"s3://{bucket}/{key}" for key in sorted(keys)]
