"""A real S3 endpoint for tests: moto's server in a subprocess on 127.0.0.1 (no in-process mocks).

Fixtures (import them into a test module):
    moto_endpoint: session-scoped; starts the server once, yields its URL, terminates it.
    s3_env: per test; points the standard AWS configuration (AWS_ENDPOINT_URL, fake
        credentials, region) at the server, isolated from the user's ~/.aws files.
    s3_admin: per test; a sync boto3 client on the server, for creating buckets and objects.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Iterator, Optional

import pytest

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never wait for an instance-metadata lookup
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# `python -m moto.server` with one fix: moto sends "server: amazon.com" and werkzeug adds its own
# "Server:" header, a pair that strict HTTP parsers reject (aiohttp's pure-Python parser, which it
# uses under PYTHONASYNCIODEBUG=1 or -X dev, fails every moto error reply). Keep moto's.
_LAUNCH = """
import http.server, sys
from moto.server import main
_send_header = http.server.BaseHTTPRequestHandler.send_header
def send_header(self, keyword, value):
    if keyword != "Server":
        _send_header(self, keyword, value)
http.server.BaseHTTPRequestHandler.send_header = send_header
main(sys.argv[1:])
"""


def _command(port: int) -> list:
    return [sys.executable, "-c", _LAUNCH, "-H", "127.0.0.1", "-p", str(port)]


@contextlib.contextmanager
def moto_server(timeout: float = 30.0, pids: Optional[list] = None) -> Iterator[str]:
    """Start moto_server on a free port, wait until it answers, yield its URL, then stop it. The
    server's pid is appended to `pids` when given (the benchmarks measure its CPU)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Werkzeug logs every request: a file, not a pipe nobody drains (a full pipe blocks the server).
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            _command(port), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"moto_server exited with {proc.returncode}: {log.read()[-2000:]!r}")
                try:
                    with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"moto_server did not answer on {url} within {timeout}s")
                    time.sleep(0.1)
            if pids is not None:
                pids.append(proc.pid)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch, tmp_path) -> str:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config-absent"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials-absent"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


@pytest.fixture
def s3_admin(moto_endpoint):
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    yield client
    client.close()
