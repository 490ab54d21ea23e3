"""Synchronous byte sources for a shard URL: local files, `pipe:` commands (opt-in), any fsspec
URL, and the openers a user put in webdataset's `gopen_schemes`. Errors are translated into the
shardstream error tree here, at the boundary.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import IO, Any, Callable, Iterator, Mapping, Optional
from urllib.parse import urlparse
from urllib.request import url2pathname

from .._base.errors import FetchError, ShardNotFound, ShardStreamError, UsageError, safe_cause
from .._base.redact import redact
from .._base.security import enforced

__all__ = ["allow_pipe", "pipe_switch", "iter_chunks", "local_path_of", "open_fsspec", "open_url", "open_writable", "pipe_allowed",
           "use_gopen_schemes", "user_opener"]

CHUNK_SIZE = 1 << 20
_PIPE_ENV = "SHARDSTREAM_ALLOW_PIPE"
_pipe_switch: Optional[bool] = None
_switch_lock = threading.Lock()


def allow_pipe(enabled: bool = True) -> None:
    """Allow (or forbid again) `pipe:` URLs, which run a shell command, in this process."""
    global _pipe_switch
    with _switch_lock:
        _pipe_switch = bool(enabled)


def pipe_switch() -> Optional[bool]:
    """What allow_pipe() set in this process (None: never called, the environment decides)."""
    return _pipe_switch


def pipe_allowed(override: Optional[bool] = None) -> bool:
    """Whether `pipe:` URLs may run: the explicit argument, else allow_pipe(), else the env var."""
    if override is not None:
        return bool(override)
    if _pipe_switch is not None:
        return _pipe_switch
    return os.environ.get(_PIPE_ENV, "0").lower() in ("1", "true", "yes")


# webdataset's `gopen_schemes` (the `gopen` module's dict, handed over when it is imported):
# scheme (or "__default__": every other scheme) -> opener(url, mode, bufsize). An opener a user
# puts there reads that scheme's shards everywhere shardstream reads them (the loader, counts, the
# CLI), as webdataset's loader uses it; entries marked `shardstream_default` mean our own way.
_gopen_schemes: Mapping[str, Callable[..., Any]] = {}


def use_gopen_schemes(schemes: Mapping[str, Callable[..., Any]]) -> None:
    """Consult `schemes` (kept, not copied: later changes count) for the openers of users."""
    global _gopen_schemes
    _gopen_schemes = schemes


def user_opener(url: str) -> Optional[Callable[..., Any]]:
    """The opener a user registered in `gopen_schemes` for `url`'s scheme, else None."""
    if ":" not in url:
        return None  # (a plain path, quickly)
    scheme = urlparse(url).scheme
    if scheme in ("", "file") or len(scheme) == 1:  # (a Windows drive letter)
        return None
    schemes = _gopen_schemes
    entry = schemes.get(scheme, schemes.get("__default__"))
    return None if entry is None or getattr(entry, "shardstream_default", False) else entry


def local_path_of(url: str) -> Optional[str]:
    """The filesystem path for a plain path or file: URL, else None."""
    if url.startswith("file:"):
        return url2pathname(urlparse(url).path)
    if "://" in url or url.startswith("pipe:") or url == "-":
        return None
    return url


class _PipeReader:
    """A file-like view of a shell command's stdout that checks the exit status on close."""

    def __init__(self, url: str, cmd: str) -> None:
        self.url = url
        self.proc: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
            cmd, shell=True, stdout=subprocess.PIPE, bufsize=CHUNK_SIZE
        )
        assert self.proc.stdout is not None
        self.stdout: IO[bytes] = self.proc.stdout

    def read(self, n: int = -1) -> bytes:
        return self.stdout.read(n)

    def close(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        self.stdout.close()
        status = proc.wait()
        # 141 is SIGPIPE: the reader stopped early, which is not the command's failure.
        if status not in (0, 141, -13):
            raise FetchError(f"pipe command exited with status {status}", url=self.url)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_url(url: str, *, allow_pipe: Optional[bool] = None, mode: str = "rb") -> IO[bytes]:
    """Open `url` for binary reading; raise ShardNotFound / FetchError / UsageError."""
    if url == "-":
        return sys.stdin.buffer
    opener = user_opener(url)
    if opener is not None:
        return _open_with(opener, url, mode)
    if url.startswith("pipe:"):
        if enforced():
            raise UsageError("gopen_pipe: unsafe_gopen is False, cannot open pipe URLs", url=url)
        if not pipe_allowed(allow_pipe):
            raise UsageError(
                "pipe: URLs run a shell command and are off by default; enable them with "
                f"shardstream.allow_pipe(True) or {_PIPE_ENV}=1",
                url=url,
            )
        return _PipeReader(url, url[5:])  # type: ignore[return-value]
    path = local_path_of(url)
    try:
        if path is not None:
            return open(path, mode, buffering=0)
        return open_fsspec(url, mode)
    except FileNotFoundError as exn:
        raise ShardNotFound("shard not found", url=url) from exn
    except (UsageError, FetchError):
        raise
    except OSError as exn:
        raise FetchError(f"cannot open shard: {exn}", url=url) from safe_cause(exn)
    except (ValueError, ImportError) as exn:  # fsspec: an unknown protocol, one whose package is missing
        raise UsageError(f"cannot open shard: {exn}", url=url) from safe_cause(exn)


class _Holding:
    """A file-like that keeps what it was opened from alive (see `open_fsspec`)."""

    def __init__(self, stream: Any, keep: Any) -> None:
        self._stream, self._keep = stream, keep

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __iter__(self) -> Any:
        return iter(self._stream)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()


def open_fsspec(url: str, mode: str) -> IO[bytes]:
    """fsspec's file for `url`, holding on to its `OpenFile`: fsspec closes a chained URL's
    file (`zip://a.tar::file:///d/z.zip`, `simplecache::s3://...`) when that is collected."""
    import fsspec

    opened = fsspec.open(url, mode)
    stream = opened.open()
    try:
        stream._shardstream_opened_from = opened
    except AttributeError:  # (a file type without a __dict__)
        return _Holding(stream, opened)  # type: ignore[return-value]
    return stream


def open_writable(url: str, mode: str = "wb") -> IO[bytes]:
    """Open a path, `file:` URL or any writable fsspec URL (s3://, gs://, memory://) for writing.

    Raises:
        UsageError: an http(s) URL (no upload here), an unknown protocol, a missing package.
    """
    path = local_path_of(url)
    if path is not None:
        return open(path, mode)
    if url.lower().startswith(("http://", "https://")):
        raise UsageError(f"cannot write to an http(s) URL (webdataset uploads with `curl -T`: write to "
                         f"'pipe:curl -s -T - {redact(url)}', with pipes enabled, or to s3://, gs://, a path)", url=url)
    try:
        return open_fsspec(url, mode)
    except (ValueError, ImportError, NotImplementedError) as exn:  # (an unknown protocol, a missing package)
        raise UsageError(f"cannot write there: {type(exn).__name__}: {exn}", url=url) from None


def _open_with(opener: Callable[..., Any], url: str, mode: str) -> IO[bytes]:
    try:
        return opener(url, mode, 8192)
    except FileNotFoundError as exn:
        missing = exn.filename
        if isinstance(missing, str) and missing and "/" not in missing and missing not in urlparse(url).path:
            # (the opener's command is not installed: no missing shard, which handlers skip)
            raise UsageError(f"the opener in gopen_schemes for this URL runs {missing!r}, which is not installed "
                             "(or not on PATH)", url=url) from safe_cause(exn)
        raise ShardNotFound("shard not found", url=url) from safe_cause(exn)
    except (UsageError, FetchError):
        raise
    except OSError as exn:
        raise FetchError(f"cannot open shard with the opener in gopen_schemes: {exn}", url=url) from safe_cause(exn)


def iter_chunks(
    url: str, *, chunk_size: int = CHUNK_SIZE, allow_pipe: Optional[bool] = None, start: int = 0
) -> Iterator[bytes]:
    """Yield the bytes of `url` from byte `start` in chunks; the source is closed when the
    generator ends or is closed. Unseekable sources (pipes) read and drop the first bytes."""
    stream = open_url(url, allow_pipe=allow_pipe)
    try:
        read = stream.read
        if start:
            try:
                stream.seek(start)
            except (AttributeError, OSError, ValueError):
                left = start
                while left > 0:
                    dropped = read(min(left, chunk_size))
                    if not dropped:
                        break
                    left -= len(dropped)
        while True:
            try:
                chunk = read(chunk_size)
            except ShardStreamError:
                raise
            except Exception as exn:  # (an fsspec file system's own: zip's, an archive's ValueError)
                raise FetchError(f"read failed: {type(exn).__name__}: {exn}", url=url) from safe_cause(exn)
            if not chunk:
                break
            yield chunk
    finally:
        if url != "-":
            stream.close()
