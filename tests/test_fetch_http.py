"""The fetch layer against a real HTTP server (tools/shardserver.py): exact bytes, latency and
bandwidth, injected faults, retries and Range resumes, errors, early close, backpressure."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest
from aiohttp import web
from looptools import loop_tasks, reader, serve_app, wait_for, write_files

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))


import shardstream as wds  # noqa: E402
from shardstream._fetch import registry as _fetch  # noqa: E402
from shardstream._base.errors import (  # noqa: E402
    FetchError,
    FetchTimeout,
    NetworkError,
    ShardNotFound,
    UsageError,
)
from shardstream._fetch.stream import open_stream
from shardstream._fetch.registry import fetch_stream, register_fetcher
from shardstream._fetch.options import FetchOptions, fetch_stats
from shardstream._fetch.loop import get_loop, run_coroutine  # noqa: E402

pytestmark = pytest.mark.timeout(20)

KIB, MIB = 1 << 10, 1 << 20
# One connection per URL: these tests are about a single transfer's retries and resumes (parted
# downloads are tested in test_fetch_parallel.py).
FAST = FetchOptions(backoff_base=0.01, backoff_max=0.05, chunk_size=64 * KIB, prefetch_bytes=1 * MIB, stall_timeout=5,
                    parallel_parts=1)
SIZES = {"empty.bin": 0, "one.bin": 1, "small.bin": 1000, "multi.bin": 3 * 64 * KIB + 17, "big.bin": 2 * MIB + 3}
SIZES.update({"large.bin": 16 * MIB}, **{f"par{i}.bin": 512 * KIB for i in range(4)})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("served"), SIZES, seed=0)


fetch_all = reader(FAST)  # the `server` fixture comes from conftest.py


async def _collect(url, options, start=0):
    return b"".join([chunk async for chunk in fetch_stream(url, options=options, start=start)])


# --- whole downloads ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["empty.bin", "one.bin", "small.bin", "multi.bin", "big.bin"])
def test_download_equals_file(server, files, name):
    data = files[1][name]
    got, stats = fetch_all(server.url(name))
    assert got == data and stats["bytes"] == len(data) and stats["retries"] == 0
    assert run_coroutine(_collect(server.url(name), FAST)).result(10) == data
    if data:  # from an offset: one Range request
        assert run_coroutine(_collect(server.url(name), FAST, start=len(data) // 2)).result(10) == data[len(data) // 2 :]


def test_chunks_respect_chunk_size(server, files):
    with open_stream(server.url("big.bin"), options=FAST) as stream:
        sizes = [len(chunk) for chunk in stream]
    assert sum(sizes) == len(files[1]["big.bin"]) and max(sizes) <= FAST.chunk_size and len(sizes) > 2


def test_fetch_stream_on_a_loop_of_your_own(server, files):
    from shardstream._fetch.loop import close_session

    async def main():
        try:
            return await _collect(server.url("multi.bin"), FAST)
        finally:
            await close_session()

    assert asyncio.run(main()) == files[1]["multi.bin"]


def test_local_paths_file_urls_and_pipe(files, tmp_path):
    root, contents = files
    path = str(root / "big.bin")
    assert fetch_all(path)[0] == contents["big.bin"]
    assert fetch_all(f"file://{path}", start=10)[0] == contents["big.bin"][10:]
    with pytest.raises(ShardNotFound):
        fetch_all(str(tmp_path / "missing.tar"))
    with pytest.raises(UsageError, match="pipe"):
        fetch_all(f"pipe:cat {path}")


def test_latency_bandwidth_and_streams_in_parallel(server, files):
    server.options.latency_ms = 50
    server.options.bandwidth = 2e6  # per connection: one 512 KiB file takes ~0.3 s
    names = [f"par{i}.bin" for i in range(4)]
    started = time.monotonic()
    streams = [open_stream(server.url(name), options=FAST) for name in names]  # 4 shards in flight
    bodies = [b"".join(stream) for stream in streams]
    elapsed = time.monotonic() - started
    assert bodies == [files[1][name] for name in names]
    one = 0.05 + 512 * KIB / 2e6
    assert elapsed >= one * 0.9
    assert elapsed < 2.5 * one  # ~max, not the sum of the four (4 * one)


# --- faults ---------------------------------------------------------------------------------------

BODY_FAULTS = {"reset", "truncate", "wrong_length", "stall"}


@pytest.mark.parametrize("kind", ["status", "throttle", "reset", "truncate", "wrong_length", "stall"])
def test_every_download_survives_faults(server, files, kind):
    server.options.seed = 7
    server.options.cut_fraction = None
    setattr(server.options, f"{kind}_rate", 0.3)
    options = FAST
    if kind == "stall":
        server.options.stall_seconds = 3
        options = FAST.replace(stall_timeout=0.3)
    total = {"retries": 0, "resumes": 0}
    for name in ["big.bin", "multi.bin", "big.bin", "small.bin", "big.bin"]:
        got, stats = fetch_all(server.url(name), options)
        assert got == files[1][name], name
        for key in total:
            total[key] += stats[key]
    seen = server.stats.snapshot()
    assert seen.faults[kind] > 0 and total["retries"] >= seen.faults[kind]
    if kind in BODY_FAULTS:
        assert total["resumes"] > 0 and seen.range_requests > 0
    if kind == "wrong_length":
        assert seen.statuses[416] > 0  # the resume after a lying length found nothing left


def test_mixed_faults_with_shards_in_flight(server, files):
    opts = server.options
    opts.seed, opts.status_rate, opts.throttle_rate, opts.reset_rate = 3, 0.1, 0.05, 0.1
    opts.truncate_rate, opts.wrong_length_rate, opts.bandwidth = 0.1, 0.1, 20e6
    names = ["big.bin", "multi.bin", "big.bin", "small.bin", "big.bin", "one.bin"]
    streams = [open_stream(server.url(name), options=FAST) for name in names]
    try:
        assert [b"".join(stream) for stream in streams] == [files[1][name] for name in names]
    finally:
        for stream in streams:
            stream.close()
    assert sum(server.stats.faults.values()) > 0


def test_retry_after_is_honoured(server, files):
    server.options.retry_after = 1
    server.options.fail_first_fault = "throttle"
    server.options.fail_first = {"small.bin": 1}
    started = time.monotonic()
    got, stats = fetch_all(server.url("small.bin"), FAST.replace(backoff_max=10))
    assert got == files[1]["small.bin"] and stats["retries"] == 1
    assert time.monotonic() - started >= 0.9


def test_retries_exhausted_names_the_url(server):
    server.options.fail_first = {"big.bin": 100}
    before = fetch_stats().snapshot()
    with pytest.raises(FetchError) as info:
        fetch_all(server.url("big.bin"), FAST.replace(retries=3))
    message = str(info.value)
    assert server.url("big.bin") in message and "503" in message and "gave up after 4 attempts" in message
    assert "offset=0" in message and not isinstance(info.value, ShardNotFound)
    assert server.stats.path_requests["big.bin"] == 4
    after = fetch_stats().snapshot()
    assert after["failures"] == before["failures"] + 1 and after["retries"] == before["retries"] + 3


def test_not_found_is_not_retried(server):
    with pytest.raises(ShardNotFound) as info:
        fetch_all(server.url("nope.tar"))
    assert isinstance(info.value, FileNotFoundError) and "404" in str(info.value)
    assert server.stats.requests == 1


def test_other_client_errors_are_not_retried(server):
    server.options.require_token = "tok"
    with pytest.raises(FetchError, match="403") as info:
        fetch_all(server.url("small.bin"))
    assert not isinstance(info.value, ShardNotFound) and server.stats.requests == 1


def test_error_is_raised_again_on_next(server):
    stream = open_stream(server.url("nope.tar"), options=FAST)
    for _ in range(2):
        with pytest.raises(ShardNotFound):
            next(stream)
    stream.close()
    assert list(stream) == []


def _all_text(exc):
    return str(exc) + repr(exc) + "".join(traceback.format_exception(exc))


def test_credentials_never_appear_in_errors(server, files):
    token, password = "tok-SECRET-1", "pw-SECRET-2"
    server.options.require_token = token
    assert fetch_all(server.url("small.bin", token=token))[0] == files[1]["small.bin"]
    with pytest.raises(ShardNotFound) as missing:
        fetch_all(server.url("nope.tar", token=token))
    server.options.fail_first = {"small.bin": 100}
    with pytest.raises(FetchError) as exhausted:
        fetch_all(server.url("small.bin", token=token), FAST.replace(retries=1))
    for info in (missing, exhausted):
        assert token not in _all_text(info.value) and "token=***" in str(info.value)

    server.options.require_token, server.options.fail_first = None, {}
    server.options.basic_auth = ("alice", password)
    authed = server.url("small.bin").replace("http://", f"http://alice:{password}@")
    assert fetch_all(authed)[0] == files[1]["small.bin"]
    with pytest.raises(ShardNotFound) as info:
        fetch_all(authed.replace("small.bin", "nope.tar"))
    assert password not in _all_text(info.value) and "***@" in str(info.value)
    with pytest.raises(NetworkError) as refused:
        fetch_all(f"http://alice:{password}@127.0.0.1:{_closed_port()}/x.tar?token={token}", FAST.replace(retries=1))
    assert password not in _all_text(refused.value) and token not in _all_text(refused.value)


def _closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused_is_retried_then_fails():
    with pytest.raises(NetworkError, match="gave up after 3 attempts"):
        fetch_all(f"http://127.0.0.1:{_closed_port()}/x.tar", FAST.replace(retries=2))


def test_no_headers_within_the_stall_timeout(server):
    server.options.latency_ms = 1500
    started = time.monotonic()
    with pytest.raises(FetchTimeout, match="gave up after 2 attempts"):
        fetch_all(server.url("small.bin"), FAST.replace(stall_timeout=0.3, retries=1))
    assert time.monotonic() - started < 1.4


def test_headers_sent_a_byte_at_a_time_are_a_stall():
    """A server that sends its status line and headers a byte every 0.1 s never trips aiohttp's
    read timeout (the longest silence between reads), so the request waited for as long as the
    headers went on (here 30 s a connection; an hour for a long header). The headers now have
    `stall_timeout` from the request: a FetchTimeout, retried, then given up on."""
    connections = []

    async def drip(reader, writer):
        connections.append(1)
        try:
            await reader.readuntil(b"\r\n\r\n")
            for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"x" * 300:  # 30 s of headers, then it gives up
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = run_coroutine(asyncio.start_server(drip, "127.0.0.1", 0)).result(5)
    port = server.sockets[0].getsockname()[1]
    started = time.monotonic()
    try:
        with pytest.raises(FetchTimeout, match=r"response headers not complete 0.5 s after the request .*"
                                               r"gave up after 2 attempts"):
            fetch_all(f"http://127.0.0.1:{port}/x.tar", FAST.replace(stall_timeout=0.5, retries=1))
    finally:
        server.close()
        run_coroutine(server.wait_closed()).result(5)
    assert time.monotonic() - started < 3, "the headers' phase is held to stall_timeout"
    assert len(connections) == 2


@pytest.mark.parametrize("scope", ["asyncio", "async-timeout"])
def test_the_headers_deadline_on_each_pythons_timeout_scope(server, files, monkeypatch, scope):
    """Python 3.10 has no asyncio.timeout: the deadline runs on async-timeout there, whose scope
    moves with `update`, not `reschedule` (the first version called `reschedule` on both, and
    every HTTP request failed on 3.10). Both scopes read a body, and both end a header drip."""
    from shardstream._fetch import heads

    if scope == "async-timeout":
        monkeypatch.setattr(heads, "_timeout", pytest.importorskip("async_timeout").timeout)
    data, _ = fetch_all(server.url("small.bin"), FAST)
    assert data == files[1]["small.bin"]
    test_headers_sent_a_byte_at_a_time_are_a_stall()


def test_a_redirect_targets_lookup_and_connect_do_not_count_against_the_headers(monkeypatch):
    """The headers' deadline runs from a request's sending to its response. A redirect to a
    host whose name takes 0.6 s to resolve, from an origin that takes 0.6 s to answer, is 1.2 s
    in all with each phase within its 1 s: the first version kept the first request's deadline
    running through the lookup and gave up."""
    import aiohttp.resolver

    resolve = aiohttp.resolver.ThreadedResolver.resolve

    async def slow_resolve(self, host, port=0, family=socket.AF_INET):
        if host == "slow.test":
            await asyncio.sleep(0.6)
            host = "127.0.0.1"
        return await resolve(self, host, port, family)

    monkeypatch.setattr(aiohttp.resolver.ThreadedResolver, "resolve", slow_resolve)
    body = os.urandom(1000)

    async def handle(request):
        if request.path == "/start":
            await asyncio.sleep(0.6)
            raise web.HTTPFound(f"http://slow.test:{request.url.port}/x.bin")
        return web.Response(body=body)

    runner, url = serve_app(handle)
    try:
        data, _ = fetch_all(url.replace("x.bin", "start"), FAST.replace(stall_timeout=1, retries=0))
    finally:
        run_coroutine(runner.cleanup()).result(5)
    assert data == body


@pytest.mark.parametrize("encoding", ["br", "gzip", "bzip2", "identity, identity", "none"])
def test_a_body_with_a_content_encoding(encoding):
    """We ask for no encoding and read bodies byte for byte. A .tar.gz labelled `gzip` or a
    .tar.bz2 labelled `bzip2` (as servers and upload tools label such files) is read as its bytes,
    and so is a body under a label that names no coding; one the reader cannot take (br) is an
    error that says so, not "bad tar header" at byte 0."""
    import bz2
    import gzip

    from shardsets import sample_members, tar_bytes

    raw = tar_bytes([m for i in range(3) for m in sample_members(i, exts=("cls",))])
    body = {"gzip": gzip.compress(raw, mtime=0), "bzip2": bz2.compress(raw), "br": b"\x1b" + raw[:1000]}.get(encoding, raw)

    async def handle(request):
        return web.Response(body=body, headers={"Content-Encoding": encoding, "ETag": '"v1"'})

    runner, url = serve_app(handle)
    try:
        dataset = wds.WebDataset(url.replace("x.bin", "x.tar"), shardshuffle=False)
        if encoding == "br":
            with pytest.raises(FetchError, match="Content-Encoding 'br' though none was asked for"):
                list(dataset)
        else:
            assert [s["cls"] for s in dataset] == [b"0", b"1", b"2"]
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_resume_refuses_a_changed_object(server, files):
    """The server stalls mid-body; while it does, the file changes (new ETag): no mixed bytes."""
    path = files[0] / "multi.bin"
    server.options.fail_first_fault, server.options.cut_fraction = "stall", 0.5
    server.options.stall_seconds = 2
    server.options.fail_first = {"multi.bin": 1}
    stream = open_stream(server.url("multi.bin"), options=FAST.replace(stall_timeout=0.5))
    try:
        assert wait_for(lambda: server.stats.faults["stall"] == 1)
        info = path.stat()
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))
        with pytest.raises(FetchError, match="changed"):
            b"".join(stream)
    finally:
        stream.close()


# --- servers that misbehave in ways shardserver does not (they run on the shared loop) ----------


async def _send(request, status, body, headers, content_length, cut=None):
    response = web.StreamResponse(status=status, headers={"ETag": '"v1"', **headers})
    response.content_length = content_length
    await response.prepare(request)
    await response.write(body if cut is None else body[:cut])
    if cut is not None:
        request.transport.close()  # a clean close mid-body
    return response


def test_server_that_ignores_range_gets_the_prefix_skipped(files):
    data, ranges = files[1]["big.bin"], []

    async def handle(request):  # always 200 with the whole file; the first one cut in half
        ranges.append(request.headers.get("Range"))
        cut = len(data) // 2 if len(ranges) == 1 else None
        return await _send(request, 200, data, {}, len(data), cut)

    runner, url = serve_app(handle)
    try:
        got, stats = fetch_all(url)
        assert got == data and stats["resumes"] == 1
        assert ranges[0] is None and ranges[1] == f"bytes={len(data) // 2}-"
        assert run_coroutine(_collect(url, FAST, start=5)).result(10) == data[5:]
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_a_lying_content_length_gives_way_to_content_range(files):
    data, ranges = files[1]["multi.bin"], []

    async def handle(request):  # first a 200 promising 1024 bytes too many, cut short; then 206s
        ranges.append(request.headers.get("Range"))
        if len(ranges) == 1:
            return await _send(request, 200, data, {}, len(data) + 1024, cut=len(data) - 100)
        first = int(request.headers["Range"][6:-1])
        content_range = {"Content-Range": f"bytes {first}-{len(data) - 1}/{len(data)}"}
        return await _send(request, 206, data[first:], content_range, len(data) - first)

    runner, url = serve_app(handle)
    try:
        assert fetch_all(url)[0] == data and len(ranges) == 2
    finally:
        run_coroutine(runner.cleanup()).result(5)


async def _bare(request, status, body, headers, content_length=None, cut=None):
    """A response with exactly `headers` (no ETag unless given); cut short by a clean close."""
    response = web.StreamResponse(status=status, headers=headers)
    if content_length is not None:
        response.content_length = content_length
    else:
        response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(body if cut is None else body[:cut])
    if cut is not None:
        request.transport.close()
    return response


def _fails_against(handle, error, match, **options):
    """Fetch from a server answering with `handle` (one connection, fast retries): `error`."""
    runner, url = serve_app(handle)
    try:
        with pytest.raises(error, match=match):
            fetch_all(url, FetchOptions(backoff_base=0.01, backoff_max=0.02, parallel_parts=1, **options))
    finally:
        run_coroutine(runner.cleanup()).result(5)


@pytest.mark.parametrize("later", ["no validator", "other Last-Modified"])
def test_a_resume_without_the_objects_validator_is_another_version(files, later):
    """The first response shows ETag "v1"; the resume's (a 200: a server that honours If-Range
    answers a replaced object so) shows no ETag: another version of the same size, spliced in
    before. It is refused as a changed object, after asking again."""
    data = files[1]["big.bin"]
    other = bytes(reversed(data))
    calls = []

    async def handle(request):
        calls.append(request.headers.get("Range"))
        if len(calls) == 1:
            return await _bare(request, 200, data, {"ETag": '"v1"', "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"},
                               len(data), cut=len(data) // 2)
        headers = {} if later == "no validator" else {"Last-Modified": "Tue, 02 Jan 2024 00:00:00 GMT"}
        return await _bare(request, 200, other, headers, len(other))

    _fails_against(handle, FetchError, 'object changed during the download .ETag "v1" -> none')


def test_a_416_without_the_objects_size_after_a_break_is_an_error(files):
    """A chunked body (no length) breaks; the resume's Range gets a 416 that does not say the
    object's size: the bytes so far were taken as the whole object (a shard cut in half, with a
    warning at most). Now an error: nothing says they are."""
    data = files[1]["big.bin"]
    calls = []

    async def handle(request):
        calls.append(request.headers.get("Range"))
        if len(calls) == 1:
            return await _bare(request, 200, data, {"ETag": '"v1"'}, cut=len(data) // 2)
        return web.Response(status=416, headers={"ETag": '"v1"'})

    _fails_against(handle, FetchError, "without the object's size")


@pytest.mark.parametrize("parts", [1, 4])
def test_a_server_that_refuses_ranges_with_416_is_read_whole(files, parts):
    """A server that answers every Range with `416 bytes */N` (a CDN in front of a generated
    object) but serves the object whole: the resume after a break (or every part but the first)
    was an error; now it asks without a Range once and skips the bytes it has."""
    data = files[1]["big.bin"]
    calls = []

    async def handle(request):
        calls.append(request.headers.get("Range"))
        if "Range" in request.headers:
            return web.Response(status=416, headers={"ETag": '"v1"', "Content-Range": f"bytes */{len(data)}"})
        cut = len(data) // 3 if calls.count(None) == 1 else None
        return await _bare(request, 200, data, {"ETag": '"v1"'}, len(data), cut=cut)

    runner, url = serve_app(handle)
    try:
        got, _ = fetch_all(url, FetchOptions(backoff_base=0.01, backoff_max=0.02, parallel_parts=parts,
                                          part_size=256 << 10))
    finally:
        run_coroutine(runner.cleanup()).result(5)
    assert got == data
    if parts == 1:
        assert calls[0] is None and calls[1].startswith("bytes=") and calls[2:] == [None], calls
    else:  # (the first part asks for a range too)
        assert calls[0].startswith("bytes=0-") and None in calls, calls


def test_a_server_that_sends_a_byte_per_connection_is_given_up_on(files):
    """Each attempt delivered one byte, then stalled: an attempt that delivers anything used to
    start the retry count again, so the download never ended (13 requests in 20 s for one shard
    with retries=1). Under 64 KiB (or the rest of the object) is no progress now."""
    data = files[1]["big.bin"]
    calls = []

    async def handle(request):
        calls.append(request.headers.get("Range"))
        first = int(request.headers["Range"][6:-1]) if "Range" in request.headers else 0
        response = web.StreamResponse(status=206 if first else 200, headers={"ETag": '"v1"'})
        response.content_length = len(data) - first
        if first:
            response.headers["Content-Range"] = f"bytes {first}-{len(data) - 1}/{len(data)}"
        await response.prepare(request)
        await response.write(data[first:first + 1])
        await asyncio.sleep(1)  # then silence, past the stall timeout
        return response

    _fails_against(handle, FetchTimeout, "gave up after 3 attempts", stall_timeout=0.3, retries=2)
    assert len(calls) == 3


def test_a_body_longer_than_the_object_is_an_error(files):
    data = files[1]["small.bin"]

    async def handle(request):  # a 206 whose Content-Range total is smaller than its body
        content_range = {"Content-Range": f"bytes 0-{len(data) - 1}/{len(data) - 10}"}
        return await _send(request, 206, data, content_range, len(data))

    runner, url = serve_app(handle)
    try:
        with pytest.raises(FetchError, match="shorter|longer"):
            fetch_all(url)
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_options_and_arguments_are_validated():
    with pytest.raises(ValueError):
        FetchOptions(retries=-1)
    with pytest.raises(ValueError):
        FetchOptions(chunk_size=0)
    with pytest.raises(ValueError):
        FetchOptions(stall_timeout=0)
    with pytest.raises(ValueError):
        register_fetcher("bad scheme!", None)
    with pytest.raises(ValueError):
        open_stream("x", start=-1)


# --- the registry -------------------------------------------------------------------------------


def test_registered_fetchers_and_lazy_imports(server, files, monkeypatch):
    async def memory(url, *, options, start=0):
        for i in range(start, 10):
            yield bytes([i])

    async def broken(url, *, options, start=0):
        yield b"x"
        raise RuntimeError("kaput")

    previous = register_fetcher("mem", memory)
    try:
        assert previous is None
        assert fetch_all("mem://anything", start=3)[0] == bytes(range(3, 10))
        register_fetcher("mem", broken)
        with pytest.raises(FetchError, match="kaput") as info:
            fetch_all("mem://thing")
        assert info.value.offset == 1
    finally:
        register_fetcher("mem", None)
    # A missing optional module fails only the URLs of its scheme.
    monkeypatch.setitem(_fetch._fetchers, "s3", ".no_such_module:s3_stream")
    with pytest.raises(UsageError, match="s3"):
        fetch_all("s3://bucket/key.tar")
    assert fetch_all(server.url("small.bin"))[0] == files[1]["small.bin"]


@pytest.mark.parametrize("scheme", ["ais", "htgs"])
def test_a_fetcher_registered_for_a_scheme_our_openers_serve_takes_it_over(files, scheme):
    """gopen_schemes holds our own `ais` (the ais CLI) and `htgs` openers by default: they were
    taken for a user's, so register_fetcher("ais", f) was silently ignored."""
    async def memory(url, *, options, start=0):
        yield files[1]["small.bin"][start:]

    previous = register_fetcher(scheme, memory)
    try:
        assert fetch_all(f"{scheme}://bucket/small.bin")[0] == files[1]["small.bin"]
        with wds.gopen(f"{scheme}://bucket/small.bin") as stream:
            assert stream.read() == files[1]["small.bin"]
    finally:
        register_fetcher(scheme, previous)


@pytest.mark.timeout(30)
def test_a_registered_fetcher_that_falls_silent_is_held_to_the_stall_timeout():
    """A user's fetcher that yields a KiB, then waits for ever, hung the pass: stall_timeout was
    kept by our own fetchers only."""
    async def silent(url, *, options, start=0):
        yield b"x" * 1024
        await asyncio.sleep(3600)
        yield b"never"

    previous = register_fetcher("silent", silent)
    try:
        started = time.monotonic()
        with pytest.raises(FetchTimeout, match="stall_timeout") as info:
            fetch_all("silent://bucket/a.tar", FetchOptions(stall_timeout=0.5))
        assert time.monotonic() - started < 5 and info.value.offset == 1024
        assert info.value.url == "silent://bucket/a.tar"
    finally:
        register_fetcher("silent", previous)


def test_a_registered_fetcher_runs_in_one_task_and_keeps_its_own_timeouts():
    """The stall guard ran each step of a user's fetcher in a task of its own (a scope that spans
    its yields broke), and took a TimeoutError of its own for a 30 s stall."""
    tasks = set()

    async def steady(url, *, options, start=0):
        for i in range(8):
            tasks.add(asyncio.current_task())
            yield bytes([i]) * 10

    async def own_timeout(url, *, options, start=0):
        yield b"x" * 10
        raise asyncio.TimeoutError("the backend's own read timeout")

    previous = [register_fetcher("steady", steady), register_fetcher("owntimeout", own_timeout)]
    try:
        assert len(fetch_all("steady://b/a.tar")[0]) == 80 and len(tasks) == 1
        with pytest.raises(FetchError, match="backend's own read timeout") as info:
            fetch_all("owntimeout://b/a.tar")
        assert not isinstance(info.value, FetchTimeout) and info.value.offset == 10
    finally:
        register_fetcher("steady", previous[0])
        register_fetcher("owntimeout", previous[1])


def test_an_opener_whose_command_is_missing_is_a_usage_error_not_a_missing_shard(monkeypatch):
    """`ais://` goes to the `ais` command (webdataset's gopen_schemes); without it installed,
    Popen's FileNotFoundError read as "shard not found", which handlers skip: every shard of a
    misconfigured machine skipped quietly."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError, match="runs 'ais', which is not installed"):
        list(wds.WebDataset("ais://bucket/train-000.tar", shardshuffle=False))


# --- early close, garbage collection, backpressure ------------------------------------------------


def test_close_mid_download_stops_promptly(server, files):
    fetch_all(server.url("small.bin"))  # warm: loop, session
    baseline_tasks, baseline_threads = loop_tasks(), set(threading.enumerate())
    server.options.bandwidth = 4e6
    stream = open_stream(server.url("large.bin"), options=FAST)
    assert files[1]["large.bin"].startswith(next(stream))
    assert wait_for(lambda: server.stats.bytes_sent > 256 * KIB)
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 0.5
    assert wait_for(lambda: loop_tasks() == baseline_tasks)
    sent = server.stats.bytes_sent
    time.sleep(0.3)  # at 4 MB/s a live transfer would send ~1.2 MB more
    assert server.stats.bytes_sent - sent < 256 * KIB
    assert set(threading.enumerate()) == baseline_threads
    assert sent < len(files[1]["large.bin"]) // 2


def test_dropped_stream_is_cancelled(server):
    fetch_all(server.url("small.bin"))
    baseline = loop_tasks()
    server.options.bandwidth = 4e6
    stream = open_stream(server.url("large.bin"), options=FAST)
    next(stream)
    del stream
    gc.collect()
    assert wait_for(lambda: loop_tasks() == baseline)


def test_a_consumer_that_does_not_read_holds_back_the_download(server, files):
    options = FAST.replace(prefetch_bytes=1 * MIB, chunk_size=256 * KIB)
    stream = open_stream(server.url("large.bin"), options=options)
    try:
        time.sleep(0.5)  # unthrottled, the whole 16 MiB would be here by now
        assert stream.buffered_bytes <= options.prefetch_bytes + options.chunk_size
        assert stream.buffered_bytes >= options.prefetch_bytes // 2
        # The server is held back too: what it sent (ours + aiohttp's + the kernel's socket
        # buffers) stops growing short of the whole file.
        sent = server.stats.bytes_sent
        time.sleep(0.2)
        assert server.stats.bytes_sent == sent < len(files[1]["large.bin"])
        assert b"".join(stream) == files[1]["large.bin"]
    finally:
        stream.close()


def test_streams_share_the_loop_without_blocking_it(server, files):
    """A stalled consumer of one stream does not hold back another stream's consumer."""
    idle = open_stream(server.url("large.bin"), options=FAST.replace(prefetch_bytes=256 * KIB))
    try:
        assert fetch_all(server.url("big.bin"))[0] == files[1]["big.bin"]
        assert get_loop().is_running()
    finally:
        idle.close()


def test_a_signed_url_quoted_decoded_in_a_third_party_message_is_redacted():
    """aiohttp's errors quote the request URL decoded: a presigned URL's X-Amz-Credential (with
    its %2F as "/") once reached the error's own message, and a password holding "#" was not
    taken for a password at all. Neither the message, the warning nor the traceback shows them."""
    import shardstream as wds

    async def handle(request):  # a redirect loop: aiohttp's TooManyRedirects quotes the URL
        raise web.HTTPFound(str(request.rel_url))

    runner, url = serve_app(handle)
    try:
        query = ("?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAZQ9%2F20240101%2Fus-east-1%2Fs3%2F"
                 "aws4_request&X-Amz-Security-Token=SESSIONZQ9&X-Amz-Signature=SIGZQ9")
        host = url.split("//", 1)[1]
        for shard, secrets in ((url.replace(".bin", ".tar") + query, ("AKIAZQ9", "SESSIONZQ9", "SIGZQ9")),
                               (f"http://user:Zq9#frag@{host}", ("Zq9",))):
            options = wds.FetchOptions(retries=0)
            with pytest.raises(wds.FetchError) as caught:
                list(wds.WebDataset(shard, shardshuffle=False, fetch_options=options))
            shown = str(caught.value) + "".join(traceback.format_exception(caught.value))
            assert "(url=" in shown and not [s for s in secrets if s in shown], shown
            with pytest.warns(UserWarning) as warned:
                list(wds.WebDataset(shard, shardshuffle=False, fetch_options=options,
                                    handler=wds.warn_and_continue, empty_check=False))
            assert warned and not [s for s in secrets for w in warned if s in str(w.message)]
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_a_reader_that_pauses_is_no_silence_of_the_servers(server, files, caplog):
    """The transfer waits for its reader, not the server: the watchdog does not warn about it."""
    options = FAST.replace(stall_timeout=0.6, prefetch_bytes=256 * KIB)  # (a warning after 0.2 s)
    with caplog.at_level("WARNING", logger="shardstream"):
        with open_stream(server.url("large.bin"), options=options) as stream:
            first = next(stream)
            time.sleep(1.0)
            assert first + b"".join(stream) == files[1]["large.bin"]
            assert stream.stats.retries == 0
    assert not [r for r in caplog.records if "no bytes from" in r.getMessage()]


def test_many_datasets_over_a_server_without_ranges_all_get_connections():
    """40 datasets open at once over a server that ignores Range (one connection per shard,
    held while the shard's buffer is full): their streams opened ahead took all 256 pooled
    connections, the stream each reader waited for queued for a connection for ever, and
    nothing moved. Every dataset now reads every sample."""
    from shardsets import tar_bytes

    shards = [tar_bytes([(f"s{i}-{n:02d}.bin", os.urandom(24 << 10)) for n in range(20)]) for i in range(10)]

    async def handle(request):  # (no Range, no ETag: each shard over one connection)
        return web.Response(body=shards[int(request.match_info["path"].split(".")[0])])

    runner, url = serve_app(handle)
    base = url.rsplit("/", 1)[0]
    options = FetchOptions(prefetch_bytes=32 << 10, chunk_size=16 << 10)
    iterators = [iter(wds.WebDataset([f"{base}/{i}.tar" for i in range(10)], shardshuffle=False, fetch_options=options))
                 for _ in range(40)]
    counts = [0] * len(iterators)
    try:
        done = threading.Event()

        def read_all():
            live = list(range(len(iterators)))
            while live:
                for k in list(live):
                    if next(iterators[k], None) is None:
                        live.remove(k)
                    else:
                        counts[k] += 1
            done.set()

        reader_thread = threading.Thread(target=read_all, daemon=True)
        reader_thread.start()
        assert done.wait(120), f"stuck: samples read per dataset {counts}"
    finally:
        for it in iterators:
            getattr(it, "close", lambda: None)()
        run_coroutine(runner.cleanup()).result(5)
    assert counts == [200] * len(iterators)
