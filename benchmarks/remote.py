"""The remote workloads: the raw and decode pipelines over HTTP and S3, and the disk cache.

One module, four table sections (`Config.workload`), every configuration in its own child process as
usual; `run.py` starts the servers once and hands their URLs to the children (`servers.py`):

- `http-raw`: iterate every sample, no decoding, from the HTTP server (a subprocess; 50 ms to first
  byte, 25 MB/s per connection). webdataset fetches `http://` URLs by piping `curl`; it runs inside
  `torch.utils.data.DataLoader(ds, batch_size=None, num_workers=N)`, where `split_by_worker` gives each
  worker its own shards, so N workers hold N connections. shardstream runs directly, with its default
  4 shards in flight and with 8.
- `http-decode`: the `decode` workload's pipeline (decode("pil"), center crop 224, to_tuple, batched
  64), shardstream direct, over HTTP and over local files (the ratio's reference).
- `cache`: shardstream direct over HTTP without a cache (the first epoch's reference, run in this
  section so that both ratios come from one run), and with `cache_dir=` a fresh temporary folder. "cold" empties the
  cache before every pass (the first epoch: bytes stream through to the parser and the cache file);
  "warm" fills it in an untimed pass first (every timed pass is a second epoch, read from the cache);
  "filled" fills it in a forked child first (every timed pass is a later job on the node: this
  process has not fetched anything, so it has not imported the HTTP client either).
  The reference is the same raw pass over the local files.
- `http-first`: the issue tracker's first-pass pipeline over HTTP,
  `WebDataset(urls, shardshuffle=False, nodesplitter=split_by_node).to_tuple("jpg", "cls")
  .map_tuple(len, int).batched(64)` (one rank), webdataset + DataLoader(2) and (8) against
  shardstream direct: read the `samples/s` column (first pass of a fresh process).
- `http-split`: the raw pipeline over HTTP with `nodesplitter=split_by_node`, as rank 0 of 2 (the
  shape every DDP script has), with no sizes.json beside the shards: how long until the first sample,
  and the pass over this rank's half. webdataset splits shard by shard; shardstream does the same
  without counts (it warns), and with `EqualSplit(count_shards=True)` reads every shard once, in
  parallel, to count it first.
- `s3`: raw and decode from moto's S3 server (a subprocess), shardstream direct. webdataset 1.0.2 has
  no `s3://` support (only `pipe:aws s3 cp ...` commands), so it is left out.

Raw items are sample dicts and decode items `(images, labels)` batches; `count` tells them apart.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import shutil
import tempfile
from typing import Callable, Iterable

import decode
import raw
from harness import Comparison, Config

__all__ = ["NAME", "CachedPass", "comparisons", "configs", "count", "make_pass"]

NAME = "remote"
WEBDATASET_WORKERS = (2, 8)


def _config(workload: str, name: str, library: str = "shardstream", **fields) -> Config:
    return Config(workload, name, library, module=NAME, **fields)


def configs(workers: list[int]) -> list[Config]:
    """The four sections' configurations; `workers` is not used (webdataset runs with 2 and 8)."""
    return [
        *(_config("http-raw", f"webdataset-dl{n}", "webdataset", num_workers=n, source="http",
                  pipeline="raw") for n in WEBDATASET_WORKERS),
        _config("http-raw", "shardstream", source="http", pipeline="raw"),
        _config("http-decode", "shardstream-local", source="local", pipeline="decode", baseline=True),
        _config("http-decode", "shardstream-http", source="http", pipeline="decode"),
        _config("cache", "shardstream-local", source="local", pipeline="raw", baseline=True),
        _config("cache", "shardstream-http", source="http", pipeline="raw"),
        _config("cache", "shardstream-http-cold", source="http", pipeline="raw", cache="cold"),
        _config("cache", "shardstream-http-warm", source="http", pipeline="raw", cache="warm"),
        _config("cache", "shardstream-http-filled", source="http", pipeline="raw", cache="filled"),
        *(_config("http-first", f"webdataset-dl{n}", "webdataset", num_workers=n, source="http",
                  pipeline="lengths") for n in WEBDATASET_WORKERS),
        _config("http-first", "shardstream", source="http", pipeline="lengths"),
        *(_config("http-split", f"webdataset-dl{n}", "webdataset", num_workers=n, source="http",
                  pipeline="raw", world_size=2, full_pass=False) for n in WEBDATASET_WORKERS),
        _config("http-split", "shardstream", source="http", pipeline="raw", world_size=2, full_pass=False),
        _config("http-split", "shardstream-count", source="http", pipeline="raw", world_size=2,
                full_pass=False, count_shards=True),
        _config("s3", "shardstream-raw", source="s3", pipeline="raw"),
        _config("s3", "shardstream-decode", source="s3", pipeline="decode"),
    ]


def comparisons() -> list[Comparison]:
    """The ratios printed under the table, with their targets."""
    lines = [
        Comparison(f"HTTP raw: shardstream / webdataset-dl{n}", "http-raw/shardstream", f"http-raw/webdataset-dl{n}")
        for n in WEBDATASET_WORKERS
    ]
    return lines + [
        Comparison("HTTP decode / local decode", "http-decode/shardstream-http",
                   "http-decode/shardstream-local", target=0.90),
        Comparison("cache pass 2 (warm) / local raw", "cache/shardstream-http-warm",
                   "cache/shardstream-local", target=0.95),
        Comparison("cache filled by another process (a later job) / local raw", "cache/shardstream-http-filled",
                   "cache/shardstream-local"),
        Comparison("cache pass 1 (cold) / HTTP raw without cache", "cache/shardstream-http-cold",
                   "cache/shardstream-http", target=0.97),
        *(Comparison(f"HTTP first pass (lengths pipeline): shardstream / webdataset-dl{n}", "http-first/shardstream",
                     f"http-first/webdataset-dl{n}", target=target)
          for n, target in zip(WEBDATASET_WORKERS, (5.0, 1.5))),
        Comparison("HTTP first pass, its peak PSS: shardstream / webdataset-dl8", "http-first/shardstream",
                   "http-first/webdataset-dl8", target=0.6, measure="pss"),
        Comparison("HTTP first pass, PSS added by the pass: shardstream / webdataset-dl8", "http-first/shardstream",
                   "http-first/webdataset-dl8", measure="added"),
        Comparison("HTTP first pass, PSS before it (no loader yet) / webdataset-dl8's peak", "http-first/shardstream",
                   "http-first/webdataset-dl8", measure="base", over="pss"),
        *(Comparison(f"HTTP split_by_node, rank 0 of 2: shardstream / webdataset-dl{n}", "http-split/shardstream",
                     f"http-split/webdataset-dl{n}") for n in WEBDATASET_WORKERS),
        Comparison("S3 raw / HTTP raw", "s3/shardstream-raw", "http-raw/shardstream"),
        Comparison("S3 decode / local decode", "s3/shardstream-decode", "http-decode/shardstream-local"),
    ]


class CachedPass:
    """Start passes of shardstream with `cache_dir=` a temporary folder this object owns.

    cold: `prepare()` (untimed, before each pass) empties the folder and flushes dirty pages, so each
    timed pass downloads every shard and writes it to the cache. warm: the constructor (untimed setup)
    runs one pass to fill the cache and checks that it holds every shard. filled: the same pass runs
    in a forked child, so this process starts its passes as a later job on the node does (nothing
    of the filling pass's imports, threads or connections in it).
    """

    def __init__(self, build: Callable[[dict], Iterable], mode: str, shards: int) -> None:
        self.build, self.mode = build, mode
        self.root = tempfile.mkdtemp(prefix="shardstream-bench-cache-")
        if mode == "warm":
            self._fill()
        elif mode == "filled":
            child = multiprocessing.get_context("fork").Process(target=self._fill)
            child.start()
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"the filling process exited with {child.exitcode}")
        if mode in ("warm", "filled"):
            cached = [name for name in os.listdir(self.root) if not name.startswith(".")]
            if len(cached) != shards:
                raise RuntimeError(f"the filling pass cached {len(cached)} of {shards} shards")

    def _fill(self) -> None:
        for _ in self():
            pass

    def __call__(self) -> Iterable:
        return self.build({"cache_dir": self.root})

    def prepare(self) -> None:
        if self.mode == "cold":
            shutil.rmtree(self.root)
            os.mkdir(self.root)
            os.sync()  # the previous pass's cache writes must not be flushed during this one

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def make_pass(config: Config, urls: list[str]) -> Callable[[], Iterable]:
    """Import the library and return what starts one pass of the config's pipeline over `urls`."""
    wds = importlib.import_module(config.library)
    options = {"shards_in_flight": config.shards_in_flight} if config.shards_in_flight else {}
    if config.world_size > 1:  # rank 0 of world_size, as torchrun would say (DataLoader workers inherit it)
        os.environ.update(RANK="0", WORLD_SIZE=str(config.world_size))
        options["nodesplitter"] = wds.EqualSplit(count_shards=True) if config.count_shards else wds.split_by_node

    def build(extra: dict) -> Iterable:
        if config.pipeline == "raw":
            dataset = wds.WebDataset(urls, shardshuffle=False, **options, **extra)
        elif config.pipeline == "lengths":
            dataset = (wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, **options, **extra)
                       .to_tuple("jpg", "cls").map_tuple(len, int).batched(64))
        else:
            dataset = decode.pipeline(wds, urls, **options, **extra)
        if config.num_workers == 0:
            return dataset
        from torch.utils.data import DataLoader

        return DataLoader(dataset, batch_size=None, num_workers=config.num_workers)

    if config.cache:
        return CachedPass(build, config.cache, len(urls))
    return lambda: build({})


def count(item) -> tuple[int, int]:
    """A raw sample (a dict), a decode batch (images, labels) or a lengths batch (jpg lengths,
    labels), counted like those workloads count them (a lengths batch: its jpg bytes)."""
    if isinstance(item, dict):
        return raw.count(item)
    first = item[0]
    if getattr(first, "dtype", None) is not None and first.ndim == 1:  # lengths
        return len(item[1]), int(sum(int(n) for n in first))
    return decode.count(item)
