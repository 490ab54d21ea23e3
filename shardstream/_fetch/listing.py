"""Shard specs that name many objects at once: globs and prefixes, expanded by listing.

`s3://bucket/prefix/` (the shards under it) and `s3://bucket/train-*.tar` are listed with the
async S3 client; local globs (`/data/train-*.tar`) and folders (`/data/train/`: the shards in it)
with the filesystem.
Everything else is taken as one URL.
"""

from __future__ import annotations

import glob
import os
from typing import List

from .._base.errors import ShardNotFound
from .open import local_path_of

__all__ = ["SHARD_SUFFIXES", "expand_listings", "folder_shards", "needs_listing"]

_GLOB = ("*", "?", "[")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.lzma")  # what a local folder's listing keeps


def needs_listing(url: str) -> bool:
    """True for an S3 prefix (trailing /) or glob, or a local glob or folder (trailing /; a path or
    a file: URL). A local file whose name holds glob characters is no glob."""
    if url.startswith("s3://"):
        return url.endswith("/") or any(c in url[5:] for c in _GLOB)
    path = local_path_of(url)
    if path is None:
        return False
    if path.endswith("/"):
        return True
    # A file that exists is read as named, glob characters and all (`train[1].tar`), as
    # webdataset opens it: a glob would read `train1.tar` instead, or nothing.
    return any(c in path for c in _GLOB) and not os.path.isfile(path)


def expand_listings(urls: List[str]) -> List[str]:
    """Replace each glob / prefix by the sorted URLs it names (order of the spec kept)."""
    if not any(needs_listing(u) for u in urls):
        return urls
    result: List[str] = []
    for url in urls:
        if not needs_listing(url):
            result.append(url)
            continue
        if url.startswith("s3://"):
            from .loop import run_coroutine
            from .s3 import s3_list

            keys = run_coroutine(s3_list(url)).result()
            # A prefix holds what `shardstream create` writes beside the shards (sizes.json,
            # .idx files): its shards are the objects a folder's listing would keep. A glob
            # names its objects itself.
            found = keys if any(c in url[5:] for c in _GLOB) else [k for k in keys if _is_shard_name(k)]
        else:
            path = local_path_of(url) or url
            globbed = any(c in path for c in _GLOB)
            found = sorted(glob.glob(path)) if globbed else folder_shards(path)
        if not found:  # (a typo in a spec, or a `::` source of a mix, must not pass as no data)
            raise ShardNotFound("no shards match this glob or folder", url=url)
        result.extend(found)
    return result


def folder_shards(path: str) -> List[str]:
    """The shards in a local folder: its files named with a `SHARD_SUFFIXES` suffix (any case;
    not hidden ones, not in its subfolders), sorted by name."""
    try:
        names = os.listdir(path)
    except OSError as exn:
        raise ShardNotFound(f"cannot list the folder: {exn.strerror}", url=path) from exn
    return [
        os.path.join(path, name) for name in sorted(names)
        if _is_shard_name(name) and os.path.isfile(os.path.join(path, name))
    ]


def _is_shard_name(path: str) -> bool:
    """Named like a shard: a `SHARD_SUFFIXES` suffix (any case), not hidden."""
    name = path.rpartition("/")[2]
    return name.lower().endswith(SHARD_SUFFIXES) and not name.startswith(".")
