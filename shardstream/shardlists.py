"""webdataset's `shardlists`: shard sources and node/worker splitters."""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import sys
import time
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any, Dict, Iterator, List, Optional

import braceexpand
import yaml

from . import utils
from ._shard.counts import known_counts
from ._shard.origin import Draw
from ._shard.dirshards import DirectoryShardList, check_pid_is_running, get_pid_from_filename, without_last_extension
from ._fetch.listing import expand_listings
from ._fetch.registry import warm_fetchers
from ._plan.scheduler import ShardScheduler
from ._plan.shards import SchedulerConfig, Shard
from ._resume.equal_split import WORKER_SPLIT, EqualSplit
from ._stages.resumable import ResumeTraits
from ._base.lazytorch import IterableDataset
from ._base.redact import redact
from ._plan.urls import envlookup, envsubst, expand_urls, split_sources
from .filters import pipelinefilter
from .utils import is_iterable, obsolete

__all__ = [
    "DirectoryShardList",
    "EqualSplit",
    "MSSource",
    "MultiShardSample",
    "ResampledShardList",
    "ResampledShards",
    "SimpleShardList",
    "check_pid_is_running",
    "default_rng",
    "envlookup",
    "envsubst",
    "expand",
    "expand_source",
    "expand_urls",
    "get_pid_from_filename",
    "non_empty",
    "obsolete",
    "resampled",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "without_last_extension",
]


def split_by_node(src, group=None):
    """Every world_size-th shard, starting at this rank."""
    rank, world_size, _worker, _num_workers = utils.pytorch_worker_info(group=group)
    if world_size > 1:
        yield from islice(src, rank, None, world_size)
    else:
        yield from src


def single_node_only(src, group=None):
    """Refuse to run with world_size > 1 (the WebDataset default nodesplitter)."""
    _rank, world_size, _worker, _num_workers = utils.pytorch_worker_info(group=group)
    if world_size > 1:
        raise ValueError("you need to add an explicit nodesplitter to your input pipeline for multi-node training")
    yield from src


def split_by_worker(src):
    """Every num_workers-th shard, starting at this DataLoader worker (items that the equal-work
    node splitter already cut for this worker pass unchanged)."""
    src = iter(src)
    first = next(src, None)
    if first is None:
        return
    if isinstance(first, dict) and first.get(WORKER_SPLIT):
        yield first
        yield from src
        return
    _rank, _world_size, worker, num_workers = utils.pytorch_worker_info()
    if num_workers > 1:
        yield from islice(chain([first], src), worker, None, num_workers)
    else:
        yield first
        yield from src


def expand_source(source, max_urls: int = int(1e9)) -> List[str]:
    if isinstance(source, str):
        return expand_urls(source)
    if isinstance(source, list):
        return source
    if is_iterable(source):
        return list(islice(source, max_urls))
    raise ValueError(f"cannot handle {type(source)}")


class SimpleShardList(IterableDataset):
    """The shards of a spec, in order (or shuffled once per pass with `seed`)."""

    def __init__(self, urls, seed=None) -> None:
        super().__init__()
        self.urls = expand_listings(expand_urls(urls))
        if not self.urls:
            raise ValueError(f"no shards match {urls!r}")
        assert isinstance(self.urls[0], str)
        warm_fetchers(self.urls)  # (aiohttp's import, off the event loop's thread)
        if seed is True:
            seed = time.time()
        self.seed = seed

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[dict]:
        urls = self.urls.copy()
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)
        for url in urls:
            yield dict(url=url)


def resampled_(src, n=sys.maxsize):
    rng = random.Random(os.urandom(20))
    items = list(src)
    for _ in range(n):
        yield rng.choice(items)


resampled = pipelinefilter(resampled_)


def non_empty(src):
    """Raise if the stream turns out to be empty."""
    count = 0
    for s in src:
        yield s
        count += 1
    if count == 0:
        raise ValueError("pipeline stage received no data at all and this was declared as an error")


class ResampledShards(IterableDataset):
    """An endless (or nshards long) stream of shards drawn with replacement.

    `weights` (a shardstream extension): one weight per `::`-separated source of a string spec;
    a source's weight is split evenly over its shards, so each source is drawn in proportion to
    its weight whatever its number of shards. (OpenCLIP's upsampling factors apply per *shard*:
    there a source's share is its factor times its shard count. To reproduce OpenCLIP's mix,
    pass factor x number of shards, as tools/train_clip.py does.)
    `mix="exact"` (the default with weights) gives each source its exact share of the *samples*
    (known from sizes.json or `.idx` files): at every point of a worker's stream a source is off
    its share by less than one of its shards; `mix="random"` draws every shard independently
    (shares hold only on average). Both are seeded by (seed, epoch, rank, worker) when
    deterministic.
    """

    def __init__(self, urls, nshards=sys.maxsize, seed=0, worker_seed=None, deterministic=False,
                 max_urls=int(1e6), empty_check=True, weights=None, mix=None) -> None:
        super().__init__()
        sources = _listed_sources(urls) if isinstance(urls, str) else [expand_listings(expand_source(urls, max_urls))]
        self.urls = [url for source in sources for url in source]
        if empty_check and len(self.urls) == 0:
            raise ValueError("empty_check=True, but no shards found in ResampledShards")
        assert isinstance(self.urls[0], str)
        warm_fetchers(self.urls)
        self.weights = None if weights is None else _per_shard_weights(urls, sources, weights)
        self.mix = mix if mix is not None else ("exact" if weights is not None else "random")
        if self.mix not in ("exact", "random"):
            raise ValueError(f"mix must be 'exact' or 'random', got {mix!r}")
        self.sources = [i for i, source in enumerate(sources) for _ in source]  # each shard's `::` source
        self.nshards = nshards
        self.worker_seed = utils.pytorch_worker_seed if worker_seed is None else worker_seed
        self.deterministic = deterministic
        self.seed = seed
        self.epoch = -1
        self._epoch_set: Optional[int] = None

    @property
    def resume_traits(self) -> ResumeTraits:
        """Unseeded draws cannot be made again by a resumed run (the pipeline warns)."""
        return ResumeTraits(deterministic=self.deterministic is not False)

    def set_epoch(self, epoch: int) -> None:
        """Draw the next pass for this epoch (else each pass counts as the next epoch)."""
        self._epoch_set = epoch

    def state_settings(self) -> Dict[str, Any]:
        """In a saved state's fingerprint: other weights, mix, length or seed draw other shards."""
        weights = None
        if self.weights is not None:
            weights = hashlib.blake2b(repr([float(w) for w in self.weights]).encode(), digest_size=8).hexdigest()
        return {"weights": weights, "mix": self.mix, "nshards": self.nshards,
                **({"seed": self.seed} if self.deterministic else {})}

    def __iter__(self) -> Iterator[dict]:
        self.epoch = self._epoch_set if self._epoch_set is not None else self.epoch + 1
        if self.mix == "exact":
            yield from self._exact()
            return
        if self.deterministic:
            seed = utils.make_seed(self.worker_seed(), self.epoch, self.seed)
        else:
            seed = utils.make_seed(self.worker_seed(), self.epoch, self.seed, os.getpid(), time.time_ns(), os.urandom(4))
        self.rng = random.Random(seed)
        drawn_from = self._drawn_from()
        if self.weights is not None:
            cumulative = list(itertools.accumulate(self.weights))
            for _ in range(self.nshards):
                yield Draw(self.rng.choices(self.urls, cum_weights=cumulative)[0], drawn_from)
            return
        for _ in range(self.nshards):
            index = self.rng.randint(0, len(self.urls) - 1)
            yield Draw(self.urls[index], drawn_from)


    def _exact(self) -> Iterator[dict]:
        rank, _world, worker, _workers = utils.pytorch_worker_info()
        seed = int(self.seed) if self.deterministic else utils.make_seed(os.getpid(), time.time_ns(), os.urandom(4))
        weights = self.weights if self.weights is not None else [1.0] * len(self.urls)
        counts = self.__dict__.get("_exact_counts")
        if counts is None or counts[0] != tuple(self.urls):  # (looked up once for a list, not every pass)
            counts = self._exact_counts = (tuple(self.urls), known_counts(self.urls))
        shards = [Shard(url, count, weight, source)
                  for url, count, weight, source in zip(self.urls, counts[1], weights, self.sources)]
        draws = ShardScheduler(shards, SchedulerConfig(seed=seed, mode="resampled")).iter_exact(self.epoch, rank, worker)
        drawn_from = self._drawn_from()
        for piece in itertools.islice(draws, self.nshards):
            yield Draw(piece.url, drawn_from)

    def _drawn_from(self) -> int:
        """The shards a draw can pick (a zero weight: never); counted once a pass, not per draw."""
        if self.weights is None:
            return len(set(self.urls))
        return len({url for url, weight in zip(self.urls, self.weights) if weight > 0})


def _listed_sources(spec: str) -> List[List[str]]:
    """The shards of each `::` source of a spec (braces expanded, globs and prefixes listed)."""
    return [expand_listings(expand_urls(part)) for part in split_sources(spec)]


def _per_shard_weights(spec, sources: List[List[str]], weights) -> List[float]:
    """Weights per source of a `::` spec, spread evenly over each source's shards."""
    if not isinstance(spec, str):
        raise ValueError("weights need a string spec with one `::`-separated source per weight")
    weights = [float(w) for w in (weights.split("::") if isinstance(weights, str) else weights)]
    if len(weights) != len(sources):
        raise ValueError(f"{len(weights)} weights for {len(sources)} `::` sources")
    if any(w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError("weights must be >= 0 and not all 0")
    empty = [i for i, (urls, w) in enumerate(zip(sources, weights)) if w > 0 and not urls]
    if empty:
        raise ValueError(f"`::` source {empty[0]} of {redact(spec)!r} has a weight but names no shards")
    return [w / len(urls) for urls, w in zip(sources, weights) for _ in urls]


ResampledShardList = ResampledShards


@dataclass
class MSSource:
    name: str = ""
    perepoch: int = -1
    resample: bool = False
    urls: List[str] = field(default_factory=list)


# The random source MultiShardSample starts from (webdataset's), until set_epoch seeds its own.
default_rng = random.Random()


def expand(s: str) -> str:
    """Expand `~` and environment variables in a string."""
    return os.path.expanduser(os.path.expandvars(s))


class MultiShardSample(IterableDataset):
    """Shards from a YAML/dict spec of several datasets (webdataset's `datasets:` format)."""

    def __init__(self, fname) -> None:
        self.epoch = -1
        self.rng = default_rng
        if isinstance(fname, dict):
            spec = fname
        else:
            with open(fname) as stream:
                spec = yaml.safe_load(stream)
        assert set(spec.keys()).issubset({"prefix", "datasets", "buckets"}), list(spec.keys())
        prefix = expand(spec.get("prefix", ""))
        self.sources = []
        for ds in spec["datasets"]:
            assert set(ds.keys()).issubset({"buckets", "name", "shards", "resample", "choose"}), list(ds.keys())
            buckets = ds.get("buckets", spec.get("buckets", []))
            if isinstance(buckets, str):
                buckets = [buckets]
            buckets = [expand(s) for s in buckets] or [""]
            assert len(buckets) == 1, f"{buckets}: multiple buckets are not supported"
            bucket = buckets[0]
            urls = ds["shards"]
            urls = [urls] if isinstance(urls, str) else urls
            urls = [prefix + os.path.join(bucket, u) for url in urls for u in braceexpand.braceexpand(expand(url))]
            resample = ds.get("resample", -1)
            nsample = ds.get("choose", -1)
            if nsample > len(urls):
                raise ValueError(f"perepoch {nsample} must be no greater than the number of shards")
            if nsample > 0 and resample > 0:
                raise ValueError("specify only one of perepoch or choose")
            self.sources.append(MSSource(name=ds.get("name", "@" + bucket), urls=urls, perepoch=nsample, resample=resample))

    def set_epoch(self, seed) -> None:
        self.rng = random.Random(seed)

    def get_shards_for_epoch(self) -> List[str]:
        result: List[str] = []
        for source in self.sources:
            if source.resample > 0:
                chosen = self.rng.choices(source.urls, k=source.resample)
            elif source.perepoch > 0:
                chosen = list(source.urls)
                self.rng.shuffle(chosen)
                chosen = chosen[: source.perepoch]
            else:
                chosen = list(source.urls)
            result += chosen
        self.rng.shuffle(result)
        return result

    def __iter__(self) -> Iterator[dict]:
        for shard in self.get_shards_for_epoch():
            yield dict(url=shard)


def shardspec(spec: str):
    return MultiShardSample(spec) if spec.endswith(".yaml") else SimpleShardList(spec)
