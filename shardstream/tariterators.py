"""webdataset's `tariterators` module, on the shardstream tar reader.

The composable generators (`url_opener`, `tar_file_expander`, `group_by_keys`) keep the dict
shapes that old code (OpenCLIP's `tarfile_to_samples_nothrow`) builds on. `tarfile_samples` /
`tarfile_to_samples` use the fused fast path instead.

0.2.x compatibility: `tar_file_expander` yields no end-of-shard marker unless `eof_value` is
given (webdataset 1.0.2's default `{}` marker breaks groupers that index `["fname"]`), and
`group_by_keys` starts a new sample whenever `__url__` changes, so samples never span shards
with or without the marker.

A shard-list item may name a range of a shard's samples, dict(url=..., start=..., stop=...), as the
equal-work `split_by_node` yields them; `tar_file_expander` then yields only the members of those
samples, like the fused path, so hand-built pipelines (OpenCLIP's) get the same equal split.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Set, Tuple

import braceexpand

from ._base.errors import ShardStreamError
from ._tar.keys import META_PATTERN, base_plus_ext, is_meta
from ._shard.members import iter_members
from ._shard.samples import TarShardSamples
from ._shard.origin import shard_range
from .gopen import gopen
from .handlers import reraise_exception

__all__ = [
    "base_plus_ext",
    "group_by_keys",
    "meta_prefix",
    "meta_suffix",
    "shardlist",
    "tar_file_expander",
    "tar_file_iterator",
    "tarfile_samples",
    "tarfile_to_samples",
    "url_opener",
    "valid_sample",
]

meta_prefix = "__"
meta_suffix = "__"
trace = False
_READ_SIZE = 1 << 20


def valid_sample(sample: Any) -> bool:
    """A non-empty dict without a `__bad__` flag."""
    return sample is not None and isinstance(sample, dict) and len(sample) > 0 and not sample.get("__bad__", False)


def shardlist(urls, *, shuffle: bool = False) -> Iterator[Dict[str, str]]:
    """Yield dict(url=...) for a brace spec or list of URLs."""
    urls = list(braceexpand.braceexpand(urls)) if isinstance(urls, str) else list(urls)
    if shuffle:
        random.shuffle(urls)
    for url in urls:
        yield dict(url=url)


def url_opener(data: Iterable[Dict[str, Any]], handler: Callable = reraise_exception, **kw: Any):
    """Open each dict(url=...) and add `stream` to it."""
    for sample in data:
        assert isinstance(sample, dict), sample
        assert "url" in sample
        url = sample["url"]
        try:
            stream = gopen(url, **kw)
            sample.update(stream=stream)
            yield sample
        except Exception as exn:
            if not isinstance(exn, ShardStreamError):
                exn.args = exn.args + (url,)
            if handler(exn):
                continue
            break


def tar_file_iterator(
    fileobj,
    skip_meta: Optional[str] = META_PATTERN,
    handler: Callable = reraise_exception,
    select_files: Optional[Callable[[str], bool]] = None,
    rename_files: Optional[Callable[[str], str]] = None,
) -> Iterator[Dict[str, Any]]:
    """Yield dict(fname=..., data=...) for the regular members of a binary tar stream."""
    return _tar_members(fileobj, 0, None, skip_meta, handler, select_files, rename_files)


Member = Tuple[str, Any, int]


def _in_range(members: Iterator[Member], start: int, stop: Optional[int]) -> Iterator[Member]:
    """The members of samples [start, stop) of a shard, numbered as sample counts and `.idx` files
    number them: a new sample at each change of key; meta members and keyless ones start none."""
    index, current = -1, None
    for member in members:
        name = member[0]
        if not is_meta(name):
            key, _ = base_plus_ext(name)
            if key is not None and key != current:
                index, current = index + 1, key
                if stop is not None and index >= stop:
                    return
        if max(index, 0) >= start:
            yield member


def _tar_members(fileobj, start, stop, skip_meta, handler, select_files, rename_files) -> Iterator[Dict[str, Any]]:
    """tar_file_iterator over the samples [start, stop) of the shard."""
    url = getattr(fileobj, "name", None)
    skip = None if skip_meta is None or skip_meta == META_PATTERN else re.compile(skip_meta)
    chunks = iter(lambda: fileobj.read(_READ_SIZE), b"")
    members: Iterator[Any] = iter_members(chunks, None if url is None else str(url))
    if start or stop is not None:
        members = _in_range(members, start, stop)
    for fname, data, _offset in members:
        try:
            if "/" not in fname and fname.startswith(meta_prefix) and fname.endswith(meta_suffix):
                continue
            if skip_meta is not None and (is_meta(fname) if skip is None else skip.match(fname)):
                continue
            if rename_files:
                fname = rename_files(fname)
            if select_files is not None and not select_files(fname):
                continue
            yield dict(fname=fname, data=data)
        except Exception as exn:
            if handler(exn):
                continue
            return


def tar_file_expander(
    data: Iterable[Dict[str, Any]],
    handler: Callable = reraise_exception,
    select_files: Optional[Callable[[str], bool]] = None,
    rename_files: Optional[Callable[[str], str]] = None,
    eof_value: Optional[Any] = None,
) -> Iterator[Dict[str, Any]]:
    """Expand dict(url=..., stream=...) items into member dicts with `__url__` (and `__local_path__`);
    an item's `start`/`stop` keep only the members of those samples of its shard."""
    for source in data:
        url = source["url"]
        local_path = source.get("local_path")
        stream = source.get("stream")
        try:
            assert isinstance(source, dict)
            assert "stream" in source
            start, stop = shard_range(source)
            for sample in _tar_members(stream, start, stop, META_PATTERN, handler, select_files, rename_files):
                sample["__url__"] = url
                if local_path is not None:
                    sample["__local_path__"] = local_path
                yield sample
            if eof_value is not None:
                yield eof_value
        except Exception as exn:
            if isinstance(exn, ShardStreamError):
                exn.with_location(url=url)
            else:
                exn.args = exn.args + (stream, url)
            if handler(exn):
                continue
            break
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()


def group_by_keys(
    data: Iterable[Dict[str, Any]],
    keys: Callable[[str], Tuple[Optional[str], Optional[str]]] = base_plus_ext,
    lcase: bool = True,
    suffixes: Optional[Set[str]] = None,
    handler: Callable = reraise_exception,
) -> Iterator[Dict[str, Any]]:
    """Group consecutive member dicts with the same key into samples."""
    current_sample: Optional[Dict[str, Any]] = None
    for filesample in data:
        try:
            assert isinstance(filesample, dict)
            if filesample == {}:
                if valid_sample(current_sample):
                    yield current_sample  # type: ignore[misc]
                current_sample = None
                continue
            fname, value = filesample["fname"], filesample["data"]
            prefix, suffix = keys(fname)
            if prefix is None:
                continue
            if lcase:
                suffix = suffix.lower()  # type: ignore[union-attr]  # as webdataset: a key function's None suffix fails here
            if (
                current_sample is None
                or prefix != current_sample["__key__"]
                or filesample.get("__url__") != current_sample["__url__"]
            ):
                if valid_sample(current_sample):
                    yield current_sample  # type: ignore[misc]
                current_sample = dict(__key__=prefix, __url__=filesample.get("__url__"))
            if suffix in current_sample:
                raise ValueError(f"{fname}: duplicate file name in tar file {suffix} {current_sample.keys()}")
            if suffixes is None or suffix in suffixes:
                current_sample[suffix] = value  # type: ignore[index]
            local_path = filesample.get("__local_path__")
            if local_path is not None:
                current_sample["__local_path__"] = local_path
        except Exception as exn:
            exn.args = exn.args + (filesample.get("stream"), filesample.get("url"))
            if handler(exn):
                continue
            break
    if valid_sample(current_sample):
        yield current_sample  # type: ignore[misc]


def tarfile_samples(src, handler: Callable = reraise_exception, select_files=None, rename_files=None):
    """Shard URLs (dicts or strings) in, samples out (the fused fast path)."""
    return TarShardSamples(handler=handler, select_files=select_files, rename_files=rename_files).run(src)


def tarfile_to_samples(handler: Callable = reraise_exception, select_files=None, rename_files=None):
    """The pipeline stage for `tarfile_samples` (what `wds.tarfile_to_samples()` returns)."""
    return TarShardSamples(handler=handler, select_files=select_files, rename_files=rename_files)
