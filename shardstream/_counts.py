"""Sample counts per shard, for equal work per rank: `sizes.json`, `.idx`, else a counted scan.

A scan reads the whole shard once; its result is kept for the process (and, for local files,
keyed by size and mtime so an edited shard is counted again). Run `shardstream index` to write
`sizes.json` beside large datasets and skip the scans.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Dict, List, Optional, Tuple

from ._index import read_index, scan_shard
from ._open import iter_chunks, local_path_of

__all__ = ["known_counts", "sample_counts"]

log = logging.getLogger(__name__)
_lock = threading.Lock()
_warned = False
_scanned: Dict[Tuple[str, Optional[Tuple[int, float]]], int] = {}
_sizes_files: Dict[str, Optional[Dict[str, int]]] = {}


def _sizes_json(directory_url: str) -> Optional[Dict[str, int]]:
    """The sizes.json of a directory (local or any URL), or None; read once per process."""
    with _lock:
        if directory_url in _sizes_files:
            return _sizes_files[directory_url]
    sizes: Optional[Dict[str, int]] = None
    try:
        data = b"".join(iter_chunks(directory_url.rstrip("/") + "/sizes.json"))
        sizes = {str(k): int(v) for k, v in json.loads(data).items()}
    except Exception:  # no sizes.json there: fall back to indexes or scans
        sizes = None
    with _lock:
        _sizes_files[directory_url] = sizes
    return sizes


def _stamp(url: str) -> Optional[Tuple[int, float]]:
    path = local_path_of(url)
    if path is None:
        return None
    st = os.stat(path)
    return st.st_size, st.st_mtime


def _count_one(url: str, scan: bool = True) -> Optional[int]:
    directory, _, name = url.rpartition("/")
    sizes = _sizes_json(directory or ".")
    if sizes is not None and name in sizes:
        return sizes[name]
    path = local_path_of(url)
    if path is not None and os.path.exists(path + ".idx"):
        return len(read_index(path + ".idx"))
    if not scan:
        return None
    key = (url, _stamp(url))
    with _lock:
        if key in _scanned:
            return _scanned[key]
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "shardstream: counting the samples of %s by reading it (no sizes.json or .idx beside it); "
            "`shardstream index` writes them once for the whole dataset", url
        )
    count = scan_shard(url, iter_chunks(url)).count
    with _lock:
        _scanned[key] = count
    return count


def sample_counts(urls: List[str]) -> List[int]:
    """The number of samples in each shard."""
    return [_count_one(url) for url in urls]  # type: ignore[misc]


def known_counts(urls: List[str]) -> List[Optional[int]]:
    """Sample counts from sizes.json or `.idx` files only (None where neither has it): no scans."""
    return [_count_one(url, scan=False) for url in urls]
