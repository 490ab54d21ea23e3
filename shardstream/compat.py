"""webdataset's `compat` module: WebDataset, the fluid interface, WebLoader.

Why this module is over 400 lines: it holds the three classes webdataset's `compat` defines, as
old code imports them from here; WebLoader's per-worker resume bookkeeping is most of the length
and belongs to that class alone.
"""

from __future__ import annotations

import operator
import os
import random
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional

import yaml

from . import filters, shardlists, utils
from ._base.errors import UsageError
from ._fetch.options import FetchOptions
from ._fetch.registry import warming_skips
from ._resume.states import worker_passes, worker_view
from ._shard.samples import TarShardSamples
from ._cache.shardcache import cache_from_options
from ._resume.equal_split import EqualSplit
from ._stages.resumable import declare, traits
from ._resume.statecheck import STATE_FORMAT, fingerprint
from ._stages.stream_filters import SeededShuffle, ShardShuffle, ShardSpread, check_batchsize
from ._loader.subprocess import SubprocessLoader
from ._base.lazytorch import DataLoader, release_workers
from .filters import pipelinefilter
from .handlers import reraise_exception
from .mix import RandomMix, RoundRobin
from .pipeline import DataPipeline
from ._pipeline.passes import WORKER_END, Tagged
from .tariterators import group_by_keys, tar_file_expander

__all__ = [
    "FluidInterface",
    "FluidWrapper",
    "WebDataset",
    "WebLoader",
    "check_empty",
    "group_by_keys",
    "pipelinefilter",
    "tar_file_expander",
]


class FluidInterface:
    """Chainable methods; each returns a new pipeline with one more stage (`compose`)."""

    def batched(self, batchsize, collation_fn=filters.default_collation_fn, partial=True):
        check_batchsize(batchsize)  # (here, not at the first batch)
        return self.compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self):
        return self.compose(filters.unbatched())

    def listed(self, batchsize, partial=True):
        return self.compose(filters.batched(batchsize=batchsize, collation_fn=None))

    def unlisted(self):
        return self.compose(filters.unlisted())

    def log_keys(self, logfile=None):
        return self.compose(filters.log_keys(logfile))

    def shuffle(self, size, **kw):
        if size < 1:
            return self
        seed = getattr(self, "sample_seed", None)
        if seed is not None and "rng" not in kw and "seed" not in kw:
            # The dataset has an explicit seed: seed the buffer from (seed, epoch, rank, worker).
            return self.compose(SeededShuffle(size, kw.get("initial", 100), seed))
        return self.compose(filters.shuffle(size, **kw))

    def map(self, f, handler=reraise_exception):
        return self.compose(filters.map(f, handler=handler))

    def decode(self, *args, pre=None, post=None, only=None, partial=False, handler=reraise_exception, allow_pickle=None):
        """webdataset's decode; `allow_pickle=True` lets this decoder unpickle (refused by default)."""
        return self.compose(filters.decode(*args, pre=pre, post=post, only=only, partial=partial, handler=handler,
                                           allow_pickle=allow_pickle))

    def map_dict(self, handler=reraise_exception, **kw):
        return self.compose(filters.map_dict(handler=handler, **kw))

    def select(self, predicate, **kw):
        return self.compose(filters.select(predicate, **kw))

    def to_tuple(self, *args, **kw):
        return self.compose(filters.to_tuple(*args, **kw))

    def map_tuple(self, *args, handler=reraise_exception):
        return self.compose(filters.map_tuple(*args, handler=handler))

    def slice(self, *args):
        return self.compose(filters.slice(*args))

    def rename(self, **kw):
        return self.compose(filters.rename(**kw))

    def rsample(self, p=0.5):
        return self.compose(filters.rsample(p))

    def rename_keys(self, *args, **kw):
        return self.compose(filters.rename_keys(*args, **kw))

    def extract_keys(self, *args, **kw):
        return self.compose(filters.extract_keys(*args, **kw))

    def xdecode(self, *args, **kw):
        return self.compose(filters.xdecode(*args, **kw))

    def mcached(self):
        return self.compose(filters.Cached())

    def lmdb_cached(self, *args, **kw):
        return self.compose(filters.LMDBCached(*args, **kw))


def check_empty(source):
    """Raise if a pass yields no samples at all (usually: fewer shards than workers)."""
    count = 0
    for sample in source:
        yield sample
        count += 1
    if count == 0:
        raise ValueError(
            "No samples found in dataset; perhaps you have fewer shards than workers, or every shard this "
            "worker read failed and was skipped (a handler's warnings above name them).\n"
            "Turn off using empty_check=False in the WebDataset constructor."
        )


# A clean cut, left out of a resumed pass: one resumed near its end may rightly have nothing left.
declare(check_empty, clean_cut=True, skip_on_resume=True)


class WebDataset(DataPipeline, FluidInterface):
    """A pipeline that reads samples from WebDataset shards; webdataset 1.0.2's constructor.

    Beyond webdataset's arguments: `allow_pipe` enables `pipe:` URLs for this dataset, and
    `cache_memory_bytes` adds a memory tier (shards up to that size) in front of the disk cache,
    `fetch_options` sets timeouts / retries / buffer sizes for http(s) and s3 shards, and
    `shards_in_flight` how many remote shards are opened ahead of the one being read, `weights` (with
    resampled=True) one weight per `::`-separated source of the spec, and `mix` how weighted
    sources are drawn: "exact" (default: each source its exact share of the samples, within one
    shard at every point) or "random" (independent weighted shard draws).
    `cache_dir` / `cache_size` (and WDS_CACHE / WDS_CACHE_SIZE) set up the disk tier, shared by
    all processes on the node; `url_to_name` is accepted and ignored (names derive from the URL).
    """

    def __init__(
        self,
        urls,
        handler: Callable = reraise_exception,
        mode: Optional[str] = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle=None,
        cache_size: int = -1,
        cache_dir: Optional[str] = None,
        url_to_name=None,
        detshuffle: bool = False,
        nodesplitter=shardlists.single_node_only,
        workersplitter=shardlists.split_by_worker,
        select_files=None,
        rename_files=None,
        empty_check: bool = True,
        verbose: bool = False,
        seed=None,
        *,
        allow_pipe: Optional[bool] = None,
        cache_memory_bytes: int = 0,
        fetch_options: Optional[FetchOptions] = None,
        shards_in_flight: int = 8,
        weights: Any = None,
        mix: Optional[str] = None,
    ) -> None:
        super().__init__()
        if resampled:
            mode = "resampled"
        if mode == "resampled" and shardshuffle not in (False, None):
            warnings.warn("WebDataset(shardshuffle=...) is ignored for resampled datasets")
        elif shardshuffle is None:
            warnings.warn("WebDataset(shardshuffle=...) is None; set explicitly to False or a number")
        if shardshuffle is True:
            warnings.warn("set WebDataset(shardshuffle=...) to a positive integer or 0 or False")
            shardshuffle = 100
        self.seed = os.environ.get("WDS_SEED", random.randint(0, 1000000)) if seed is None else seed
        # Only a seed the user chose (argument or WDS_SEED) makes sample shuffles reproducible.
        self.sample_seed = seed if seed is not None else os.environ.get("WDS_SEED")
        cache = cache_from_options(cache_dir, cache_size, memory_bytes=cache_memory_bytes)
        if weights is not None and mode != "resampled":
            raise UsageError("weights= needs resampled=True (draws with replacement, per `::` source)")
        if mix is not None and mode != "resampled":
            raise UsageError("mix= needs resampled=True")
        with warming_skips(cache.holds if cache is not None else None):  # (a cached epoch needs no client)
            self._append_shard_source(urls, mode, self.sample_seed, weights, mix)
        if nodesplitter is shardlists.split_by_node and mode != "resampled":
            # Equal samples per rank, a new shard order every epoch, the same on all ranks.
            split_seed = seed if seed is not None else int(os.environ.get("WDS_SEED", 0))
            nodesplitter = EqualSplit(seed=int(split_seed), shuffle=bool(shardshuffle))
        if shardshuffle and mode != "resampled" and not isinstance(nodesplitter, EqualSplit):
            # later epochs give each worker new shards, not the same ones reordered
            self.append(ShardSpread(self.seed, shared=self.sample_seed is not None))
        if nodesplitter is not None:
            self.append(nodesplitter)
        if workersplitter:
            self.append(workersplitter)
        # A shard shuffle seeded at random in this process cannot be repeated by a resumed one.
        self._unseeded_shard_shuffle = bool(shardshuffle) and self.sample_seed is None and not isinstance(
            nodesplitter, EqualSplit
        ) and mode != "resampled"
        if shardshuffle is not None and not isinstance(nodesplitter, EqualSplit):  # it shuffles itself
            if detshuffle:
                self.append(filters.detshuffle(shardshuffle, seed=self.seed))
                self.pipeline[-1].seed_chosen = self.sample_seed is not None  # (else drawn here at random)
            else:  # webdataset's order in epoch 0, a new one every epoch (webdataset repeats it)
                self.append(ShardShuffle(shardshuffle, seed=self.seed))
        self.append(
            TarShardSamples(handler=handler, select_files=select_files, rename_files=rename_files,
                            allow_pipe=allow_pipe, local_paths=True, cache=cache,
                            fetch_options=fetch_options, shards_in_flight=shards_in_flight)
        )
        if isinstance(nodesplitter, EqualSplit) and nodesplitter.reader is None:
            nodesplitter.reader = self.pipeline[-1].batches  # counting by reading fills the cache
        if empty_check and not isinstance(nodesplitter, EqualSplit):
            # (with the equal-work splitter a worker may rightly get nothing: fewer samples per
            # rank than workers; the splitter itself refuses an epoch with nothing for a rank)
            self.append(check_empty)

    def state_settings(self) -> Dict[str, Any]:
        """The pipeline's settings (see DataPipeline) and the seed, where the user chose one."""
        # (as text: WDS_SEED=3 from the environment and seed=3 in code are one seed)
        chosen = {"seed": str(self.sample_seed)} if self.sample_seed is not None else {}
        return {**super().state_settings(), **chosen}

    def _append_shard_source(
        self, urls: Any, mode: Optional[str], seed: Any = None, weights: Any = None, mix: Optional[str] = None
    ) -> None:
        if isinstance(urls, os.PathLike):  # (a pathlib path: the string it stands for)
            urls = os.fspath(urls)
        if isinstance(urls, str) and (urls.endswith(".yaml") or urls.endswith(".yml")):
            with open(urls) as stream:
                spec = yaml.safe_load(stream)
            assert "datasets" in spec
            self.append(shardlists.MultiShardSample(spec))
        elif isinstance(urls, dict):
            assert "datasets" in urls
            self.append(shardlists.MultiShardSample(urls))
        elif isinstance(urls, str) and urls.endswith(".json"):
            raise ValueError("unimplemented")
        elif isinstance(urls, str) or utils.is_iterable(urls):
            if mode == "resampled":
                # An explicit seed makes the draws reproducible per (seed, epoch, rank, worker).
                deterministic = seed is not None
                self.append(
                    shardlists.ResampledShards(
                        urls, seed=int(seed) if deterministic else 0, deterministic=deterministic, weights=weights,
                        mix=mix,
                    )
                )
            else:
                self.append(shardlists.SimpleShardList(urls))
        else:
            raise ValueError(f"cannot handle urls of type {type(urls)}")

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.close()


class FluidWrapper(DataPipeline, FluidInterface):
    """Wrap any iterable so that it gets the fluid methods."""

    def __init__(self, initial) -> None:
        super().__init__()
        self.append(initial)


_MISSING = object()


class _TaggedCollate:
    """A stateful WebLoader's `collate_fn` (batch_size=None: called on each item in its worker):
    the caller's function, or torch's `default_convert` (numpy arrays to tensors, tuples to
    lists), applied to the item inside its worker tag, so items arrive converted as from a plain
    DataLoader and the tag still says where each came from."""

    def __init__(self, inner: Optional[Callable[[Any], Any]]) -> None:
        self.inner = inner

    def __call__(self, item: Any) -> Any:
        inner: Any = self.inner
        if inner is None:
            from torch.utils.data import default_convert

            inner = default_convert
        if not isinstance(item, Tagged):
            return inner(item)
        if item.item is WORKER_END:
            return item
        return item.replace(inner(item.item))


class _Untag:
    """WebLoader's first stage after the DataLoader (`WebLoader._untag`), holding its loader
    weakly. A bound method there made every WebLoader a reference cycle, so a DataLoader with
    persistent workers (which keeps their iterator) was let go only by a garbage collection, whose
    finalizer then held whichever thread ran it ~5 s per iterator, its workers alive meanwhile."""

    def __init__(self, loader: "WebLoader") -> None:
        self._loader = weakref.ref(loader)

    def __call__(self, src):
        loader = self._loader()
        if loader is None:  # (a stage list copied out of a loader that is gone)
            raise UsageError("this WebLoader stage belongs to a loader that no longer exists")
        return loader._untag(src)

    def __reduce__(self):  # a copy (deepcopy, pickle) of the loader holds its own copy's stage
        return (_Untag, (self._loader(),))


class WebLoader(DataPipeline, FluidInterface):
    """A torch DataLoader with the fluid methods (`.unbatched().shuffle().batched()`).

    With a shardstream dataset and `batch_size=None` (the usual way: the dataset batches), it is
    stateful in the torchdata StatefulDataLoader convention: `state_dict()` records how many items
    each worker has delivered, and `load_state_dict()` makes the next epoch continue after them.

    `subprocess=True` (or a dict of SubprocessLoader options, e.g. {"buffer": 8}) runs the
    loader, engine threads and all, in one helper process instead of this one (num_workers=0);
    its batches arrive through shared memory. See SubprocessLoader.
    """

    # SubprocessLoader refuses a WebLoader with this advice (its workers are processes already)
    subprocess_refusal = "use WebLoader(..., subprocess=True) to run a WebLoader's pipeline in a helper process"

    def __init__(self, *args, subprocess=False, **kw) -> None:
        if subprocess and kw.get("num_workers", 0):
            raise UsageError("WebLoader(subprocess=True) runs the pipeline with threads in one helper process: "
                             "leave num_workers at 0")
        positional = list(args)
        given: Any = positional[0] if positional else kw.get("dataset")
        dataset = DataPipeline(given) if isinstance(given, (RandomMix, RoundRobin)) else given  # (it keeps a state)
        self._stateful = isinstance(dataset, DataPipeline) and kw.get("batch_size", 1) is None
        self._stateless_reason: Optional[str] = None
        if not isinstance(dataset, DataPipeline):
            self._stateless_reason = ("WebLoader state needs a shardstream dataset (a WebDataset, DataPipeline or "
                                      f"mix; got {type(dataset).__name__})")
        elif not self._stateful:
            self._stateless_reason = ("WebLoader state needs batch_size=None (the dataset batches; got "
                                      f"batch_size={kw.get('batch_size', 1)!r})")
        self._origin = dataset if self._stateful else None  # where the caller may set_epoch by hand
        if self._stateful:
            dataset = dataset.tagged_copy()  # the caller's dataset keeps handing out plain items
            if len(positional) > 6:  # (DataLoader's 7th argument)
                positional[6] = _TaggedCollate(positional[6])
            else:
                kw["collate_fn"] = _TaggedCollate(kw.get("collate_fn"))
        if dataset is not given:
            if positional:
                positional[0] = dataset
            else:
                kw["dataset"] = dataset
        self._dataset: Any = dataset
        self._consumed: Dict[int, int] = {}  # items handed out per worker, this epoch
        self._positions: Dict[int, Any] = {}  # resume position of each worker's last item
        self._pass_bases: Dict[int, int] = {}  # passes each worker's copy had run before this iteration
        self._pending: Optional[Dict[str, Any]] = None  # a loaded state the next epoch continues
        self._loader_split: Optional[List[Dict[str, Any]]] = None  # the history this epoch resumed from
        self._auto_epoch = 0  # the epoch the next iteration gets unless set_epoch was called
        self._auto_set: Optional[int] = None  # the epoch this loader last set on the dataset
        self._user_epoch = False
        self._worker_pass = 0  # persistent workers without set_epoch: the pass their next iteration runs
        workers_epoch = None
        if self._stateful and kw.get("persistent_workers") and kw.get("num_workers", 0) > 0:
            # their copies of the dataset live as long as the loader: a set epoch reaches them here
            workers_epoch = dataset.share_epoch()
        loader = DataLoader(*positional, **kw)
        if subprocess:
            loader = SubprocessLoader(loader, **(subprocess if isinstance(subprocess, dict) else {}))
        super().__init__(loader, _Untag(self))
        self._workers_epoch = workers_epoch

    def __iter__(self):
        it = super().__iter__()
        if self._pending is not None:  # continuing a saved epoch: its items count towards with_epoch
            it.credit(int(self._pending.get("loader_delivered") or 0))
        return it

    def __copy__(self) -> "WebLoader":
        """A shallow copy (`compose`, `with_engine`, `copy.copy`) that keeps its own resume
        bookkeeping: its own stage list, whose untag stage serves the copy."""
        result = type(self).__new__(type(self))
        result.__dict__.update(self.__dict__)
        result.pipeline = list(self.pipeline)
        result.pipeline[1] = _Untag(result)
        result._consumed, result._positions, result._pass_bases = {}, {}, {}
        return result

    def _untag(self, src):
        """Unwrap worker-tagged items, in the canonical order (the k-th item of every worker in
        worker order, then the (k+1)-th, ...: torch's round robin), from the resume point."""
        workers = max(1, getattr(self.pipeline[0], "num_workers", 0))
        pending, self._pending = self._pending, None
        if pending is None:
            self._loader_split = None  # a fresh epoch
        consumed = self._consumed
        consumed.clear()
        consumed.update({w: 0 for w in range(workers)})
        counts, saved = worker_view(pending)
        consumed.update(counts)
        positions = self._positions
        positions.clear()
        positions.update(saved)
        bases = self._pass_bases
        bases.clear()
        bases.update(worker_passes(pending))
        pending: Dict[int, Dict[int, Any]] = {w: {} for w in range(workers)}
        ended: Dict[int, int] = {}

        def ready():
            while True:
                live = [w for w in range(workers) if w not in ended or consumed[w] + 1 < ended[w]]
                if not live:
                    return
                worker = min(live, key=lambda w: (consumed[w], w))
                entry = pending[worker].pop(consumed[worker] + 1, _MISSING)
                if entry is _MISSING:
                    return
                consumed[worker] += 1
                positions[worker] = entry.position
                if entry.pass_base is not None:
                    bases[worker] = entry.pass_base
                yield entry.item

        try:
            for item in src:
                if not isinstance(item, Tagged):
                    yield item
                    continue
                if item.item is WORKER_END:
                    ended[item.worker] = item.count
                else:
                    pending[item.worker][item.count] = item
                yield from ready()
        except BaseException:  # a worker's error (or a consumer that stopped): its workers go now
            release_workers(src)
            raise

    def iterator1(self, position=None, track=False, resumed=False):
        if isinstance(self._dataset, DataPipeline) and getattr(self.pipeline[0], "num_workers", 0) > 0:
            # Workers get a fresh copy of the dataset every epoch, so its stages' own pass
            # counters would start at 0 each time: number the epochs here instead, unless the
            # epoch was set by hand (on the loader or on the dataset).
            by_hand = self._origin.epoch if self._origin is not None else None
            if by_hand is not None and by_hand != self._dataset.epoch and by_hand != self._auto_set:
                self._dataset.set_epoch(by_hand)  # set on the caller's dataset after the loader was made
                self._user_epoch = True
            persistent = getattr(self.pipeline[0], "persistent_workers", False)  # their copies count passes
            if persistent and not self._user_epoch:
                self._worker_pass += 1
            if not (self._user_epoch or persistent) and self._dataset.epoch in (None, self._auto_set):
                self._dataset.set_epoch(self._auto_epoch)
                self._auto_set = self._auto_epoch
                self._auto_epoch += 1
            if self._workers_epoch is not None and self._user_epoch and self._dataset.epoch is not None:
                self._workers_epoch.value = self._dataset.epoch  # (read by the workers as their pass starts)
            self._dataset.count_samples()  # once here, not in every worker
        it = super().iterator1(position, track, resumed)
        if isinstance(self._dataset, DataPipeline):
            self._dataset.forget_resume_point()  # the workers have their copy of the resume point
        return it

    def set_epoch(self, epoch: int) -> None:
        """Set the dataset's epoch (DataLoader workers pick it up, persistent ones as their next
        pass starts). Without it, each iteration of the loader is the next epoch (0, 1, ...)."""
        epoch = operator.index(epoch)  # (a numpy int from np.arange: states stay JSON)
        self.epoch = epoch
        self._user_epoch = True
        if self._pending is not None and self._pending.get("epoch") not in (None, epoch):
            self._pending, self._loader_split = None, None  # a loaded state of another epoch: start fresh
        if isinstance(self._dataset, DataPipeline):
            self._dataset.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        if not self._stateful:
            raise UsageError(str(self._stateless_reason))
        pending = self._pending  # loaded, not started yet: still that state
        counts, positions = worker_view(pending) if pending is not None else (self._consumed, self._positions)
        return {
            "format": STATE_FORMAT, "fingerprint": fingerprint(self._fingerprinted(), self._dataset.state_settings()),
            "epoch": self._dataset.epoch,
            # set by hand (it then stays for every iteration until set again), or counted
            "epoch_set": bool(pending.get("epoch_set")) if pending is not None else self._user_epoch,
            "per_worker": {str(k): v for k, v in counts.items()},
            "positions": {str(k): v for k, v in positions.items() if v is not None},
            "layout": self._dataset.layout(self._workers()),
            "split": self._loader_split,
            # without workers the dataset runs here and counts its passes (see pass_base); persistent
            # workers' copies count theirs, one per iteration of this loader
            "passes": self._passes(pending),
            # ... and each worker's own count (one that wrapped around within with_epoch is ahead)
            "worker_passes": {str(k): v for k, v in (worker_passes(pending) if pending is not None
                                                     else self._pass_bases).items()},
            # items this loader handed out, for loader.with_epoch(n)
            "loader_delivered": int(pending.get("loader_delivered") or 0) if pending is not None else self.progress()[0],
        }

    def _workers(self) -> int:
        return max(1, getattr(self.pipeline[0], "num_workers", 0))

    def _counting_workers(self) -> bool:
        """Persistent workers without set_epoch: their dataset copies number the passes."""
        loader = self.pipeline[0]
        return bool(getattr(loader, "num_workers", 0) and getattr(loader, "persistent_workers", False)
                    and not self._user_epoch)

    def _passes(self, pending: Optional[Dict[str, Any]]) -> int:
        """The pass a state is in: the dataset's count here, or the workers' (see _counting_workers)."""
        if pending is not None:
            return int(pending.get("passes") or 0)
        if not getattr(self.pipeline[0], "num_workers", 0):
            return self._dataset.progress()[2]
        return max(0, self._worker_pass - 1) if self._counting_workers() else 0  # (the pass under way)

    def _fingerprinted(self) -> List[Any]:
        """The stages a state describes: the dataset's, then the loader's own after its items."""
        return [*self._dataset.pipeline, *self.pipeline[2:]]

    def load_state_dict(self, state: Any) -> None:
        """Continue the saved epoch: `state` is this loader's `state_dict()`, or the list of
        every rank's (`gather_states`) to finish it on another world size or worker count."""
        if not self._stateful:
            raise UsageError(str(self._stateless_reason))
        state = self._dataset.resume_from(state, self._fingerprinted(), "loader", self._workers())
        held = [s for s in self.pipeline[2:] if not traits(s).clean_cut]
        if held:
            warnings.warn(
                f"stages after the WebLoader that hold samples back ({', '.join(map(repr, held))}) are not "
                "in its state: the samples they held at the checkpoint are not delivered after it; put "
                "them in the dataset instead",
                stacklevel=2,
            )
        if state.get("epoch") is not None:
            self._auto_epoch = self._auto_set = int(state["epoch"])  # the resumed epoch runs next
        if self._counting_workers():
            self._worker_pass = int(state.get("passes") or 0)  # the resumed pass runs next
        self._pending = state
        self._loader_split = state.get("split")
        if state.get("epoch_set") and state.get("epoch") is not None:
            self.set_epoch(int(state["epoch"]))  # it stays, as it did in the saved run (the same epoch: kept pending)


