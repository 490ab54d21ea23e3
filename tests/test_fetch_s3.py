"""shardstream._fetch.s3 against a real moto_server subprocess: streams, offsets, errors, resume, listing."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import uuid
import warnings

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)
from faultproxy import FaultProxy
from motoserver import free_port, moto_endpoint, moto_server, s3_admin, s3_env  # noqa: F401  (fixtures)

from shardstream._fetch import lowat
from shardstream._fetch import options as _fetch
from shardstream._fetch.options import FetchOptions
from shardstream._fetch import s3 as _s3
from shardstream._fetch import s3client as _s3client
from shardstream._fetch.loop import get_loop, run_coroutine
from shardstream._base.errors import (
    FetchError,
    FetchTimeout,
    NetworkError,
    ShardNotFound,
    UsageError,
)

pytestmark = pytest.mark.timeout(30)

KB = 1024
HERE = os.path.dirname(os.path.abspath(__file__))


# The fetch options these tests run with: short timeouts and backoffs, a small chunk size.
OPTIONS = FetchOptions(connect_timeout=5.0, stall_timeout=10.0, retries=3, backoff_base=0.01, backoff_max=0.05,
                       chunk_size=256 * KB, prefetch_bytes=4 * 1024 * KB)
Options = OPTIONS.replace  # Options(retries=2): the same with one change


def payload(n: int) -> bytes:
    return os.urandom(n)


def run(make_coro, timeout: float = 20.0):
    """Run one test body on a fresh loop (as asyncio.run: the client closes with the loop)."""
    return asyncio.run(asyncio.wait_for(make_coro(), timeout))


async def collect(url, options=Options(), start=0):
    return [chunk async for chunk in _s3.s3_stream(url, options=options, start=start)]


async def client_for(options) -> object:
    """The loop's client for `options`, as a stream gets it (its lease given back at once)."""
    lease = await _s3client.lease_client(options)
    lease.release()
    return lease.client


async def recorded(operation: str, options=Options()) -> list:
    """Headers of every HTTP request the loop's client sends for `operation` (botocore event hook)."""
    sent: list = []
    client = await client_for(options)
    client.meta.events.register(
        f"before-send.s3.{operation}", lambda request, **_: sent.append(dict(request.headers))
    )
    return sent


def header(headers: dict, name: str):
    value = headers.get(name)
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture
def bucket(s3_env, s3_admin):
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3_admin.create_bucket(Bucket=name)
    return name


@pytest.fixture
def proxy(s3_env, moto_endpoint, monkeypatch):
    """The client talks to moto through a proxy that cuts object bodies short (proxy.breaks)."""
    cutter = FaultProxy(moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", cutter.url)
    yield cutter
    cutter.close()


def delta(before: dict) -> dict:
    after = _s3.s3_stats.snapshot()
    return {k: after[k] - before[k] for k in after}


# ---- whole objects and offsets ---------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1000, 5 * 1024 * KB + 123], ids=["empty", "small", "5MB"])
def test_stream_equals_object(bucket, s3_admin, size):
    data = payload(size)
    s3_admin.put_object(Bucket=bucket, Key="shard.tar", Body=data)
    before = _s3.s3_stats.snapshot()
    chunks = run(lambda: collect(f"s3://{bucket}/shard.tar"))
    assert b"".join(chunks) == data
    assert all(len(c) == OPTIONS.chunk_size for c in chunks[:-1]) and all(chunks)
    counts = delta(before)
    assert counts["bytes"] == size and counts["requests"] == 1 and counts["retries"] == 0


@pytest.mark.skipif(not lowat.ENABLED, reason="the receive low-water mark is used on Linux only")
def test_an_object_body_gets_the_receive_low_water_mark(bucket, s3_admin, moto_endpoint, monkeypatch):
    """aiobotocore's body is an aiohttp response: it is read in batches as an HTTP body is (the
    mark's rate is kept for the origin when the body ends; the mark itself: test_fetch_lowat.py).
    (A rate is measured over 5 ms at least: moto can send the whole body in less.)"""
    monkeypatch.setattr(lowat, "SAMPLE_S", 1e-9)
    data = payload(8 * 1024 * KB)
    s3_admin.put_object(Bucket=bucket, Key="shard.tar", Body=data)
    endpoint = urllib.parse.urlsplit(moto_endpoint)
    lowat._rates.pop((endpoint.hostname, endpoint.port), None)
    assert b"".join(run(lambda: collect(f"s3://{bucket}/shard.tar"))) == data
    assert lowat._rates.get((endpoint.hostname, endpoint.port), 0.0) > 0


def test_start_offsets(bucket, s3_admin):
    data = payload(700 * KB)
    s3_admin.put_object(Bucket=bucket, Key="x.tar", Body=data)
    url = f"s3://{bucket}/x.tar"

    async def body():
        sent = await recorded("GetObject")
        for start in (1, OPTIONS.chunk_size, len(data) - 1, len(data)):
            assert b"".join(await collect(url, start=start)) == data[start:], start
        assert [header(h, "Range") for h in sent] == [
            "bytes=1-", f"bytes={OPTIONS.chunk_size}-", f"bytes={len(data) - 1}-", f"bytes={len(data)}-"
        ]
        with pytest.raises(FetchError) as info:
            await collect(url, start=len(data) + 5)
        assert not isinstance(info.value, (ShardNotFound, NetworkError))
        assert info.value.offset == len(data) + 5
        assert "past the end" in str(info.value) and url in str(info.value)

    run(body)


def test_start_at_end_of_empty_object(bucket, s3_admin):
    s3_admin.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert run(lambda: collect(f"s3://{bucket}/empty", start=0)) == []


# ---- errors --------------------------------------------------------------------------------


def test_missing_key_is_shard_not_found_at_once(bucket):
    url = f"s3://{bucket}/nope.tar"
    slow = Options(retries=5, backoff_base=2.0, backoff_max=2.0)  # one retry would show in the time

    async def body():
        sent = await recorded("GetObject", slow)
        before = _s3.s3_stats.snapshot()
        t0 = time.monotonic()
        with pytest.raises(ShardNotFound) as info:
            await collect(url, slow)
        return time.monotonic() - t0, len(sent), delta(before), info.value

    elapsed, requests, counts, error = run(body)
    assert elapsed < 1.0 and requests == 1 and counts["retries"] == 0 and counts["errors"] == 1
    assert isinstance(error, FileNotFoundError) and error.url == url and error.offset == 0
    assert url in str(error) and "NoSuchKey" in str(error)


def test_missing_bucket_is_shard_not_found(s3_env):
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/a.tar"
    with pytest.raises(ShardNotFound, match="NoSuchBucket") as info:
        run(lambda: collect(url, Options(backoff_base=2.0, backoff_max=2.0)))
    assert url in str(info.value)
    with pytest.raises(ShardNotFound):
        run(lambda: _s3.s3_list(url.rsplit("/", 1)[0] + "/"))


def test_bad_urls_are_usage_errors(s3_env):
    for url in ("http://x/y", "s3:///key"):
        with pytest.raises(UsageError):
            run(lambda: collect(url))
    with pytest.raises(UsageError):
        run(lambda: collect("s3://b/k", start=-1))
    for url in ("s3://b", "s3://b/"):  # (botocore's "Invalid length for parameter Key" before)
        with pytest.raises(UsageError, match="without a key"):
            run(lambda: collect(url))


def test_credentials_in_an_s3_url_are_refused_and_never_shown(s3_env):
    """botocore quoted the bucket part of s3://user:pass@bucket/key, password and all, as an
    invalid bucket name; there are no credentials in an s3:// URL: refused, redacted."""
    with pytest.raises(UsageError, match="holds no credentials") as info:
        run(lambda: collect("s3://AKID:hunter2secret@bkt/x.tar"))
    assert "hunter2secret" not in str(info.value) and "hunter2secret" not in repr(info.value)


def test_aws_region_names_the_region_where_nothing_else_does(s3_env, monkeypatch):
    """botocore reads AWS_DEFAULT_REGION and profiles, not AWS_REGION (the variable the other SDKs
    and container platforms set)."""
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    assert run(lambda: client_for(Options())).meta.region_name == "eu-west-3"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")  # the one botocore reads wins
    assert run(lambda: client_for(Options())).meta.region_name == "ap-south-1"


def test_connection_refused_retries_then_network_error(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nobody listens
    before = _s3.s3_stats.snapshot()
    with pytest.raises(NetworkError) as info:
        run(lambda: collect("s3://b/k.tar", Options(retries=2)))
    assert delta(before)["retries"] == 2 and delta(before)["requests"] == 3
    assert "s3://b/k.tar" in str(info.value) and info.value.offset == 0


def test_stall_timeout(s3_env, monkeypatch):
    """A server that accepts and never answers: FetchTimeout after the stall timeout, retried."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        t0 = time.monotonic()
        with pytest.raises(FetchTimeout) as info:
            run(lambda: collect("s3://b/k.tar", Options(stall_timeout=0.3, retries=1)))
        assert 0.5 < time.monotonic() - t0 < 5
    assert isinstance(info.value, TimeoutError) and "s3://b/k.tar" in str(info.value)


def test_a_stall_is_reported_before_its_timeout(s3_env, monkeypatch, caplog):
    """As over HTTP: a WARNING naming the URL after a third of the stall timeout, before it ends."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        with caplog.at_level("WARNING", logger="shardstream"), pytest.raises(FetchTimeout):
            run(lambda: collect("s3://b/k.tar", Options(stall_timeout=1.5, retries=0)))
    said = [r.getMessage() for r in caplog.records if "no bytes from" in r.getMessage()]
    assert len(said) == 1 and "s3://b/k.tar" in said[0], [r.getMessage() for r in caplog.records]


def test_a_dripping_body_is_a_stall(bucket, s3_admin, proxy, caplog):
    """A body that comes 200 bytes every 50 ms never falls silent for the read timeout, and
    went on for ever; under 64 KiB per stall_timeout is a stall, retried, then an error."""
    s3_admin.put_object(Bucket=bucket, Key="k.tar", Body=payload(256 * KB))
    proxy.drip = (200, 0.05)
    with caplog.at_level("WARNING", logger="shardstream"), pytest.raises(FetchTimeout) as info:
        run(lambda: collect(f"s3://{bucket}/k.tar", Options(stall_timeout=1.0, retries=1)))
    assert "stalled: under 64 KiB in 1 s" in str(info.value) and f"s3://{bucket}/k.tar" in str(info.value)
    assert 0 < info.value.offset < 64 * KB
    assert any("retry 1/1" in r.getMessage() for r in caplog.records)


def _client_error(code: str, status: int) -> ClientError:
    reply = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(reply, "GetObject")


@pytest.mark.parametrize(
    "exc, kind",
    [
        (_client_error("NoSuchKey", 404), ShardNotFound),
        (_client_error("404", 404), ShardNotFound),
        (_client_error("NoSuchBucket", 404), ShardNotFound),
        (_client_error("AccessDenied", 403), FetchError),
        (_client_error("InvalidAccessKeyId", 403), FetchError),
        (_client_error("PreconditionFailed", 412), FetchError),
        (_client_error("SlowDown", 503), NetworkError),
        (_client_error("InternalError", 500), NetworkError),
        (_client_error("RequestTimeout", 400), FetchTimeout),
        (EndpointConnectionError(endpoint_url="http://h"), NetworkError),
        (ReadTimeoutError(endpoint_url="http://h"), FetchTimeout),
        (asyncio.TimeoutError(), FetchTimeout),
        (ConnectionResetError(), NetworkError),
        (NoCredentialsError(), FetchError),
    ],
)
def test_translate(exc, kind):
    error = _s3._translate(exc, url="s3://b/k", offset=7)
    assert type(error) is kind and error.url == "s3://b/k" and error.offset == 7


def test_translate_leaves_bugs_alone():
    assert _s3._translate(KeyError("x"), url="s3://b/k", offset=0) is None


@pytest.mark.parametrize("code, status, calls", [("AccessDenied", 403, 1), ("SlowDown", 503, 4)])
def test_retry_policy(code, status, calls):
    attempts = []

    async def failing():
        attempts.append(1)
        raise _client_error(code, status)

    with pytest.raises(FetchError) as info:
        run(lambda: _s3._retrying(failing, url="s3://b/k", options=Options(retries=3)))
    assert len(attempts) == calls and code in str(info.value) and "s3://b/k" in str(info.value)


# ---- resume --------------------------------------------------------------------------------


def test_resume_after_broken_body(bucket, s3_admin, proxy):
    data = payload(1024 * KB + 17)
    put = s3_admin.put_object(Bucket=bucket, Key="r.tar", Body=data)
    url = f"s3://{bucket}/r.tar"

    async def body():
        sent = await recorded("GetObject")
        proxy.breaks[:] = [100_000, 50]  # first body breaks at 100000, the next 50 later
        before, fetch_before = _s3.s3_stats.snapshot(), _fetch.fetch_stats().snapshot()
        chunks = await collect(url)
        fetch_after = _fetch.fetch_stats().snapshot()
        return chunks, sent, delta(before), {k: fetch_after[k] - fetch_before[k] for k in fetch_after}

    chunks, sent, counts, fetch_counts = run(body)
    assert b"".join(chunks) == data
    assert all(len(c) == OPTIONS.chunk_size for c in chunks[:-1])  # a resume does not split chunks
    assert [header(h, "Range") for h in sent] == [None, "bytes=100000-", "bytes=100050-"]
    assert [header(h, "If-Match") for h in sent] == [None, put["ETag"], put["ETag"]]
    assert counts["resumes"] == 2 and counts["retries"] == 2 and counts["bytes"] == len(data)
    assert fetch_counts["resumes"] == 2 and fetch_counts["retries"] == 2  # reported to the fetch layer


def test_resume_from_a_start_offset(bucket, s3_admin, proxy):
    data = payload(300 * KB)
    s3_admin.put_object(Bucket=bucket, Key="r.tar", Body=data)

    async def body():
        sent = await recorded("GetObject")
        proxy.breaks[:] = [10]
        return await collect(f"s3://{bucket}/r.tar", start=1000), sent

    chunks, sent = run(body)
    assert b"".join(chunks) == data[1000:]
    assert [header(h, "Range") for h in sent] == ["bytes=1000-", "bytes=1010-"]


def test_object_replaced_mid_stream_is_an_error(bucket, s3_admin, proxy):
    s3_admin.put_object(Bucket=bucket, Key="c.tar", Body=payload(600 * KB))
    url = f"s3://{bucket}/c.tar"

    async def body():
        proxy.breaks[:] = [OPTIONS.chunk_size + 5]
        stream = _s3.s3_stream(url, options=Options())
        first = await stream.__anext__()
        s3_admin.put_object(Bucket=bucket, Key="c.tar", Body=payload(600 * KB))  # a new ETag
        try:
            with pytest.raises(FetchError) as info:
                async for _ in stream:
                    pass
        finally:
            await stream.aclose()
        return first, info.value

    first, error = run(body)
    assert len(first) == OPTIONS.chunk_size
    assert "changed" in str(error) and not isinstance(error, NetworkError)
    assert url in str(error) and error.offset == OPTIONS.chunk_size + 5


def test_retries_are_spent_on_a_body_that_keeps_breaking(bucket, s3_admin, proxy):
    s3_admin.put_object(Bucket=bucket, Key="k.tar", Body=payload(300 * KB))
    proxy.breaks[:] = [0] * 10  # every response breaks before its first byte
    with pytest.raises(NetworkError, match="connection failed.*content length") as info:
        run(lambda: collect(f"s3://{bucket}/k.tar", Options(retries=2)))
    assert info.value.offset == 0


def test_progress_between_breaks_refills_the_retry_budget(bucket, s3_admin, proxy):
    data = payload(500 * KB)
    s3_admin.put_object(Bucket=bucket, Key="k.tar", Body=data)
    proxy.breaks[:] = [70 * KB] * 6  # six breaks, each after progress (64 KiB or more)
    before = _s3.s3_stats.snapshot()
    assert b"".join(run(lambda: collect(f"s3://{bucket}/k.tar", Options(retries=1)))) == data
    assert delta(before)["resumes"] == 6


def test_a_trickle_between_breaks_is_no_progress(bucket, s3_admin, proxy):
    """Attempts that each deliver a little (under 64 KiB) and break do not refill the budget: a
    server that sends a few bytes per connection is given up on, not retried for ever."""
    s3_admin.put_object(Bucket=bucket, Key="k.tar", Body=payload(500 * KB))
    proxy.breaks[:] = [10 * KB] * 6
    with pytest.raises(NetworkError, match="gave up|connection failed"):
        run(lambda: collect(f"s3://{bucket}/k.tar", Options(retries=2)))


def test_early_break_by_the_consumer(bucket, s3_admin):
    s3_admin.put_object(Bucket=bucket, Key="big.tar", Body=payload(2048 * KB))

    async def body():
        stream = _s3.s3_stream(f"s3://{bucket}/big.tar", options=Options())
        async for _chunk in stream:
            break
        await stream.aclose()
        return b"".join(await collect(f"s3://{bucket}/big.tar", start=2048 * KB - 3))

    assert len(run(body)) == 3


# ---- listing -------------------------------------------------------------------------------


def test_list_prefix_and_glob_with_pagination(bucket, s3_admin):
    keys = [f"train-{i:03d}.tar" for i in range(7)]
    keys += ["val-000.tar", "sub/train-100.tar", "sub/deep/x.tar", "sub/"]
    for key in keys:
        s3_admin.put_object(Bucket=bucket, Key=key, Body=b"x")
    base = f"s3://{bucket}"

    async def body():
        sent = await recorded("ListObjectsV2")
        globbed = await _s3.s3_list(f"{base}/train-*.tar", options=Options(), page_size=2)
        pages = len(sent)
        everything = await _s3.s3_list(f"{base}/", page_size=3)
        sub = await _s3.s3_list(f"{base}/sub", page_size=3)
        nested = await _s3.s3_list(f"{base}/*/train-1??.tar")
        none = await _s3.s3_list(f"{base}/nothing-*.tar")
        return globbed, pages, everything, sub, nested, none

    globbed, pages, everything, sub, nested, none = run(body)
    assert globbed == [f"{base}/train-{i:03d}.tar" for i in range(7)] and pages == 4
    assert everything == sorted(f"{base}/{k}" for k in keys if not k.endswith("/"))
    assert sub == [f"{base}/sub/deep/x.tar", f"{base}/sub/train-100.tar"]
    assert nested == [f"{base}/sub/train-100.tar"] and none == []


def test_glob_match_stays_in_one_segment():
    assert _s3._glob_match("a/*.tar", "a/x.tar")
    assert not _s3._glob_match("a/*.tar", "a/b/x.tar")
    assert _s3._glob_match("a/[0-9]?.tar", "a/1x.tar")


# ---- client life and configuration ----------------------------------------------------------


def test_one_client_per_loop_closed_with_the_loop(bucket, s3_admin, caplog):
    s3_admin.put_object(Bucket=bucket, Key="a", Body=b"abc")

    async def body():
        first, second = await asyncio.gather(client_for(Options()), client_for(Options()))
        assert first is second
        assert b"".join(await collect(f"s3://{bucket}/a")) == b"abc"
        return asyncio.get_running_loop()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop = run(body)
        gc.collect()
    assert not any(key[0] is loop for key in _s3client._clients)
    assert [w for w in caught if "nclosed" in str(w.message)] == []
    assert "nclosed" not in caplog.text  # aiohttp logs an unclosed session through the loop


def test_background_loop_thread_and_explicit_close(bucket, s3_admin):
    """The engine's shape: a loop in a thread; its owner awaits close_s3_clients() before stopping."""
    s3_admin.put_object(Bucket=bucket, Key="a", Body=b"hello")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        got = asyncio.run_coroutine_threadsafe(collect(f"s3://{bucket}/a"), loop).result(10)
        assert b"".join(got) == b"hello"
        assert any(key[0] is loop for key in _s3client._clients)
        asyncio.run_coroutine_threadsafe(_s3client.close_s3_clients(), loop).result(10)
        assert not any(key[0] is loop for key in _s3client._clients)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


FORK_SCRIPT = """
import asyncio, os, sys, threading, time
from shardstream._fetch import s3 as _s3
from shardstream._fetch import s3client as _s3client
from test_fetch_s3 import Options
url = sys.argv[1]

async def get():
    return b"".join([chunk async for chunk in _s3.s3_stream(url, options=Options())])

loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
first = asyncio.run_coroutine_threadsafe(get(), loop).result(10)
t0 = time.monotonic()
pid = os.fork()
if pid == 0:  # the child streams on its own loop, then exits normally (atexit, finalisers)
    assert asyncio.run(get()) == first and not _s3client._clients and _s3client._inherited
    sys.exit(0)
assert os.waitpid(pid, 0)[1] == 0
assert asyncio.run_coroutine_threadsafe(get(), loop).result(10) == first
asyncio.run_coroutine_threadsafe(_s3client.close_s3_clients(), loop).result(10)
print(f"ok {time.monotonic() - t0:.2f}")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_leaves_the_parents_client_alone(bucket, s3_admin):
    """A forked child (DataLoader workers) neither closes nor waits for the parent's client."""
    s3_admin.put_object(Bucket=bucket, Key="a", Body=payload(300 * KB))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)]))
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT, f"s3://{bucket}/a"], env=env,
                          capture_output=True, text=True, timeout=25)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ") and float(done.stdout.split()[1]) < 3  # no exit-time wait
    assert "nclosed" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_service_specific_endpoint_variable(bucket, s3_admin, monkeypatch, s3_env):
    s3_admin.put_object(Bucket=bucket, Key="a", Body=b"svc")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # would fail
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_env)  # takes precedence
    assert b"".join(run(lambda: collect(f"s3://{bucket}/a"))) == b"svc"


def _shard_bytes(tag: str) -> bytes:
    """A two-sample tar whose keys say which server it came from."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(2):
            info = tarfile.TarInfo(f"{tag}{i}.txt")
            info.size = len(tag)
            tar.addfile(info, io.BytesIO(tag.encode()))
    return buf.getvalue()


def _shared_loop_entries() -> dict:
    loop = get_loop()
    return {key: entry for key, entry in list(_s3client._clients.items()) if key[0] is loop}


def test_a_changed_endpoint_is_used_on_a_loop_that_outlives_it(bucket, s3_admin, monkeypatch, caplog):
    """The shared loop lives as long as the process: a client made there for one endpoint must not
    serve a later AWS_ENDPOINT_URL (a test that sets its own moto_server, after another test read
    S3 through the shared loop, got the old server). The first server's client is closed once the
    second's replaces it."""
    import boto3

    import shardstream as wds

    s3_admin.put_object(Bucket=bucket, Key="a.tar", Body=_shard_bytes("first"))
    url = f"s3://{bucket}/a.tar"
    keys = lambda: [s["__key__"] for s in wds.WebDataset(url, shardshuffle=False)]  # noqa: E731
    assert keys() == ["first0", "first1"]
    replaced = list(_shared_loop_entries().values())
    assert replaced
    with moto_server() as second:
        admin = boto3.client("s3", endpoint_url=second, region_name="us-east-1",
                             aws_access_key_id="testing", aws_secret_access_key="testing")
        admin.create_bucket(Bucket=bucket)
        admin.put_object(Bucket=bucket, Key="a.tar", Body=_shard_bytes("second"))
        admin.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL", second)
        assert keys() == ["second0", "second1"]
        # The replaced client is closed (its holder task ends after closing it), not left open.
        tasks = [entry.task for entry in replaced]
        run_coroutine(asyncio.wait(tasks, timeout=5)).result(10)
        assert all(task.done() for task in tasks)
        assert all(entry not in replaced for entry in _shared_loop_entries().values())
    assert "nclosed" not in caplog.text


def test_the_client_follows_the_aws_environment(bucket, s3_admin, monkeypatch):
    """Credentials, profile and region are read when a client is made: a change gets a new client
    (a missing profile is an error, not the cached client); an unrelated variable does not."""
    s3_admin.put_object(Bucket=bucket, Key="a", Body=b"env")

    async def body():
        first = await client_for(Options())
        monkeypatch.setenv("SHARDSTREAM_TEST_UNRELATED", "1")
        assert await client_for(Options()) is first
        clients = [first]
        for name, value in (("AWS_DEFAULT_REGION", "eu-west-1"), ("AWS_ACCESS_KEY_ID", "other")):
            with pytest.MonkeyPatch.context() as change:
                change.setenv(name, value)
                clients.append(await client_for(Options()))
        assert len({id(c) for c in clients}) == len(clients)
        assert clients[1].meta.region_name == "eu-west-1"
        with pytest.MonkeyPatch.context() as change:
            change.setenv("AWS_PROFILE", "nobody")
            with pytest.raises(ProfileNotFound):
                await client_for(Options())
        current = await client_for(Options())  # the test's environment again: a fresh client
        assert all(current is not c for c in clients)
        assert b"".join(await collect(f"s3://{bucket}/a")) == b"env"

    run(body)


def test_a_stream_keeps_a_retired_client_until_it_ends(bucket, s3_admin, monkeypatch):
    """A configuration change retires the loop's client; a stream reading through it reads on to
    the end, and the client closes when it is done (the lease)."""
    data = payload(3 * 1024 * KB)
    s3_admin.put_object(Bucket=bucket, Key="big", Body=data)

    async def body():
        stream = _s3.s3_stream(f"s3://{bucket}/big", options=Options(chunk_size=64 * KB))
        first = await stream.__anext__()
        loop = asyncio.get_running_loop()
        (old,) = [entry for entry in _s3client._clients.values() if entry.key[0] is loop]
        monkeypatch.setenv("AWS_SHARDSTREAM_TEST_MARK", "1")  # any AWS_* variable is configuration
        newer = await client_for(Options())
        assert newer is not old.ready.result() and old in _s3client._retired and not old.task.done()
        rest = [chunk async for chunk in stream]
        assert first + b"".join(rest) == data
        await asyncio.wait([old.task], timeout=5)
        assert old.task.done() and old not in _s3client._retired

    run(body)


# ---- botocore's data, read once per process ---------------------------------------------------

_CLIENT_IN_A_FRESH_PROCESS = r"""
import asyncio, json, os, sys
from botocore import loaders
from shardstream._fetch import registry
assert "shardstream._fetch.s3" not in sys.modules
url = f"s3://{sys.argv[1]}/a.tar"
if sys.argv[2] == "warm":
    registry.warm_fetchers([url])  # (what WebDataset does when it is built)
    registry._finish_warming()
from shardstream._fetch import s3 as _s3
from shardstream._fetch.options import FetchOptions
read = []
load_file = loaders.JSONFileLoader.load_file
loaders.JSONFileLoader.load_file = lambda self, path: read.append(os.path.basename(path)) or load_file(self, path)

async def main():
    chunks = [chunk async for chunk in _s3.s3_stream(url, options=FetchOptions())]
    return b"".join(chunks)

data = asyncio.run(main())
print(json.dumps({"read": read, "size": len(data)}))
"""


@pytest.mark.parametrize("warmed", [False, True], ids=["cold", "warmed"])
def test_a_warmed_process_reads_no_botocore_data_when_it_makes_its_client(bucket, s3_admin, warmed):
    # Making a client reads the S3 model, endpoints and partitions (~0.1 s); warming reads them
    # into the process's shared loader first, so the first client (and a forked worker's) finds them.
    s3_admin.put_object(Bucket=bucket, Key="a.tar", Body=payload(3000))
    child = subprocess.run([sys.executable, "-c", _CLIENT_IN_A_FRESH_PROCESS, bucket, "warm" if warmed else "cold"],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert child.returncode == 0, child.stderr[-2000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["size"] == 3000
    if warmed:
        assert result["read"] == []
    else:
        assert "service-2" in result["read"] and "endpoints" in result["read"]


def test_sessions_share_one_loader(bucket, s3_admin):
    async def two_clients():
        first = await client_for(Options())
        await _s3client.close_s3_clients()  # (the next lease makes a new client, in a new session)
        second = await client_for(Options())
        return first, second

    first, second = run(two_clients)
    assert first is not second and first._loader is second._loader


def test_botocores_debug_lines_hold_no_session_token(bucket, s3_admin, monkeypatch, caplog):
    """botocore logs each request's headers and its signed canonical request at DEBUG: with a
    root logger at DEBUG, every S3 read printed AWS_SESSION_TOKEN (the security hunt: 16 lines
    a shard). Their lines are redacted as ours are."""
    import logging

    import shardstream as wds
    from shardsets import tar_bytes

    monkeypatch.setenv("AWS_SESSION_TOKEN", "SessionTokenQQQ555")
    s3_admin.put_object(Bucket=bucket, Key="logged.tar", Body=tar_bytes([("s0.txt", b"a"), ("s1.txt", b"b")]))
    with caplog.at_level(logging.DEBUG):
        assert len(list(wds.WebDataset(f"s3://{bucket}/logged.tar", shardshuffle=False))) == 2
    botocore_lines = [r for r in caplog.records if r.name.startswith(("botocore", "aiobotocore"))]
    assert botocore_lines  # (they do log: what the test looks at)
    assert not [r.getMessage()[:200] for r in botocore_lines if "SessionTokenQQQ555" in r.getMessage()]
