"""From shard bytes to samples: the tar reader's members grouped by webdataset's key rules.

`shard_samples` is the fused fast path for one shard (no per-member dicts, no nested
generators). `TarShardSamples` is the pipeline stage that opens each URL and runs it.
"""

from __future__ import annotations

from collections import deque
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

from .._base.errors import NOTE_PREFIX, FormatError, ShardStreamError, UsageError, add_note, redact_url, safe_cause
from .._base.handlers import reraise_exception
from .._cache.shardcache import ShardCache
from .._fetch.open import local_path_of
from .._fetch.options import FetchOptions
from .._fetch.registry import fetches_natively
from .._fetch.stream import ChunkStream, open_stream
from .._stages.contract import PipelineStage
from .._stages.resumable import ResumeTraits
from .._tar.keys import base_plus_ext, is_meta
from .._tar.reader import TarMember
from .hits import hit_member_batches, open_hit
from .index import checked_start, has_index, index_position
from .members import SourceStats, member_batches
from .origin import open_origin, pulling, shard_range, source_url

__all__ = ["ShardCursor", "TarShardSamples", "shard_samples"]

Handler = Callable[[BaseException], bool]


def shard_samples(
    batches: Iterable[List[TarMember]],
    url: str,
    *,
    local_path: Optional[str] = None,
    select_files: Optional[Callable[[str], bool]] = None,
    rename_files: Optional[Callable[[str], str]] = None,
    handler: Handler = reraise_exception,
    skip: int = 0,
    limit: Optional[int] = None,
    cursor: Optional["ShardCursor"] = None,
    ends_shard: bool = False,
    read_on: Optional[Callable[[], Optional[Tuple[int, Optional[int], bool]]]] = None,
) -> Iterator[Dict[str, Any]]:
    """Yield the samples of one shard, given its members in batches (see `_shard.members`).

    `skip` samples are dropped first and at most `limit` are yielded (a shard range; with
    `ends_shard`, a count says the range ends where the shard does, and another sample after it
    is a FormatError: the count is stale, and its samples would be lost). When the range is
    done, `read_on()` may give the next range of the same shard, after it, as (samples to skip
    first, limit, ends_shard): the stream reads on instead of being opened again. A `cursor` is
    advanced before each yield: samples read, and the byte offset where the next one starts.

    Consecutive members with the same key form a sample; samples never span shards. A format or
    fetch error propagates (the caller's handler decides about the shard); the sample being
    assembled when it happens is dropped, never yielded incomplete. Per-member errors
    (rename_files, duplicate fields) go to `handler`: a continuing one skips the member, a
    stopping one ends the shard after the sample being assembled (as webdataset's does).
    """
    if limit is not None and limit <= 0:
        if ends_shard:  # (a count of 0: an empty shard, which nobody reads; a stale 0 would lose its samples)
            _check_empty(batches, url, rename_files, select_files)
        return
    current: Optional[Dict[str, Any]] = None
    current_key: Optional[str] = None
    batches = iter(batches)
    stopped = False
    stale: Optional[FormatError] = None
    while not stopped:
        try:
            members = next(batches)
        except StopIteration:
            break
        except ShardStreamError as exn:
            # The shard broke inside a member whose header names another sample, or after the
            # archive's end: the sample being assembled is whole (webdataset hands it out too).
            if current is not None and not skip and (limit is None or limit > 0):
                next_offset = _whole_before(exn, current_key, rename_files, select_files)
                if next_offset is not None:
                    if cursor is not None:
                        cursor.advance(next_offset, limit == 1)
                    yield current
            raise
        for name, data, offset in members:
            try:
                field = _field(name, rename_files, select_files)
                if field is None:
                    continue
                key, ext = field
                if key != current_key:
                    if current is not None:
                        if skip:
                            skip -= 1
                        else:
                            if cursor is not None:
                                cursor.advance(offset, limit == 1)
                            yield current
                            if limit is not None:
                                limit -= 1
                                if limit <= 0:
                                    if ends_shard:  # (the shard's error, not the member's: see below)
                                        stale = FormatError(
                                            "the shard holds more samples than its sample count (sizes.json or .idx) "
                                            "says: the count is stale (run `shardstream index` on it again)",
                                            url=url, member=name, offset=offset)
                                        raise stale
                                    following = read_on() if read_on is not None else None
                                    if following is None:
                                        return
                                    skip, limit, ends_shard = following
                    current_key = key
                    current = {"__key__": key, "__url__": url}
                    # (a member named like a field we set, `a.__key__`, is a duplicate)
                    duplicate = ext in current or (ext == "__local_path__" and local_path is not None)
                    if not duplicate:
                        current[ext] = data
                    if local_path is not None:  # (after the first field, where webdataset's dict has it)
                        current["__local_path__"] = local_path
                    if duplicate:
                        raise FormatError(f"duplicate file name in tar file: {ext!r}", url=url, member=name, offset=offset)
                elif ext in current:  # type: ignore[operator]
                    raise FormatError(f"duplicate file name in tar file: {ext!r}", url=url, member=name, offset=offset)
                else:
                    current[ext] = data  # type: ignore[index]
            except Exception as exn:
                if exn is stale:  # the shard's handler decides: a continuing one goes on with the next shard
                    raise
                if not isinstance(exn, ShardStreamError):  # rename_files or select_files raised
                    _note_member(exn, url, name, offset)
                if handler(exn):
                    continue
                stopped = True  # (the sample so far is handed out, as webdataset's stop does)
                break
    if current is not None and not skip and (limit is None or limit > 0):
        if cursor is not None:
            cursor.advance(None, True)
        yield current


def _check_empty(batches: Iterable[List[Any]], url: str, rename_files: Optional[Callable[[str], str]],
                 select_files: Optional[Callable[[str], bool]]) -> None:
    """Raise FormatError at the first member of a sample in a shard counted empty."""
    for members in batches:
        for name, _data, offset in members:
            if _field(name, rename_files, select_files) is not None:
                raise FormatError("the shard holds samples, but its sample count (sizes.json or .idx) says 0: the "
                                  "count is stale (run `shardstream index` on it again)", url=url, member=name,
                                  offset=offset)


def _whole_before(
    exn: ShardStreamError, key: Optional[str], rename_files: Optional[Callable[[str], str]],
    select_files: Optional[Callable[[str], bool]],
) -> Optional[int]:
    """Where the shard stopped being whole, if the sample `key` being assembled when `exn` was
    raised is whole (see ShardStreamError.pending, archive_end), else None."""
    if exn.archive_end is not None:
        return exn.archive_end
    if exn.pending is None:
        return None
    try:
        field = _field(exn.pending[0], rename_files, select_files)
    except Exception:  # (the member's own error: not ours to report over the shard's)
        return None
    return exn.pending[1] if field is not None and field[0] != key else None


def _note_member(exn: BaseException, url: str, member: str, offset: int) -> None:
    """Say on a user callback's error (rename_files, select_files) which member it was given:
    the error itself knows nothing of the shard."""
    add_note(exn, f"{NOTE_PREFIX}on member {member!r} at byte {offset} of {redact_url(url)}")


def _field(
    name: str, rename_files: Optional[Callable[[str], str]], select_files: Optional[Callable[[str], bool]],
) -> Optional[Tuple[str, str]]:
    """(key, extension) of the member `name` as a sample field, or None when it is none (metadata,
    not selected, no extension). rename_files may raise."""
    if name.startswith("__") and is_meta(name):
        return None
    if rename_files is not None:
        renamed = rename_files(name)
        if not isinstance(renamed, str):
            raise TypeError(f"rename_files returned {renamed!r} for member {name!r}: it must return a str "
                            "(select_files drops members)")
        name = renamed
    if select_files is not None and not select_files(name):
        return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1 and "\n" not in name:
        return name[:dot], name[dot + 1 :].lower()
    base, extension = base_plus_ext(name)
    if base is None or extension is None:
        return None
    return base, extension.lower()


class ShardCursor:
    """Where a pass over a shard stream stands, sample by sample (for exact, seeking resume).

    `position` is (item, sample, offset) after the last sample yielded: `item` shard-list items
    have been passed, `sample` samples of the next one read (counted from the item's own
    `start`), and `offset` is the byte offset in that shard's uncompressed tar where the next
    sample begins (None: unknown, e.g. a gzip shard; resuming then skips samples from the
    shard's start or its `.idx`).
    """

    __slots__ = ("item", "sample", "position", "info")

    def __init__(self) -> None:
        self.item = 0
        self.sample = 0
        self.position: Tuple[int, int, Optional[int]] = (0, 0, None)
        self.info: Dict[str, Any] = {}

    def start(self, item: int, sample: int = 0) -> None:
        self.item, self.sample, self.info = item, sample, {}

    def read_on(self, item: int) -> None:
        """Item `item` continues the shard the cursor is in, on the same stream (the position
        already says the item before it is finished)."""
        self.item, self.sample = item, 0

    def advance(self, offset: Optional[int], last: bool) -> None:
        self.sample += 1
        if last:  # the item is finished: resume with the next one
            self.position = (self.item + 1, 0, None)
        else:
            self.position = (self.item, self.sample, offset if self.info.get("compressed") is False else None)


_NO_ITEM = object()


class TarShardSamples(PipelineStage):
    """Shard URLs in, samples out: webdataset's url_opener + tar_file_expander + group_by_keys, fused.

    Args:
        handler: webdataset handler for errors: True skips the rest of the failing shard (the
            samples already delivered stay), False stops the stream, raising propagates.
        select_files, rename_files: webdataset's member filters.
        allow_pipe: allow `pipe:` URLs for this stage (default: the process-wide switch).
        opener: `url -> iterable of byte chunks` (default: local files, pipe:, fsspec).
        local_paths: add `__local_path__` for local shards (WebDataset does, the function-style
            `tarfile_to_samples` does not).
        cache: a ShardCache for remote shards (memory / disk tiers, stream-through); local
            shards are read in place.
        fetch_options: timeouts, retries, chunk and prefetch sizes for http(s) and s3 shards.
        shards_in_flight: remote shards opened ahead of the one being read (so up to this
            many plus one are open): the next ones start while the current one is parsed (each
            buffers at most fetch_options.prefetch_bytes ahead; connections and bytes in flight
            are the part scheduler's, across all of them).
    """

    name = "tar_samples"

    def __init__(
        self,
        handler: Handler = reraise_exception,
        select_files: Optional[Callable[[str], bool]] = None,
        rename_files: Optional[Callable[[str], str]] = None,
        *,
        allow_pipe: Optional[bool] = None,
        opener: Optional[Callable[[str], Iterable[bytes]]] = None,
        local_paths: bool = False,
        cache: Optional[ShardCache] = None,
        fetch_options: Optional[FetchOptions] = None,
        shards_in_flight: int = 8,
    ) -> None:
        if shards_in_flight < 1:
            raise ValueError("shards_in_flight must be >= 1")
        self.cache = cache
        self.fetch_options = fetch_options
        self.shards_in_flight = shards_in_flight
        self.local_paths = local_paths
        self.source_stats = SourceStats()
        self.handler = handler
        self.select_files = select_files
        self.rename_files = rename_files
        self.allow_pipe = allow_pipe
        self.opener = opener

    def open(self, url: str, start: int = 0, ready: Optional[ChunkStream] = None) -> Iterable[bytes]:
        """The shard's bytes from byte `start` in chunks: the opener, else the cache (remote
        shards read from the start), else the origin. `ready` is a stream opened ahead."""
        if self.opener is not None:
            if start:
                raise UsageError("a custom opener cannot start mid-shard", url=url)
            return self.opener(url)
        if self.cache is not None and not start and local_path_of(url) is None:
            return self.cache.stream(url, lambda u: ready if ready is not None else self._origin(u), settled=False)
        return ready if ready is not None else self._origin(url, start)

    def _origin(self, url: str, start: int = 0) -> Iterable[bytes]:
        return open_origin(url, start, self.fetch_options, self.allow_pipe, count_into=self.source_stats)

    def _open_ahead(self, url: str, start: int, group: object) -> Optional[ChunkStream]:
        """Start downloading a remote shard now, unless the cache serves it. The cache's claim is
        taken first (`prepare`), so of the processes sharing a cache only one opens the origin.
        The streams of one pass share a `group`: they are read in the order they are opened."""
        if self.opener is not None or start or not fetches_natively(url):
            return None
        if self.cache is not None and not self.cache.prepare(url):
            return None
        try:
            return open_stream(url, options=self.fetch_options, group=group, count_into=self.source_stats)
        except BaseException:
            if self.cache is not None:
                self.cache.release(url)
            raise

    @staticmethod
    def _abandon(ahead: Deque[Tuple[int, Any, Optional[ChunkStream]]]) -> None:
        """The streams opened ahead will be closed unread (before the one being read is)."""
        for _index, _item, ready in ahead:
            if ready is not None:
                ready.abandon()

    def _drop_ahead(self, url: str, ready: Optional[ChunkStream]) -> None:
        """Close a stream opened ahead, and give back the claim `prepare` took if no read used it."""
        if ready is not None:
            ready.close()
            if self.cache is not None:
                self.cache.release(url)

    def batches(
        self, url: str, start_offset: int = 0, ready: Optional[ChunkStream] = None, info: Optional[Dict[str, Any]] = None
    ) -> Iterator[List[TarMember]]:
        """The shard's members in batches from the member header at `start_offset`; local files
        and disk-cache hits are memory-mapped (unless an opener is set; a hit's blocks are checked
        in the map before they are parsed, from the block holding `start_offset`), everything else
        is streamed (from the origin, with a Range from `start_offset`, when it is not 0)."""
        mappable = local_path_of(url) if self.opener is None else None
        if mappable is None and self.opener is None and self.cache is not None and ready is None:
            # (with `ready`, the cache had no copy when the stream was opened ahead: no lookup again)
            hit = open_hit(self.cache, url, start_offset)
            if hit is not None:
                return hit_member_batches(self.cache, url, hit, self._origin, self.source_stats, start_offset, info)
        open_chunks = lambda u, s: self.open(u, s, ready)  # noqa: E731
        return member_batches(url, mappable, open_chunks, self.source_stats, start_offset, info)

    def _shard(
        self, url: str, local_path: Optional[str], start: int = 0, stop: Optional[int] = None,
        ready: Optional[ChunkStream] = None, cursor: Optional[ShardCursor] = None, offset: Optional[int] = None,
        ends_shard: bool = False, read_on: Optional[Callable[[], Optional[Tuple[int, Optional[int], bool]]]] = None,
    ) -> Iterator[Dict[str, Any]]:
        """The samples [start, stop) of one shard. To start mid-shard it seeks to `offset` (the
        byte offset of sample `start`, from a resume position) or to the offset in an `.idx`
        beside a local shard; else it reads from the shard's start and skips."""
        skip, indexed = 0, None
        if self.opener is not None:  # it can only read a shard from its start
            offset, skip = 0, start
        elif offset is None:
            offset, skip, indexed = index_position(url, start) if start else (0, 0, None)
        if stop is not None and stop <= start and not ends_shard:
            return  # (an empty range; one that ends the shard at 0 checks that the shard is empty)
        info = cursor.info if cursor is not None and self.opener is None else None  # offsets only where we can seek
        batches = self.batches(url, offset, ready if not offset else None, info)
        if indexed is not None:
            batches = checked_start(batches, url, start, offset, indexed)
        samples = shard_samples(
            batches,
            url,
            local_path=local_path,
            select_files=self.select_files,
            rename_files=self.rename_files,
            handler=self.handler,
            skip=skip,
            limit=None if stop is None else stop - start,
            cursor=cursor,
            ends_shard=ends_shard,
            read_on=read_on,
        )
        try:
            yield from samples
        finally:
            samples.close()  # type: ignore[attr-defined]  # generators
            batches.close()  # type: ignore[attr-defined]

    def _ends_shard(self, item: Any, stop: Optional[int]) -> bool:
        """Whether the range of `item` ends where its shard's sample count says the shard does."""
        counted = item.get("counted") if isinstance(item, dict) else None
        return counted is not None and stop == counted and self._counts_samples()

    def _counts_samples(self) -> bool:
        """Whether this reader sees every sample a count counts (member filters may drop some)."""
        return self.select_files is None and self.rename_files is None

    def _failed(self, exn: Exception, url: str) -> bool:
        """Apply the handler to a shard's error: True means go on with the next shard."""
        if isinstance(exn, ShardStreamError):
            exn.with_location(url=url)
        self.source_stats.add(errors=1)
        return bool(self.handler(exn))

    resume_traits = ResumeTraits(seekable=True)  # the engine can follow a cursor's `position` and resume a pass at one

    @staticmethod
    def cursor() -> ShardCursor:
        """A fresh cursor to pass to `run`."""
        return ShardCursor()

    def run(
        self, src: Iterable[Any], position: Optional[Sequence[Any]] = None, cursor: Optional[ShardCursor] = None
    ) -> Iterator[Dict[str, Any]]:
        """The samples of the shards in `src`. A `cursor` follows the position of the last
        sample yielded; `position` (a cursor position from an earlier pass over the same shard
        stream) resumes right after that sample: the items before it are not opened, and its
        shard is entered at the saved byte offset."""
        items = iter(src)
        cursor = cursor if cursor is not None else ShardCursor()
        resume_item, resume_sample, resume_offset = (int(position[0]), int(position[1]), position[2]) if position else (0, 0, None)
        for passed in range(resume_item):  # shard-list items finished before the resume point
            if next(items, _NO_ITEM) is _NO_ITEM:
                raise UsageError(
                    f"the resume position is at shard item {resume_item}, but this pass has {passed}: "
                    "the state was saved from another dataset or layout"
                )
        numbered = enumerate(items, resume_item)
        ahead: Deque[Tuple[int, Any, Optional[ChunkStream]]] = deque()
        reader = object()  # this pass reads the streams it opens in order: one window of parts

        budget = self.shards_in_flight * (self.fetch_options or FetchOptions()).prefetch_bytes
        exhausted = False
        failing: set = set()  # drawn shards (`Draw`) that failed since the last sample

        def fill() -> None:
            # Keep `shards_in_flight` downloads busy: a finished or stalled (buffer full) stream
            # frees its slot, within a byte budget for what is buffered ahead and a cap on
            # shards queued ahead.
            nonlocal exhausted
            while not exhausted and len(ahead) < 4 * self.shards_in_flight:
                streams = [ready for _index, _item, ready in ahead if ready is not None]
                busy = sum(1 for ready in streams if pulling(ready))
                if ahead and (busy >= self.shards_in_flight or sum(r.buffered_bytes for r in streams) >= budget):
                    return
                index, item = next(numbered, (0, _NO_ITEM))
                if item is _NO_ITEM:
                    exhausted = True
                    return
                url, _ = source_url(item, False)
                resumed = index == resume_item and resume_sample
                ahead.append((index, item, None if resumed else self._open_ahead(url, shard_range(item)[0], reader)))
                if local_path_of(url) is not None:
                    # Read in place: nothing to fetch ahead. Pulling no further than the shard
                    # about to be read also keeps sources that act on each pull working, as with
                    # webdataset (DirectoryShardList recycles the previous shard).
                    return

        try:
            while True:
                fill()
                if not ahead:
                    return
                index, item, ready = ahead.popleft()
                url, local_path = source_url(item, self.local_paths)
                if local_path is None and self.local_paths and self.cache is not None:
                    local_path = self.cache.disk_path(url)  # as webdataset's: the cache file
                start, stop = shard_range(item)
                offset = None
                if index == resume_item and resume_sample:
                    start += resume_sample
                    offset = resume_offset
                cursor.start(index, start - shard_range(item)[0])
                count = told = 0  # samples handed out of this item; of them, counted in the stats

                def read_on() -> Optional[Tuple[int, Optional[int], bool]]:
                    # The item is done. When the next one is a later range of the same shard (an
                    # elastic resume after a shuffle buffer gives one range per hole), read on in
                    # this stream past the samples between: not a new stream from the shard's
                    # first byte for every range. (Not where an .idx seeks to the range: reading
                    # the samples between would cost more, and a fault in them is not this item's.)
                    nonlocal index, item, start, stop, count, told
                    if stop is None or (self.opener is None and has_index(url)):
                        return None
                    if not ahead:
                        fill()
                    if not ahead:
                        return None
                    following, (next_start, next_stop) = ahead[0][1], shard_range(ahead[0][1])
                    if (ahead[0][2] is not None or source_url(following, False)[0] != url or next_start < stop
                            or (next_stop is not None and next_stop <= next_start)):
                        return None
                    self.source_stats.add(samples=count - told, shards=1)
                    gap = next_start - stop
                    index, item, _ready = ahead.popleft()
                    start, stop, count, told = next_start, next_stop, 0, 0
                    cursor.read_on(index)
                    return gap, None if stop is None else stop - start, self._ends_shard(item, stop)

                try:
                    ends_shard = self._ends_shard(item, stop)
                    for sample in self._shard(url, local_path, start, stop, ready, cursor, offset, ends_shard, read_on):
                        count += 1
                        if not count & 31:  # (the stats count as the pass goes, 32 at a time)
                            self.source_stats.add(samples=count - told)
                            told = count
                            if ahead:
                                fill()
                        yield sample
                    if stop is not None and start + count < stop and self._counts_samples():
                        raise FormatError(
                            f"the shard ends after sample {start + count}, but its sample count "
                            f"(sizes.json, .idx or the split) says at least {stop}: truncated at a member boundary?",
                            url=url,
                        )
                except Exception as exn:
                    if not self._failed(exn, url):
                        self._abandon(ahead)
                        return
                    drawn_from = getattr(item, "drawn_from", None)
                    if drawn_from is not None and not count:
                        failing.add(url)
                        if len(failing) >= drawn_from:
                            raise ShardStreamError(
                                f"all {drawn_from} shards that resampled draws come from failed since the last sample "
                                f"(each went to the handler): drawing them again would never end",
                                url=url,
                            ) from safe_cause(exn)
                except BaseException:  # the pass is closed (a break, Ctrl-C): none of its streams is read on
                    self._abandon(ahead)
                    raise
                else:
                    self.source_stats.add(shards=1)
                finally:
                    self.source_stats.add(samples=count - told)  # (a shard left or failed part way too)
                    self._drop_ahead(url, ready)
                if count:
                    failing.clear()
        finally:
            for _index, item, ready in ahead:
                self._drop_ahead(source_url(item, False)[0], ready)
            if self.cache is not None:
                self.cache.settle()  # the last shards' commits: in the cache once the pass is over

    def __call__(self, src: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        return self.run(src)


from . import locate as _locate  # noqa: E402,F401  (registers the member locator that errors ask)
