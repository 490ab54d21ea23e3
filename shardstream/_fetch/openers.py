"""webdataset's named openers, `opener(url, mode="rb", bufsize=8192)`, for code that calls them or
registers them in `gopen.gopen_schemes`.

They behave as webdataset's, with three differences: `gopen_curl` reads http(s) through
shardstream's fetcher (retries, Range resume; the bytes are the same) and runs `curl` only for
its other schemes and for uploads; `gopen_htgs` reads `htgs://bucket/path` over HTTPS from
storage.googleapis.com (webdataset hands `gs://` to curl, which cannot fetch it); `gopen_hf`
reads through huggingface_hub's filesystem instead of curl with a token. Command-line tools run
with a fixed argument list, never through a shell; only `gopen_pipe` runs a shell command, and
only when pipes are enabled.
"""

from __future__ import annotations

import io
import re
from typing import IO, Any

from .._base.errors import UsageError
from .pipe import Pipe, open_pipe
from .._base.security import enforced

__all__ = [
    "StreamReader",
    "gopen_ais",
    "gopen_curl",
    "gopen_error",
    "gopen_file",
    "gopen_gsutil",
    "gopen_hf",
    "gopen_htgs",
    "gopen_pipe",
    "open_http",
]

_CURL_READ = ["curl", "--connect-timeout", "30", "--retry", "30", "--retry-delay", "2", "-f", "-s", "-L"]


class StreamReader(io.RawIOBase):
    """A read-only binary file over a fetch stream (http(s) and s3: retries, Range resume)."""

    def __init__(self, url: str) -> None:
        from .stream import open_stream

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


def open_http(url: str, bufsize: int = 8192) -> IO[bytes]:
    """A buffered reader over an http(s) or s3 URL, fetched by shardstream's clients."""
    return io.BufferedReader(StreamReader(url), buffer_size=max(bufsize, 1 << 20))  # type: ignore[return-value]


def _unknown_mode(mode: str) -> ValueError:
    return ValueError(f"{mode}: unknown mode")


def gopen_file(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[bytes]:
    """Open a local path or file: URL."""
    if enforced():
        raise UsageError("gopen: unsafe_gopen is False, cannot open local files", url=url)
    if url.startswith("file:"):
        url = re.sub(r"^file://?", "", url)
    return open(url, mode)


def gopen_pipe(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Run a `pipe:` URL's shell command (only when pipes are enabled)."""
    return open_pipe(url, mode, bufsize)


def gopen_curl(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[bytes]:
    """Read a URL (http(s) with shardstream's fetcher, other schemes with curl) or upload with curl PUT."""
    if mode[0] == "r":
        if url.startswith(("http://", "https://")):
            return open_http(url, bufsize)
        return Pipe([*_CURL_READ, url], mode=mode, bufsize=bufsize, ignore_status=[141, 23])  # type: ignore[return-value]
    if mode[0] == "w":
        cmd = ["curl", "-f", "-s", "-X", "PUT", "-L", "-T", "-", url]
        return Pipe(cmd, mode=mode, bufsize=bufsize, ignore_status=[141, 26])  # type: ignore[return-value]
    raise _unknown_mode(mode)


def gopen_htgs(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[bytes]:
    """Read `htgs://bucket/path`: a public Google Cloud Storage object over HTTPS."""
    if mode[0] == "r":
        return open_http(re.sub(r"(?i)^htgs://", "https://storage.googleapis.com/", url), bufsize)
    if mode[0] == "w":
        raise ValueError(f"{mode}: cannot write")
    raise _unknown_mode(mode)


def gopen_hf(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[bytes]:
    """Read an `hf://` URL through huggingface_hub (its token, if one is configured)."""
    if mode[0] == "r":
        from huggingface_hub import HfFileSystem

        return HfFileSystem().open(url, "rb", block_size=max(bufsize, 1 << 20))
    if mode[0] == "w":
        raise ValueError(f"{mode}: cannot write")
    raise _unknown_mode(mode)


def _tool(read_cmd: list, write_cmd: list, mode: str, bufsize: int) -> Any:
    if mode[0] == "r":
        return Pipe(read_cmd, mode=mode, bufsize=bufsize, ignore_status=[141, 23])
    if mode[0] == "w":
        return Pipe(write_cmd, mode=mode, bufsize=bufsize, ignore_status=[141, 26])
    raise _unknown_mode(mode)


def gopen_gsutil(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read or write a `gs://` URL with the `gsutil` command."""
    return _tool(["gsutil", "cat", url], ["gsutil", "cp", "-", url], mode, bufsize)


def gopen_ais(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read or write an AIStore URL with the `ais` command."""
    return _tool(["ais", "get", url, "-"], ["ais", "put", "-", url], mode, bufsize)


def gopen_error(url: str, *args: Any, **kw: Any) -> IO[bytes]:
    """The handler for schemes nobody handles: always raises."""
    raise UsageError(f"{url}: no gopen handler defined")


# (ours, in gopen_schemes by default: a fetcher registered for their scheme takes over from them)
gopen_htgs.shardstream_builtin = True  # type: ignore[attr-defined]
gopen_ais.shardstream_builtin = True  # type: ignore[attr-defined]
