"""`verify`: read every shard exactly as the loader does (its reader, its strictness), check the
counts in sizes.json / .idx and each `.idx` line (where the loader seeks), decode every image (`--no-decode` skips), and check that every
sample has the `--require`d fields. Each problem is reported with shard, member and byte offset;
the exit status is 1 when anything failed."""

from __future__ import annotations

import io
import itertools
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .._shard.counts import known_counts
from .._base.errors import FormatError, ShardStreamError
from .._tar.keys import base_plus_ext
from .._fetch.open import local_path_of
from .._shard.index import read_index, walk_shard
from .._shard.members import is_compressed_file, iter_members
from .._shard.samples import TarShardSamples
from .._shard.origin import open_origin
from ._common import bar, is_image, say, shard_urls, worker_pool

__all__ = ["cmd_verify", "parse_require", "verify_shard"]

SHOWN_PER_SHARD = 10

Problem = Tuple[str, str, Optional[str]]  # (message, key, field or None: the whole sample)


def parse_require(text: Optional[str]) -> List[Tuple[str, ...]]:
    """"jpg;png,txt" -> [("jpg", "png"), ("txt",)]: each group needs one of its fields."""
    if not text:
        return []
    groups = [group for group in text.split(",") if group.strip()]
    return [tuple(f.strip().lower() for f in group.split(";") if f.strip()) for group in groups]


def _decode(data: bytes) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.load()


def _locate(url: str, problems: Sequence[Problem]) -> Dict[Tuple[str, Optional[str]], Tuple[str, int]]:
    """(key, field) -> (member name, offset), by a second read of the shard (only when it failed)."""
    wanted: Set[Tuple[str, Optional[str]]] = {(key, field) for _, key, field in problems}
    keys = {key for key, _ in wanted}
    found: Dict[Tuple[str, Optional[str]], Tuple[str, int]] = {}
    for name, _data, offset in iter_members(open_origin(url), url):
        key, ext = base_plus_ext(name)
        if key not in keys:
            continue
        found.setdefault((key, None), (name, offset))
        if ext is not None and (key, ext.lower()) in wanted:
            found.setdefault((key, ext.lower()), (name, offset))
    return found


def verify_shard(
    url: str, require: Sequence[Tuple[str, ...]] = (), decode: bool = True
) -> Tuple[Dict[str, Any], List[str]]:
    """(summary, problems as printable lines); raises ShardStreamError for a shard the loader fails."""
    summary: Dict[str, Any] = {"samples": 0, "members": 0, "bytes": 0, "images": 0, "fields": {}}
    problems: List[Problem] = []
    for sample in TarShardSamples().run([url]):
        summary["samples"] += 1
        key = sample["__key__"]
        for field, value in sample.items():
            if field.startswith("__"):
                continue
            summary["members"] += 1
            summary["bytes"] += len(value)
            summary["fields"][field] = summary["fields"].get(field, 0) + 1
            if decode and is_image(field):
                summary["images"] += 1
                try:
                    _decode(value)
                except Exception as exn:  # Pillow raises many kinds: each one is this image's problem
                    problems.append((f"image does not decode: {type(exn).__name__}: {exn}", key, field))
        for group in require:
            if not any(field in sample for field in group):
                problems.append((f"sample {key!r} has no {' or '.join(group)!r} field", key, None))
    expected = known_counts([url])[0]
    lines = []
    if expected is not None and expected != summary["samples"]:  # (a problem of a shard read to its end)
        lines.append(str(FormatError(f"the shard has {summary['samples']} samples, its sizes.json / .idx says "
                                     f"{expected}", url=url)))
    stale = _stale_index(url)
    if stale is not None:
        lines.append(stale)
    if problems:
        where = _locate(url, problems[:SHOWN_PER_SHARD])
        for message, key, wanted in problems[:SHOWN_PER_SHARD]:
            found: Tuple[Optional[str], Optional[int]] = where.get((key, wanted), where.get((key, None), (None, None)))
            member, offset = found
            lines.append(str(FormatError(message, url=url, member=member, offset=offset)))
        if len(problems) > SHOWN_PER_SHARD:
            lines.append(f"... and {len(problems) - SHOWN_PER_SHARD} more problems in {url}")
    return summary, lines


def _stale_index(url: str) -> Optional[str]:
    """The first line of a local shard's `.idx` that disagrees with the shard (the loader seeks
    by it to start mid-shard), as a printable problem; None when it agrees or there is none."""
    path = local_path_of(url)
    if path is None or not os.path.exists(path + ".idx") or is_compressed_file(path):
        return None
    entries = read_index(path + ".idx")
    actual = walk_shard(path, url).samples
    for number, (said, found) in enumerate(itertools.zip_longest(entries, actual)):
        if said != found:
            told = "nothing" if said is None else f"{said[1]!r} at byte {said[0]}"
            held = "no such sample" if found is None else f"{found[1]!r} at byte {found[0]}"
            return str(FormatError(f"stale index: its .idx says sample {number} is {told}, the shard has {held}; "
                                   "run `shardstream index` on it again", url=url,
                                   offset=None if found is None else found[0]))
    return None


def _check(url: str, require: Sequence[Tuple[str, ...]], decode: bool) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    try:
        return verify_shard(url, require, decode)
    except ShardStreamError as exn:
        return None, [str(exn)]


def cmd_verify(args) -> int:
    require = parse_require(args.require)
    urls = shard_urls(args.urls)
    failed = 0
    totals = {"shards": 0, "samples": 0, "members": 0, "bytes": 0, "images": 0}
    threads = max(1, min(args.threads, len(urls)))
    with worker_pool(threads, "shardstream-verify") as pool, \
            bar(len(urls), "shardstream verify", "shard", args.quiet) as progress:
        for url, (summary, problems) in zip(urls, pool.map(lambda u: _check(u, require, not args.no_decode), urls)):
            progress.update()
            for line in problems:
                say(f"FAIL {line}")
            if summary is None or problems:
                failed += 1
            if summary is None:
                continue
            totals["shards"] += 1
            for key in ("samples", "members", "bytes", "images"):
                totals[key] += summary[key]
            if args.verbose and not problems:
                say(f"ok   {url}: {summary['samples']} samples, {summary['members']} members, "
                    f"fields {summary['fields']}")
    say(json.dumps({**totals, "failed": failed}))
    return 1 if failed else 0
