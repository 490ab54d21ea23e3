"""Names and files of the disk cache: a cache file's name (a digest of the whole URL, then its
basename) and file locks (temp-file names and writer liveness: `_base.processes`)."""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import urlparse

from filelock import FileLock


__all__ = ["cache_file_name"]



def _pipe_url(spec: str) -> str:
    """For `pipe:curl ... URL` specs, the URL inside (so naming matches `cache.pipe_cleaner`)."""
    if spec.startswith("pipe:"):
        for word in spec[5:].split(" "):
            if re.match("^(https?|hdfs|gs|ais|s3):", word):
                return word
    return spec


def cache_file_name(url: str) -> str:
    """The cache file name of `url`: a digest of the whole URL, then its basename for humans.

    Same scheme as `cache.url_to_cache_path`, so two URLs with one basename never collide and a
    name never starts with "." (hidden names are the cache's own bookkeeping).
    """
    url = _pipe_url(url)
    digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    base = os.path.basename(urlparse(url).path) or "shard"
    return f"{digest}-{re.sub(r'[^A-Za-z0-9._+-]', '_', base)[-80:]}"


def _url_digest(url: str) -> str:
    return hashlib.sha256(_pipe_url(url).encode("utf-8", "surrogateescape")).hexdigest()




def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _file_lock(path: str) -> FileLock:
    # Not thread-local: a generator may be resumed (and closed) by a thread other than the one
    # that took the lock, and a thread-local lock would then silently fail to release.
    try:
        return FileLock(path, thread_local=False)
    except TypeError:  # filelock < 3.10 has no thread-local context at all
        return FileLock(path)


