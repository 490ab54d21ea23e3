"""Where a shard's bytes come from: a shard-list item's URL, range and local path, and the one
routing decision from a URL to its origin (the registry's async fetchers, or files, `pipe:` and
fsspec through `_fetch.open`)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from .._base.counters import Counters
from .._fetch.open import iter_chunks, local_path_of
from .._fetch.options import FetchOptions
from .._fetch.registry import fetches_natively
from .._fetch.stream import ChunkStream, open_stream

__all__ = ["Draw", "open_origin", "pulling", "shard_range", "source_url"]


class Draw(dict):
    """A shard-list item drawn with replacement (`ResampledShards`): `dict(url=...)`, equal to
    one, that also tells how many shards the draws come from (`drawn_from`). Once every one of
    them has failed since the last sample, the reader stops: drawing them again would never end."""

    __slots__ = ("drawn_from",)

    def __init__(self, url: str, drawn_from: int) -> None:
        super().__init__(url=url)
        self.drawn_from = drawn_from

    def __reduce__(self):
        return (Draw, (self["url"], self.drawn_from))


def open_origin(
    url: str, start: int = 0, options: Optional[FetchOptions] = None, allow_pipe: Optional[bool] = None,
    count_into: Optional[Counters] = None,
) -> Iterable[bytes]:
    """The bytes of `url` from byte `start`, from where it lives: our async fetchers for
    http(s) and s3 (retries, Range resume, one shared session; their retries and resumes also
    counted into `count_into`), else files, `pipe:` and fsspec."""
    if fetches_natively(url):
        return open_stream(url, options=options, start=start, count_into=count_into)
    return iter_chunks(url, allow_pipe=allow_pipe, start=start)


def pulling(stream: ChunkStream) -> bool:
    """A stream still downloading with room in its buffer (it holds a connection busy)."""
    return stream.downloading and stream.buffered_bytes < stream.options.prefetch_bytes


def shard_range(item: Any) -> tuple:
    """(start, stop) sample indices of a shard-list item: dict(url=..., start=..., stop=...)."""
    if isinstance(item, dict):
        return item.get("start", 0) or 0, item.get("stop")
    return 0, None


def source_url(item: Any, find_local_path: bool = True) -> tuple:
    """(url, local_path) from a shard-list item: a dict(url=..., [local_path=...]) or a string.

    With find_local_path, plain paths and file: URLs are their own local path (what
    WebDataset's opener reports as `__local_path__`; the function-style pipeline does not).
    """
    if isinstance(item, dict):
        url = item["url"]
        local_path = item.get("local_path")
    else:
        url, local_path = item, None
    if local_path is None and find_local_path:
        local_path = local_path_of(url)
    return url, local_path


