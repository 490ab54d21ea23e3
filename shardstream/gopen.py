"""webdataset's `gopen`: open a URL as a binary stream.

Local paths and file: URLs open directly; http(s) and s3 read through shardstream's async
fetchers (retries, Range resume); `pipe:` runs a shell command only when enabled
(`shardstream.allow_pipe(True)`, `SHARDSTREAM_ALLOW_PIPE=1` or `allow_pipe=True`); every other
scheme goes through fsspec (gs, memory, ...), unless a handler is registered in `gopen_schemes`
for it, as webdataset allows.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from typing import IO, Any, Callable, Dict
from urllib.parse import urlparse

from ._errors import FetchError, UsageError
from ._open import local_path_of, open_url, pipe_allowed

__all__ = ["StreamReader", "gopen", "gopen_schemes", "reader", "rewrite_url"]


def _gopen_pipe_write(url: str, bufsize: int) -> IO[bytes]:
    proc = subprocess.Popen(url[5:], shell=True, stdin=subprocess.PIPE, bufsize=bufsize)
    return _PipeWriter(proc, url)  # type: ignore[return-value]


class _PipeWriter:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def write(self, data: bytes) -> int:
        return self.proc.stdin.write(data)  # type: ignore[union-attr]

    def flush(self) -> None:
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        status = self.proc.wait()
        if status != 0:
            raise FetchError(f"pipe command exited with status {status}", url=self.url)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StreamReader(io.RawIOBase):
    """A read-only binary file over a fetch stream (http(s) and s3: retries, Range resume)."""

    def __init__(self, url: str) -> None:
        from ._fetch import open_stream

        super().__init__()
        self.name = url
        self._stream = open_stream(url)
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._chunk:
            chunk = next(self._stream, None)
            if chunk is None:
                return 0
            self._chunk = memoryview(chunk)
        n = min(len(buffer), len(self._chunk))
        buffer[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


def _default_handler(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    allow = kw.pop("allow_pipe", None)
    if mode == "rb":
        if url.startswith(("http://", "https://", "s3://")):
            return io.BufferedReader(StreamReader(url), buffer_size=max(bufsize, 1 << 20))
        return open_url(url, allow_pipe=allow)
    if url.startswith("pipe:"):
        if not pipe_allowed(allow):
            raise UsageError("pipe: URLs are off by default; enable with shardstream.allow_pipe(True)", url=url)
        return _gopen_pipe_write(url, bufsize)
    path = local_path_of(url)
    if path is not None:
        return open(path, mode)
    import fsspec

    return fsspec.open(url, mode).open()


# Scheme -> opener(url, mode, bufsize, **kw). Users may register their own, as with webdataset.
gopen_schemes: Dict[str, Callable[..., IO[bytes]]] = {"__default__": _default_handler}


def rewrite_url(url: str) -> str:
    """Apply GOPEN_REWRITE="prefix=replacement;..." like webdataset."""
    rules = os.environ.get("GOPEN_REWRITE")
    if not rules:
        return url
    for rule in rules.split(";"):
        k, v = rule.split("=", 1)
        new = re.sub("^" + k, v, url)
        if new != url:
            return new
    return url


def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    """Open `url` for reading ("rb") or writing ("wb"); "-" is stdin/stdout."""
    assert mode in ("rb", "wb"), mode
    if url == "-":
        return sys.stdin.buffer if mode == "rb" else sys.stdout.buffer
    url = rewrite_url(url)
    scheme = urlparse(url).scheme
    handler = gopen_schemes.get(scheme) if scheme else None
    if handler is None:
        handler = gopen_schemes["__default__"]
    return handler(url, mode, bufsize, **kw)


def reader(url: str, **kw: Any) -> IO[bytes]:
    """Open `url` for reading."""
    return gopen(url, "rb", **kw)
