"""`inspect` (the first samples as JSON: field sizes) and `ls` (every sample: shard, key, fields
and sizes). Both read through the loader; every line is redacted."""

from __future__ import annotations

import json
from typing import Any, Dict

from .._shard.samples import TarShardSamples
from .._plan.urls import shard_name
from ._common import say, shard_urls

__all__ = ["cmd_inspect", "cmd_ls"]


def _sizes(sample: Dict[str, Any]) -> Dict[str, Any]:
    return {k: (len(v) if isinstance(v, (bytes, bytearray)) else v) for k, v in sample.items()}


def cmd_inspect(args) -> int:
    from ..compat import WebDataset

    dataset = WebDataset(shard_urls(args.urls), shardshuffle=False, empty_check=False)
    for i, sample in enumerate(dataset):
        if i >= args.n:
            break
        say(json.dumps(_sizes(sample), ensure_ascii=False, default=str))
    return 0


def cmd_ls(args) -> int:
    shown = 0
    for url in shard_urls(args.urls):
        for sample in TarShardSamples().run([url]):
            if args.n is not None and shown >= args.n:
                return 0
            shown += 1
            if args.json:
                say(json.dumps(_sizes(sample), ensure_ascii=False, default=str))
                continue
            fields = " ".join(f"{k}:{len(v)}" for k, v in sample.items() if not k.startswith("__"))
            say(f"{shard_name(url)}\t{sample['__key__']}\t{fields}")
    return 0
