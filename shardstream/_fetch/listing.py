"""Shard specs that name many objects at once: globs and prefixes, expanded by listing.

`s3://bucket/prefix/` and `s3://bucket/train-*.tar` are listed with the async S3 client; local
globs (`/data/train-*.tar`) with the filesystem. Everything else is taken as one URL.
"""

from __future__ import annotations

import glob
from typing import List

__all__ = ["expand_listings", "needs_listing"]

_GLOB = ("*", "?", "[")


def needs_listing(url: str) -> bool:
    """True for an S3 prefix (trailing /) or glob, or a local glob."""
    if url.startswith("s3://"):
        return url.endswith("/") or any(c in url[5:] for c in _GLOB)
    return "://" not in url and not url.startswith("pipe:") and any(c in url for c in _GLOB)


def expand_listings(urls: List[str]) -> List[str]:
    """Replace each glob / prefix by the sorted URLs it names (order of the spec kept)."""
    if not any(needs_listing(u) for u in urls):
        return urls
    result: List[str] = []
    for url in urls:
        if not needs_listing(url):
            result.append(url)
        elif url.startswith("s3://"):
            from .loop import run_coroutine
            from .s3 import s3_list

            result.extend(run_coroutine(s3_list(url)).result())
        else:
            result.extend(sorted(glob.glob(url)))
    return result
