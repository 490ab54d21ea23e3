"""The servers of the remote workloads, each in its own process, started once by `run.py`.

- `http_server`: `tools/shardserver.py` (aiohttp) serving the corpus folder with a time to first byte
  and a per-connection bandwidth cap.
- `s3_server`: moto's S3 server (`tests/motoserver.py`), with the corpus uploaded by boto3 into one
  bucket, and the environment that points a child's AWS configuration at it.

Both are context managers that stop their server on the way out, errors and Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
HTTP_LATENCY_MS = 50
HTTP_BANDWIDTH = 25e6  # bytes/s per connection
S3_BUCKET = "shardstream-bench"

__all__ = ["HTTP_BANDWIDTH", "HTTP_LATENCY_MS", "Remote", "http_server", "s3_server"]


def _import_from(folder: str, module: str):
    path = str(ROOT / folder)
    if path not in sys.path:
        sys.path.insert(0, path)
    return __import__(module)


class Remote:
    """Where a source's shards are: their URLs, environment variables for the child (None: unset),
    and the pid of the server process (None: local files), whose CPU the child measures per pass."""

    def __init__(self, urls: list[str], env: Optional[dict[str, Optional[str]]] = None,
                 pid: Optional[int] = None) -> None:
        self.urls = urls
        self.env = env or {}
        self.pid = pid


@contextlib.contextmanager
def http_server(paths: list[str], *, latency_ms: float = HTTP_LATENCY_MS,
                bandwidth: float = HTTP_BANDWIDTH) -> Iterator[Remote]:
    """Serve the folder of `paths` (the corpus shards) over HTTP from a subprocess; yield their URLs."""
    shardserver = _import_from("tools", "shardserver")
    folder = Path(paths[0]).parent
    proc, base_url = shardserver.start_subprocess(folder, latency_ms=latency_ms, bandwidth=bandwidth)
    try:
        yield Remote([f"{base_url}/{Path(p).relative_to(folder).as_posix()}" for p in paths], pid=proc.pid)
    finally:
        shardserver.stop_subprocess(proc)


def s3_env(endpoint: str, scratch: str) -> dict[str, Optional[str]]:
    """The standard AWS configuration pointed at `endpoint`, isolated from the user's ~/.aws files."""
    motoserver = _import_from("tests", "motoserver")
    env: dict[str, Optional[str]] = dict(motoserver.FAKE_ENV)
    env.update({name: None for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3",
                                        "AWS_CA_BUNDLE")})
    env["AWS_CONFIG_FILE"] = os.path.join(scratch, "aws-config-absent")
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.path.join(scratch, "aws-credentials-absent")
    env["AWS_ENDPOINT_URL"] = endpoint
    return env


@contextlib.contextmanager
def s3_server(paths: list[str], bucket: str = S3_BUCKET) -> Iterator[Remote]:
    """Start moto's S3 server, upload `paths` into `bucket` under their file names, yield their URLs."""
    import boto3

    motoserver = _import_from("tests", "motoserver")
    pids: list[int] = []
    with motoserver.moto_server(pids=pids) as endpoint, tempfile.TemporaryDirectory(prefix="bench-aws-") as scratch:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        try:
            client.create_bucket(Bucket=bucket)
            for path in paths:
                with open(path, "rb") as body:
                    client.put_object(Bucket=bucket, Key=Path(path).name, Body=body)
        finally:
            client.close()
        yield Remote([f"s3://{bucket}/{Path(p).name}" for p in paths], s3_env(endpoint, scratch),
                     pid=pids[0])

