"""webdataset's `cache` module: shard downloads into a local cache directory.

Divergence: cache file names are derived from the whole URL (a hash prefix plus the basename),
so shards with the same basename from different directories or hosts never collide, and a
download goes to a temp file that is renamed into place only when complete and valid.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterable, Iterator, Optional
from urllib.parse import urlparse

from ._cache.naming import _pipe_url, cache_file_name
from ._base.errors import FormatError
from ._cache.filetype import check_tar_format, get_filetype, magic_filetype
from ._fetch.open import iter_chunks, local_path_of
from .handlers import reraise_exception
from .utils import obsolete

__all__ = [
    "FileCache",
    "LRUCleanup",
    "StreamingOpen",
    "check_tar_format",
    "default_cache_dir",
    "default_cache_size",
    "download",
    "get_filetype",
    "islocal",
    "magic_filetype",
    "obsolete",
    "pipe_cleaner",
    "url_to_cache_name",
    "url_to_cache_path",
    "verbose_cache",
]

default_cache_dir = os.environ.get("WDS_CACHE", "./_cache")
default_cache_size = float(os.environ.get("WDS_CACHE_SIZE", "1e18"))
verbose_cache = int(os.environ.get("WDS_VERBOSE_CACHE", "0"))  # webdataset's; read by nothing there either


def islocal(url: str) -> bool:
    return urlparse(url).scheme in ("", "file") and not url.startswith("pipe:")


def pipe_cleaner(spec: str) -> str:
    """For `pipe:curl ... URL` specs, the URL inside; else the spec."""
    return _pipe_url(spec)


def url_to_cache_name(url: str, ndir: int = 0) -> str:
    """webdataset's naming: the last ndir+1 path components (collides across directories)."""
    assert isinstance(url, str)
    parsed = urlparse(url)
    if parsed.scheme in (None, "", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais"):
        parts = parsed.path.lstrip("/").split("/")
        return "/".join(parts[-1 - ndir :])
    return urllib.parse.quote(url, safe="_+{}*,-")[-128:]


def url_to_cache_path(url: str) -> str:
    """shardstream's naming: a digest of the whole URL, then the basename (the disk tier's)."""
    return cache_file_name(url)


class LRUCleanup:
    """Delete the oldest files in a directory until it is under a byte bound."""

    def __init__(self, cache_dir=None, cache_size=int(1e12), keyfn=os.path.getctime, verbose=False, interval=30):
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.keyfn = keyfn
        self.verbose = verbose
        self.interval = interval
        self.last_run = 0.0

    def set_cache_dir(self, cache_dir):
        self.cache_dir = cache_dir

    def cleanup(self):
        if self.cache_dir is None or not os.path.exists(self.cache_dir):
            return
        if self.interval is not None and time.time() - self.last_run < self.interval:
            return
        try:
            files = [os.path.join(d, f) for d, _, fs in os.walk(self.cache_dir) for f in fs]
            total = sum(os.path.getsize(f) for f in files)
            files.sort(key=self.keyfn, reverse=True)
            while files and total > self.cache_size:
                fname = files.pop()
                total -= os.path.getsize(fname)
                os.remove(fname)
        except OSError:
            pass
        self.last_run = time.time()


def download(url: str, dest: str, chunk_size: int = 1 << 20, verbose: bool = False) -> None:
    """Copy `url` to `dest` through a temp file renamed into place when complete."""
    temp = f"{dest}.temp{os.getpid()}"
    try:
        with open(temp, "wb") as f:
            for chunk in iter_chunks(url, chunk_size=chunk_size):
                f.write(chunk)
        os.replace(temp, dest)
    finally:
        if os.path.exists(temp):
            os.remove(temp)


class StreamingOpen:
    """dict(url=...) in, dict(url, stream[, local_path]) out, with no caching."""

    def __init__(self, verbose=False, handler=reraise_exception):
        self.verbose = verbose
        self.handler = handler

    def __call__(self, urls):
        from .gopen import gopen

        for url in urls:
            if isinstance(url, dict):
                url = url["url"]
            try:
                path = local_path_of(url)
                if path is not None:
                    yield dict(url=url, stream=open(path, "rb"), local_path=path)
                else:
                    yield dict(url=url, stream=gopen(url))
            except Exception as exn:
                if self.handler(exn):
                    continue
                break


class FileCache:
    """Download remote shards into `cache_dir` once, then open the local copy."""

    def __init__(self, cache_dir: Optional[str] = None, *, url_to_name: Callable[[str], str] = url_to_cache_path,
                 verbose: bool = False, validator: Optional[Callable[[str], bool]] = check_tar_format,
                 handler: Callable = reraise_exception, cache_size: int = -1, cache_cleanup_interval: int = 30):
        self.url_to_name = url_to_name
        self.validator = validator
        self.handler = handler
        self.cache_dir = default_cache_dir if cache_dir is None else cache_dir
        self.verbose = verbose
        self.cleaner = (
            LRUCleanup(self.cache_dir, cache_size, verbose=verbose, interval=cache_cleanup_interval)
            if cache_size > 0
            else None
        )

    def get_file(self, url: str) -> str:
        """The local path of `url`, downloading it into the cache first if needed."""
        path = local_path_of(url)
        if path is not None:
            return path
        dest = os.path.join(self.cache_dir, self.url_to_name(url))
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        if not os.path.exists(dest):
            if self.cleaner is not None:
                self.cleaner.cleanup()
            download(url, dest)
            if self.validator and not self.validator(dest):
                with open(dest, "rb") as f:
                    head = f.read(200)
                os.remove(dest)
                raise FormatError(f"downloaded file is not a tar archive: {head[:40]!r}", url=url, offset=0)
        return dest

    def __call__(self, urls: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        for url in urls:
            if isinstance(url, dict):
                url = url["url"]
            try:
                dest = self.get_file(url)
                stream = open(dest, "rb")
            except Exception as exn:
                if self.handler(exn):
                    continue
                break
            yield dict(url=url, stream=stream, local_path=dest)
