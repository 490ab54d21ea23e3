"""Shard indexes: per-sample byte offsets (`.idx`) and per-shard sample counts (`sizes.json`).

An `.idx` file has one line per sample, "OFFSET KEY", where OFFSET is the byte offset of the
sample's first member header in the uncompressed tar stream. `sizes.json` maps shard file names
to sample counts (the format webdataset's tools and wids use).
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from .._base.errors import FormatError
from .._tar.keys import base_plus_ext, is_meta
from .members import is_compressed_file, iter_members, mapped_member_batches
from .._fetch.open import local_path_of
from .._tar.reader import TarMember

__all__ = [
    "ShardSummary", "checked_start", "has_index", "index_position", "read_index", "scan_shard", "summarize", "walk_shard", "write_index", "write_sizes",
]


class ShardSummary:
    """What a full scan of one shard found."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.members = 0
        self.bytes = 0
        self.samples: List[Tuple[int, str]] = []  # (offset, key)
        self.fields: Dict[str, int] = {}

    @property
    def count(self) -> int:
        return len(self.samples)


def scan_shard(url: str, chunks: Iterable[bytes]) -> ShardSummary:
    """Read a whole shard and record its samples' offsets and keys; raises FormatError."""
    return summarize(url, iter_members(chunks, url))


def walk_shard(path: str, url: str) -> ShardSummary:
    """The summary of a local uncompressed shard from its headers alone (memory-mapped: the
    payload pages are never read); `bytes` stays 0. Raises FormatError."""
    return summarize(url, (m for batch in mapped_member_batches(path, url, payloads=False) for m in batch))


def summarize(url: str, members: Iterable[TarMember]) -> ShardSummary:
    """Samples (offset, key) and extension counts of a shard's members, by webdataset's key rules."""
    summary = ShardSummary(url)
    current = None
    for name, data, offset in members:
        summary.members += 1
        summary.bytes += len(data)
        if is_meta(name):
            continue
        key, ext = base_plus_ext(name)
        if key is None or ext is None:
            continue
        ext = ext.lower()
        summary.fields[ext] = summary.fields.get(ext, 0) + 1
        if key != current:
            summary.samples.append((offset, key))
            current = key
    return summary


def write_index(path: str, summary: ShardSummary) -> None:
    """Write `.idx` atomically (temp file, then rename)."""
    temp = f"{path}.tmp{os.getpid()}"
    with open(temp, "w", encoding="utf-8", errors="surrogateescape") as f:
        for offset, key in summary.samples:
            f.write(f"{offset} {key}\n")
    os.replace(temp, path)


def read_index(path: str) -> List[Tuple[int, str]]:
    """Read an `.idx` file into [(offset, key), ...].

    Raises:
        FormatError: a line that is not "offset key" with offsets rising, naming the file and line.
    """
    result: List[Tuple[int, str]] = []
    with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as f:  # (a key may hold a \r)
        for number, line in enumerate(f, 1):
            text, _, key = line.rstrip("\n").partition(" ")
            try:
                offset = int(text)
            except ValueError:
                offset = -1
            if offset < 0 or offset % 512 or (result and offset <= result[-1][0]):
                raise FormatError(f"bad index line {number}: {line.rstrip()[:80]!r} (want rising tar offsets "
                                  "and keys; rewrite it with `shardstream index`)", url=path)
            result.append((offset, key))
    return result


def write_sizes(path: str, counts: Dict[str, int]) -> None:
    """Write (or merge into) a `sizes.json` mapping shard names to sample counts."""
    existing: Dict[str, int] = {}
    if os.path.exists(path):
        with open(path) as f:
            existing = json.load(f)
    existing.update(counts)
    temp = f"{path}.tmp{os.getpid()}"
    with open(temp, "w") as f:
        json.dump(dict(sorted(existing.items())), f, indent=1)
    os.replace(temp, path)


def has_index(url: str) -> bool:
    """Whether `index_position` can seek in this shard (a local uncompressed one with an `.idx`)."""
    path = local_path_of(url)
    return path is not None and os.path.exists(path + ".idx") and not is_compressed_file(path)


def index_position(url: str, sample: int) -> Tuple[int, int, Optional[str]]:
    """Where to start reading to reach sample number `sample` of a shard: (byte offset, samples
    still to skip from there, the key the `.idx` says starts there). Uses the `.idx` beside a
    local shard; (0, sample, None) without one."""
    path = local_path_of(url)
    if path is None or not has_index(url):
        return 0, sample, None  # (a gzip shard's offsets are in the inflated stream: no seeking)
    entries = read_index(path + ".idx")
    if sample >= len(entries):
        return 0, sample, None
    return entries[sample][0], 0, entries[sample][1]


def checked_start(batches: Iterable[List[TarMember]], url: str, sample: int, offset: int,
                  key: str) -> Iterator[List[TarMember]]:
    """`batches` read from `offset`, where the `.idx` says sample number `sample` (`key`) starts:
    a FormatError naming the stale index when the shard holds no header of that sample there (a
    shard rewritten after it was indexed: seeking on would split samples or repeat them)."""
    first = True
    try:
        for batch in batches:
            if first and batch:
                name, _data, at = batch[0]
                if at != offset or base_plus_ext(name)[0] != key:
                    raise FormatError(
                        f"stale index: its .idx says sample {sample} ({key!r}) starts at byte {offset}, but the "
                        f"shard holds {name!r} at byte {at}; run `shardstream index` on it again",
                        url=url, member=name, offset=at)
                first = False
            yield batch
    except FormatError as exn:
        if first and not str(exn).startswith("stale index"):
            raise FormatError(f"stale index: its .idx says sample {sample} ({key!r}) starts at byte {offset}, "
                              f"where the shard holds no member header ({exn.message}); run `shardstream index` "
                              "on it again", url=url, offset=offset) from exn
        raise
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # (the mapped file, now: the caller closes this generator, not the one inside)
