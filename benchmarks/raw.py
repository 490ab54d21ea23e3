"""The raw iteration workload: read every sample once, no decoding, in one process.

Both libraries run the same code, `WebDataset(urls, shardshuffle=False)` iterated directly; each sample's
payload lengths are summed so that no member can be skipped lazily.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable

from harness import Config

__all__ = ["NAME", "configs", "count", "make_pass"]

NAME = "raw"


def configs(workers: list[int]) -> list[Config]:
    """webdataset (the baseline) and shardstream, each iterated directly; `workers` is not used."""
    return [Config(NAME, "webdataset", "webdataset"), Config(NAME, "shardstream", "shardstream")]


def make_pass(config: Config, urls: list[str]) -> Callable[[], Iterable]:
    """Import the config's library; each call of the result builds a fresh dataset to iterate."""
    wds = importlib.import_module(config.library)
    return lambda: wds.WebDataset(urls, shardshuffle=False)


def count(sample: dict) -> tuple[int, int]:
    """One sample, and the bytes of its payloads (`__key__`, `__url__` and other strings not counted)."""
    return 1, sum(len(value) for value in sample.values() if isinstance(value, (bytes, bytearray)))
