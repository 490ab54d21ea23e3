"""tools/shardserver.py, seen from plain HTTP clients (http.client, urllib, aiohttp).

These tests use no shardstream code on purpose: the server is the fixed point the fetchers are
tested against, so it is checked on its own.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import random
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from shardserver import (  # noqa: E402
    ServerOptions,
    ShardServer,
    _arg_parser,
    _options_from_args,
    _options_to_argv,
    start_subprocess,
    stop_subprocess,
)

pytestmark = pytest.mark.timeout(30)

SHARD = "train-000000.tar"
SHARD_BYTES = random.Random(0).randbytes(300_000)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A served directory, plus a secret next to it and a symlink that points at the secret."""
    base = tmp_path_factory.mktemp("shardserver")
    served = base / "served"
    (served / "sub").mkdir(parents=True)
    (served / SHARD).write_bytes(SHARD_BYTES)
    (served / "sub" / "small.bin").write_bytes(b"0123456789")
    (served / "empty.bin").write_bytes(b"")
    (served / "big.bin").write_bytes(bytes(1_000_000))
    (base / "secret.txt").write_bytes(b"TOP SECRET")
    (served / "escape.txt").symlink_to(base / "secret.txt")
    (served / "inside.bin").symlink_to(served / "sub" / "small.bin")
    return served


@pytest.fixture
def server(root):
    with ShardServer(root, seed=0) as running:
        yield running


def status_of(url):
    """GET `url` with urllib; return the HTTP status, closing the response either way."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


def request(server, path, method="GET", headers=None, timeout=10.0):
    """One request on a fresh connection; returns (response, body or the exception from read)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        try:
            body = response.read()
        except (http.client.IncompleteRead, OSError) as error:
            body = error
        return response, body
    finally:
        conn.close()


# --- plain serving ----------------------------------------------------------------------------


def test_get_returns_the_file_with_validators(server):
    with urllib.request.urlopen(server.url(SHARD), timeout=10) as response:
        assert response.read() == SHARD_BYTES
        assert response.headers["Content-Length"] == str(len(SHARD_BYTES))
        assert response.headers["Accept-Ranges"] == "bytes"
        assert response.headers["ETag"].startswith('"')
        assert response.headers["Last-Modified"].endswith("GMT")
    assert server.url(SHARD) == f"{server.base_url}/{SHARD}"
    assert server.base_url == f"http://127.0.0.1:{server.port}"


def test_head_sends_headers_only(server):
    response, body = request(server, f"/{SHARD}", method="HEAD")
    assert response.status == 200 and body == b""
    assert response.headers["Content-Length"] == str(len(SHARD_BYTES))


N = len(SHARD_BYTES)
RANGE_CASES = [  # Range header, expected status, expected body, expected Content-Range
    ("bytes=0-9", 206, SHARD_BYTES[:10], f"bytes 0-9/{N}"),
    ("bytes=299990-", 206, SHARD_BYTES[299990:], f"bytes 299990-299999/{N}"),
    ("bytes=-5", 206, SHARD_BYTES[-5:], f"bytes 299995-299999/{N}"),
    ("bytes=-999999", 206, SHARD_BYTES, f"bytes 0-299999/{N}"),
    ("bytes=100-999999", 206, SHARD_BYTES[100:], f"bytes 100-299999/{N}"),
    ("bytes=300000-", 416, None, f"bytes */{N}"),
    ("bytes=-0", 416, None, f"bytes */{N}"),
    ("bytes=9-0", 200, SHARD_BYTES, None),  # invalid: ignored
    ("bytes=0-1,5-6", 200, SHARD_BYTES, None),  # multi-range: ignored
    ("items=0-1", 200, SHARD_BYTES, None),  # unknown unit: ignored
]


@pytest.mark.parametrize(
    ("range_header", "status", "expected", "content_range"),
    [pytest.param(*case, id=case[0]) for case in RANGE_CASES],
)
def test_range_requests(server, range_header, status, expected, content_range):
    response, body = request(server, f"/{SHARD}", headers={"Range": range_header})
    assert response.status == status
    assert response.headers.get("Content-Range") == content_range
    if expected is not None:
        assert body == expected
        assert int(response.headers["Content-Length"]) == len(expected)


def test_empty_file(server):
    response, body = request(server, "/empty.bin")
    assert (response.status, body) == (200, b"")
    response, _ = request(server, "/empty.bin", headers={"Range": "bytes=0-"})
    assert response.status == 416


def test_missing_file_and_directory_are_404(server):
    assert request(server, "/nope.tar")[0].status == 404
    assert request(server, "/sub")[0].status == 404
    assert request(server, "/")[0].status == 404


@pytest.mark.parametrize(
    "raw_path",
    [
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "/sub/..%2f..%2fsecret.txt",
        "//etc/passwd",
        "/%2fetc/passwd",
        "/escape.txt",  # a symlink to ../secret.txt
    ],
)
def test_paths_cannot_leave_the_root(server, raw_path):
    response, body = request(server, raw_path)
    assert response.status in (403, 404)
    assert b"SECRET" not in body and b"root:" not in body


def test_symlink_inside_the_root_is_served(server):
    assert request(server, "/inside.bin")[1] == b"0123456789"


# --- pacing -----------------------------------------------------------------------------------


def test_latency_delays_the_first_byte(server):
    server.options.latency_ms = 200
    began = time.monotonic()
    assert request(server, "/sub/small.bin")[1] == b"0123456789"
    assert time.monotonic() - began >= 0.2


def test_bandwidth_caps_the_rate(server):
    server.options.bandwidth = 2e6
    began = time.monotonic()
    assert request(server, "/big.bin")[1] == bytes(1_000_000)
    assert time.monotonic() - began >= 0.45  # 1 MB at 2 MB/s


# --- faults -----------------------------------------------------------------------------------


def test_status_fault(server):
    server.options = replace(server.options, status_rate=1.0, status_code=502)
    response, _ = request(server, f"/{SHARD}")
    assert response.status == 502
    assert server.stats.faults["status"] == 1


def test_throttle_fault_sends_retry_after(server):
    server.options.throttle_rate = 1.0
    server.options.retry_after = 7
    response, _ = request(server, f"/{SHARD}", headers={"Range": "bytes=0-99"})
    assert response.status == 429
    assert response.headers["Retry-After"] == "7"


def test_reset_fault_is_a_connection_error_after_part_of_the_body(server):
    server.options.reset_rate = 1.0
    server.options.cut_fraction = 0.5
    response, body = request(server, f"/{SHARD}")
    assert response.status == 200
    assert isinstance(body, (ConnectionResetError, http.client.IncompleteRead))
    assert server.stats.faults["reset"] == 1


def test_reset_fault_seen_by_aiohttp(server):
    server.options.reset_rate = 1.0

    async def fetch():
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url(SHARD), headers={"Range": "bytes=1000-"}) as response:
                assert response.status == 206
                await response.read()

    with pytest.raises(aiohttp.ClientPayloadError):
        asyncio.run(fetch())


def test_truncate_fault_is_a_short_body(server):
    server.options.truncate_rate = 1.0
    server.options.cut_fraction = 0.25
    response, body = request(server, f"/{SHARD}")
    assert response.headers["Content-Length"] == str(len(SHARD_BYTES))
    assert isinstance(body, http.client.IncompleteRead)
    assert body.partial == SHARD_BYTES[: len(SHARD_BYTES) // 4]


def test_wrong_length_fault_promises_more_than_it_sends(server):
    server.options.wrong_length_rate = 1.0
    response, body = request(server, "/sub/small.bin", headers={"Range": "bytes=2-5"})
    assert response.status == 206
    assert int(response.headers["Content-Length"]) > 4
    assert isinstance(body, http.client.IncompleteRead) and body.partial == b"2345"


def test_stall_fault_trips_a_client_read_timeout(server):
    server.options.stall_rate = 1.0
    server.options.stall_seconds = 5.0
    server.options.cut_fraction = 0.5
    began = time.monotonic()
    response, body = request(server, f"/{SHARD}", timeout=0.5)
    assert response.status == 200
    assert isinstance(body, TimeoutError)
    assert time.monotonic() - began < 4


def test_stall_fault_then_resumes(server):
    server.options.stall_rate = 1.0
    server.options.stall_seconds = 0.3
    began = time.monotonic()
    assert request(server, f"/{SHARD}")[1] == SHARD_BYTES
    assert time.monotonic() - began >= 0.3


def test_head_requests_get_no_body_faults(server):
    server.options.truncate_rate = 1.0
    response, _ = request(server, f"/{SHARD}", method="HEAD")
    assert response.status == 200
    assert server.stats.faults == {}


def test_fail_first_schedule(server):
    server.options.fail_first = {SHARD: 2}
    statuses = [request(server, f"/{SHARD}")[0].status for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert request(server, "/sub/small.bin")[0].status == 200
    assert request(server, "/nope.tar")[0].status == 404  # refusals use up no scheduled fault
    server.options.fail_first_fault = "throttle"
    server.options.fail_first = {SHARD: 1, "nope.tar": 1}  # assigning restarts the schedule
    assert request(server, f"/{SHARD}")[0].status == 429
    assert request(server, f"/{SHARD}")[0].status == 200


def test_seeded_faults_repeat(root):
    def statuses():
        with ShardServer(root, status_rate=0.5, seed=42) as srv:
            return [request(srv, "/sub/small.bin")[0].status for _ in range(12)]

    first = statuses()
    assert first == statuses()
    assert {200, 503} == set(first)


# --- credentials --------------------------------------------------------------------------------


def test_token_is_required_and_never_echoed(server):
    server.options.require_token = "s3cret"
    response, body = request(server, "/sub/small.bin?token=guess-123")
    assert response.status == 403 and b"guess-123" not in body and b"s3cret" not in body
    assert request(server, "/sub/small.bin")[0].status == 403
    with urllib.request.urlopen(server.url("sub/small.bin", token="s3cret"), timeout=10) as ok:
        assert ok.read() == b"0123456789"


def test_basic_auth(server):
    server.options.basic_auth = ("user", "pw")
    response, _ = request(server, "/sub/small.bin")
    assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Basic")
    good = "Basic " + base64.b64encode(b"user:pw").decode()
    assert request(server, "/sub/small.bin", headers={"Authorization": good})[1] == b"0123456789"


# --- options, stats, lifecycle -------------------------------------------------------------------


def test_options_are_validated_on_every_assignment():
    with pytest.raises(ValueError):
        ServerOptions(reset_rate=1.5)
    with pytest.raises(ValueError):
        ServerOptions(reset_rate=0.6, stall_rate=0.6)
    with pytest.raises(ValueError):
        ServerOptions(status_code=404)
    options = ServerOptions()
    with pytest.raises(ValueError):
        options.latency_ms = -1
    with pytest.raises(ValueError):
        options.fail_first_fault = "explode"
    with pytest.raises(AttributeError):
        options.fail_rate = 0.1
    options.fail_first = {"/a.tar": 1}
    assert dict(options.fail_first) == {"a.tar": 1}
    with pytest.raises(TypeError):
        options.fail_first["b.tar"] = 1  # type: ignore[index]


def test_stats_count_requests_bytes_and_statuses(server):
    request(server, f"/{SHARD}")
    request(server, f"/{SHARD}", headers={"Range": "bytes=0-99"})
    request(server, f"/{SHARD}", headers={"Range": "bytes=7-7"})  # a client asking for the size
    request(server, f"/{SHARD}", method="HEAD")
    request(server, "/nope")  # (no body last: a body is counted after the write, which the client may see first)
    stats = server.stats.snapshot()
    assert stats.requests == 5 and stats.range_requests == 2 and stats.head_requests == 1
    assert stats.bytes_sent == len(SHARD_BYTES) + 100 + 1
    assert stats.path_requests == {SHARD: 4, "nope": 1}
    assert stats.size_probes == {SHARD: 1} and stats.fetches == {SHARD: 3, "nope": 1}
    assert stats.statuses == {200: 2, 206: 2, 404: 1}
    assert stats.faults == {}


def test_options_round_trip_through_the_command_line():
    options = ServerOptions(
        latency_ms=12.5,
        bandwidth=25e6,
        seed=3,
        reset_rate=0.25,
        stall_abort=True,
        fail_first={"a.tar": 2, "b/c.tar": 1},
        basic_auth=("u", "p:w"),
        require_token="t",
    )
    args = _arg_parser().parse_args(["ROOT", *_options_to_argv(options)])
    assert _options_from_args(args) == options


def test_no_threads_leak_after_exit(root):
    before = set(threading.enumerate())
    with ShardServer(root) as srv:
        assert request(srv, "/sub/small.bin")[1] == b"0123456789"
        port = srv.port
    assert set(threading.enumerate()) == before
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_close_does_not_wait_for_a_stalled_response(root):
    srv = ShardServer(root, stall_rate=1.0, stall_seconds=30).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("GET", f"/{SHARD}")
    conn.getresponse()
    began = time.monotonic()
    srv.close()
    conn.close()
    assert time.monotonic() - began < 5


def test_subprocess_prints_ready_and_stops_on_sigterm(root):
    proc, base_url = start_subprocess(root, require_token="t", fail_first={"sub/small.bin": 1})
    try:
        assert base_url.startswith("http://127.0.0.1:")
        assert status_of(f"{base_url}/sub/small.bin") == 403
        assert status_of(f"{base_url}/sub/small.bin?token=t") == 503
        with urllib.request.urlopen(f"{base_url}/sub/small.bin?token=t", timeout=10) as response:
            assert response.read() == b"0123456789"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop_subprocess(proc)
