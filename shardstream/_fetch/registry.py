"""The scheme registry and `fetch_stream`: the bytes of any URL as an async stream.

`fetch_stream` dispatches on the URL scheme: http(s) to `http`, s3 to `s3`, schemes added with
`register_fetcher`, and everything else (paths, file:, pipe:, other fsspec protocols) to the
blocking opener in `open`, run in worker threads. The registry is the one place that decides
which schemes are fetched natively (`fetches_natively`): the loader, counts, gopen and the CLI ask it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import importlib.util
import itertools
import os
import sys
import threading
from typing import Any, AsyncGenerator, Callable, Dict, Iterable, Iterator, List, Optional, Set, Union

from .._base.errors import FetchError, FetchTimeout, ShardStreamError, UsageError, safe_cause
from .open import open_url, user_opener
from .options import FetchOptions, note_fetch
from .parts import parallel_stream

__all__ = ["Fetcher", "fetch_stream", "fetches_natively", "register_fetcher", "warm_fetchers", "warming_skips"]

Fetcher = Callable[..., AsyncGenerator[bytes, None]]  # (url, *, options, start=0) -> chunks


# --- the scheme registry ------------------------------------------------------------------------

# Built-in fetchers are "module:function" strings, imported on first use: aiohttp and the S3
# client are optional, and a missing one must fail only for the URLs that need it.
_fetchers: Dict[str, Union[str, Fetcher]] = {
    "http": ".http:http_stream",
    "https": ".http:http_stream",
    "s3": ".s3:s3_stream",
}
# Fetchers that can fetch in parallel parts (see parts.parallel_stream for the contract).
_PARTED = {".http:http_stream"}
_registry_lock = threading.Lock()


def register_fetcher(scheme: str, fetcher: Optional[Fetcher]) -> Optional[Union[str, Fetcher]]:
    """Route `scheme://` URLs to `fetcher(url, *, options, start=0)`, an async iterator of bytes
    (None removes the route); return the previous entry."""
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"invalid URL scheme {scheme!r}")
    with _registry_lock:
        previous = _fetchers.pop(scheme.lower(), None)
        if fetcher is not None:
            _fetchers[scheme.lower()] = fetcher
        return previous


def fetches_natively(url: str) -> bool:
    """Whether `url`'s scheme has a fetcher in the registry (http, https, s3 and every scheme
    added with `register_fetcher`): such URLs stream through the async fetchers; the rest
    (paths, file:, pipe:, other fsspec protocols, and schemes whose opener a user put in
    webdataset's `gopen_schemes`) through the blocking opener. A fetcher registered for a scheme
    that one of our own openers serves in `gopen_schemes` (`ais`, `htgs`) takes it over."""
    if _entry_for(url) is None:
        return False
    opener = user_opener(url)
    return opener is None or getattr(opener, "shardstream_builtin", False)


def _entry_for(url: str) -> Optional[Union[str, Fetcher]]:
    scheme, sep, _ = url.partition("://")
    return _fetchers.get(scheme.lower()) if sep else None


def _resolve(entry: str, url: str) -> Any:
    module_name, _, name = entry.partition(":")
    try:
        return getattr(importlib.import_module(module_name, __package__), name)
    except ImportError as exc:
        scheme = url.partition("://")[0]
        raise UsageError(f"{scheme}:// URLs need an optional dependency: {exc}", url=url) from exc


# --- importing the fetchers ahead of the first fetch ---------------------------------------------

_warming: List[threading.Thread] = []  # threads importing fetchers (the finished ones pruned as new ones start)
_warmed: Set[str] = set()  # the modules they were given


_held: "contextvars.ContextVar[Optional[Callable[[str], bool]]]" = contextvars.ContextVar("shardstream_held", default=None)


@contextlib.contextmanager
def warming_skips(held: Optional[Callable[[str], bool]]) -> Iterator[None]:
    """Within it, `warm_fetchers` passes over the URLs for which `held(url)` is true (a cache holds
    them): a pass whose first shards are all cached does not import a client it may never use
    (aiohttp: 0.15-0.27 s of CPU, on the cores that pass is using). Its first miss imports it."""
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)


def warm_fetchers(urls: Iterable[Any], limit: int = 64) -> None:
    """Start importing the built-in fetchers that the first `limit` of `urls` need, on a daemon
    thread. The first fetch would import them on the event loop's thread, in the way of every
    transfer: aiohttp, with the SSL contexts it builds at import, takes ~0.15 s, the S3 client
    ~0.25 s. A pipeline built a while before it is iterated (a model is set up meanwhile) finds them
    loaded, and so do the DataLoader workers it forks. A failed import is left to the first fetch,
    which reports it. A fork waits for the thread first: a child must not inherit a module's
    import lock held by a thread it does not have."""
    names = set()
    held = _held.get()
    for url in itertools.islice(urls, limit):
        entry = _entry_for(url) if isinstance(url, str) else None
        if isinstance(entry, str):
            name = importlib.util.resolve_name(entry.partition(":")[0], __package__)
            # (the cache is asked only about a URL that would warm a module not loaded or named yet)
            if name not in sys.modules and name not in names and not (held is not None and held(url)):
                names.add(name)
    with _registry_lock:
        names -= _warmed
        if not names:
            return
        _warmed.update(names)
        thread = threading.Thread(target=_import_quietly, args=(sorted(names),), name="shardstream-warm", daemon=True)
        _warming[:] = [t for t in _warming if t.is_alive()] + [thread]
        thread.start()


def _import_quietly(names) -> None:
    """Import each module, then run its `warm()` if it has one (the S3 fetcher reads botocore's
    model of S3 there)."""
    for name in names:
        try:
            warm = getattr(importlib.import_module(name), "warm", None)
            if callable(warm):
                warm()
        except Exception:  # noqa: BLE001 - (an optional dependency missing: the first fetch says so)
            pass


def _finish_warming() -> None:
    for thread in list(_warming):
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(30.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_finish_warming)


def _fetcher_for(url: str) -> Fetcher:
    entry = _entry_for(url)
    if entry is None:
        return _blocking_stream
    if isinstance(entry, str):
        return _resolve(entry, url)
    return entry


def _chunks_for(url: str, options: FetchOptions, start: int) -> AsyncGenerator[bytes, None]:
    if options.parallel_parts > 1:
        entry = _entry_for(url)
        if isinstance(entry, str) and entry in _PARTED:
            return parallel_stream(url, options, start, _resolve(entry, url))
    return _fetcher_for(url)(url, options=options, start=start)


async def fetch_stream(url: str, *, options: Optional[FetchOptions] = None, start: int = 0) -> AsyncGenerator[bytes, None]:
    """Yield the bytes of `url` from byte `start` on, in chunks, retrying as `options` say.

    Raises:
        ShardNotFound: nothing at the URL (never retried).
        FetchError (FetchTimeout, NetworkError): the bytes could not be fetched; the message
            names the URL (credentials redacted) and the offset reached.
        UsageError: the URL needs something not enabled or installed (pipe:, aiohttp, s3).
    """
    options = options or FetchOptions()
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    offset = start
    # A fetcher of the user's (register_fetcher) is held to stall_timeout here: ours keep it
    # themselves, with retries; one that falls silent hung the pass for ever.
    try:
        chunks = _chunks_for(url, options, start)
        if callable(_entry_for(url)):  # a fetcher of the user's: held to stall_timeout here (ours keep it)
            chunks = _held_to(chunks, options.stall_timeout, url, start)
        try:
            async for chunk in chunks:
                offset += len(chunk)
                note_fetch(bytes=len(chunk))
                yield chunk
        finally:
            await chunks.aclose()  # `async for` does not close it when we are closed or cancelled
    except ShardStreamError:
        note_fetch(failures=1)
        raise
    except Exception as exc:  # a third-party fetcher's own error: keep the tree's promise
        note_fetch(failures=1)
        raise FetchError(f"fetch failed: {type(exc).__name__}: {exc}", url=url, offset=offset) from safe_cause(exc)


_DONE = object()


async def _held_to(chunks: AsyncGenerator[bytes, None], timeout: float, url: str, start: int) -> AsyncGenerator[bytes, None]:
    """A user's fetcher, failed as a FetchTimeout when it yields nothing for `timeout` seconds
    (one that fell silent hung the pass for ever). It runs in one task of its own, a chunk ahead,
    as an `async for` would run it: a scope of its own that spans its yields (`asyncio.timeout`,
    a session's) keeps working, and a TimeoutError of its own stays its own."""
    handoff: "asyncio.Queue[Any]" = asyncio.Queue(maxsize=1)

    async def drive() -> None:
        try:
            async for chunk in chunks:
                await handoff.put(chunk)
            await handoff.put(_DONE)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, raised there
            await handoff.put(exc)

    task = asyncio.get_running_loop().create_task(drive())
    offset = start
    try:
        while True:
            try:
                item = await asyncio.wait_for(handoff.get(), timeout)
            except asyncio.TimeoutError:
                raise FetchTimeout(f"no bytes from the fetcher registered for this scheme for {timeout:g} s "
                                   "(stall_timeout)", url=url, offset=offset) from None
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            offset += len(item)
            yield item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # (ours cancelled; the caller's own cancel goes on)
        await chunks.aclose()


class _BlockingReader:
    """A blocking source (file, pipe, fsspec) read in worker threads, one call at a time."""

    def __init__(self, url: str, chunk_size: int, start: int) -> None:
        self.url, self.chunk_size, self.start = url, chunk_size, start
        self.file: Any = None
        self.offset = 0

    def read(self) -> bytes:
        if self.file is None:
            self.file = open_url(self.url)
            self._skip_to_start()
        try:
            chunk = self.file.read(self.chunk_size)
        except OSError as exc:
            raise FetchError(f"read failed: {exc}", url=self.url, offset=self.offset) from safe_cause(exc)
        self.offset += len(chunk)
        return chunk

    def _skip_to_start(self) -> None:
        seekable = getattr(self.file, "seekable", None)
        if self.start and seekable is not None and seekable():
            self.offset = self.file.seek(self.start)
            return
        while self.offset < self.start:  # pipes: read and drop the prefix
            chunk = self.file.read(min(self.chunk_size, self.start - self.offset))
            if not chunk:
                break
            self.offset += len(chunk)

    def close(self) -> None:
        if self.file is not None and self.url != "-":
            self.file.close()


async def _blocking_stream(url: str, *, options: FetchOptions, start: int = 0) -> AsyncGenerator[bytes, None]:
    """Local files, pipe: and other fsspec URLs, read in the loop's default executor."""
    loop = asyncio.get_running_loop()
    reader = _BlockingReader(url, options.chunk_size, start)
    pending: Optional[asyncio.Future] = None
    try:
        while True:
            pending = loop.run_in_executor(None, reader.read)
            chunk = await asyncio.shield(pending)
            if not chunk:
                return
            yield chunk
    finally:
        if pending is not None and not pending.done():
            # Cancelled mid-read: the worker still uses the file; close it only once it is done.
            await asyncio.wait({pending})
        await loop.run_in_executor(None, reader.close)


