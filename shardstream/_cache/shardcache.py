"""The tiered shard cache: memory, then local disk, then the origin, with stream-through.

`ShardCache.stream(url, open_origin)` yields a shard's bytes from the fastest tier holding it.
On a miss the origin's chunks go to the consumer and into every tier's writer in one pass, so a
first epoch with the cache on costs no extra read; a tier keeps the shard only when the origin
ran to its end (an early close or an origin error discards the temp file). Across processes a
disk tier's `claim` makes exactly one process download a shard while the others wait for it
and then read the committed file.

Disk hits are checked block by block as they are read (`_cache.check`). A corrupt file is
evicted under its URL's claim and the stream goes on from a fresh copy (the origin's, or one
another process committed meanwhile), skipping the bytes already delivered once they are checked
against those handed out: the consumer sees one correct stream or an error naming the file.

The cache never decides what to fetch: the caller hands it `open_origin(url) -> Iterable[bytes]`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from .._base.errors import FormatError, UsageError, redact_url
from .._tar.codecs import MAGIC_BYTES, sniff
from .._tar.headers import number_field, pax_records
from .._tar.reader import DATALESS, EXTENSIONS, header_span
from .check import CorruptCacheFile, Resume, VerifiedFile
from .claims import ClaimsAhead, release_claims
from .share import follow
from .memory import MemoryTier, TierCounters
from .disk import DiskTier

__all__ = ["ShardCache", "cache_from_options"]

logger = logging.getLogger(__name__)

ORIGIN_FIELDS = ("fetches", "bytes_served", "errors")
_MISS = object()  # no tier holds the shard
_REREADS = 3  # copies tried in one stream before a corrupt one is an error (a failing disk)
# Chunks are handed to the writers (and counted) a MiB at a time, or a disk writer's block if
# smaller: one lock and one wake-up check per MiB on the reader's thread, not per network chunk.
TEE_BYTES = 1 << 20
BLOCK = 512  # a tar block
ZERO_BLOCK = bytes(BLOCK)

OpenOrigin = Callable[[str], Iterable[bytes]]


class _AfterAll:
    """Call `then` once this object has been called `count` times (from any threads)."""

    def __init__(self, count: int, then: Callable[[], None]) -> None:
        self._left, self._then = count, then
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._then()


def _reserve(writers: List, size: Optional[int]) -> None:
    """Tell the writers the shard's size (a disk writer preallocates it; one that cannot hold
    it gives up before copying more)."""
    if size:
        for writer in writers:
            writer.reserve(size)


def _without_dead(writers: List, claims: Optional[Dict[str, object]]) -> List:
    """The writers still writing. One that gave up (a shard too big for its tier, a failed write)
    lets its tier's claim go at once: another process that wants the shard follows a write that
    will never come, until its stall timeout; now it takes the claim and fetches the shard itself."""
    live = []
    for writer in writers:
        if writer.live:
            live.append(writer)
        elif claims and writer.tier.name in claims:
            release_claims({writer.tier.name: claims.pop(writer.tier.name)})
    return live


def _close(obj) -> None:
    close = getattr(obj, "close", None)
    if close is not None:
        close()


class ShardCache(ClaimsAhead):
    """Tiers searched in order (typically `MemoryTier`, then `DiskTier`), then the origin.

    Thread-safe; one instance may serve many shards at once. `stats()` reports every tier's
    counters and the origin's.
    """

    def __init__(self, tiers: Sequence = ()) -> None:
        self.tiers = tuple(tiers)
        names = [tier.name for tier in self.tiers]
        if len(set(names)) != len(names) or "origin" in names:
            raise ValueError(f"cache tier names must be unique and not 'origin': {names}")
        self.origin = TierCounters("origin", ORIGIN_FIELDS)
        self._init_claims()

    def stream(self, url: str, open_origin: OpenOrigin, *, settled: bool = True) -> Iterator[bytes]:
        """Yield the bytes of `url` in chunks, from the first tier that has it, else the origin.

        Disk-tier bytes are checked block by block before they are yielded. A cached file that
        fails is evicted (WARNING naming it) and the stream goes on, seamlessly, from a fresh
        copy: the origin's, or one another process has cached meanwhile.

        Raises whatever `open_origin` or its iterator raises (after discarding partial writes);
        `CorruptCacheFile` (naming the cache file) when a corrupt cached copy cannot be replaced.
        Close the iterator to stop early; nothing partial is ever committed.

        The tiers' writes and commits run on their writer threads. With `settled` (the default)
        the stream ends once the shard is committed; without, it ends as soon as the last byte is
        handed on, and the commit finishes behind it (`lookup` of the URL and `settle()` wait for
        it): a reader of many shards goes on to the next one meanwhile and calls `settle()` at
        the end of its pass.
        """
        above: List = []
        outcome = _MISS
        for tier in self.tiers:
            source = tier.lookup(url)
            if source is not None:
                outcome = yield from self._serve(url, tier, source, above)
                break
            above.append(tier)
        if outcome is _MISS:
            outcome = yield from self._fetch(url, open_origin)
        if outcome is not None:
            yield from self._repair(url, open_origin, outcome)  # type: ignore[arg-type]
        if settled:
            self._settle(url)

    def open_mapped(
        self, url: str, accept: Optional[Callable[[int], bool]] = None, start: int = 0,
    ) -> Optional[VerifiedFile]:
        """A disk hit of `url` (a `VerifiedFile`) to parse in place from a memory map, checking
        each block there before it is parsed (`VerifiedFile.check`), else None (not held, held by
        a faster tier, or `accept(fd)` says no). Close it when done; after its `CorruptCacheFile`,
        go on with `reread`.

        `start`: the caller parses nothing before this byte (a resume mid-shard): the checks begin
        at the block holding it, and faster tiers neither turn the hit down nor serve the read
        (they keep and serve whole shards: a read from mid-shard can neither fill nor use them)."""
        for index, tier in enumerate(self.tiers):
            if isinstance(tier, DiskTier):
                source = tier.lookup(url)
                fill = not start and any(isinstance(t, MemoryTier) and t.max_bytes >= (source.size if source else 0)
                                         for t in self.tiers[:index])  # (the stream fills faster tiers on the way)
                if source is not None and (fill or (accept is not None and not accept(source.file.fileno()))):
                    source.close()
                    source = None
                if source is not None:
                    source.check_from(start)
                    tier.counters.add(hits=1)
                    for upper in self.tiers[:index]:
                        upper.counters.add(misses=1)
                return source
            if url in tier and not start:  # (a faster tier serves whole shards only)
                return None
        return None

    def reread(
        self, url: str, open_origin: OpenOrigin, failure: CorruptCacheFile, *, settled: bool = True,
    ) -> Iterator[bytes]:
        """After `failure` stopped a mapped hit (`open_mapped`): the whole shard again, from byte 0,
        from a fresh copy (the corrupt file is evicted and fetched again, once per node). The bytes
        before the bad block (those the hit had checked, and those a hit opened at a `start`
        skipped) are checked again against the record, block by block, before they are handed on:
        the shard is the one that was parsed so far, or this raises."""
        failure.source.tier.counters.add(corrupt=1)  # type: ignore[union-attr]
        yield from self._repair(url, open_origin, failure, keep=True)
        if settled:
            self._settle(url)

    def _repair(self, url: str, open_origin: OpenOrigin, outcome: CorruptCacheFile, keep: bool = False):
        """Evict the corrupt copy `outcome` names and stream the shard on from a fresh one."""
        for _ in range(_REREADS):
            outcome = yield from self._claimed(url, open_origin, outcome, keep=keep)
            if outcome is None:
                return
            keep = False  # the consumer has read the copy that failed now: drop what it delivered
        # copy after copy fails: a failing disk, say
        claims: Dict[str, object] = {}
        try:
            claims = self._claim(url)
            self._evict(url, outcome, outcome.source.tier.name in claims)  # type: ignore[union-attr]
        finally:
            outcome.source.release()  # type: ignore[union-attr]
            self._release(claims)
        raise outcome

    def _fetch(self, url: str, open_origin: OpenOrigin):
        """A miss in every tier: take the shared tier's claim without waiting (or use the one
        `prepare` took) and fetch the shard, or follow the write of the process that holds it.
        Returns None when done, or the failure of a corrupt committed copy."""
        claims = self._take_ahead(url)
        resume = None
        try:
            shared = next((tier for tier in self.tiers if tier.shared), None)
            if shared is not None and shared.name not in claims:
                claim = None if shared.writing_here(url) else shared.try_claim(url)
                if claim is not None:
                    claims[shared.name] = claim
                elif shared.writing_here(url) or shared.unlockable(url):
                    # ours (following ourselves could deadlock), or no lock file can be made: nobody writes it
                    shared.counters.add(bypassed=1)
                else:
                    shared.counters.add(followed=1)
                    end = yield from follow(shared, url, on_stuck=self._release_unstarted)
                    if end.kind == "committed":  # a hit, read partly while it was being written
                        return (yield from self._serve(url, shared, end.source, self.tiers[: self.tiers.index(shared)]))
                    if end.kind == "claimed":
                        claims[shared.name] = end.claim
                    else:
                        shared.counters.add(bypassed=1)
                    if end.digests:
                        resume = Resume(len(end.digests) * shared.chunk_size, end.digests, shared.chunk_size, url=url)
            return (yield from self._claimed(url, open_origin, None, claims=claims, resume=resume))
        finally:
            self._release(claims)

    def _claim(self, url: str) -> Dict[str, object]:
        """The claims of the shared tiers that grant one (waiting for other processes' downloads)."""
        claims: Dict[str, object] = {}
        try:
            for tier in self.tiers:
                if tier.shared:
                    claim = tier.claim(url)
                    if claim is not None:
                        claims[tier.name] = claim
        except BaseException:
            self._release(claims)
            raise
        return claims

    def _claimed(
        self, url: str, open_origin: OpenOrigin, failure: Optional[CorruptCacheFile], *,
        claims: Optional[Dict[str, object]] = None, resume: Optional[Resume] = None, keep: bool = False,
    ):
        """Take the shared tiers' claims (waiting; unless `claims` were taken), then read a copy
        committed meanwhile or the origin (written through). After a `failure`, evict the corrupt
        file first; skip the bytes already delivered (`resume`). Returns None when done, or the
        failure of another corrupt copy."""
        if failure is not None and failure.bad_offset:
            resume = Resume.after(failure, keep=keep)
        try:
            if claims is None:
                claims = self._claim(url)
            held = failure.source if failure is not None else None
            if held is not None:
                self._evict(url, failure, held.tier.name in claims)  # type: ignore[arg-type]
            source, index = None, 0
            for index, tier in enumerate(self.tiers):
                if tier.shared:
                    source = tier.lookup(url, repair=tier.name in claims)
                    if source is not None and held is not None and source.ident == held.ident:
                        source.close()  # the corrupt file itself (not evicted without the claim)
                        source = None
                    if source is not None:
                        break
            if held is not None:
                held.release()  # the identity checks are done: the inode may be reused now
            if source is not None:  # committed while we waited: let the others in, read it
                self._release(claims)
                return (yield from self._serve(url, self.tiers[index], source, self.tiers[:index], resume))
            for tier in self.tiers:
                tier.counters.add(misses=1)
            self.origin.add(fetches=1)
            try:
                chunks = open_origin(url)
            except Exception as exn:
                self.origin.add(errors=1)
                _raise_unreplaced(failure, exn)
                raise
            writers = []
            for tier in self.tiers:
                if not tier.shared or tier.name in claims:
                    writer = tier.writer(url)
                    if writer is not None:
                        writers.append(writer)
            try:
                yield from self._pump(chunks, self.origin, writers, resume, claims, origin=url)
            except CorruptCacheFile:
                raise
            except Exception as exn:
                _raise_unreplaced(failure, exn)
                raise
            return None
        finally:
            if failure is not None:
                failure.source.release()  # type: ignore[union-attr]
            if claims:
                self._release(claims)  # (what _pump did not hand to the commits)

    def _evict(self, url: str, failure: CorruptCacheFile, claimed: bool) -> None:
        """Evict the corrupt file `failure` names if we may (we hold its URL's claim), and say so."""
        source = failure.source
        tier = source.tier  # type: ignore[union-attr]
        where = f"cache file {failure.cache_path} failed verification ({failure.reason})"
        if not claimed:
            logger.warning("%s; not evicted (another download of the shard is in progress): reading %s from the origin",
                           where, redact_url(url))
        elif tier.discard_corrupt(source):
            logger.warning("%s; evicted it, fetching %s again", where, redact_url(url))
        else:
            logger.warning("%s; another process already evicted or replaced it, reading %s again",
                           where, redact_url(url))

    def _serve(self, url: str, tier, source, above: Sequence, resume: Optional[Resume] = None):
        """Yield a hit's bytes. Returns None when done, or the `CorruptCacheFile` that stopped it."""
        tier.counters.add(hits=1)
        for upper in above:
            upper.counters.add(misses=1)
        # Fill faster private tiers on the way (shared ones would need a claim: not worth it).
        writers = [] if getattr(source, "start", 0) else [  # (not from a mid-shard start: the writers need it all)
            w for w in (t.writer(url, size_hint=source.size) for t in above if not t.shared) if w is not None]
        try:
            yield from self._pump(source, tier.counters, writers, resume)
        except CorruptCacheFile as exn:
            if exn.source is not source:
                raise
            tier.counters.add(corrupt=1)
            return exn
        return None

    @staticmethod
    def _pump(chunks: Iterable[bytes], counters: TierCounters, writers: List, resume: Optional[Resume] = None,
              claims: Optional[Dict[str, object]] = None, origin: Optional[str] = None):
        """Hand each chunk to the consumer (after `resume` dropped what was delivered before) and,
        a MiB at a time, to every writer; commit only a complete stream. A stream from the
        `origin` URL that did not say its length (`chunks.size`, which the fetchers check) must be
        a whole archive (`_TarEnd`): a body cut short that its transport could not tell from a
        whole one reads to its end, but is not kept.

        The commits run on the writers' threads (`commit_soon`): the consumer goes on to its next
        shard without waiting for the last block's write and the rename. `claims` (emptied here)
        are released once every writer has committed, so that nobody they let in finds no file."""
        complete = False
        iterator = iter(chunks)
        batch: List[bytes] = []  # chunks not yet handed to the writers, `pending` bytes
        pending = counted = 0  # (counted: bytes delivered and not yet in `counters`)
        reserved = False  # (whether the writers were told the shard's size)
        tar_end = _TarEnd() if origin is not None else None
        # (at most a block: a follower in another process waits for whole blocks, no longer)
        tee_bytes = min([TEE_BYTES, *(getattr(writer, "block_size", TEE_BYTES) for writer in writers)])
        try:
            for chunk in iterator:
                size = len(chunk)
                counted += size
                if writers:  # (immutable bytes: a hit's chunks may be views of a map that closes)
                    batch.append(chunk if type(chunk) is bytes else bytes(chunk))
                    pending += size
                    if pending >= tee_bytes:
                        if tar_end is not None:
                            tar_end = _judge(tar_end, chunks, batch)
                        if not reserved:  # (the origin has said its size by now, when it says it)
                            reserved = True
                            _reserve(writers, getattr(chunks, "size", None))
                        for writer in writers:
                            writer.write_many(batch, pending)
                        batch, pending = [], 0
                        if not all(writer.live for writer in writers):
                            writers = _without_dead(writers, claims)
                if counted >= TEE_BYTES:
                    counters.add(bytes_served=counted)
                    counted = 0
                if resume is not None and resume.left:
                    chunk = resume.take(chunk)
                    if not chunk:
                        continue
                yield chunk
            if resume is not None and resume.left:
                resume.check_done()  # the copy is shorter than what was delivered: raises
            if batch:
                if tar_end is not None:
                    tar_end = _judge(tar_end, chunks, batch)
                for writer in writers:
                    writer.write_many(batch, pending)
            complete = tar_end is None or not writers or tar_end.whole(origin)
        except CorruptCacheFile:
            raise
        except Exception:
            counters.add(errors=1)
            raise
        finally:
            if counted:
                counters.add(bytes_served=counted)
            if complete and writers:
                handed = dict(claims or {})
                if claims:
                    claims.clear()
                after = _AfterAll(len(writers), lambda: release_claims(handed))
                for writer in writers:
                    writer.commit_soon(after)
            else:
                for writer in writers:
                    writer.abort()
            if iterator is not chunks:
                _close(iterator)
            _close(chunks)

    def settle(self) -> None:
        """Wait for this process's commits in progress (streams opened with `settled=False`):
        every shard read whole so far is then in the disk tiers."""
        self._settle(None)

    def _settle(self, url: Optional[str]) -> None:
        for tier in self.tiers:
            if isinstance(tier, DiskTier):
                tier.settle(url)  # (a commit still going after WRITE_STALL is given up, with a WARNING)

    def local_path(self, url: str) -> Optional[str]:
        """The path of a committed copy of `url` in a disk tier (with a record of its size and
        block CRCs), else None: tells whether `stream` will find the shard cached.

        Its bytes are checked only when read through `stream`; whoever reads the path directly
        gets no such check. The file may be evicted later (an open file survives eviction).
        """
        for tier in self.tiers:
            if isinstance(tier, DiskTier):
                source = tier.lookup(url)
                if source is not None:
                    source.close()
                    return source.path
        return None

    def holds(self, url: str) -> bool:
        """Whether a tier holds a committed copy of `url` now (a cheap look: the file and its
        record exist; `stream` still checks both before serving a byte)."""
        return any(url in tier for tier in self.tiers)

    def disk_path(self, url: str) -> Optional[str]:
        """Where the first disk tier keeps `url`, whether or not it holds it yet (webdataset's
        `__local_path__` for a remote shard read through a cache), else None."""
        for tier in self.tiers:
            if isinstance(tier, DiskTier):
                return tier.path_for(url)
        return None

    def stats(self) -> Dict[str, Dict[str, int]]:
        """Counters keyed by tier name, plus "origin" (fetches, bytes_served, errors)."""
        snapshot = {tier.name: tier.counters.snapshot() for tier in self.tiers}
        snapshot["origin"] = self.origin.snapshot()
        return snapshot

    def __getstate__(self):  # tiers pickle as configuration; counters restart in the new process
        return {"tiers": self.tiers}

    def __setstate__(self, state) -> None:
        ShardCache.__init__(self, state["tiers"])


def _judge(tar_end: "_TarEnd", chunks: object, batch: List[bytes]) -> Optional["_TarEnd"]:
    """Walk `batch` unless the origin has said its length (None from then on): the fetchers
    check a stated length (HTTP's Content-Length or Content-Range, S3's ContentLength) and raise
    on a body that ends short of it, so only a stream without one needs its archive judged."""
    if getattr(chunks, "size", None) is not None:
        return None
    tar_end.add(batch)
    return tar_end


class _TarEnd:
    """Whether a stream from the origin is a whole archive, judged from the batches handed to
    the writers. A plain tar is walked header to header (each header's size, or the `size` record
    of a PAX header before it, says where the next is due): it is whole once a zero block stands
    where a header is due, whatever follows (record
    padding, a signature), as the reader reads it. A plain tar that stops before that block (cut
    at a member boundary or inside a member, by a transport that could not tell) is not kept, nor
    is a stream too short to tell what it is. A gzip, xz or bzip2 stream is inflated as it comes
    (the reader's codecs) and its tar walked the same way: it is whole once that block has come
    and the compressed member holding it has ended (its trailer, with the checksum, is there). A
    stream whose first block is neither is its reader's to judge."""

    def __init__(self, inflated: bool = False) -> None:
        self.seen = 0  # bytes fed
        self.due = 0  # where the next header is due
        self.cut = b""  # the start of a header split between two chunks
        self.judged = True  # False: not a tar walked to its end (other data)
        self.ended = False  # the end-of-archive block stood where a header was due
        self._pax: Optional[bytearray] = None  # the records of a PAX header, being collected
        self._pax_from = self._pax_end = 0  # where the rest of them is, in the stream
        self._pax_size: Optional[int] = None  # the size a PAX header gave the member after it
        # the first chunks, until `sniff` can tell the codec (then None; at once for what a codec inflated)
        self._early: Optional[List[bytes]] = None if inflated else []
        self._inflater = None  # the codec's inflater of a compressed stream
        self._inner: Optional["_TarEnd"] = None  # the walk of what it inflates

    def add(self, batch: List[bytes]) -> None:
        if self._early is not None:  # (undecided: a stream of a few bytes so far)
            self._early.extend(batch)
            codec, decided = sniff(b"".join(chunk[:MAGIC_BYTES] for chunk in self._early)[:MAGIC_BYTES])
            if not decided:
                return
            batch, self._early = self._early, None
            if codec is not None:
                self._inflater, self._inner = codec(), _TarEnd(inflated=True)
        if self._inflater is None:
            self._walk(batch)
            return
        inflater, inner = self._inflater, self._inner
        for chunk in batch:
            self.seen += len(chunk)
            piece = inflater.feed(chunk)
            while True:  # (each member's output walked before the next member is inflated)
                if piece:
                    inner._walk([piece])  # type: ignore[union-attr]
                if inner.ended or not inner.judged:  # type: ignore[union-attr]
                    inflater.last_member = True  # (inflate that member to its trailer, ignore what follows)
                if not inflater.pending:  # (else a member ended inside the chunk: the next one begins there)
                    break
                piece = inflater.feed(b"")

    def _walk(self, batch: List[bytes]) -> None:
        for chunk in batch:
            start = self.seen
            self.seen += len(chunk)
            while self.judged and not self.ended:
                if self._pax is not None:  # (a PAX header's records lie between it and the next header)
                    low, high = max(self._pax_from, start), min(self._pax_end, self.seen)
                    if high > low:
                        self._pax += chunk[low - start : high - start]
                        self._pax_from = high
                    if self._pax_from < self._pax_end:
                        break
                    self._read_pax(bytes(self._pax))
                if self.due >= self.seen:
                    break
                if self.cut:  # (the header began in the chunk before: it goes on at this one's start)
                    header = self.cut + chunk[: BLOCK - len(self.cut)]
                else:
                    header = chunk[self.due - start : self.due - start + BLOCK]
                if len(header) < BLOCK:
                    self.cut = header
                    break
                self.cut = b""
                self._step(header)

    def _step(self, header: bytes) -> None:
        if header == ZERO_BLOCK:
            self.ended = True
            return
        span = header_span(header)
        if span is None:  # no tar header here (other data): the reader fails it or reads it
            self.judged = False
            return
        kind = header[156:157]
        if kind in (b"x", b"X"):  # PAX records for the next member: collect them (its size may be there)
            self._pax, self._pax_from = bytearray(), self.due + BLOCK
            self._pax_end = self._pax_from + number_field(header[124:136])
        elif self._pax_size is not None and kind not in EXTENSIONS:  # the member they describe
            if kind not in DATALESS:
                span = BLOCK + ((self._pax_size + 511) & -512)
            self._pax_size = None
        self.due += span

    def _read_pax(self, records: bytes) -> None:
        self._pax = None
        try:
            size = pax_records(records).get("size")
            if size is not None and self._pax_size is None:  # (the first header that sets it wins, as in the reader)
                self._pax_size = int(size)
        except ValueError:  # the reader fails the shard there
            self.judged = False

    def whole(self, url: Optional[str]) -> bool:
        """Whether the stream may be kept; a WARNING naming `url` when not."""
        if self._inflater is not None:
            try:
                self._inflater.close()  # (raises unless the last member read came to its trailer)
            except FormatError as exn:
                return _not_kept(url, f"its compressed stream is not whole ({exn})")
            return self._inner.whole(url)  # type: ignore[union-attr]
        if self._early is not None:
            return _not_kept(url, f"it ends after {sum(map(len, self._early))} bytes, too few to tell what it is")
        if not self.judged or self.ended:
            return True
        return _not_kept(url, "it ends before its tar end-of-archive block")


def _not_kept(url: Optional[str], why: str) -> bool:
    logger.warning("not cached: %s: %s (a download cut short?); it is read from the origin again next time",
                   redact_url(str(url)), why)
    return False


def _raise_unreplaced(failure: Optional[CorruptCacheFile], exn: Exception) -> None:
    """After a corrupt cached copy, an origin error is raised as one that names the cache file."""
    if failure is not None:
        raise CorruptCacheFile(
            f"corrupt cache file {failure.cache_path} ({failure.reason}) was evicted, and reading the shard "
            f"from the origin failed: {exn}",
            cache_path=failure.cache_path, url=failure.url, reason=failure.reason, offset=failure.bad_offset,
        ) from exn


def _env_size(text: str) -> int:
    try:
        return int(float(text))  # webdataset takes int(); "1e9" is friendlier and harmless
    except ValueError:
        raise UsageError(f"WDS_CACHE_SIZE must be a number of bytes, got {text!r}") from None


def cache_from_options(
    cache_dir: Optional[str] = None,
    cache_size: float = -1,
    memory_bytes: int = 0,
    *,
    environ: Optional[Mapping[str, str]] = None,
    **disk_options,
) -> Optional[ShardCache]:
    """Map webdataset's `cache_dir` / `cache_size` (and `WDS_CACHE` / `WDS_CACHE_SIZE`) onto tiers.

    As in webdataset 1.0.2's `WebDataset`: the environment variables override the arguments;
    the directory is `~`-expanded and must exist; no directory or a size of 0 means no disk
    cache; a negative size means no bound; a positive size is the byte bound (LRU eviction).

    Args:
        memory_bytes: also keep shards of at most this many bytes in a memory LRU (0: off).
        environ: the environment to read (default `os.environ`).
        disk_options: passed to `DiskTier` (lock_timeout, stall_timeout, ...).

    Returns:
        A `ShardCache`, or None when no tier is asked for (stream straight from the origin).

    Raises:
        UsageError: the directory does not exist, or WDS_CACHE_SIZE is not a number.
    """
    env = os.environ if environ is None else environ
    if env.get("WDS_CACHE"):
        cache_dir = env["WDS_CACHE"]
    if env.get("WDS_CACHE_SIZE"):
        cache_size = _env_size(env["WDS_CACHE_SIZE"])
    tiers: List = []
    if memory_bytes and memory_bytes > 0:
        tiers.append(MemoryTier(memory_bytes))
    if cache_dir is not None and int(cache_size) != 0:
        cache_dir = os.path.expanduser(os.fspath(cache_dir))
        if not os.path.isdir(cache_dir):
            raise UsageError(f"cache directory {cache_dir} does not exist")
        tiers.append(DiskTier(cache_dir, int(cache_size) if cache_size > 0 else None, **disk_options))
    return ShardCache(tiers) if tiers else None
