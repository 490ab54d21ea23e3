#!/usr/bin/env python
"""A real HTTP file server for tests, the demo and the benchmarks.

Serves the files under one directory over HTTP/1.1 (aiohttp), bound to 127.0.0.1 on a free port,
with knobs that make it slow or flaky on purpose: time to first byte, a per-connection bandwidth cap
and seeded fault injection (5xx, 429, connection resets, stalls, truncated bodies, a lying
Content-Length). It counts what it did, so tests can assert on it.

In process (a background thread runs the event loop)::

    with ShardServer(root, latency_ms=20, seed=0) as server:
        url = server.url("train-000000.tar")     # http://127.0.0.1:PORT/train-000000.tar
        server.options.status_rate = 0.1         # validated; applies from the next request
        ...
        assert server.stats.faults["status"] > 0

In another process, so that the server does not compete for the client's GIL::

    proc, base_url = start_subprocess(root, bandwidth=25e6)
    try:
        ...
    finally:
        stop_subprocess(proc)

From a shell (every ServerOptions field is a flag: ``--latency-ms``, ``--reset-rate``, ...)::

    python tools/shardserver.py ROOT --latency-ms 50 --bandwidth 25e6 --seed 0
    # prints "READY http://127.0.0.1:PORT" and serves until SIGTERM or SIGINT

What it serves: GET and HEAD of regular files under ROOT. A single ``Range: bytes=a-b``,
``bytes=a-`` or ``bytes=-n`` gets 206 with Content-Range, an unsatisfiable one 416; multi-range and
malformed Range headers are ignored (200, whole file), as RFC 9110 allows. Paths that leave ROOT
(``..``, absolute paths, symlinks pointing out) get 403; missing files and directories get 404.
Faults replace only responses that would otherwise succeed (200/206), so 404 and 416 stay exact.
Not supported: conditional requests (If-None-Match, If-Range), uploads, directory listings.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import random
import re
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import traceback
import types
from collections import Counter
from dataclasses import MISSING, Field, dataclass, field, fields
from email.utils import formatdate
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import quote, urlencode

from aiohttp import BasicAuth, hdrs, web

__all__ = [
    "FAULT_KINDS",
    "ServerOptions",
    "ServerStats",
    "ShardServer",
    "main",
    "start_subprocess",
    "stop_subprocess",
]

#: Fault kinds, in the order a random draw is matched against their rates.
FAULT_KINDS = ("status", "throttle", "reset", "stall", "truncate", "wrong_length")
_BODY_FAULTS = frozenset({"reset", "stall", "truncate", "wrong_length"})
_RATE_FIELDS = tuple(f"{kind}_rate" for kind in FAULT_KINDS)
_WRONG_LENGTH_EXTRA = 1024  # how many bytes the lying Content-Length promises beyond the body
# At low bandwidth, write ~50 ms worth at a time, so that the server looks slow, not stalled.
_PACING_SLICE = 0.05
# Seconds to let in-flight responses finish at shutdown: tests stall some on purpose.
_SHUTDOWN_GRACE = 0.5
_RANGE = re.compile(r"bytes=(\d*)-(\d*)", re.ASCII)
_ONE_BYTE = re.compile(r"bytes=(\d+)-\1", re.ASCII)  # a range of one byte: a client asking for the size


def _opt(default: Any, parse: Callable[[str], Any] | type, help: str) -> Any:
    """A ServerOptions field; `parse` and `help` make its command-line flag (bool: a switch)."""
    metadata = {"parse": parse, "help": help}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=metadata)
    return field(default=default, metadata=metadata)


def _parse_fail_first(text: str) -> tuple[str, int]:
    path, _, count = text.rpartition("=")
    return path, int(count)


def _parse_user_password(text: str) -> tuple[str, str]:
    user, _, password = text.partition(":")
    return user, password


@dataclass(slots=True)
class ServerOptions:
    """How the server misbehaves. Every assignment is validated, at construction and at run time
    (``server.options.reset_rate = 0.1``), so a bad value fails on the line that set it; unknown
    names raise AttributeError. The fault rates are probabilities of disjoint events: one draw per
    request picks at most one fault, so they must sum to at most 1. ``fail_first={path: n}`` gives
    `fail_first_fault` to the first n requests for path (URL path without the leading /) that
    would otherwise succeed, counted from when fail_first was assigned; likewise assigning a new
    `seed` restarts the fault draws.
    """

    latency_ms: float = _opt(0.0, float, "delay before every response, in milliseconds")
    bandwidth: float | None = _opt(None, float, "per-connection cap in bytes/s (default: none)")
    chunk_size: int = _opt(64 * 1024, int, "bytes per body write")
    seed: int | None = _opt(None, int, "seed for the fault draws (default: unseeded)")
    status_rate: float = _opt(0.0, float, "probability of answering --status-code")
    status_code: int = _opt(503, int, "the 5xx code a status fault answers")
    throttle_rate: float = _opt(0.0, float, "probability of answering 429 with Retry-After")
    retry_after: int = _opt(1, int, "seconds in the Retry-After header of a 429")
    reset_rate: float = _opt(0.0, float, "probability of a TCP reset part-way through the body")
    stall_rate: float = _opt(0.0, float, "probability of pausing part-way through the body")
    stall_seconds: float = _opt(5.0, float, "how long a stall pauses")
    stall_abort: bool = _opt(False, bool, "reset the connection after a stall instead of resuming")
    truncate_rate: float = _opt(0.0, float, "probability of a clean close mid-body")
    wrong_length_rate: float = _opt(0.0, float, "probability of a Content-Length beyond the body")
    cut_fraction: float | None = _opt(
        None, float, "where body faults cut, in [0, 1) (default: random)"
    )
    fail_first: Mapping[str, int] = _opt({}, _parse_fail_first, "PATH=N: fault N requests for PATH")
    fail_first_fault: str = _opt("status", str, f"the fault --fail-first injects: {FAULT_KINDS}")
    require_token: str | None = _opt(None, str, "answer 403 unless the query has ?token=THIS")
    basic_auth: tuple[str, str] | None = _opt(None, _parse_user_password, "USER:PASSWORD, else 401")
    no_validators: bool = _opt(False, bool, "send neither ETag nor Last-Modified (a dynamic origin)")

    def __setattr__(self, name: str, value: Any) -> None:
        value = _validated(name, value)
        if name in _RATE_FIELDS:
            # Unset fields count as 0, so this also holds while __init__ is still assigning.
            others = sum(getattr(self, rate, 0.0) for rate in _RATE_FIELDS if rate != name)
            if value + others > 1.0 + 1e-9:
                total = value + others
                raise ValueError(f"fault rates must sum to at most 1; {name}={value} makes {total}")
        object.__setattr__(self, name, value)


def _validated(name: str, value: Any) -> Any:
    """Check one ServerOptions value; return it normalized (fail_first becomes read-only)."""
    ok = True
    if name in _RATE_FIELDS:
        ok = 0.0 <= value <= 1.0
    elif name in ("latency_ms", "stall_seconds", "retry_after"):
        ok = value >= 0
    elif name == "bandwidth":
        ok = value is None or value > 0
    elif name == "chunk_size":
        ok = isinstance(value, int) and value > 0
    elif name == "status_code":
        ok = isinstance(value, int) and 500 <= value <= 599
    elif name == "cut_fraction":
        ok = value is None or 0.0 <= value < 1.0
    elif name == "fail_first_fault":
        ok = value in FAULT_KINDS
    elif name == "fail_first":
        counts = {str(path).lstrip("/"): int(n) for path, n in dict(value).items()}
        value = types.MappingProxyType(counts)
        ok = all(n >= 0 for n in value.values())
    elif name == "require_token":
        ok = value is None or (isinstance(value, str) and value != "")
    elif name == "basic_auth":
        value = None if value is None else tuple(value)
        ok = value is None or (len(value) == 2 and ":" not in value[0])
    if not ok:
        raise ValueError(f"ServerOptions.{name}: invalid value {value!r}")
    return value


@dataclass
class ServerStats:
    """What the server did, live. Updated from the server's loop thread; read fields directly or
    take a consistent copy with `snapshot()`."""

    requests: int = 0
    head_requests: int = 0
    range_requests: int = 0  # requests that carried a Range header, satisfiable or not
    bytes_sent: int = 0  # body bytes handed to the socket
    path_requests: Counter = field(default_factory=Counter)  # URL path (no leading /) -> requests
    size_probes: Counter = field(default_factory=Counter)  # path -> GETs of one byte (a client learning the size)
    statuses: Counter = field(default_factory=Counter)  # HTTP status -> responses
    faults: Counter = field(default_factory=Counter)  # fault kind -> times injected
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_request(self, path: str, method: str, range_header: str | None) -> None:
        probe = range_header is not None and _ONE_BYTE.fullmatch(range_header.strip()) is not None
        with self._lock:
            self.requests += 1
            self.head_requests += method == "HEAD"
            self.range_requests += range_header is not None
            self.path_requests[path] += 1
            if probe and method == "GET":
                self.size_probes[path] += 1

    @property
    def fetches(self) -> Counter:
        """path -> requests for its bytes: `path_requests` less the one-byte size probes (paths
        asked only for their size are left out)."""
        return self.path_requests - self.size_probes

    def record_status(self, status: int) -> None:
        with self._lock:
            self.statuses[status] += 1

    def record_fault(self, kind: str) -> None:
        with self._lock:
            self.faults[kind] += 1

    def record_bytes(self, count: int) -> None:
        with self._lock:
            self.bytes_sent += count

    def snapshot(self) -> ServerStats:
        with self._lock:
            copy = ServerStats(self.requests, self.head_requests, self.range_requests)
            copy.bytes_sent = self.bytes_sent
            copy.path_requests.update(self.path_requests)
            copy.size_probes.update(self.size_probes)
            copy.statuses.update(self.statuses)
            copy.faults.update(self.faults)
            return copy

    def reset(self) -> None:
        with self._lock:
            self.requests = self.head_requests = self.range_requests = self.bytes_sent = 0
            for counter in (self.path_requests, self.size_probes, self.statuses, self.faults):
                counter.clear()


class _Refusal(Exception):
    """An error answer (401/403/404/416) raised from deep in the handler and sent as is."""

    def __init__(self, status: int, text: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(text)
        self.status, self.text, self.headers = status, text, dict(headers or {})

    def as_response(self) -> web.Response:
        return web.Response(status=self.status, text=self.text + "\n", headers=self.headers)


class _FileHandler:
    """The one request handler: credentials, path check, fault choice, then the paced body."""

    def __init__(self, root: Path, options: ServerOptions, stats: ServerStats) -> None:
        self.root = root
        self.options = options
        self.stats = stats
        self._seed = options.seed
        self._rng = random.Random(options.seed)
        self._schedule = options.fail_first
        self._scheduled: Counter = Counter()  # path -> requests that reached fault injection

    async def handle(self, request: web.Request) -> web.StreamResponse:
        opts = self.options  # one options object per request, even if `server.options` is swapped
        rel_path = request.match_info["path"]
        self.stats.record_request(rel_path, request.method, request.headers.get(hdrs.RANGE))
        if opts.latency_ms:
            await asyncio.sleep(opts.latency_ms / 1000)
        try:
            response = await self._respond(request, opts, rel_path)
        except _Refusal as refusal:
            response = refusal.as_response()
        self.stats.record_status(response.status)
        return response

    async def _respond(
        self, request: web.Request, opts: ServerOptions, rel_path: str
    ) -> web.StreamResponse:
        _check_credentials(request, opts)
        target = _resolve_inside(self.root, rel_path)
        info = target.stat()
        span = _parse_range(request.headers.get(hdrs.RANGE), info.st_size)
        fault = self._choose_fault(opts, rel_path, request.method)
        if fault == "status":
            return web.Response(status=opts.status_code, text="injected fault\n")
        if fault == "throttle":
            headers = {hdrs.RETRY_AFTER: str(opts.retry_after)}
            return web.Response(status=429, text="injected throttle\n", headers=headers)
        return await self._send_file(request, opts, target, info, span, fault)

    def _choose_fault(self, opts: ServerOptions, rel_path: str, method: str) -> str | None:
        # Assigning a seed or a fail_first schedule restarts it, so tests can set them up live.
        if opts.seed != self._seed:
            self._seed, self._rng = opts.seed, random.Random(opts.seed)
        if opts.fail_first is not self._schedule:
            self._schedule, self._scheduled = opts.fail_first, Counter()
        roll = self._rng.random()  # drawn on every request so the seed alone fixes the sequence
        self._scheduled[rel_path] += 1
        if self._scheduled[rel_path] <= opts.fail_first.get(rel_path, 0):
            kind: str | None = opts.fail_first_fault
        else:
            kind = _pick_fault(roll, opts)
        if kind in _BODY_FAULTS and method == "HEAD":
            return None  # a HEAD response has no body to cut
        if kind is not None:
            self.stats.record_fault(kind)
        return kind

    async def _send_file(
        self,
        request: web.Request,
        opts: ServerOptions,
        target: Path,
        info: os.stat_result,
        span: tuple[int, int] | None,
        fault: str | None,
    ) -> web.StreamResponse:
        start, end = span if span else (0, info.st_size - 1)
        length = end - start + 1
        response = web.StreamResponse(status=206 if span else 200, headers=_file_headers(info, opts.no_validators))
        if span:
            response.headers[hdrs.CONTENT_RANGE] = f"bytes {start}-{end}/{info.st_size}"
        response.content_length = length + (_WRONG_LENGTH_EXTRA if fault == "wrong_length" else 0)
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        try:
            # aiohttp holds the headers back until the first body write; a body cut at 0 bytes
            # must still show the client a status line.
            await response.write(b"")
            await self._send_body(request, response, opts, target, start, length, fault)
        except ConnectionError:
            pass  # the client hung up (often on purpose, after a read timeout): nothing left to do
        return response

    async def _send_body(
        self,
        request: web.Request,
        response: web.StreamResponse,
        opts: ServerOptions,
        target: Path,
        start: int,
        length: int,
        fault: str | None,
    ) -> None:
        if fault in (None, "wrong_length"):
            await self._write_span(response, opts, target, start, length)
            if fault == "wrong_length" and request.transport is not None:
                request.transport.close()  # the client is still waiting for the promised rest
            return
        fraction = opts.cut_fraction if opts.cut_fraction is not None else self._rng.random()
        cut = int(length * fraction)
        await self._write_span(response, opts, target, start, cut)
        if fault == "stall":
            await asyncio.sleep(opts.stall_seconds)
            if not opts.stall_abort:
                await self._write_span(response, opts, target, start + cut, length - cut)
                return
        transport = request.transport
        if transport is None:
            return
        if fault == "truncate":
            transport.close()  # FIN once the buffered bytes are out: a clean but short body
        else:
            await _reset(transport)

    async def _write_span(
        self,
        response: web.StreamResponse,
        opts: ServerOptions,
        target: Path,
        start: int,
        count: int,
    ) -> None:
        """Write `count` bytes of `target` from `start`, on average no faster than bandwidth."""
        rate, chunk_size = opts.bandwidth, opts.chunk_size
        if rate is not None:
            chunk_size = max(1, min(chunk_size, int(rate * _PACING_SLICE)))
        began, sent = time.monotonic(), 0
        with open(target, "rb") as file:
            file.seek(start)
            while sent < count:
                # Shards are page-cached: a read takes microseconds, less than an executor hop.
                chunk = file.read(min(chunk_size, count - sent))
                if not chunk:
                    return  # the file shrank under us; the client sees a short body
                await response.write(chunk)
                sent += len(chunk)
                self.stats.record_bytes(len(chunk))
                if rate is not None:
                    # Sleep until the schedule of `rate` catches up, so that the average is the cap.
                    delay = began + sent / rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)


def _pick_fault(roll: float, opts: ServerOptions) -> str | None:
    """Map a uniform draw in [0, 1) to at most one fault kind, each with exactly its rate."""
    for kind, rate_field in zip(FAULT_KINDS, _RATE_FIELDS):
        roll -= getattr(opts, rate_field)
        if roll < 0:
            return kind
    return None


def _check_credentials(request: web.Request, opts: ServerOptions) -> None:
    # The refusals never echo what the client sent, so tests can look for leaked secrets.
    if opts.require_token is not None:
        given = request.query.get("token", "")
        if not hmac.compare_digest(given.encode(), opts.require_token.encode()):
            raise _Refusal(403, "missing or wrong token")
    if opts.basic_auth is not None:
        try:
            auth = BasicAuth.decode(request.headers.get(hdrs.AUTHORIZATION, ""))
            given_pair = f"{auth.login}:{auth.password}"
        except ValueError:
            given_pair = ""
        if not hmac.compare_digest(given_pair.encode(), ":".join(opts.basic_auth).encode()):
            challenge = {hdrs.WWW_AUTHENTICATE: 'Basic realm="shardserver"'}
            raise _Refusal(401, "authentication required", challenge)


def _resolve_inside(root: Path, rel_path: str) -> Path:
    """Map a URL path to a regular file under `root`; symlinks count only if they stay inside."""
    if "\x00" in rel_path:
        raise _Refusal(404, "not found")
    target = (root / rel_path).resolve()  # an absolute rel_path replaces root, then fails below
    if not target.is_relative_to(root):
        raise _Refusal(403, "outside the served directory")
    if not target.is_file():
        raise _Refusal(404, "not found")
    return target


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Return the inclusive (first, last) byte of a single Range, or None to send the whole file.

    Raises _Refusal(416) when the range is valid but asks for no byte of the file."""
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or match.group(1) == match.group(2) == "":
        return None  # absent, malformed or multi-range: RFC 9110 lets us ignore it
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix: the last n bytes
        start, end = max(0, size - int(last)), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
        if last and int(last) < start:
            return None  # last < first makes the header invalid, hence ignored
    if start > end or start >= size:
        raise _Refusal(416, "range not satisfiable", {hdrs.CONTENT_RANGE: f"bytes */{size}"})
    return start, end


def _file_headers(info: os.stat_result, no_validators: bool = False) -> dict[str, str]:
    headers = {hdrs.ACCEPT_RANGES: "bytes", hdrs.CONTENT_TYPE: "application/octet-stream"}
    if not no_validators:
        headers[hdrs.ETAG] = f'"{info.st_mtime_ns:x}-{info.st_size:x}"'
        headers[hdrs.LAST_MODIFIED] = formatdate(info.st_mtime, usegmt=True)
    return headers


async def _reset(transport: asyncio.BaseTransport) -> None:
    """Abort with a TCP RST, once the bytes written so far have reached the kernel."""
    deadline = time.monotonic() + 1.0
    while transport.get_write_buffer_size() and time.monotonic() < deadline:  # type: ignore
        await asyncio.sleep(0.005)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Linger 0 turns close into RST rather than FIN: what a crashed server or a middlebox does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


def _served_root(root: str | Path) -> Path:
    resolved = Path(root).resolve()
    if not resolved.is_dir():
        raise NotADirectoryError(f"not a directory: {root}")
    return resolved


async def _start_site(
    handler: _FileHandler, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, str]:
    """Start serving (HTTPS with `ssl_context`); return the runner (for cleanup) and the base URL
    with the bound port."""
    app = web.Application()
    app.router.add_get("/{path:.*}", handler.handle)  # also answers HEAD
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=_SHUTDOWN_GRACE
    )
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    bound_port = runner.addresses[0][1]
    shown = f"[{host}]" if ":" in host else host  # (an IPv6 literal is bracketed in a URL)
    return runner, f"{'https' if ssl_context is not None else 'http'}://{shown}:{bound_port}"


class ShardServer:
    """The server on a background thread with its own event loop; a context manager.

    Args:
        root: directory to serve.
        host, port: where to bind; port 0 picks a free port.
        ssl_context: serve HTTPS with this server-side context (its certificate and key).
        options: a ServerOptions, or give its fields as keyword arguments instead.

    Attributes: `options` (live; assign fields or a whole new ServerOptions), `stats`
    (ServerStats), `base_url` and `port` (once started), `root`.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        options: ServerOptions | None = None,
        **option_fields: Any,
    ) -> None:
        if options is not None and option_fields:
            raise TypeError("pass either options= or option keywords, not both")
        self.root = _served_root(root)
        self.stats = ServerStats()
        options = options or ServerOptions(**option_fields)
        self._handler = _FileHandler(self.root, options, self.stats)
        self._host, self._bind_port, self._ssl_context = host, port, ssl_context
        self.base_url: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._startup_error: BaseException | None = None

    @property
    def options(self) -> ServerOptions:
        return self._handler.options

    @options.setter
    def options(self, options: ServerOptions) -> None:
        self._handler.options = options

    @property
    def port(self) -> int:
        if self.base_url is None:
            raise RuntimeError("server not started")
        return int(self.base_url.rsplit(":", 1)[1])

    def url(self, path: str = "", **query: str) -> str:
        """The URL of `path` (relative to root), with optional query parameters such as token=."""
        if self.base_url is None:
            raise RuntimeError("server not started")
        url = f"{self.base_url}/{quote(path.lstrip('/'))}"
        return f"{url}?{urlencode(query)}" if query else url

    def start(self) -> ShardServer:
        if self._thread is not None:
            raise RuntimeError("server already started")
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="shardserver", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            raise self._startup_error
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving, close the socket and join the thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        thread.join(timeout)
        if thread.is_alive():
            frame = sys._current_frames().get(thread.ident)  # where its loop is stuck: the thing to fix
            where = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n"
            raise RuntimeError(f"shardserver thread did not stop within {timeout} s; it is at:\n{where}")

    def __enter__(self) -> ShardServer:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(ready))  # also joins the loop's executor threads on the way out
        except BaseException as error:  # noqa: BLE001 - handed to start() to re-raise
            if not ready.is_set():
                self._startup_error = error
                ready.set()
            else:
                raise

    async def _serve(self, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        runner, self.base_url = await _start_site(self._handler, self._host, self._bind_port, self._ssl_context)
        ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()


# --- subprocess mode ---------------------------------------------------------------------------


def _flag(option: Field) -> str:
    return "--" + option.name.replace("_", "-")


def _arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardserver.py",
        description="Serve ROOT over HTTP, print 'READY URL', stop on SIGTERM or SIGINT.",
    )
    parser.add_argument("root", help="directory to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 (default) picks a free port")
    for option in fields(ServerOptions):
        parse, help = option.metadata["parse"], option.metadata["help"]
        if parse is bool:
            parser.add_argument(_flag(option), action="store_true", default=None, help=help)
        elif option.name == "fail_first":
            parser.add_argument(
                _flag(option), action="append", type=parse, metavar="PATH=N", help=help
            )
        else:
            parser.add_argument(_flag(option), type=parse, help=help)
    return parser


def _options_from_args(args: argparse.Namespace) -> ServerOptions:
    given = {option.name: getattr(args, option.name) for option in fields(ServerOptions)}
    return ServerOptions(**{name: value for name, value in given.items() if value is not None})


def _options_to_argv(options: ServerOptions) -> list[str]:
    """The flags that make `_arg_parser` rebuild `options` (defaults are left out)."""
    argv: list[str] = []
    for option in fields(ServerOptions):
        value = getattr(options, option.name)
        if option.default is MISSING:
            default = option.default_factory()  # type: ignore[misc]
        else:
            default = option.default
        if value == default:
            continue
        if option.metadata["parse"] is bool:
            argv.append(_flag(option))
        elif option.name == "fail_first":
            argv += [arg for path, n in value.items() for arg in (_flag(option), f"{path}={n}")]
        elif option.name == "basic_auth":
            argv += [_flag(option), ":".join(value)]
        else:
            argv += [_flag(option), str(value)]
    return argv


async def _serve_until_signal(root: Path, host: str, port: int, options: ServerOptions) -> None:
    runner, base_url = await _start_site(_FileHandler(root, options, ServerStats()), host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"READY {base_url}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: serve until SIGTERM or SIGINT, then exit 0."""
    args = _arg_parser().parse_args(argv)
    options = _options_from_args(args)
    asyncio.run(_serve_until_signal(_served_root(args.root), args.host, args.port, options))
    return 0


def start_subprocess(
    root: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ready_timeout: float = 30.0,
    **option_fields: Any,
) -> tuple[subprocess.Popen, str]:
    """Run the server in a child Python process; return it and its base URL once it is READY.

    Options are ServerOptions fields, validated here so mistakes fail in the caller. Stop the
    child with `stop_subprocess`. Raises TimeoutError or RuntimeError if it never gets READY."""
    options = ServerOptions(**option_fields)
    command = [sys.executable, str(Path(__file__).resolve()), str(root)]
    command += ["--host", host, "--port", str(port), *_options_to_argv(options)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        return proc, _read_ready_line(proc, ready_timeout)
    except BaseException:
        stop_subprocess(proc)
        raise


def _read_ready_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], timeout)
    if not readable:
        raise TimeoutError(f"shardserver printed nothing within {timeout} s")
    line = proc.stdout.readline()
    proc.stdout.close()  # nothing else comes on stdout; closing it spares callers a ResourceWarning
    if not line.startswith("READY "):
        raise RuntimeError(f"shardserver did not start (exit code {proc.poll()}, said {line!r})")
    return line.split()[1]


def stop_subprocess(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    """SIGTERM the server process, SIGKILL it if it lingers; return its exit code."""
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
