"""`bench`: stream shards through the loader's engine (optionally decoding images) and print
throughput, per-stage stats and the verdict naming the stage that limits it."""

from __future__ import annotations

import json
import time
from typing import Any

from .._base.errors import OptionError
from .._shard.counts import cheap_counts
from ._common import bar, say, shard_urls

__all__ = ["cmd_bench"]


def cmd_bench(args) -> int:
    from ..compat import WebDataset

    urls = shard_urls(args.urls)
    dataset: Any = WebDataset(urls, shardshuffle=False, empty_check=False)
    if args.decode:
        try:
            dataset = dataset.decode(args.decode)
        except ValueError as exn:  # an unknown image spec
            raise OptionError(f"--decode {args.decode!r}: {exn}") from None
    if args.threads:
        dataset = dataset.with_engine(threads=args.threads)
    known = cheap_counts(urls)
    total = sum(known) if None not in known else None  # type: ignore[arg-type]
    if args.limit is not None:
        total = args.limit if total is None else min(total, args.limit)
    count = shards = 0
    last_url = None
    started = time.perf_counter()
    iterator = iter(dataset)
    with bar(total, "shardstream bench", "sample", args.quiet) as progress:
        for sample in iterator if args.limit != 0 else ():
            count += 1
            url = sample.get("__url__") if isinstance(sample, dict) else None
            if url != last_url:  # (the shards this run read from, with --limit fewer than the spec's)
                shards, last_url = shards + 1, url
            if not count & 63:
                progress.update(64)
            if args.limit is not None and count >= args.limit:
                break
    wall = time.perf_counter() - started
    stats = iterator.stats() if hasattr(iterator, "stats") else None
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    if args.json:
        report = {"samples": count, "wall_s": wall, "samples_per_s": count / wall if wall else 0.0}
        if stats is not None:
            report["stats"] = stats.as_dict()
        say(json.dumps(report, default=str))
        return 0
    read = f"{shards} of {len(urls)}" if shards != len(urls) else f"{len(urls)}"
    say(f"{count} samples from {read} shards in {wall:.2f} s: {count / wall if wall else 0:.0f} samples/s"
        f"{' (decode ' + args.decode + ')' if args.decode else ''}")
    if stats is not None:
        say(stats.format())
    else:
        say("no per-stage stats (the engine is off: SHARDSTREAM_ENGINE=0)")
    return 0
