"""Stream stages with webdataset's semantics: shuffle, detshuffle, batched, unbatched, unlisted,
rsample, info, log_keys, xdecode, Cached; and default collation.

These see the whole stream (order, buffering, grouping), so the engine runs them in order.
"""

from __future__ import annotations

import io
import numbers
import os
import random
import re
import sys
import time
from fnmatch import fnmatch
from typing import Any, Dict, List, Optional

import numpy as np

from .._plan.ranks import pytorch_worker_info
from .._base.errors import UsageError
from .._base.redact import redact
from .contract import PipelineStage
from .resumable import ResumeTraits, clean_cut, declare
from .._base.lazytorch import is_tensor

__all__ = [
    "Cached",
    "SeededShuffle",
    "ShardShuffle",
    "ShardSpread",
    "combine_values",
    "default_collation_fn",
    "detshuffle",
    "dict2tuple",
    "pick",
    "tuple2dict",
]


def pick(buf: List[Any], rng: random.Random) -> Any:
    """Remove and return a random element of buf (swap with the last: O(1))."""
    k = rng.randint(0, len(buf) - 1)
    sample = buf[k]
    buf[k] = buf[-1]
    buf.pop()
    return sample


def _shuffle(data, bufsize=1000, initial=100, rng=None, seed=None, handler=None):
    """Shuffle through a buffer; the same rng draws as webdataset, so a seed gives its order."""
    if seed is not None:
        assert rng is None
        rng = random.Random(seed)
    elif rng is None:
        rng = random.Random(int((os.getpid() + time.time()) * 1e9))
    initial = min(initial, bufsize)
    data = iter(data)
    buf: List[Any] = []
    for sample in data:
        buf.append(sample)
        if len(buf) < bufsize:
            try:
                buf.append(next(data))
            except StopIteration:
                pass
        if len(buf) >= initial:
            yield pick(buf, rng)
    while len(buf) > 0:
        yield pick(buf, rng)


def _shuffle_traits(bufsize=1000, initial=100, rng=None, seed=None, handler=None) -> ResumeTraits:
    """A seeded shuffle gives the same order again (a resume may recompute it); one without a
    seed or an rng of the caller's cannot be repeated by a resumed run."""
    return ResumeTraits(replayable=seed is not None and rng is None, deterministic=seed is not None or rng is not None)


_shuffle.resume_traits = _shuffle_traits  # type: ignore[attr-defined]


class detshuffle(PipelineStage):
    """Shuffle seeded by seed + epoch; the epoch advances on every pass."""

    resume_traits = ResumeTraits(replayable=True)  # the same order again for the same epoch (elastic resume recomputes it)

    def __init__(self, bufsize=1000, initial=100, seed=0, epoch=-1):
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self.epoch = epoch

    seed_chosen = True  # (False where WebDataset drew the seed at random: the dataset's settings say so)

    def set_epoch(self, epoch: int) -> None:
        """The next pass shuffles with seed + epoch."""
        self.epoch = epoch - 1

    def state_settings(self) -> Dict[str, Any]:
        """In a saved state's fingerprint: another buffer or seed gives another order."""
        return {"bufsize": self.bufsize, "initial": self.initial, **({"seed": str(self.seed)} if self.seed_chosen else {})}

    def run(self, src):
        self.epoch += 1
        rng = random.Random()
        rng.seed(self.seed + self.epoch)
        return _shuffle(src, self.bufsize, self.initial, rng)

    def __call__(self, src):
        return self.run(src)


class _ByEpoch(PipelineStage):
    """A stage whose pass depends on the epoch: `set_epoch(e)`, else its passes count 0, 1, ..."""

    def __init__(self) -> None:
        self.epoch: Optional[int] = None
        self.passes = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _next_epoch(self) -> int:
        """The epoch of the pass starting now (called once per pass, when it starts)."""
        epoch = self.epoch if self.epoch is not None else self.passes
        self.passes += 1
        return epoch

    def __call__(self, src):
        return self.run(src)


class _EpochShuffle(_ByEpoch):
    """A shuffle buffer whose draws depend on the epoch; subclasses say how the epoch seeds it
    (`_rng`)."""

    name = "shuffle"

    def __init__(self, bufsize: int, initial: int, seed: Any) -> None:
        super().__init__()
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed

    def _rng(self, epoch: int) -> random.Random:  # pragma: no cover - subclasses override
        raise NotImplementedError

    def run(self, src):
        return _shuffle(src, self.bufsize, self.initial, self._rng(self._next_epoch()))


class ShardShuffle(_EpochShuffle):
    """`WebDataset(shardshuffle=N)`'s shard shuffle: webdataset 1.0.2's order in epoch 0
    (`shuffle(N, seed=seed)`), then a new order every epoch, seeded by (seed, epoch, rank,
    worker). webdataset seeds every pass alike, so its shard order repeats every epoch (and
    `set_epoch` cannot change it). It runs after the worker split, on each worker's own shards:
    seeded alike, every worker would put its shards in the same positions each epoch (with 3
    shards a worker, 2 workers repeated a whole epoch's order in 3 of 6 epochs)."""

    resume_traits = ResumeTraits(replayable=True)  # the same order again for the same (seed, epoch)

    def __init__(self, bufsize: int, seed: Any) -> None:
        super().__init__(bufsize, 100, seed)

    def state_settings(self) -> Dict[str, Any]:
        """In a saved state's fingerprint (the seed is the dataset's: WebDataset's settings hold it
        where the user chose it, and a seed drawn at random per process must not refuse a resume)."""
        return {"bufsize": self.bufsize}

    def _rng(self, epoch: int) -> random.Random:
        # random.Random(str) seeds from a SHA-512 of the text: stable across processes.
        if epoch == 0:
            return random.Random(self.seed)
        rank, _world, worker, _workers = pytorch_worker_info()
        return random.Random(f"shardstream-shards/{self.seed}/{epoch}/{rank}/{worker}")

    def __repr__(self) -> str:  # (webdataset's tests find the stage by "shuffle" in its str)
        return f"<shard shuffle({self.bufsize}, seed={self.seed!r})>"


class ShardSpread(_ByEpoch):
    """`WebDataset(shardshuffle=N)`'s shard order before the node and worker splits: epoch 0
    passes the list as it is (webdataset's split), every later epoch puts the whole list in a new
    order seeded by (seed, epoch), the same in every worker. The splits after it then hand each
    worker a new subset of the shards every epoch; without it worker k reads the same shards in
    every epoch (only reordered by the shard shuffle after the split), so the samples a batch can
    mix never change.

    Ranks must agree on the order, so at world size > 1 it runs only with `shared` (a seed the
    user chose, the same on every rank); otherwise it passes the list as it is."""

    name = "shard spread"
    resume_traits = ResumeTraits(replayable=True)  # the same order again for the same (seed, epoch)

    def __init__(self, seed: Any, shared: bool) -> None:
        super().__init__()
        self.seed = seed
        self.shared = shared

    def run(self, src):
        epoch = self._next_epoch()
        if epoch == 0 or (not self.shared and pytorch_worker_info()[1] > 1):
            return iter(src)
        return self._spread(src, random.Random(f"shardstream-spread/{self.seed}/{epoch}"))

    @staticmethod
    def _spread(src, rng: random.Random):
        shards = list(src)
        rng.shuffle(shards)
        yield from shards

    def __repr__(self) -> str:
        return f"<shard spread(seed={self.seed!r}, shared={self.shared})>"


class SeededShuffle(_EpochShuffle):
    """A shuffle buffer seeded by (seed, epoch, rank, worker): reproducible, different on every
    rank and DataLoader worker and in every epoch (what WebDataset(seed=...).shuffle(n) uses)."""

    resume_traits = ResumeTraits(replayable=True)  # the same order again for the same (seed, epoch, rank, worker)

    def __init__(self, bufsize: int = 1000, initial: int = 100, seed: Any = 0) -> None:
        super().__init__(bufsize, initial, seed)

    def state_settings(self) -> Dict[str, Any]:
        """In a saved state's fingerprint: another buffer or seed gives another order."""
        return {"bufsize": self.bufsize, "initial": self.initial, "seed": str(self.seed)}  # (WDS_SEED is text)

    def _rng(self, epoch: int) -> random.Random:
        rank, _world, worker, _workers = pytorch_worker_info()
        return random.Random(f"shardstream-shuffle/{self.seed}/{epoch}/{rank}/{worker}")


def tuple2dict(l):
    return l if isinstance(l, dict) else {i: d for i, d in enumerate(l)}


def dict2tuple(d):
    return tuple(d[i] for i in range(1 + max(d.keys())))


def combine_values(b, combine_tensors=True, combine_scalars=True):
    """Collate one column: scalars to np.array, tensors/arrays stacked, the rest as a list."""
    if isinstance(b[0], (int, float)):
        if combine_scalars:
            b = np.array(list(b))
    elif is_tensor(b[0]):
        if combine_tensors:
            import torch

            shapes = {x.shape for x in b}
            assert len(shapes) == 1, f"all shapes must be equal in collation, got {shapes}"
            b = torch.stack(list(b))
    elif isinstance(b[0], np.ndarray):
        if combine_tensors:
            shapes = {x.shape for x in b}
            assert len(shapes) == 1, f"all shapes must be equal in collation, got {shapes}"
            b = np.array(list(b))
    else:
        b = list(b)
    return b


def default_collation_fn(samples, combine_tensors=True, combine_scalars=True):
    """webdataset's collation: a tuple of columns for tuple samples, a dict for dict samples."""
    rows = [tuple2dict(x) for x in samples]
    keys = set(rows[0].keys())
    for row in rows[1:]:
        assert set(row.keys()) == keys, "keys don't match in different samples"
    result = {k: combine_values([row[k] for row in rows], combine_tensors, combine_scalars) for k in keys}
    if isinstance(samples[0], (list, tuple)):
        return dict2tuple(result)
    return result


def check_batchsize(batchsize) -> None:
    """A batch size must be a number >= 1 (webdataset fails on 0 with an IndexError, and makes
    batches of one of anything below 1)."""
    if isinstance(batchsize, bool) or not isinstance(batchsize, numbers.Real) or not float(batchsize) >= 1:
        raise UsageError(f"batchsize must be a number >= 1, got {batchsize!r}")


@clean_cut
def _batched(data, batchsize=20, collation_fn=default_collation_fn, partial=True):
    check_batchsize(batchsize)
    # A full batch goes out at once (webdataset waits for the next sample first): the same
    # batches, sooner, and a batch never holds back a sample it does not contain, which makes
    # the stage a clean cut for resume positions.
    batch: List[Any] = []
    for sample in data:
        batch.append(sample)
        if len(batch) >= batchsize:
            yield collation_fn(batch) if collation_fn is not None else batch
            batch = []
    if batch and partial:
        yield collation_fn(batch) if collation_fn is not None else batch


def _unlisted(data):
    for batch in data:
        assert isinstance(batch, list), batch
        yield from batch


def _unbatched(data):
    for sample in data:
        if isinstance(sample, (list, tuple)):
            for i in range(len(sample[0])):
                yield tuple(x[i] for x in sample)
        elif isinstance(sample, dict):
            lengths = {len(v) for v in sample.values()}
            assert len(lengths) == 1, lengths
            n = list(lengths)[0]
            for i in range(n):
                yield {k: v[i] for k, v in sample.items()}
        else:
            raise ValueError(f"unknown sample type: {type(sample)}")


def _rsample(data, p=0.5):
    assert 0.0 <= p <= 1.0
    for sample in data:
        if random.uniform(0.0, 1.0) < p:
            yield sample


declare(_rsample, deterministic=False)  # the random module's draws


@clean_cut
def _info(data, fmt=None, n=3, every=-1, width=50, stream=sys.stderr, name=""):
    for i, sample in enumerate(data):
        if i < n or (every > 0 and (i + 1) % every == 0):
            if fmt is None:
                print("---", name, file=stream)
                for k, v in sample.items():
                    print(k, redact(repr(v))[:width], file=stream)  # redact before cutting a URL short
            else:
                print(redact(fmt.format(**sample)), file=stream)
        yield sample


@clean_cut
def _log_keys(data, logfile=None):
    if logfile is None or logfile == "":
        yield from data
        return
    import fcntl

    with open(logfile, "a") as stream:
        for i, sample in enumerate(data):
            line = f"{i}\t{sample.get('__worker__')}\t{sample.get('__rank__')}\t{sample.get('__key__')}\n"
            try:
                fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
                stream.write(line)
            finally:
                fcntl.flock(stream.fileno(), fcntl.LOCK_UN)
            yield sample


def decode_bin(stream):
    return stream.read()


def decode_text(stream):
    return stream.read().decode("utf-8")


def decode_pickle(stream):
    from .._decode.basic import check_pickle_allowed

    check_pickle_allowed("xdecode of a .pyd field")
    import pickle

    return pickle.load(stream)


default_decoders = [("*.bin", decode_bin), ("*.txt", decode_text), ("*.pyd", decode_pickle)]


def find_decoder(decoders, path):
    fname = re.sub(".*/", "", path)
    if fname.startswith("__"):
        return lambda x: x
    for pattern, fun in decoders[::-1]:
        if fnmatch(fname.lower(), pattern) or fnmatch("." + fname.lower(), pattern):
            return fun
    return None


@clean_cut
def _xdecode(source, *args, must_decode=True, defaults=default_decoders, **kw):
    decoders = list(defaults) + list(args)
    decoders += [("*." + k, v) for k, v in kw.items()]
    for sample in source:
        new_sample = {}
        for path, data in sample.items():
            if path.startswith("__"):
                new_sample[path] = data
                continue
            decoder = find_decoder(decoders, path)
            if decoder is False:
                value = data
            elif decoder is None:
                if must_decode:
                    raise ValueError(f"No decoder found for {path}.")
                value = data
            else:
                if isinstance(data, bytes):
                    data = io.BytesIO(data)
                value = decoder(data)
            new_sample[path] = value
        yield new_sample


class Cached(PipelineStage):
    """Keep the first pass in memory and replay it on later passes."""

    def __init__(self):
        super().__init__()
        self.cached = None

    def run(self, source):
        if self.cached is None:
            self.temp = []
            for sample in source:
                self.temp.append(sample)
                yield sample
            self.cached = self.temp
        else:
            yield from self.cached
