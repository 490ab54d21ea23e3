"""webdataset's `filters` module: the pipeline stages, curried (`wds.map(f)(src)` or in a pipeline).

Per-sample stages are `SampleStage` objects (fusable by the engine); the rest are `StreamStage`
objects. The underscore generator functions (`_shuffle`, `_map`, ...) that old code imports by
name are kept.
"""

from __future__ import annotations

import functools
import itertools
from functools import reduce
from typing import Any, Callable

from ._stages import sample_filters as _sf
from ._stages import stream_filters as _st
from ._stages.sample_filters import getfirst, identity, parse_field_spec, transform_with
from ._stages.contract import PipelineStage, StreamStage
from ._stages.stream_filters import (
    Cached,
    _shuffle,
    combine_values,
    decode_bin,
    decode_pickle,
    decode_text,
    default_collation_fn,
    default_decoders,
    detshuffle,
    dict2tuple,
    find_decoder,
    pick,
    tuple2dict,
)
from .handlers import reraise_exception

__all__ = [
    "Cached",
    "FilterFunction",
    "LMDBCached",
    "RestCurried",
    "_associate",
    "_batched",
    "_decode",
    "_extract_keys",
    "_info",
    "_log_keys",
    "_map",
    "_map_dict",
    "_map_tuple",
    "_rename",
    "_rename_keys",
    "_rsample",
    "_select",
    "_shuffle",
    "_to_tuple",
    "_unbatched",
    "_unlisted",
    "_xdecode",
    "associate",
    "batched",
    "combine_values",
    "compose",
    "compose2",
    "decode",
    "decode_bin",
    "decode_pickle",
    "decode_text",
    "default_collation_fn",
    "default_decoders",
    "detshuffle",
    "dict2tuple",
    "extract_keys",
    "find_decoder",
    "getfirst",
    "identity",
    "info",
    "log_keys",
    "map",
    "map_dict",
    "map_tuple",
    "parse_field_spec",
    "pick",
    "pipeline",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "reraise_exception",
    "rsample",
    "select",
    "shuffle",
    "slice",
    "to_tuple",
    "transform_with",
    "tuple2dict",
    "unbatched",
    "unlisted",
    "xdecode",
]

FilterFunction = StreamStage


class RestCurried:
    """`pipelinefilter(f)(*args, **kw)` returns a stage that runs `f(src, *args, **kw)`."""

    def __init__(self, f: Callable[..., Any]) -> None:
        self.f = f

    def __call__(self, *args: Any, **kw: Any) -> StreamStage:
        return StreamStage(self.f, *args, **kw)


def pipelinefilter(f: Callable[..., Any]) -> RestCurried:
    """Turn a generator function `f(src, ...)` into a curried pipeline stage."""
    result = RestCurried(f)
    functools.update_wrapper(result, f)
    return result


def compose2(f, g):
    return lambda x: g(f(x))


def compose(*args):
    return reduce(compose2, args)


def pipeline(source, *args):
    """Apply stages to a source in order (webdataset's function-style pipeline)."""
    if len(args) == 0:
        return source
    return compose(*args)(source)


# Per-sample stages: factories with webdataset's signatures.
map = _sf.Map
map_dict = _sf.MapDict
map_tuple = _sf.MapTuple
to_tuple = _sf.ToTuple
select = _sf.Select
rename = _sf.Rename
rename_keys = _sf.RenameKeys
extract_keys = _sf.ExtractKeys
associate = _sf.Associate
decode = _sf.Decode

# Stream stages.
shuffle = pipelinefilter(_shuffle)
batched = pipelinefilter(_st._batched)
unbatched = pipelinefilter(_st._unbatched)
unlisted = pipelinefilter(_st._unlisted)
rsample = pipelinefilter(_st._rsample)
info = pipelinefilter(_st._info)
log_keys = pipelinefilter(_st._log_keys)
xdecode = pipelinefilter(_st._xdecode)
slice = pipelinefilter(itertools.islice)

_batched = _st._batched
_unbatched = _st._unbatched
_unlisted = _st._unlisted
_rsample = _st._rsample
_info = _st._info
_log_keys = _st._log_keys
_xdecode = _st._xdecode


def _map(data, f, handler=reraise_exception):
    return _sf.Map(f, handler=handler).run(data)


def _map_dict(data, handler=reraise_exception, **kw):
    return _sf.MapDict(handler=handler, **kw).run(data)


def _map_tuple(data, *args, handler=reraise_exception):
    return _sf.MapTuple(*args, handler=handler).run(data)


def _to_tuple(data, *args, **kw):
    return _sf.ToTuple(*args, **kw).run(data)


def _select(data, predicate):
    return _sf.Select(predicate).run(data)


def _rename(data, handler=reraise_exception, keep=True, **kw):
    return _sf.Rename(handler=handler, keep=keep, **kw).run(data)


def _rename_keys(source, *args, **kw):
    return _sf.RenameKeys(*args, **kw).run(source)


def _extract_keys(source, *patterns, **kw):
    return _sf.ExtractKeys(*patterns, **kw).run(source)


def _associate(data, associator, **kw):
    return _sf.Associate(associator, **kw).run(data)


def _decode(data, *args, handler=reraise_exception, **kw):
    return _sf.Decode(*args, handler=handler, **kw).run(data)


class LMDBCached(PipelineStage):
    """Cache samples in an LMDB database (needs the `lmdb` package, as in webdataset)."""

    def __init__(self, fname, map_size=1e12, pickler=None, chunksize=500):
        import pickle

        import lmdb  # noqa: F401  - optional dependency, as in webdataset

        self.db = lmdb.open(fname, readonly=False, map_size=int(map_size))
        self.pickler = pickler or pickle
        self.chunksize = chunksize

    def is_complete(self):
        with self.db.begin(write=False) as txn:
            return txn.get(b"_") is not None

    def add_samples(self, samples):
        with self.db.begin(write=True) as txn:
            for key, sample in samples:
                txn.put(key.encode(), self.pickler.dumps(sample))

    def run(self, source):
        if self.is_complete():
            with self.db.begin(write=False) as txn:
                for key, value in txn.cursor():
                    if key != b"_":
                        yield self.pickler.loads(value)
            return
        buffer = []
        for i, sample in enumerate(source):
            key = isinstance(sample, dict) and sample.get("__key__") or str(i)
            buffer.append((key, sample))
            if len(buffer) >= self.chunksize:
                self.add_samples(buffer)
                buffer = []
            yield sample
        if buffer:
            self.add_samples(buffer)
        with self.db.begin(write=True) as txn:
            txn.put(b"_", b"1")
