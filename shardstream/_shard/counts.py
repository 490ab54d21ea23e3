"""Sample counts per shard, for equal work per rank, and what each way of knowing them costs.

Cheap (`cheap_counts`): counts given in code, a `sizes.json` beside the shards (one small read
per directory), an `.idx` beside a local shard, or a walk of a local uncompressed shard's
headers (memory-mapped: one page per member, never the payloads). Walk results are kept for the
process, keyed by the file's size and mtime.

Expensive (`read_counts`): reading whole shards. Only on request (the splitter's
`count_shards=True`), in parallel through the loader's own fetchers and cache, so the bytes
are not wasted. `shardstream index` writes sizes.json once for the whole dataset instead.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import as_completed
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from .index import read_index, summarize, walk_shard
from .members import is_compressed_file
from .._fetch.open import local_path_of
from .origin import open_origin
from .._tar.reader import TarMember
from .._plan.urls import shard_name, without_query
from .._base.workers import WorkerPool

__all__ = ["cheap_counts", "known_counts", "read_counts"]

_lock = threading.Lock()
_walked: Dict[Tuple[str, int, float], int] = {}
_sizes_files: Dict[str, Optional[Dict[str, int]]] = {}


def _sizes_json(directory_url: str) -> Optional[Dict[str, int]]:
    """The sizes.json of a directory (local or any URL), or None; read once per process."""
    with _lock:
        if directory_url in _sizes_files:
            return _sizes_files[directory_url]
    sizes: Optional[Dict[str, int]] = None
    try:
        data = b"".join(open_origin(directory_url.rstrip("/") + "/sizes.json"))
        sizes = {str(k): int(v) for k, v in json.loads(data).items()}
    except Exception:  # no (readable) sizes.json there: other ways, or no count
        sizes = None
    with _lock:
        _sizes_files[directory_url] = sizes
    return sizes


def _given(url: str, given: Mapping[str, int]) -> Optional[int]:
    if url in given:
        return int(given[url])
    name = shard_name(url)
    return int(given[name]) if name in given else None


def _walked_count(path: str, url: str) -> Optional[int]:
    try:
        st = os.stat(path)
    except OSError:
        return None  # missing: the loader reports it when it gets there
    if is_compressed_file(path):
        return None  # counting it means inflating it all
    key = (path, st.st_size, st.st_mtime)
    with _lock:
        if key in _walked:
            return _walked[key]
    count = walk_shard(path, url).count
    with _lock:
        _walked[key] = count
    return count


def _directory_of(url: str) -> Optional[str]:
    """Where a shard's sizes.json would be: the folder of its path or URL (an http(s) URL's
    query is not part of it); None for a `pipe:` command, whose words are no place (cut at a
    `/`, they are another command: one the user never wrote)."""
    if url.startswith("pipe:"):
        return None
    return without_query(url).rpartition("/")[0] or "."


def _count_one(url: str, given: Mapping[str, int], walk: bool) -> Optional[int]:
    count = _given(url, given)
    if count is not None:
        return count
    directory, name = _directory_of(url), shard_name(url)
    sizes = _sizes_json(directory) if directory is not None else None
    if sizes is not None and name in sizes:
        return sizes[name]
    path = local_path_of(url)
    if path is None:
        return None
    if os.path.exists(path + ".idx"):
        return len(read_index(path + ".idx"))
    return _walked_count(path, url) if walk else None


def cheap_counts(urls: List[str], given: Mapping[str, int] = {}) -> List[Optional[int]]:
    """Each shard's sample count where it costs no shard download (see the module doc), else None."""
    return [_count_one(url, given, walk=True) for url in urls]


def known_counts(urls: List[str]) -> List[Optional[int]]:
    """Sample counts from sizes.json or `.idx` files only (None where neither has it)."""
    return [_count_one(url, {}, walk=False) for url in urls]


def read_counts(
    urls: List[str], open_members: Callable[[str], Iterable[List[TarMember]]], threads: int = 16, progress: bool = True,
) -> List[int]:
    """Count samples by reading whole shards, `threads` at a time; `open_members(url)` gives a
    shard's members in batches (the loader's reader: fetchers, retries, cache). A tqdm bar
    shows progress on a terminal. Raises the first shard's error (it names the URL)."""
    from tqdm import tqdm

    def count(url: str) -> int:
        return summarize(url, (m for batch in open_members(url) for m in batch)).count

    if not urls:
        return []
    with WorkerPool(max(1, min(threads, len(urls))), thread_name_prefix="shardstream-count") as pool:
        futures = [pool.submit(count, url) for url in urls]
        try:
            with tqdm(total=len(urls), desc="shardstream: counting samples", unit="shard", disable=None if progress else True) as bar:
                for future in as_completed(futures):
                    future.result()  # the first failure ends the count
                    bar.update()
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()
