"""Sans-IO tar reader: feed bytes of a tar stream (plain, gzip, bzip2 or xz), get regular files.

`TarReader` follows stdlib `tarfile`'s reading rules (USTAR prefix, GNU longname/longlink, PAX
per-file and global headers, base-256 numbers, both checksum variants, which types count as
regular files and which carry data), so on a valid archive it lists exactly the members, names
and offsets that `tarfile.open(mode="r|*")` lists as regular files. Unlike tarfile it is strict:
a bad header, a truncated archive or a corrupt compressed stream raises `FormatError` instead of
quietly ending the archive. (Header fields it has no use for, such as mode or mtime, go unchecked.)

It does no I/O: callers read bytes however they like and feed chunks of any size, and chunk
boundaries never change the result: every member before a format error is returned first, and
the error is raised by the call after that (or at once, if that call returns nothing).

Why this module is over 400 lines: `TarReader` is one state machine (header, extension, payload,
padding, end of archive, tail scan) whose states share its buffer and offsets; split across
modules, each part would need the others' private state. Header field parsing is in `headers.py`.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from .._base.errors import FormatError
from .codecs import OUT_STEP, GzipInflater, sniff
from .sparse import Regions, expand, map_1_0, old_gnu_extension, old_gnu_header, pax_regions
from .headers import changes_member, header_checksum_ok, number_field, pax_records, text_field

__all__ = ["DATALESS", "EXTENSIONS", "TAIL_LIMIT", "TAIL_SCAN", "TarMember", "TarReader", "header_span"]

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # tarfile.REGULAR_TYPES minus GNU sparse (`S`: see _sparse)
# Types tarfile knows; their size field is ignored for non-regular ones (no data is skipped).
# Unknown types are skipped *with* their data, as tarfile does.
_SUPPORTED = (b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"L", b"K", b"S")
_NOT_FILES = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device",
              b"6": "FIFO"}  # what `others` hears of (directories are implied by the files' names)
_GNU_TYPES = (b"L", b"K", b"S")  # the USTAR prefix field means something else in these
_EXTENSIONS = (b"L", b"K", b"x", b"X", b"g")  # headers that describe the next member (or all: g)
EXTENSIONS = _EXTENSIONS  # (for a walk of headers elsewhere: the cache's)
# Every other type has data after its header (padded to blocks): regular files, extensions and
# types tarfile does not know.
_DATALESS = frozenset(_SUPPORTED) - frozenset(_REGULAR) - frozenset(_EXTENSIONS) - {b"S"}  # (GNU sparse: stored data)
DATALESS = _DATALESS  # (for a walk of headers elsewhere: the cache's)
_BIG = 1 << 16  # payloads this large go through feed_view's read_range (GIL-free copies)
_BIG_PAYLOAD = 4 << 20  # data this large that came in chunks is joined once, exactly (see _take)
# After the end-of-archive block, a valid header this close means a damaged shard or concatenated
# archives (tarfile would stop there quietly). Record padding (GNU tar: up to 10 KiB; `tar -b 256`:
# 128 KiB) is zeros. A stream of unknown length is looked at this far; one whose length is known
# (a file, an HTTP body) to its end, up to TAIL_LIMIT: a run of zeros longer than TAIL_SCAN (a
# damaged shard) must not hide the samples after it.
TAIL_SCAN = 64 << 10
TAIL_LIMIT = 64 << 20
_TAIL_STEP = 1 << 20
_new_member = tuple.__new__  # skips NamedTuple's Python-level __new__ on the hot path


def header_span(hdr: bytes) -> Optional[int]:
    """Bytes from the header `hdr` to the next one: the header and the data the reader skips
    after it (padded to blocks), for a caller that finds where an archive ends without parsing
    it. None when `hdr` is no header: neither the ustar magic nor a valid checksum (the reader
    checks every checksum; the magic alone is a fifth of the cost). A PAX `size` record (members
    over 8 GiB) is the caller's to apply: its header's span is its records' (see the cache's walk)."""
    if len(hdr) != BLOCK or (hdr[257:262] != b"ustar" and not header_checksum_ok(hdr)):
        return None
    try:
        size = number_field(hdr[124:136])
    except ValueError:
        return None
    if size < 0 or (hdr[156:157] == b"S" and hdr[482]):  # (a sparse map in blocks after it: not for a walk)
        return None
    return BLOCK + (0 if hdr[156:157] in _DATALESS else (size + 511) & -512)


class TarMember(NamedTuple):
    """One regular file of the archive."""

    name: str  # full path (longname / PAX path applied), utf-8 with surrogateescape
    data: bytes  # exactly the member's payload
    offset: int  # offset of its first header block (extension headers included) in the tar stream


class _Extension:
    """What GNU longname/longlink and PAX 'x' headers say about the next member.

    tarfile applies them innermost first, so for each field the *first* header that sets it wins.
    """

    __slots__ = ("offset", "name", "size", "sparse", "sparse_records", "sparse_payloads")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.name: Optional[str] = None
        self.size: Optional[str] = None  # the PAX record; parsed once the member's name is known
        self.sparse = False
        self.sparse_records: Dict[str, str] = {}  # GNU.sparse.* PAX records (the first header's win)
        self.sparse_payloads: List[bytes] = []  # the PAX headers that held them (format 0.0 repeats keys)


class TarReader:
    """Parse a tar stream fed in chunks; return regular-file members as soon as they are complete.

    Args:
        url: used only in error messages.
        compressed: None detects gzip, bzip2 and xz by their magic bytes; True requires gzip;
            False means raw tar.
        start_offset: the input begins at this offset of an uncompressed archive, at a header
            (resuming mid-shard from an index); member offsets are reported from the archive
            start. PAX global headers before that point are not seen.
        payloads: False hands out members with empty `data` and never touches payload bytes:
            with `feed_view` over a memory map, walking a shard reads only its header pages.
        size: the archive's length when known (a local uncompressed file): a header claiming
            more bytes than are left fails at once, instead of buffering the rest of the shard.
        others: called with (name, kind, offset) for each link, device or FIFO member, which
            are not handed out (as in webdataset); `extract` says which it left out.
    """

    def __init__(
        self, url: Optional[str] = None, *, compressed: Optional[bool] = None, start_offset: int = 0,
        payloads: bool = True, size: Optional[int] = None, others: Optional[Callable[[str, str, int], None]] = None,
    ) -> None:
        if start_offset and compressed:
            raise ValueError("start_offset needs an uncompressed archive")
        self._url = url
        self._others = others
        self._payloads = payloads
        self._size = size
        self._compressed = False if start_offset else compressed
        self._inflater = GzipInflater() if compressed else None
        self._head = b""  # first bytes, held back while they may begin a codec's magic (see _codecs)
        self._fed = False
        self._buf: Any = b""  # bytes (or a _BytesView) being parsed; _buf[_pos:] is not consumed yet
        self._pos = 0
        self._base = start_offset  # tar stream offset of _buf[0]
        self._queue: List[bytes] = []  # chunks held back until _need bytes are there
        self._queued = 0
        self._need = BLOCK  # bytes from _pos needed before parsing can make progress
        self._need_data = BLOCK  # of those, the bytes up to the end of a regular member's data (the rest: padding)
        self._stalled: Optional[tuple] = None  # (member, offset) of the header waiting for data
        self._pending: Optional[Tuple[str, int]] = None  # the same, for a regular member (see pending_header)
        self._last_name: Optional[str] = None  # the last member handed out by an earlier call (for errors)
        self._ext: Optional[_Extension] = None
        self._dangling: Optional[int] = None  # offset of extension headers no member followed yet
        self._global: dict = {}  # PAX global header records
        self._global_applies = False  # whether they change members (path, size, sparse)
        self._finished = False
        self.unterminated: Optional[int] = None  # set by close(): where an archive without its end-of-archive blocks stops
        self._error: Optional[FormatError] = None  # raised again by every later call
        self._tail_at = self._tail_stop = 0  # the bytes after the end-of-archive block still to scan
        self._tail_partial = b""

    def limit(self, size: int) -> None:
        """The archive's length, learnt after reading began (e.g. from an HTTP response): as
        `size=` at construction; call it before feeding the bytes it applies to."""
        self._size = size

    @property
    def offset(self) -> int:
        """Bytes of the uncompressed tar stream consumed so far."""
        return self._base + self._pos

    @property
    def compressed(self) -> Optional[bool]:
        """Whether the input is gzip (None until its first bytes are seen)."""
        return self._compressed

    @property
    def pending_member(self) -> Optional[str]:
        """The member whose header is read and whose data has not all come yet (None between
        members): where a stream that breaks now broke."""
        return self._stalled[0] if self._stalled else None

    @property
    def pending_header(self) -> Optional[Tuple[str, int]]:
        """(name, header offset) of the regular member whose header is read and whose data has
        not all come, also when it never will (the shard is cut there); None between members.
        When the shard breaks now, every member before it is whole: so is a sample it does not
        belong to."""
        return self._pending

    @property
    def backlog(self) -> bool:
        """True while compressed bytes fed wait to be decompressed (a chunk gives OUT_STEP bytes
        of tar at most per call): call `feed(b"")` until False before the next chunk, so that a
        highly compressible shard costs a step of memory, not a chunk's whole output."""
        inflater = self._inflater
        return inflater is not None and inflater.pending and inflater.error is None and self._error is None

    @property
    def finished(self) -> bool:
        """True once the end-of-archive zero block was seen; later input is ignored."""
        return self._finished

    def feed(self, data) -> List[TarMember]:
        """Add bytes (bytes, bytearray or memoryview, any length); return the members they complete."""
        if self._error is not None:
            raise self._error
        if type(data) is not bytes:
            data = bytes(data)  # also detaches us from a buffer the caller may reuse
        if not data and not self.backlog:
            return []
        self._fed = True
        if self._compressed is None:
            data = self._head + data
            codec, decided = sniff(data)
            if not decided:  # the first bytes may begin a codec's magic: wait for more
                self._head = data
                return []
            self._head = b""
            self._compressed = codec is not None
            if codec is not None:
                self._inflater = codec()
        inflater = self._inflater
        if inflater is None:
            return self._take(data)
        members: List[TarMember] = []
        produced = 0
        while True:  # one gzip member at a time, so the tar end is seen before the next member
            try:
                out = inflater.feed(data)
                produced += len(out)
                members += self._take(out)
            except FormatError:
                if not members:
                    raise
                return members  # the error is raised by the next call (self._error)
            if self._finished:  # a member after the archive is read only for the tail scan,
                inflater.tail_only = True  # and no further than uncompressed shards are scanned
                if self._tail_at + len(self._tail_partial) >= self._tail_stop:
                    inflater.last_member = True
            if not inflater.pending or inflater.error is not None or self._error is not None:
                break
            if produced >= OUT_STEP:  # the rest waits (`backlog`): memory is bounded by a step, not a chunk
                break
            if not out and not data and self._finished:  # (no progress possible: nothing more is wanted)
                break
            data = b""
        if inflater.error is not None and self._error is None:
            # Members that decompressed before the corruption are still handed out (like any
            # members before a format error); the error comes now or with the next call.
            member, offset = self._stalled or (None, self.offset)
            self._error = inflater.error.with_location(url=self._url, member=member, offset=offset)
            if not members:
                raise self._error
        return members

    def feed_view(self, view, *, read_range=None) -> Tuple[List[TarMember], int]:
        """Parse the members that lie complete at the start of `view`, without buffering any of it.

        For callers that own a stable buffer (an mmap of a file, a reusable read buffer): payloads
        are copied once, straight out of `view`, and nothing is kept after the call. Returns the
        members and the number of bytes consumed; the caller presents the unconsumed rest again
        at the start of its next view, and ends with `feed(rest)` + `close()`. Uncompressed tar
        only, and only while `feed` has nothing buffered.

        `read_range(start, stop)`, if given, must return `bytes(view[start:stop])`; it is used for
        large payloads so that a caller can copy them without holding the GIL (os.pread).
        """
        if self._error is not None:
            raise self._error
        if self._compressed or self._head or self._pos < len(self._buf) or self._queue:
            raise ValueError("feed_view needs an uncompressed stream with nothing buffered by feed()")
        if len(view) == 0 or self._finished:
            if self._finished:
                self._scan_tail(view)
            return [], len(view) if self._finished else 0
        self._fed = True
        self._compressed = False
        self._buf, self._pos = _BytesView(view, read_range), 0
        consumed = 0
        try:
            members = self._parse()
        finally:
            if self._finished:  # _parse has set _base; whatever follows the archive is ignored
                consumed = len(view)
            else:
                consumed = self._pos
                self._base += consumed
            self._buf, self._pos = b"", 0
        return members, consumed

    def _take(self, data: bytes) -> List[TarMember]:
        """Add uncompressed tar bytes to the buffer; parse once there is enough to make progress."""
        if self._finished:
            self._scan_tail(data)
            return []
        if not data:
            return []
        buf, pos = self._buf, self._pos
        if len(buf) - pos + self._queued + len(data) < self._need:
            # Not enough for the next header or payload: queue instead of re-joining per chunk,
            # so a large member arriving in small chunks is copied once, not once per chunk.
            self._queue.append(data)
            self._queued += len(data)
            return []
        if pos < len(buf) or self._queue:
            pieces = [buf[pos:], *self._queue, data]
            self._queue.clear()
            self._queued = 0
            if self._pending is not None and self._need_data - BLOCK >= _BIG_PAYLOAD:
                # A large member's data came in chunks: joined once, exactly, it is the member's
                # data itself (`_Pieces` hands it out whole); a join of everything and then a
                # slice of the data held the member three times over.
                data = _Pieces.around(pieces, BLOCK, self._need_data)  # type: ignore[assignment]
            else:
                data = b"".join(pieces)
            del pieces
        self._base += pos
        self._buf, self._pos = data, 0
        return self._parse()

    def close(self) -> List[TarMember]:
        """Signal the end of input; raise FormatError if the archive (or gzip stream) is incomplete.
        A shard cut inside the padding after its last member's data hands that member out here,
        as tarfile does, and raises on the next call: call `close` again after using it."""
        if self._error is not None:
            raise self._error
        if self._head:  # the start of a codec's magic, then the end: not compressed after all
            self._compressed, head, self._head = False, self._head, b""
            self.feed(head)
        if not self._fed:
            raise self._fail("empty file", offset=0)
        drained: List[TarMember] = []
        try:
            while self.backlog:  # (a caller that did not ask for the rest of its last chunk)
                drained += self.feed(b"")
            if drained and self._error is None:
                drained += self.close()
        except FormatError:
            if not drained:
                raise
        if drained:  # (an error behind them is raised by the next call)
            return drained
        member, offset = self._stalled or (None, self.offset)
        if self._inflater is not None:
            try:
                self._inflater.close()
            except FormatError as exc:
                self._error = exc.with_location(url=self._url, member=member, offset=offset)
                raise
        if self._finished:
            return []
        left = len(self._buf) - self._pos + self._queued
        if left >= BLOCK:
            if not self._need_data <= left < self._need:  # (else only padding is missing: below)
                raise self._fail(f"truncated tar member ({left} of {self._need} bytes present)", member, offset)
            error = self._fail(f"truncated tar archive: it ends inside the padding after this member's data "
                               f"({self._need - left} bytes short), where the next header is due", member, offset)
            # Cut inside the padding after a member's data: the member is whole. tarfile (so
            # webdataset) hands it out, then fails at the next header; so do we, raising on the
            # next call. The padding's zeros stand in for the bytes the cut took.
            rest = bytes(self._buf[self._pos :]) + b"".join(self._queue) + bytes(self._need - left)
            last: List[TarMember] = []
            base, self._base = self._base, self._base + self._pos  # (offsets count from `rest`'s start)
            try:
                self._step(rest, 0, last)
            finally:
                self._base, self._error = base, error
            return last
        if left and self._ext is None and not any(bytes(self._buf[self._pos :]) + b"".join(self._queue)):
            left = 0  # zeros short of a block after the last member: padding, not a header (tarfile agrees)
        if left:
            if self._ext is not None:  # the header of a member whose extension headers we have
                member, offset = self._ext.name, self._ext.offset
            raise self._fail(f"truncated tar header ({left} of {BLOCK} bytes present)", member, offset)
        if self._dangling is not None:
            raise self._fail("archive ends right after an extension header", offset=self._dangling)
        if offset == 0:
            raise self._fail("empty file", offset=0)  # e.g. gzip of nothing; tarfile says the same
        # Ending at a block boundary without the end-of-archive blocks is accepted, like tarfile
        # and webdataset; `unterminated` tells the caller, which says so (a shard cut at a member
        # boundary reads this way: its last sample may lack members).
        self.unterminated = offset
        return []

    def _fail(self, message: str, member: Optional[str] = None, offset: Optional[int] = None) -> FormatError:
        self._error = FormatError(message, url=self._url, member=member, offset=offset)
        return self._error

    def _parse(self) -> List[TarMember]:
        """Consume every complete header (and payload) in the buffer; return the regular members."""
        buf, pos, base = self._buf, self._pos, self._base
        end = len(buf)
        out: List[TarMember] = []
        append = out.append
        adler32 = zlib.adler32
        plain = self._ext is None and not self._global_applies
        # A borrowed buffer (feed_view): the fast path slices the memoryview and copies with
        # tobytes() itself, skipping the wrapper's Python-level __getitem__.
        raw = big = None
        if type(buf) is _BytesView:
            raw, big = buf._view, buf._read_range
        keep = self._payloads
        try:
            while end - pos >= BLOCK:
                hdr = buf[pos : pos + BLOCK] if raw is None else raw[pos : pos + BLOCK].tobytes()
                typ = hdr[156]
                # Fast path, inlined: the ASCII header of a regular file with no extension headers
                # in effect and its payload all here. Anything else, or any doubt, goes to _step.
                if plain and (typ == 48 or typ == 0 or typ == 55) and hdr.isascii():
                    field = hdr[148:156]
                    try:
                        checksum = int(field.rstrip(b"\0 "), 8)
                        size = int(hdr[124:136].rstrip(b"\0 "), 8)
                    except ValueError:  # empty or unusual number fields
                        checksum = size = -1
                    # adler32's low 16 bits are (1 + byte sum) mod 65521 and an ASCII header sums
                    # to less than that, so this is the exact checksum (its own field as spaces).
                    total = ((adler32(hdr) & 0xFFFF) - (adler32(field) & 0xFFFF)) % 65521 + 256
                    stop = pos + BLOCK + ((size + 511) & -512)
                    if total == checksum and size >= 0 and stop <= end:
                        # ASCII: latin-1 decodes it as utf-8 would, only faster.
                        name = hdr[:100].decode("latin-1").partition("\0")[0]
                        if hdr[345]:
                            name = hdr[345:500].decode("latin-1").partition("\0")[0] + "/" + name
                        if typ or name[-1:] != "/":  # else an old-style directory
                            if not keep:
                                data = b""
                            elif raw is None:
                                data = buf[pos + BLOCK : pos + BLOCK + size]
                            elif big is not None and size >= _BIG:
                                data = big(pos + BLOCK, pos + BLOCK + size)
                            else:
                                data = raw[pos + BLOCK : pos + BLOCK + size].tobytes()
                            append(_new_member(TarMember, (name, data, base + pos)))
                            pos = stop
                            continue
                new_pos = self._step(buf, pos, out)
                if new_pos == pos or self._finished:
                    pos = new_pos
                    if self._finished:
                        self._tail_at, self._tail_stop = base + pos, self.tail_end(base + pos)
                        self._scan_tail(buf[pos : min(end, pos + self._tail_stop - self._tail_at)])
                    break
                pos = new_pos
                plain = self._ext is None and not self._global_applies
            else:
                self._need = self._need_data = BLOCK
                self._stalled = self._pending = None
        except FormatError:
            if not out:
                raise
            # Hand out the members before the error; the next call raises it (self._error).
        finally:
            self._pos = pos
            if out:
                self._last_name = out[-1][0]
        if self._finished:
            self._buf, self._pos, self._base = b"", 0, base + pos  # keep offset, free the buffer
            self._stalled = self._pending = None
        return out

    def _step(self, buf: bytes, pos: int, out: List[TarMember]) -> int:
        """Consume the header at `pos` and its payload, the general way; return the new position.

        Every header kind and state change is handled here. Returns `pos` itself when the payload
        is not all in `buf` yet (then `_need` and `_stalled` say what is missing).
        """
        self._pending = None
        hdr = buf[pos : pos + BLOCK]
        offset = self._base + pos
        if not header_checksum_ok(hdr):
            if hdr == _ZERO_BLOCK:
                if self._ext is not None:
                    message = "end-of-archive block right after an extension header"
                    raise self._fail(message, offset=self._ext.offset)
                self._finished = True
                self._dangling = None  # a global header before the end is fine (tarfile writes that)
                return pos + BLOCK
            last = out[-1][0] if out else self._last_name
            after = "" if last is None else f", after member {last!r}"
            raise self._fail(f"bad tar header checksum (corrupt, or not a tar archive{after})", offset=offset)
        typ = hdr[156:157]
        name = text_field(hdr[:100])
        try:
            size = number_field(hdr[124:136])
        except ValueError:
            raise self._fail("invalid size field in tar header", name, offset) from None
        if typ == b"\0" and name.endswith("/"):
            typ = b"5"  # old tar formats mark directories with a trailing slash only
        if typ == b"5":
            name = name.rstrip("/")
        if hdr[345] and typ not in _GNU_TYPES:
            name = text_field(hdr[345:500]) + "/" + name
        ext = self._ext

        if typ in _EXTENSIONS:
            if size < 0:
                raise self._fail("negative size in tar header", name, offset)
            stop = pos + BLOCK + ((size + 511) & -512)
            if stop > len(buf):
                return self._stall(pos, stop, name, offset)
            payload = buf[pos + BLOCK : stop]  # padded, as tarfile reads it
            if self._dangling is None:
                self._dangling = offset
            try:
                records = pax_records(payload) if typ in (b"x", b"X", b"g") else {}
            except ValueError:
                raise self._fail("invalid PAX header record", name, offset) from None
            if typ == b"g":
                self._global.update(records)
                self._global_applies = any(changes_member(key) for key in self._global)
                return stop
            if ext is None:
                ext = self._ext = _Extension(offset)
            if typ == b"L":
                if ext.name is None:
                    ext.name = text_field(payload)
            elif typ != b"K":  # PAX: its records over the global ones in effect now
                glob = self._global
                if ext.name is None:
                    path = records.get("path", glob.get("path"))
                    ext.name = None if path is None else path.rstrip("/")
                if ext.size is None:
                    ext.size = records.get("size", glob.get("size"))
                found = {key: value for key, value in records.items() if key.startswith("GNU.sparse.")}
                if found:
                    ext.sparse = True
                    for key, value in found.items():
                        ext.sparse_records.setdefault(key, value)
                    ext.sparse_payloads.append(payload)
            return stop

        # A member header: global PAX records first, then the extension headers before it.
        sparse = typ == b"S"
        glob = self._global
        pax_size = None
        if self._global_applies:
            if "path" in glob:
                name = glob["path"].rstrip("/")
            pax_size = glob.get("size")
            sparse = sparse or any(key.startswith("GNU.sparse.") for key in glob)
        if ext is not None:
            offset = ext.offset
            if ext.name is not None:
                name = ext.name
            if ext.size is not None:
                pax_size = ext.size
            sparse = sparse or ext.sparse
        regular = typ in _REGULAR
        if regular or sparse:  # (a refused header's name still says the sample before it is whole)
            self._pending = (name, offset)
        if pax_size is not None:
            try:
                size = int(pax_size)
            except ValueError:
                raise self._fail(f"invalid PAX size {pax_size!r}", name, offset) from None
        if size < 0:
            raise self._fail("negative size in tar header", name, offset)
        if sparse:
            return self._sparse(buf, pos, hdr, typ, name, size, offset, out)
        self._pending = None
        stop = pos + BLOCK
        if typ not in _DATALESS:  # (extensions returned above)
            stop += (size + 511) & -512
        if stop > len(buf):
            return self._stall(pos, stop, name, offset, pos + BLOCK + size if regular else stop, regular)
        if regular:
            out.append(TarMember(name, buf[pos + BLOCK : pos + BLOCK + size] if self._payloads else b"", offset))
        elif self._others is not None and typ in _NOT_FILES:
            self._others(name, _NOT_FILES[typ], offset)
        self._ext = self._dangling = None
        return stop

    def _sparse(self, buf, pos: int, hdr: bytes, typ: bytes, name: str, size: int, offset: int,
                out: List[TarMember]) -> int:
        """A GNU sparse member (`_tar.sparse`): handed out at its real size, the holes zeros, as
        tarfile reads it. `size` is what it stores (for PAX 1.0, its map too)."""
        ext = self._ext
        records = {k: v for k, v in self._global.items() if k.startswith("GNU.sparse.")} if self._global_applies else {}
        payloads: List[bytes] = []
        if ext is not None:
            records.update(ext.sparse_records)
            payloads = ext.sparse_payloads
        name = records.get("GNU.sparse.name", name).rstrip("/")  # (PAX formats: the header names a stand-in)
        self._pending = (name, offset)
        data_at = pos + BLOCK
        regions: Optional[Regions]
        try:
            if typ == b"S":
                regions, extended, real_size = old_gnu_header(hdr)
                while extended:  # the map goes on in blocks after the header
                    if data_at + BLOCK > len(buf):
                        return self._stall(pos, data_at + BLOCK, name, offset, regular=True)
                    more, extended = old_gnu_extension(buf[data_at : data_at + BLOCK])
                    regions += more
                    data_at += BLOCK
            else:
                found = pax_regions(records, payloads)
                if found is None:
                    raise ValueError("GNU.sparse records that describe no map")
                regions, real_size = found
        except ValueError as exn:
            raise self._fail(f"invalid GNU sparse member: {exn}", name, offset) from None
        stop = data_at + ((size + 511) & -512)
        if stop > len(buf):
            return self._stall(pos, stop, name, offset, data_at + size, True)
        data = b""
        if self._payloads:
            stored = buf[data_at : data_at + size]
            try:
                if regions is None:  # (PAX 1.0: the map heads the data)
                    regions, skip = map_1_0(stored)
                    stored = stored[skip:]
                data = expand(stored, regions, real_size)
            except ValueError as exn:
                raise self._fail(f"invalid GNU sparse member: {exn}", name, offset) from None
        out.append(TarMember(name, data, offset))
        self._ext = self._dangling = self._pending = None
        return stop

    def tail_end(self, archive_end: int) -> int:
        """How far past the end-of-archive block (at `archive_end`) to look for a stray header:
        to the end of a stream of known length (up to TAIL_LIMIT), else TAIL_SCAN."""
        if self._size is not None and not self._compressed:
            return min(self._size, archive_end + TAIL_LIMIT)
        return archive_end + TAIL_SCAN

    def _scan_tail(self, data) -> None:
        """Raise if a valid header follows the end-of-archive block before `_tail_stop`; `data`
        continues the bytes after that block."""
        left = self._tail_stop - self._tail_at - len(self._tail_partial)
        if left <= 0 or not len(data):
            return
        if min(left, len(data)) > _TAIL_STEP:  # (a long tail of a mapped file: a MiB copied at a time)
            for begin in range(0, min(left, len(data)), _TAIL_STEP):
                self._scan_tail(data[begin : begin + _TAIL_STEP])
            return
        data = self._tail_partial + bytes(data[:left])
        whole = len(data) - len(data) % BLOCK
        zeros = whole - len(data[:whole].lstrip(b"\0"))  # (padding: skipped at C speed)
        for start in range(zeros - zeros % BLOCK, whole, BLOCK):
            block = data[start : start + BLOCK]
            if block != _ZERO_BLOCK and header_checksum_ok(block):
                raise self._fail(
                    "a tar header after the end-of-archive block: a damaged shard (zero blocks in the "
                    "middle) or concatenated archives", offset=self._tail_at + start,
                )
        self._tail_at += whole
        self._tail_partial = data[whole:]

    def _stall(
        self, pos: int, stop: int, member: str, offset: int, data_end: Optional[int] = None, regular: bool = False,
    ) -> int:
        """Wait for the bytes up to `stop`; `data_end`: where a regular member's data ends (before
        its padding: a shard cut inside the padding still hands out the member, see `close`)."""
        data_end = stop if data_end is None else data_end
        if regular:
            self._pending = (member, offset)
        if self._size is not None and not self._compressed and self._base + data_end > self._size:
            raise self._fail(
                f"truncated tar member: it needs {stop - pos} bytes from its header, the shard has "
                f"{self._size - self._base - pos} left", member, offset,
            )
        self._need, self._need_data, self._stalled = stop - pos, data_end - pos, (member, offset)
        return pos


class _Pieces:
    """Bytes in a few pieces, sliced as one: a slice that is exactly a piece is that piece, not a
    copy (the parser slices a member's data out of its buffer)."""

    __slots__ = ("_parts", "_starts", "_len")

    def __init__(self, parts: List[bytes]) -> None:
        self._parts = parts
        self._starts, at = [], 0
        for part in parts:
            self._starts.append(at)
            at += len(part)
        self._len = at

    @classmethod
    def around(cls, chunks: List[bytes], start: int, stop: int) -> "_Pieces":
        """`chunks` as three pieces: the bytes before `start`, from `start` to `stop` (one join,
        exactly), and after."""
        before: List[bytes] = []
        middle: List[bytes] = []
        after: List[bytes] = []
        at = 0
        for chunk in chunks:
            end = at + len(chunk)
            if at < start:
                before.append(chunk[: start - at])
            if end > start and at < stop:
                middle.append(chunk[max(0, start - at) : stop - at])
            if end > stop:
                after.append(chunk[max(0, stop - at) :])
            at = end
        return cls([b"".join(before), b"".join(middle), b"".join(after)])

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: slice) -> bytes:
        start, stop, _ = index.indices(self._len)
        pieces = []
        for part, at in zip(self._parts, self._starts):
            end = at + len(part)
            if at == start and end == stop:
                return part
            if end > start and at < stop:
                pieces.append(part[max(0, start - at) : stop - at])
        return b"".join(pieces)


class _BytesView:
    """A memoryview whose slices are bytes: lets the parser run on a borrowed buffer unchanged."""

    __slots__ = ("_view", "_len", "_read_range")

    def __init__(self, view, read_range=None) -> None:
        self._view = memoryview(view).cast("B")
        self._len = len(self._view)
        self._read_range = read_range

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: slice) -> bytes:
        start, stop, _ = index.indices(self._len)
        if self._read_range is not None and stop - start >= _BIG:
            return self._read_range(start, stop)
        return self._view[index].tobytes()
