"""HTTP(S) fetcher on aiohttp: pooled connections, timeouts, retries with backoff, Range resume.

A transfer that breaks part-way resumes from the last byte received with `Range: bytes=N-`, and
`If-Range` (ETag, else Last-Modified) so that a resume reads the same object; a server that
ignores Range (200) has the received prefix skipped. The length is checked against
Content-Length / Content-Range. aiohttp's exceptions become the error tree in `translate_error`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from email.utils import parsedate_to_datetime
from typing import AsyncGenerator, Callable, Optional, Tuple

import aiohttp
from aiohttp import hdrs

from .._base.errors import FetchError, FetchTimeout, NetworkError, ShardNotFound, safe_cause
from .._base.redact import redact, redact_url, url_secrets
from .retries import backoff_delay, log_retry, made_progress, stall_body, watch
from .options import FetchOptions, note_fetch, note_size
from .environ import origin_settings
from .heads import HeadDeadline
from .loop import get_session
from .lowat import LowWater
from .parts import origin_of

__all__ = ["http_stream", "translate_error"]


logger = logging.getLogger(__name__)

# Content codings whose bytes the reader cannot take (it tells gzip, bzip2, xz and lzma by their
# first bytes, so a .tar.bz2 labelled `bzip2`, as mimetypes and some upload tools label it, reads
# as its bytes; so do labels that name no coding at all). A body in one of these is an error
# that names it, not "bad tar header" at byte 0.
_UNREADABLE_ENCODINGS = frozenset({"br", "zstd", "deflate", "compress", "x-compress", "pack200-gzip", "exi"})
_RETRY_STATUSES = frozenset({408, 425, 429}) | frozenset(range(500, 600))
_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)", re.ASCII)


class _Again(Exception):
    """Ask again at once, without counting a failure: the server ignored our If-Range."""


# A response that tags the object differently but states its size is asked again, at once, up to
# this many times in one transfer before the object counts as replaced: a pool of servers behind one
# name (round robin) whose copies of a file carry different ETags (an inode or an mtime in them)
# answers each request from any of them. At 2 servers, a part fails 1 time in 2**17.
OTHER_COPY_ASKS = 16
_told_other_copies: set = set()  # origins already warned about
_told_no_validator: set = set()  # origins already said to give no ETag nor Last-Modified


class _Retry(Exception):
    """An attempt failed in a way worth retrying; `error` is what to raise if retries run out."""

    def __init__(self, error: FetchError, retry_after: Optional[float] = None) -> None:
        super().__init__(str(error))
        self.error, self.retry_after = error, retry_after


def translate_error(exc: BaseException, url: str, offset: int) -> Tuple[FetchError, bool]:
    """Map an aiohttp / OS / timeout error to (error in our tree, whether a retry may help)."""
    if isinstance(exc, FetchError):
        return exc, isinstance(exc, (NetworkError, FetchTimeout))
    detail = redact(f"{type(exc).__name__}: {exc}", url_secrets(url))  # a third party's text
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):  # before OSError: some are both
        message = f"timed out (no data within the stall/connect timeout): {detail}"
        return FetchTimeout(message, url=url, offset=offset), True
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return FetchError(f"TLS certificate rejected: {detail}", url=url, offset=offset), False
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.TooManyRedirects, ValueError)):
        return FetchError(f"request failed: {detail}", url=url, offset=offset), False
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError)):
        return NetworkError(f"connection failed: {detail}", url=url, offset=offset), True
    return FetchError(f"request failed: {detail}", url=url, offset=offset), False


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class _Transfer:
    """What one download knows across attempts: bytes received, total size, the validator."""

    def __init__(self, url: str, start: int, stop: Optional[int] = None) -> None:
        self.url = url
        self.received = start  # absolute offset of the next byte wanted
        self.stop = stop  # absolute offset just past the last byte wanted (None: to the end)
        self.total: Optional[int] = None  # the object's size, once a response says
        self.total_exact = False  # said by Content-Range, not only by a 200's Content-Length
        self.response_end: Optional[int] = None  # where the current response's body ends
        self.etag: Optional[str] = None
        self.last_modified: Optional[str] = None
        self.if_range = True  # False once the server answered a ranged If-Range request with its whole body
        self.sent_validator: Optional[str] = None  # the If-Range of the request in flight
        self.known_size: Optional[int] = None  # the object's size as another part of the download learnt it
        self.other_copies = 0  # responses that tagged the object differently, asked again
        self.ranges = True  # False once the server refused a range inside the object (a 416)

    @property
    def complete(self) -> bool:
        if self.stop is not None and self.received >= self.stop:
            return True
        return self.total is not None and self.received >= self.total

    def request_headers(self) -> dict:
        if (self.received == 0 and self.stop is None) or not self.ranges:
            self.sent_validator = None
            return {}
        last = "" if self.stop is None else str(self.stop - 1)
        headers = {hdrs.RANGE: f"bytes={self.received}-{last}"}
        # If-Range wants a strong validator; a server that honours it answers 200 with the new
        # object when ours changed, which `accept` then refuses.
        validator = self.etag if self.etag and not self.etag.startswith("W/") else self.last_modified
        self.sent_validator = validator if self.if_range else None
        if self.sent_validator:
            headers[hdrs.IF_RANGE] = self.sent_validator
        return headers

    def error(self, message: str, cls: type = FetchError) -> FetchError:
        return cls(message, url=self.url, offset=self.received)

    def accept(self, resp: aiohttp.ClientResponse) -> Optional[int]:
        """Check a response's status and headers; return how many leading body bytes to skip,
        or None if there is nothing left to read. Raises FetchError, or _Retry."""
        status = resp.status
        what = f"HTTP {status} {resp.reason or ''}".rstrip()
        if status in (404, 410):
            raise self.error(what, ShardNotFound)
        if status == 416 and (self.received > 0 or self.stop is not None):
            match = _CONTENT_RANGE.fullmatch(resp.headers.get(hdrs.CONTENT_RANGE, "").strip())
            size = int(match.group(3)) if match and match.group(3) != "*" else None
            if size == self.received:
                self.total = self.received  # we already have every byte (a lying length got us here)
                self.total_exact = True
                return None
            if size is None:  # (a chunked body that broke may have ended anywhere: not "complete")
                raise self.error(f"{what} to a range from byte {self.received}, without the object's size (no "
                                 "Content-Range): cannot tell whether the bytes so far are the whole object")
            if size > self.received and self.ranges:  # inside the object: the server refuses ranges
                self.ranges = False  # (ask for the whole object, skip what we have, cut at `stop`)
                raise _Again()
            if size > self.received:
                raise self.error(f"{what}: the server refused a range inside the object (from byte {self.received} "
                                 f"of {size})")
            raise self.error(f"{what}: range starts past the end of the object (size {size})")
        if status in _RETRY_STATUSES:
            raise _Retry(self.error(what), _retry_after(resp.headers.get(hdrs.RETRY_AFTER)))
        if status not in (200, 206):
            raise self.error(what)
        encodings = [e.strip() for e in resp.headers.get(hdrs.CONTENT_ENCODING, "").lower().split(",")]
        unreadable = [e for e in encodings if e in _UNREADABLE_ENCODINGS]
        if unreadable:
            raise self.error(f"the body comes with Content-Encoding {unreadable[0]!r} though none was asked "
                             "for (Accept-Encoding: identity): shards are read byte for byte, and the reader "
                             "cannot take that coding (it reads gzip, bzip2, xz and lzma)")
        self._check_same_object(resp)
        if status == 206:
            return self._accept_partial(resp)
        if self.sent_validator and self.received and self.sent_validator in (
                resp.headers.get(hdrs.ETAG), resp.headers.get(hdrs.LAST_MODIFIED)):
            # The object we asked for, whole: the server does not honour If-Range (RFC 9110 wants
            # a 206 when the validator matches). Ask for the range again without it: every response
            # is still checked against the object's validator, and the whole body is not read.
            self.if_range = False
            raise _Again()
        length = resp.content_length
        if length is not None:
            self._set_total(length, exact=False)
        self.response_end = length
        return self.received  # a 200 starts at byte 0: drop what we already have

    def _accept_partial(self, resp: aiohttp.ClientResponse) -> int:
        header = resp.headers.get(hdrs.CONTENT_RANGE, "")
        match = _CONTENT_RANGE.fullmatch(header.strip())
        if match is None or match.group(1) is None:
            raise self.error(f"HTTP 206 with a bad Content-Range {header!r}")
        first, last, size = int(match.group(1)), int(match.group(2)), match.group(3)
        if first > self.received:
            raise self.error(f"asked for bytes from {self.received}, got a range from {first}")
        if size != "*":
            self._set_total(int(size), exact=True)
        self.response_end = last + 1
        return self.received - first

    def _set_total(self, size: int, exact: bool) -> None:
        # A 200's Content-Length can lie (a body that ends short of it is retried, and the
        # resume's Content-Range tells the truth); two statements of the same kind must agree.
        if self.total is not None and size != self.total and exact == self.total_exact:
            raise self.error(f"object size changed during the download ({self.total} -> {size} bytes)")
        if self.total is None or exact or not self.total_exact:
            self.total, self.total_exact = size, exact
        if self.received > self.total:
            raise self.error(f"object is shorter ({self.total} bytes) than the bytes already received")

    def _check_same_object(self, resp: aiohttp.ClientResponse) -> None:
        """Every response must carry the validator the object has shown (its ETag, else its
        Last-Modified) and the same value: one without it may be another version (a server that
        honours If-Range answers a replaced object with a 200 that may carry neither)."""
        etag, modified = resp.headers.get(hdrs.ETAG), resp.headers.get(hdrs.LAST_MODIFIED)
        if self.etag:
            if etag != self.etag and not (etag is None and self.last_modified and modified == self.last_modified):
                self._other_copy(resp, f"ETag {self.etag} -> {etag or 'none'}")
        elif self.last_modified and modified != self.last_modified:
            self._other_copy(resp, f"Last-Modified {self.last_modified} -> {modified or 'none'}")
        self.etag, self.last_modified = etag or self.etag, modified or self.last_modified

    def _other_copy(self, resp: aiohttp.ClientResponse, change: str) -> None:
        """A response tagged differently from the object this download reads. Of the same size, it
        may be another server's copy (a pool behind one name): ask again (_Again), OTHER_COPY_ASKS
        times at most, warning once per origin. Else, or then, the object was replaced: an error."""
        size = self.total if self.total is not None else self.known_size
        if size is not None and _stated_size(resp) == size and self.other_copies < OTHER_COPY_ASKS:
            self.other_copies += 1
            origin = origin_of(self.url)
            if origin not in _told_other_copies:
                _told_other_copies.add(origin)
                logger.warning("%s: a response tags the object differently (%s) at the same size: another server's "
                               "copy (a pool of servers behind one name), or the object replaced? Asking again, up to "
                               "%d times per transfer (said once per server)", redact_url(self.url), change,
                               OTHER_COPY_ASKS)
            raise _Again()
        asked = f", asked {self.other_copies + 1} times" if self.other_copies else ""
        raise self.error(f"object changed during the download ({change}{asked}); if the server is a pool whose "
                         f"copies of one file carry different ETags, read it with parallel_parts=1")


def _validated(transfer: _Transfer) -> bool:
    """Whether a response named the object's version (ETag or Last-Modified), so that parts of it
    can be checked to come from one object. Without one, a download is not cut into parts: an
    object replaced meanwhile would be spliced from two versions of the same size (a resume after
    a broken transfer still relies on the size alone). Said once per server."""
    if transfer.etag or transfer.last_modified:
        return True
    origin = origin_of(transfer.url)
    if origin not in _told_no_validator:
        _told_no_validator.add(origin)
        logger.warning("%s gives no ETag or Last-Modified, which would show that the parts of a shard come from one "
                       "version of it: its shards are read over one connection each (said once per server)",
                       redact_url(origin))
    return False


def _timeout(options: FetchOptions) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=options.connect_timeout, sock_read=options.stall_timeout
    )


def _stated_size(resp: aiohttp.ClientResponse) -> Optional[int]:
    """The object's size a response states: a 206's Content-Range, a 200's Content-Length."""
    if resp.status == 206:
        match = _CONTENT_RANGE.fullmatch(resp.headers.get(hdrs.CONTENT_RANGE, "").strip())
        return int(match.group(3)) if match and match.group(3) != "*" else None
    return resp.content_length


def _same_object(transfer: _Transfer, identity: Optional[dict]) -> None:
    """A part of a parted download holds the validator the first response of any part gave (and
    the size it stated), and stops sending If-Range once any part found that the server does not
    honour it."""
    if identity and transfer.etag is None and transfer.last_modified is None:
        transfer.etag, transfer.last_modified = identity["etag"], identity["last_modified"]
        transfer.known_size = identity["size"]
    if identity and not identity["if_range"]:
        transfer.if_range = False


def _learn_object(transfer: _Transfer, identity: Optional[dict]) -> None:
    if identity is not None and not identity:
        identity.update(etag=transfer.etag, last_modified=transfer.last_modified, if_range=True, size=transfer.total)
    if identity and not transfer.if_range:
        identity["if_range"] = False


async def http_stream(
    url: str, *, options: FetchOptions, start: int = 0, stop: Optional[int] = None,
    on_size: Optional[Callable[[Optional[int]], None]] = None, identity: Optional[dict] = None,
) -> AsyncGenerator[bytes, None]:
    """Yield the bytes of an http(s) URL from `start` (up to `stop`, exclusive, if given),
    retrying and resuming as `options` say.

    With `stop`, every request asks for `Range: bytes=start-(stop-1)` (a resume, for what is left
    of it); a range past the end of the object yields what there is. A server that ignores Range
    has the prefix skipped and the body cut at `stop`. `on_size`, if given, is called once with
    the object's size as a 206's Content-Range states it, or None (no ranges served, or no size).
    `identity`, a dict shared by the parts of one download, holds the first response's validator
    (ETag, else Last-Modified): every part asks for that object (If-Range) and refuses another,
    so that an object replaced mid-download is an error, not two versions spliced together.
    """
    if start < 0 or (stop is not None and stop < start):
        raise ValueError(f"bad byte range: start={start}, stop={stop}")
    if stop is not None and stop == start:
        return
    session = await get_session()
    from_env = await origin_settings(url)  # the environment's proxy and netrc credentials
    timeout = _timeout(options)
    transfer = _Transfer(url, start, stop)
    with watch(url, options) as silence:  # a silent transfer is reported before it times out
        failures = 0  # consecutive attempts that failed without progress (see made_progress)
        while not transfer.complete:
            attempt_start = transfer.received
            try:
                _same_object(transfer, identity)
                headers = transfer.request_headers()
                headers.update(from_env.headers)
                head = HeadDeadline(options.stall_timeout)  # (the headers' phase: a byte a second is a stall)
                try:
                    async with head:
                        # read_bufsize: aiohttp buffers up to twice this before it stops reading the socket.
                        resp = await session.get(url, headers=headers, timeout=timeout,
                                                 read_bufsize=options.chunk_size, trace_request_ctx=head,
                                                 **from_env.keywords)
                except (asyncio.TimeoutError, TimeoutError):
                    if not head.expired:
                        raise
                    late = f"response headers not complete {options.stall_timeout:g} s after the request (stall_timeout)"
                    raise _Retry(FetchTimeout(late, url=url, offset=transfer.received)) from None
                async with resp:
                    _same_object(transfer, identity)  # (another part's response may have come meanwhile)
                    skip = transfer.accept(resp)
                    _learn_object(transfer, identity)
                    if transfer.total_exact or (transfer.total is not None and start == 0 and stop is None):
                        note_size(transfer.total)  # type: ignore[arg-type]
                    if on_size is not None:  # (parts after this one only for an object whose version is named)
                        size = transfer.total if transfer.total_exact else None
                        on_size(None if size is not None and stop is not None and size > stop
                                and not _validated(transfer) else size)
                        on_size = None
                    if skip is None:
                        return
                    lowat = LowWater.for_response(resp, options.chunk_size)
                    silence.abort = lambda: stall_body(resp, silence, transfer.received)  # (the offset reached then)
                    try:
                        async for chunk in resp.content.iter_chunked(options.chunk_size):
                            silence.beat(len(chunk))
                            if lowat is not None:
                                lowat.update()
                            if skip:
                                if len(chunk) <= skip:
                                    skip -= len(chunk)
                                    continue
                                chunk, skip = chunk[skip:], 0
                            total = transfer.total
                            if total is not None and transfer.received + len(chunk) > total:
                                raise transfer.error(f"body is longer than the advertised {total} bytes")
                            if stop is not None and transfer.received + len(chunk) >= stop:
                                chunk = chunk[: stop - transfer.received]  # a 200 (Range ignored) goes on
                                transfer.received = stop
                                if chunk:
                                    silence.hold()
                                    yield chunk
                                return
                            transfer.received += len(chunk)
                            silence.hold()  # (while the consumer has it)
                            yield chunk
                            silence.beat()
                    finally:
                        silence.abort = None
                        if lowat is not None:
                            lowat.close()
                    if skip:
                        raise transfer.error("the full response is shorter than the bytes already received")
                if transfer.total is None or transfer.complete:
                    return
                end = transfer.response_end
                if end is not None and transfer.received >= end:
                    continue  # a server that sends large objects in parts (206 short of the total)
                short = f"body ended early ({transfer.received} of {transfer.total} bytes)"
                raise _Retry(transfer.error(short, NetworkError))
            except _Again:
                _learn_object(transfer, identity)
                continue
            except _Retry as retry:
                error, retry_after = retry.error, retry.retry_after
            except Exception as exc:  # noqa: BLE001 - translated in one place, then retried or raised
                error, retryable = translate_error(exc, url, transfer.received)
                if not retryable:
                    raise error from (None if error is exc else safe_cause(exc, url=url))
                retry_after = None
            if transfer.complete:  # e.g. a lying Content-Length on a 206 whose Content-Range we trust
                return
            ends = [end for end in (stop, transfer.total) if end is not None]  # (a part's, or the object's)
            failures = 1 if made_progress(attempt_start, transfer.received, min(ends, default=None)) else failures + 1
            if failures > options.retries:
                message = f"{error.message}; gave up after {failures} attempts"
                raise type(error)(message, url=url, offset=transfer.received) from error
            delay = backoff_delay(options, failures, retry_after)
            note_fetch(retries=1, resumes=int(transfer.received > start))  # resumed after bytes this call delivered
            log_retry(failures, options, url, transfer.received, delay, error.message)
            silence.rest(delay)  # (a back-off is no silence of the server's)
            await asyncio.sleep(delay)
