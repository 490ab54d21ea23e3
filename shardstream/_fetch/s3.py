"""Native async S3: stream one object with retries and Range resume; list prefixes and globs.

Built on aiobotocore directly rather than s3fs: a stream is a thin loop over the response body,
and retry / resume follow our rules. botocore's own retries are switched off, so one request here
is one HTTP request, and every retry is counted in `s3_stats` and logged.

Credentials, region and endpoint come from the standard AWS configuration, resolved by botocore
itself: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and the
~/.aws files, AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, container
and instance roles. When no credentials are found at all, requests go unsigned (public buckets).

There is one client per event loop, timeout pair and AWS configuration, created on first use
(`s3client`); a stream or a listing holds it by a lease. It is closed by `close_s3_clients()`, by the
task cancellation a loop gets at shutdown (as in `asyncio.run` and
`shardstream._fetch.loop.shutdown_loop`), at interpreter exit if its loop is still alive, or once the
AWS configuration changed (another endpoint, credentials, region) and its last lease is released.
A forked child sets the parent's clients aside untouched and makes its own.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import logging
import re
from typing import Any, AsyncGenerator, Awaitable, Callable, Dict, List, Optional, Tuple

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    IncompleteReadError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from .._base.counters import Counters
from .._base.errors import FetchError, FetchTimeout, NetworkError, ShardNotFound, UsageError, safe_cause
from .options import FetchOptions, note_fetch, note_size
from .retries import Silence, backoff_delay, log_retry, made_progress, stall_body, watch
from .lowat import LowWater
from .s3client import lease_client
from .s3client import preload as warm  # (the registry's warming thread runs it after importing us)

__all__ = ["S3Stats", "s3_list", "s3_stats", "s3_stream", "warm"]

logger = logging.getLogger(__name__)

_GLOB_CHARS = re.compile(r"[*?\[]")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")

_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "404"}
_TIMEOUT_CODES = {"RequestTimeout", "RequestTimeoutException"}
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
    "InternalError", "ServiceUnavailable", "500", "502", "503", "504",
}



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
                    offset: Callable[[], Optional[int]] = lambda: None, silence: Optional[Silence] = None) -> Any:
    """Await `call()`, retrying transient failures with capped exponential backoff, full jitter.

    `options.retries` bounds the failures in a row; progress (a moved `offset`) refills it. A
    back-off is no silence of the server's (`silence`, a transfer's, rests meanwhile).
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
            now = offset()
            if now is not None and reached is not None and made_progress(reached, now):
                failures = 0
            reached = now
            if not isinstance(error, (NetworkError, FetchTimeout)) or failures >= options.retries:
                s3_stats.add(errors=1)
                raise error from safe_cause(exc)
            failures += 1
            s3_stats.add(retries=1)
            note_fetch(retries=1)
            delay = backoff_delay(options, failures)
            log_retry(failures, options, url, offset(), delay, str(error))
            if silence is not None:
                silence.rest(delay)
            await asyncio.sleep(delay)


# ---- streaming ------------------------------------------------------------------------------


def _split(url: str, object_key: bool = False) -> Tuple[str, str]:
    """(bucket, key) of an s3:// URL; with `object_key`, the key must name an object."""
    if not url.startswith("s3://"):
        raise UsageError("not an s3:// URL", url=url)
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise UsageError("S3 URL without a bucket", url=url)
    if "@" in bucket:  # (botocore would quote it, password and all, as an invalid bucket name)
        raise UsageError("an s3:// URL holds no credentials (they come from the AWS configuration): "
                         "no '@' in the bucket name", url=url)
    if object_key and not key:
        raise UsageError("S3 URL without a key: name an object (s3://bucket/key)", url=url)
    return bucket, key


class _ObjectReader:
    """Reads one object from an offset in chunks; after a failure, the next read reopens it with
    a Range GET from the last byte received and IfMatch on the first response's ETag."""

    def __init__(self, client: Any, url: str, start: int, chunk_size: int, silence: Silence) -> None:
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
        self._lowat: Optional[LowWater] = None
        self._silence = silence  # the transfer's, for the stall watchdog: beaten by every body read
        self._stall: Optional[FetchTimeout] = None  # the watchdog's verdict on the body being read

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
        raw = getattr(self._body, "_raw_stream", None)  # (aiobotocore's aiohttp response; else no mark)
        self._lowat = LowWater.for_response(raw, self._chunk_size) if raw is not None else None
        if raw is not None:  # (a body that comes too slowly fails its read: `Silence`)
            self._silence.abort = functools.partial(self._stalled, raw)
        if first != self.received:
            raise FetchError(f"S3 answered from byte {first}, asked for {self.received}",
                             url=self._url, offset=self.received)
        etag = response.get("ETag")
        if self._size is None:
            self._size, self._etag = size, etag
            note_size(size)  # the whole object's: a tar header claiming more is refused at once
        elif size != self._size or (etag and self._etag and etag != self._etag):
            raise FetchError(f"S3 object changed while it was read (size {self._size} -> {size}, "
                             f"ETag {self._etag} -> {etag})", url=self._url, offset=self.received)

    async def _check_start_at_end(self) -> None:
        """A 416 for the first request: an empty stream if `start` is exactly the object's size."""
        head = await self._client.head_object(Bucket=self._bucket, Key=self._key)
        size = int(head["ContentLength"])
        if self._start != size:
            raise FetchError(f"start {self._start} is past the end of the object ({size} bytes)",
                             url=self._url, offset=self._start)
        self._size = size
        note_size(size)

    async def read(self) -> bytes:
        """The next `chunk_size` bytes (fewer at the end); b"" once the object is done."""
        try:
            while self._size is None or self.received < self._size:
                if self._body is None:
                    await self._open()
                    continue
                data = await self._body.read(self._chunk_size - self._have)
                self._silence.beat(len(data))
                if self._lowat is not None:
                    self._lowat.update()
                if not data:
                    raise NetworkError(f"S3 body ended early ({self._size} bytes expected)",
                                       url=self._url, offset=self.received)
                self._parts.append(data)
                self._have += len(data)
                self.received += len(data)
                if self._have >= self._chunk_size:
                    break
        except Exception as exc:
            stall, self._stall = self._stall, None
            self.close()
            if stall is not None:  # (aiobotocore rewraps it as a read timeout without our words)
                raise stall from safe_cause(exc)
            raise
        except BaseException:
            self.close()
            raise
        chunk = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts, self._have = [], 0
        s3_stats.add(bytes=len(chunk))
        return chunk

    def _stalled(self, raw: Any) -> None:
        self._stall = stall_body(raw, self._silence, self.received, "S3 body ")

    def close(self) -> None:
        """Drop the current response; a half-read connection cannot go back to the pool."""
        self._silence.abort = None
        if self._lowat is not None:
            self._lowat.close()
            self._lowat = None
        if self._body is not None:
            self._body.close()
            self._body = None


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
    _split(url, object_key=True)  # a malformed URL is a usage error, before any client is made
    if start < 0:
        raise UsageError(f"negative start {start}", url=url)
    lease = await _retrying(lambda: lease_client(options), url=url, options=options, offset=lambda: start)
    try:
        with watch(url, options) as silence:  # a silent transfer is reported before it times out
            reader = _ObjectReader(lease.client, url, start, max(1, options.chunk_size), silence)
            try:
                while True:
                    chunk = await _retrying(reader.read, url=url, options=options, offset=lambda: reader.received,
                                            silence=silence)
                    if not chunk:
                        return
                    silence.hold()  # (while the consumer has it)
                    yield chunk
                    silence.beat()
            finally:
                reader.close()
    finally:
        lease.release()


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
    Keys ending in `/` (folder markers) are skipped. No match gives an empty list. A glob that
    is itself the key of an object (`?`, `[`, `*` are legal in a key: `train/br[1].tar`) names
    that object alone, as a local file whose name holds them is read as named. Pass the
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
    lease = await _retrying(lambda: lease_client(options), url=url, options=options)

    async def list_page() -> Dict[str, Any]:
        s3_stats.add(requests=1)
        return await lease.client.list_objects_v2(**request)

    keys: List[str] = []
    try:
        while True:
            page = await _retrying(list_page, url=url, options=options)
            for item in page.get("Contents", ()):
                key = item["Key"]
                if magic and key == pattern:
                    return [url]
                if not key.endswith("/") and (not magic or _glob_match(pattern, key)):
                    keys.append(key)
            if not page.get("IsTruncated"):
                break
            request["ContinuationToken"] = page["NextContinuationToken"]
    finally:
        lease.release()
    return [f"s3://{bucket}/{key}" for key in sorted(keys)]
