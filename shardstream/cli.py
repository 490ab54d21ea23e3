"""The `shardstream` command: prepare, inspect, verify, index and extract shards."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from ._counts import known_counts
from ._errors import FormatError, ShardStreamError, UsageError
from ._index import scan_shard, write_index, write_sizes
from ._keys import base_plus_ext
from ._members import iter_members
from ._open import local_path_of
from ._redact import redact
from ._samples import TarShardSamples, open_origin
from ._urls import expand_urls, shard_name

__all__ = ["main"]


def _cmd_inspect(args) -> int:
    from .compat import WebDataset

    dataset = WebDataset(expand_urls(args.urls), shardshuffle=False, empty_check=False)
    for i, sample in enumerate(dataset):
        if i >= args.n:
            break
        fields = {k: (len(v) if isinstance(v, bytes) else v) for k, v in sample.items()}
        print(redact(json.dumps(fields, ensure_ascii=False, default=str)))
    return 0


def _verify_shard(url: str) -> dict:
    """Read a shard exactly as the loader does (its reader, its strictness) and check the count
    its sizes.json or .idx gives; raises ShardStreamError."""
    summary = {"samples": 0, "members": 0, "bytes": 0, "fields": {}}
    for sample in TarShardSamples().run([url]):
        summary["samples"] += 1
        for field, value in sample.items():
            if not field.startswith("__"):
                summary["members"] += 1
                summary["bytes"] += len(value)
                summary["fields"][field] = summary["fields"].get(field, 0) + 1
    expected = known_counts([url])[0]
    if expected is not None and expected != summary["samples"]:
        raise FormatError(f"the shard has {summary['samples']} samples, its sizes.json / .idx says {expected}", url=url)
    return summary


def _cmd_verify(args) -> int:
    failed = 0
    totals = {"shards": 0, "samples": 0, "members": 0, "bytes": 0}
    for url in expand_urls(args.urls):
        try:
            summary = _verify_shard(url)
        except ShardStreamError as exn:
            failed += 1
            print(f"FAIL {exn}")
            continue
        totals["shards"] += 1
        for key in ("samples", "members", "bytes"):
            totals[key] += summary[key]
        if args.verbose:
            print(f"ok   {redact(url)}: {summary['samples']} samples, {summary['members']} members, "
                  f"fields {summary['fields']}")
    print(json.dumps({**totals, "failed": failed}))
    return 1 if failed else 0


def _cmd_index(args) -> int:
    urls = expand_urls(args.urls)
    paths = [local_path_of(url) for url in urls]
    sizes_dirs = {os.path.dirname(path) for path in paths if path is not None}
    if args.sizes is None and (None in paths or len(sizes_dirs) != 1):
        raise UsageError("the shards are not all in one local directory: say where to write sizes.json with --sizes PATH")
    counts = {}
    for url, path in zip(urls, paths):
        summary = scan_shard(url, open_origin(url))
        counts[shard_name(url)] = summary.count  # the file name: never a query string (signed URLs)
        if path is not None and not args.no_idx:
            write_index(path + ".idx", summary)
        print(f"{redact(url)}: {summary.count} samples")
    target = args.sizes or os.path.join(sizes_dirs.pop(), "sizes.json")
    write_sizes(target, counts)
    print(f"wrote {target}")
    return 0


def _safe_target(root: str, name: str) -> str:
    """The extraction path for a member name, refusing anything that would land outside root."""
    root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, name))
    if os.path.isabs(name) or not target.startswith(root + os.sep):
        raise UsageError("member would be extracted outside the target directory", member=name)
    return target


def _cmd_extract(args) -> int:
    os.makedirs(args.dest, exist_ok=True)
    count = 0
    for name, data, offset in iter_members(open_origin(args.url), args.url):
        if "\0" in name:
            raise UsageError("member name holds a NUL byte", url=args.url, member=name.replace("\0", "\\0"), offset=offset)
        target = _safe_target(args.dest, name)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        except OSError as exn:  # e.g. a file "a" and then "a/b.txt"
            raise UsageError(f"cannot extract: {exn.strerror}", url=args.url, member=name, offset=offset) from exn
        count += 1
    print(f"extracted {count} members to {args.dest}")
    return 0


def _cmd_prepare(args) -> int:
    from .writer import ShardWriter

    files = sorted(
        os.path.relpath(os.path.join(d, f), args.source) for d, _, fs in os.walk(args.source) for f in fs
    )
    os.makedirs(os.path.dirname(args.pattern) or ".", exist_ok=True)
    written = 0
    with ShardWriter(args.pattern, maxcount=args.maxcount, maxsize=args.maxsize, verbose=0) as sink:
        sample: dict = {}
        for rel in files:
            key, ext = base_plus_ext(rel)
            if key is None:
                continue
            if sample and sample["__key__"] != key:
                sink.write(sample)
                written += 1
                sample = {}
            sample["__key__"] = key
            with open(os.path.join(args.source, rel), "rb") as f:
                sample[ext] = f.read()
        if sample:
            sink.write(sample)
            written += 1
    print(f"wrote {written} samples")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="print the first samples (field sizes) of a shard spec")
    p.add_argument("urls")
    p.add_argument("-n", type=int, default=5)
    p.set_defaults(func=_cmd_inspect)
    p = sub.add_parser("verify", help="read every shard fully; report errors with offsets")
    p.add_argument("urls")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser("index", help="write .idx files (sample offsets) and sizes.json (counts)")
    p.add_argument("urls")
    p.add_argument("--sizes", help="path of sizes.json (default: beside the shards)")
    p.add_argument("--no-idx", action="store_true", help="only write sizes.json")
    p.set_defaults(func=_cmd_index)
    p = sub.add_parser("extract", help="extract a shard's members into a directory (safely)")
    p.add_argument("url")
    p.add_argument("dest")
    p.set_defaults(func=_cmd_extract)
    p = sub.add_parser("prepare", help="pack a directory of files (grouped by key) into shards")
    p.add_argument("source")
    p.add_argument("pattern", help="output pattern, e.g. out/train-%%06d.tar")
    p.add_argument("--maxcount", type=int, default=10000)
    p.add_argument("--maxsize", type=float, default=3e9)
    p.set_defaults(func=_cmd_prepare)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ShardStreamError, OSError) as exn:
        print(f"error: {redact(exn)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
