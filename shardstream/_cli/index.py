"""`index`: read each shard once with the loader's reader and write its `.idx` (ours: sample
offsets, read by the loader), its `.dali.idx` (DALI v1.2) and `sizes.json` (sample counts, keyed
by file name), beside local shards or into `--out` (a directory or URL, remote shards too)."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

from .._base.errors import OptionError, UsageError
from .._fetch.open import local_path_of
from .._prep._dest import Destination
from .._prep._indexes import dali_text, idx_text, scan_indexes
from .._shard.origin import open_origin
from .._plan.urls import shard_name
from ._common import bar, say, shard_urls, worker_pool

__all__ = ["cmd_index", "merge_sizes"]


def merge_sizes(dest: Destination, name: str, counts: Dict[str, int]) -> None:
    """Write `counts` into the sizes file `name` of `dest`, keeping the entries it already has."""
    existing: Dict[str, int] = {}
    if dest.exists(name):
        where = dest.where(name)
        try:
            existing = json.loads(b"".join(open_origin(where)))
        except ValueError as exn:
            raise UsageError(f"the existing {name} is not JSON ({exn}): fix or remove it", url=where) from None
        if not isinstance(existing, dict):
            raise UsageError(f"the existing {name} is not an object of shard names to counts: fix or remove it",
                             url=where)
    existing.update(counts)
    dest.write_bytes(name, json.dumps(dict(sorted(existing.items())), indent=1).encode())


def _sizes_target(args, urls: List[str], paths: List[Optional[str]]) -> Tuple[Destination, str]:
    if args.sizes:
        split = args.sizes.rsplit("/", 1) if "://" in args.sizes else os.path.split(args.sizes.rstrip("/"))
        directory, name = split
        return Destination(directory or "."), name
    if args.out:
        return Destination(args.out), "sizes.json"
    directories = {os.path.dirname(path) for path in paths if path is not None}
    if None in paths or len(directories) != 1:
        raise OptionError(
            "the shards are not all in one local directory: say where to write sizes.json with --sizes PATH, "
            "or where to write every index with --out DIR"
        )
    return Destination(directories.pop() or "."), "sizes.json"


def cmd_index(args) -> int:
    urls = shard_urls(args.urls)
    paths = [local_path_of(url) for url in urls]
    sizes_dest, sizes_name = _sizes_target(args, urls, paths)
    out = Destination(args.out) if args.out else None
    if out is not None:
        out.prepare()
    write_idx = not args.no_idx
    skipped_remote = 0

    def scan(url: str):
        return scan_indexes(url, open_origin(url), dali=write_idx and not args.no_dali)

    counts: Dict[str, int] = {}
    threads = max(1, min(args.threads, len(urls)))
    with worker_pool(threads, "shardstream-index") as pool, \
            bar(len(urls), "shardstream index", "shard", args.quiet) as progress:
        for url, path, (summary, dali, why) in zip(urls, paths, pool.map(scan, urls)):
            progress.update()
            name = shard_name(url)  # never a query string (signed URLs)
            counts[name] = summary.count
            target = out
            if target is None and path is not None:
                target = Destination(os.path.dirname(path) or ".")
            note = ""
            if write_idx and target is not None:
                text = idx_text(summary.samples)
                if text is not None:
                    target.write_bytes(name + ".idx", text.encode("utf-8", "surrogateescape"))
                else:  # (and none of an earlier index left to go stale)
                    target.remove(name + ".idx")
                    note = " (no .idx: a key holds a newline)"
                if dali is not None:
                    target.write_bytes(name + ".dali.idx", dali_text(dali).encode("utf-8", "surrogateescape"))
                elif not args.no_dali:
                    note += f" (no .dali.idx: {why})"
            elif write_idx:
                skipped_remote += 1
            say(f"{url}: {summary.count} samples{note}")
    if skipped_remote:
        say(f"{skipped_remote} remote shards got no .idx (they go beside local shards only): --out DIR writes them")
    sizes_dest.prepare()
    merge_sizes(sizes_dest, sizes_name, counts)
    say(f"wrote {sizes_dest.where(sizes_name)}")
    return 0
