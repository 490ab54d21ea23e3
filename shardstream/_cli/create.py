"""`create` (and the old `prepare`, now an alias): options from the command line, the run, a summary."""

from __future__ import annotations

import json
import os

from .._prep import CreateOptions, CreateSummary, create_shards
from ._common import say

__all__ = ["cmd_create", "cmd_prepare"]

SHOWN = 10


def _report(summary: CreateSummary, as_json: bool) -> None:
    if as_json:
        say(json.dumps(summary.as_dict()))
        return
    shards = f"{summary.shards} shard{'' if summary.shards == 1 else 's'}"
    workers = f"{summary.workers} worker{'' if summary.workers == 1 else 's'}"
    say(
        f"wrote {summary.samples} samples in {shards} to {summary.dest} ({summary.file_bytes / 1e6:.1f} MB) "
        f"in {summary.write_s:.2f} s: {summary.samples_per_s:.0f} samples/s ({summary.engine} engine, {workers})"
    )
    for label, lines in (("left out", summary.failures), ("note", summary.notes)):
        for line in lines[:SHOWN]:
            say(f"  {label}: {line}")
        if len(lines) > SHOWN:
            say(f"  ... and {len(lines) - SHOWN} more")


def cmd_create(args) -> int:
    opts = CreateOptions(
        source=args.src, dest=args.dest, input=args.input, pattern=args.pattern, maxcount=args.maxcount,
        maxsize=args.maxsize, seed=args.seed, max_side=args.max_side, quality=args.quality, workers=args.workers,
        threads=args.threads, engine=args.engine, ray_address=args.ray_address, rank=args.rank,
        world_size=args.world_size, skip_errors=args.skip_errors, overwrite=args.overwrite, rekey=args.rekey,
        classes=args.classes, url_col=args.url_col, caption_col=args.caption_col, label_col=args.label_col,
        key_col=args.key_col, dali_index=not args.no_dali, progress=not args.quiet,
    )
    _report(create_shards(opts), args.json)
    return 0


def cmd_prepare(args) -> int:
    """The old `prepare SOURCE PATTERN`: files grouped by key (no labels), into PATTERN's directory."""
    directory, pattern = os.path.split(args.pattern)
    opts = CreateOptions(
        source=args.source, dest=directory or ".", input="files", pattern=pattern, maxcount=args.maxcount,
        maxsize=args.maxsize, workers=1, overwrite=True, progress=not args.quiet,
    )
    _report(create_shards(opts), False)
    return 0
