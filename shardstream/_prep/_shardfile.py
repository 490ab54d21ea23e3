"""Writing one planned shard: read its samples (threads, in order), re-encode, write the tar with
fixed headers, then its `.idx` and `.dali.idx`. The same function runs in every engine.

Headers are webdataset's TarWriter's (PAX, owner "bigdata", mode 0444) with a fixed mtime;
members are written field by field, in sorted order as TarWriter does, so that the offsets for
the indexes come from the writer itself. `.tar.gz` is written through a gzip stream with a fixed
timestamp and no file name (tarfile's own gzip header holds the current time).
"""

from __future__ import annotations

import gzip
from collections import deque
from dataclasses import dataclass
from itertools import groupby
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

from .._base.errors import ShardStreamError
from .._base.redact import redact
from .._base.workers import WorkerPool
from .._shard.samples import TarShardSamples
from .._shard.origin import open_origin
from .._writer.tarwriter import TarWriter
from ._dest import Destination
from ._indexes import DaliMember, dali_split, dali_text, idx_text
from ._options import Reencode
from ._plan import ShardTask
from ._reencode import reencode_fields
from ._rows import Ref, Row

__all__ = ["ShardResult", "WriteContext", "write_shard"]

_BLOCK = 512


@dataclass(frozen=True)
class WriteContext:
    """What every shard task needs besides its rows (pickled to worker processes and Ray tasks)."""

    dest: Destination
    shard_urls: Tuple[str, ...] = ()
    reencode: Optional[Reencode] = None
    threads: int = 4
    skip_errors: bool = False
    mtime: int = 0
    dali: bool = True
    shard_counts: Tuple[int, ...] = ()  # resharding: the samples each source shard was counted to hold


class ShardResult(NamedTuple):
    """What writing one shard did (`failures`: samples left out; `notes`: e.g. no DALI index)."""

    number: int
    name: str
    samples: int
    file_bytes: int
    payload_bytes: int
    failures: Tuple[str, ...]
    notes: Tuple[str, ...]


class _Counting:
    """A write-only stream that counts what passes through it. Once `abandoned`, writes are
    dropped (tarfile and gzip flush from their finalizers after a failed shard was discarded)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.written = 0
        self.abandoned = False

    def write(self, data: Any) -> int:
        if self.abandoned:
            return len(data)
        self.written += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _ordered(fn: Callable[[Any], Any], items: Iterable[Any], threads: int) -> Iterator[Any]:
    """fn over items on `threads` threads, results in input order, at most 2 x threads ahead."""
    if threads <= 1:
        yield from map(fn, items)
        return
    pool = WorkerPool(threads, thread_name_prefix="shardstream-create")
    pending: deque = deque()
    source = iter(items)
    try:
        for item in source:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _read(ref: Ref) -> bytes:
    return b"".join(open_origin(ref.url))


def _where(row: Row) -> str:
    refs = [value.url for _, value in row.fields if isinstance(value, Ref)]
    return f" from {redact(refs[0])}" if refs else ""


def _materialise(ctx: WriteContext) -> Callable[[Tuple[Row, Optional[Dict[str, Any]]]], tuple]:
    def run(item: Tuple[Row, Optional[Dict[str, Any]]]) -> tuple:
        row, sample = item
        key = row.key if row.key is not None else sample["__key__"]  # type: ignore[index]
        try:
            if sample is not None:
                fields = {k: v for k, v in sample.items() if not k.startswith("__")}
            else:
                fields = {ext: value if isinstance(value, bytes) else _read(value) for ext, value in row.fields}
            if ctx.reencode is not None:
                fields = reencode_fields(fields, ctx.reencode)
            return key, fields, None
        except Exception as exn:  # one sample's failure: reported (or skipped) by the writer
            return key, None, f"sample {key!r}{_where(row)} - {type(exn).__name__}: {redact(exn)}"

    return run


def _inputs(task: ShardTask, ctx: WriteContext) -> Iterator[Tuple[Row, Optional[Dict[str, Any]]]]:
    """(row, source sample or None) in the task's order; each source shard is read once, from
    its first wanted sample to its last (seeking with its .idx where there is one)."""
    if not task.rows or task.rows[0].origin is None:
        for row in task.rows:
            yield row, None
        return
    for shard, group in groupby(task.rows, key=lambda r: r.origin[0]):  # type: ignore[index]
        rows = {row.origin[1]: row for row in group}  # type: ignore[index]
        first, last = min(rows), max(rows)
        url = ctx.shard_urls[shard]
        # A stale count (sizes.json or .idx) must not lose samples without a word: the task with a
        # shard's last counted sample reads on to its end, and a shard that ends early says so.
        to_end = bool(ctx.shard_counts) and last == ctx.shard_counts[shard] - 1
        item = {"url": url, "start": first, "stop": None if to_end else last + 1}
        number = first - 1
        for number, sample in enumerate(TarShardSamples().run([item]), first):
            if number in rows:
                yield rows[number], sample
            elif number > last:
                raise ShardStreamError(
                    f"the source shard holds more than the {last + 1} samples its sizes.json or .idx counts "
                    f"(sample {number}, key {sample.get('__key__')!r}): the count is stale; re-count it with "
                    "`shardstream index`", url=url,
                )
        if number < last:
            raise ShardStreamError(
                f"the source shard ends after {number + 1} samples, but its sizes.json or .idx counts at least "
                f"{last + 1}: the count is stale; re-count it with `shardstream index`", url=url,
            )


def _compressor(stream: Any, name: str, mtime: int) -> Tuple[Any, Any, Optional[str]]:
    """(stream for tar bytes, gzip layer to close or None, TarWriter compress option)."""
    lower = name.lower()
    if lower.endswith((".gz", ".tgz")):
        layer = gzip.GzipFile(filename="", mode="wb", fileobj=stream, mtime=mtime)
        return layer, layer, None
    if lower.endswith(".bz2"):
        return stream, None, "bz2"
    if lower.endswith(".xz"):
        return stream, None, "xz"
    return stream, None, None


def _write_samples(
    task: ShardTask, ctx: WriteContext, out: _Counting, samples: List[Tuple[int, str]], dali: List[List[DaliMember]],
    failures: List[str],
) -> Tuple[int, bool]:
    """Write the shard's tar into `out`, filling the index lists; (payload bytes, compressed)."""
    stream, layer, compress = _compressor(out, task.name, ctx.mtime)
    writer = TarWriter(stream, compress=compress or False, encoder=False, mtime=ctx.mtime)
    tar = writer.tarstream
    previous = None
    payload = 0
    for key, fields, error in _ordered(_materialise(ctx), _inputs(task, ctx), ctx.threads):
        if error is not None:
            if not ctx.skip_errors:
                raise ShardStreamError(f"shard {task.name}: {error} (--skip-errors leaves such samples out)")
            failures.append(error)
            continue
        if key == previous:
            raise ShardStreamError(
                f"shard {task.name}: sample key {key!r} twice in a row; readers would merge the two: use --rekey"
            )
        previous = key
        samples.append((tar.offset, key))
        members: List[DaliMember] = []
        for ext in sorted(fields):  # TarWriter's member order; one write per member gives its offsets
            if ext.startswith("_"):
                continue
            data = fields[ext]
            writer.write({"__key__": key, ext: data})
            name = f"{key}.{ext}"
            data_offset = tar.offset - (len(data) + _BLOCK - 1) // _BLOCK * _BLOCK  # the end, less the padded payload
            members.append((dali_split(name)[1], data_offset, len(data), name))
            payload += len(data)
        dali.append(members)
    if not samples:
        raise ShardStreamError(f"shard {task.name}: every one of its {len(task.rows)} samples failed: {failures[:3]}")
    writer.close()
    if layer is not None:
        layer.close()
    return payload, layer is not None or compress is not None


def write_shard(task: ShardTask, ctx: WriteContext) -> ShardResult:
    """Write one shard and its indexes into ctx.dest.

    Raises:
        ShardStreamError: a sample failed (unless skip_errors), a key repeats back to back, or
            every sample of the shard failed. Nothing of the shard is left behind then.
    """
    samples: List[Tuple[int, str]] = []
    dali: List[List[DaliMember]] = []
    failures: List[str] = []
    notes: List[str] = []
    with ctx.dest.open(task.name) as raw:
        counting = _Counting(raw)
        try:
            payload, compressed = _write_samples(task, ctx, counting, samples, dali, failures)
        except BaseException:
            counting.abandoned = True
            raise
    text = idx_text(samples)
    if text is not None:
        ctx.dest.write_bytes(task.name + ".idx", text.encode("utf-8", "surrogateescape"))
    else:
        notes.append(f"{task.name}: no .idx (a key holds a newline)")
    if ctx.dali:
        if compressed:
            notes.append(f"{task.name}: no .dali.idx (DALI reads plain tars)")
        elif any(c.isspace() for members in dali for _, _, _, name in members for c in name):
            notes.append(f"{task.name}: no .dali.idx (a member name holds whitespace)")
        else:
            ctx.dest.write_bytes(task.name + ".dali.idx", dali_text(dali).encode("utf-8", "surrogateescape"))
    return ShardResult(task.number, task.name, len(samples), counting.written, payload, tuple(failures), tuple(notes))
