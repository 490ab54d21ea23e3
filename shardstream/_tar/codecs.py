"""Sans-IO decompression of compressed tar shards (gzip, bzip2, xz): bytes in, bytes out,
corruption as `FormatError`; and telling a shard's codec from its first bytes (`sniff`), as
tarfile does (so also .lzma, LZMA-alone).

One `_Inflater` holds what the three share: concatenated members (`cat a.gz b.gz`, pbzip2,
`cat a.xz b.xz`) are read one after the other, the reader stops at each member's end so that it
can set `last_member` once the tar archive ended, and a corrupt stream sets `error` after handing
out what decompressed before it. They differ in one place: zlib's decompressor can be copied, so
gzip salvages everything up to the bad byte and what a caller gets never depends on the
chunking; the bz2 and lzma decompressors cannot, so for them the chunk holding the corruption
yields nothing (what comes out of an intact stream never depends on the chunking). A call gives
at most OUT_STEP bytes: a highly compressible shard (a 424 KB .tar.gz of 400 MiB of zeros; a
decompression bomb) comes out a step at a time, not all at once from one chunk (`pending`).
No I/O: `_tar.reader.TarReader` feeds them and adds the location.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from typing import Any, Optional, Tuple, Type

from .._base.errors import FormatError

__all__ = ["Bz2Inflater", "GZIP_MAGIC", "GzipInflater", "LzmaInflater", "MAGIC_BYTES", "OUT_STEP", "XzInflater",
           "sniff"]

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # expect a gzip header and trailer; zlib checks the CRC and size
# bzip2: "BZh", the block size digit, then the first block's magic (pi) or the end-of-stream
# magic (sqrt(pi)) of an empty stream: ten bytes no tar header starts with.
_BZ2_BLOCK = b"\x31\x41\x59\x26\x53\x59"
_BZ2_END = b"\x17\x72\x45\x38\x50\x90"
XZ_MAGIC = b"\xfd7zXZ\x00"
LZMA_MAGIC = b"\x5d\x00\x00\x80"  # .lzma (LZMA-alone), as tarfile knows it: lc/lp/pb 3/0/2, an 8 MiB dictionary
OUT_STEP = 8 << 20  # the most bytes one `feed` call decompresses (a 1 MiB chunk of plain tar gives ~1 MiB)


class _Inflater:
    """Decompress a stream of concatenated members fed in chunks of any size.

    Attributes:
        compressed_offset: compressed bytes consumed so far.
        last_member: set it once no more output is wanted: the current member is still read to
            its end (so its checksum is checked), and whatever follows it is ignored.
        tail_only: set it once the archive has ended: a member that follows is decompressed
            only for the caller's look past the end (a second archive concatenated?) until
            `last_member`; one that does not decompress is ignored, as tarfile ignores it.
        error: set (and feeding stops) once the stream turned out corrupt.
    """

    name = ""
    errors: Tuple[Type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._decompressor = self._new()
        self._rest = b""  # compressed bytes not decompressed yet (after a member's end, or past a step)
        self._more = False  # the decompressor holds more output for a step of its own (feed(b""))
        self.compressed_offset = 0
        self.last_member = False
        self.tail_only = False
        self._in_tail = False  # decompressing a member after the archive's end
        self.error: Optional[FormatError] = None

    def _new(self) -> Any:  # pragma: no cover - subclasses override
        raise NotImplementedError

    @property
    def pending(self) -> bool:
        """True if fed bytes wait (behind a member's end, or past a step's output): call
        feed(b"") to go on."""
        return bool(self._rest) or self._more

    def feed(self, data: bytes) -> bytes:
        """Decompress `data` up to the end of the current member, OUT_STEP bytes at most; the
        rest waits (`pending`). On corrupt input, return what decompressed before the
        corruption and set `error`."""
        if self._rest:
            data, self._rest = self._rest + data, b""
        if (not data and not self._more) or self.error is not None or (self._in_tail and self.last_member):
            self._more = False  # (nothing more wanted: a member after the archive's end is ignored)
            return b""
        if self._decompressor.eof:
            if self.last_member:
                return b""  # like tarfile, ignore whatever follows the archive
            self._decompressor = self._new()  # another member follows
            self._in_tail = self.tail_only
        try:
            out = self._decompress(data)
        except self.errors as exc:
            self._more = False
            if self._in_tail:  # not a member after all (padding, junk): ignored, like tarfile
                self.last_member = True
                return b""
            return self._corrupt(exc, data)
        if self._decompressor.eof:
            self._rest, self._more = self._decompressor.unused_data, False  # (what followed the member)
        else:
            self._rest, self._more = self._left_over(len(out))
        self.compressed_offset += len(data) - len(self._rest)
        return out

    def _decompress(self, data: bytes) -> bytes:
        return self._decompressor.decompress(data, OUT_STEP)

    def _left_over(self, produced: int) -> Tuple[bytes, bool]:
        """After a step short of the member's end that gave `produced` bytes: (input not taken,
        whether output may wait). bz2 and lzma keep the input they did not decompress, and say
        so by `needs_input`."""
        return b"", not self._decompressor.needs_input

    def _corrupt(self, exc: BaseException, data: bytes) -> bytes:
        self.error = FormatError(f"corrupt {self.name} stream ({exc}) after compressed byte {self.compressed_offset}")
        return b""

    def close(self) -> None:
        """Raise FormatError unless the last member was complete (its trailer seen)."""
        if self.error is not None:
            raise self.error
        if not self._decompressor.eof and not self._in_tail:
            raise FormatError(f"truncated {self.name} stream (ends after {self.compressed_offset} compressed bytes)")


class GzipInflater(_Inflater):
    name = "gzip"
    errors = (zlib.error,)

    def _new(self) -> Any:
        return zlib.decompressobj(_GZIP_WBITS)

    def _decompress(self, data: bytes) -> bytes:
        self._backup = self._decompressor.copy()  # cheap next to decompressing a chunk; used on error
        return self._decompressor.decompress(data, OUT_STEP)

    def _left_over(self, produced: int) -> Tuple[bytes, bool]:
        # zlib hands back the input it did not take; a full step may leave output in its state
        return self._decompressor.unconsumed_tail, produced >= OUT_STEP

    def _corrupt(self, exc: BaseException, data: bytes) -> bytes:
        out, used = _salvage(self._backup, data)
        self.compressed_offset += used
        self.error = FormatError(f"corrupt gzip stream ({exc}) at compressed byte {self.compressed_offset}")
        return out


def _salvage(inflate: Any, data: bytes) -> Tuple[bytes, int]:
    """Decompress `data` up to the byte where zlib fails; return (output, bytes of `data` used).

    zlib discards a failing call's output, so redo that call in small steps from a copy.
    """
    parts = []
    pos, step = 0, 4096
    while pos < len(data):
        trial = inflate.copy()
        try:
            parts.append(trial.decompress(data[pos : pos + step]))
        except zlib.error:
            if step == 1:
                break  # data[pos] is the byte zlib could not accept
            step = 1
            continue
        inflate = trial
        pos += step
        if inflate.eof:
            break
    return b"".join(parts), min(pos, len(data))


class Bz2Inflater(_Inflater):
    name = "bzip2"
    errors = (OSError, ValueError, EOFError)

    def _new(self) -> Any:
        return bz2.BZ2Decompressor()


class XzInflater(_Inflater):
    name = "xz"
    errors = (lzma.LZMAError, EOFError)

    def _new(self) -> Any:
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)


class LzmaInflater(XzInflater):
    name = "lzma"

    def _new(self) -> Any:
        return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE)


def _is_bz2(head: bytes) -> bool:
    return head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] in (_BZ2_BLOCK, _BZ2_END)


MAGIC_BYTES = 10  # the most bytes `sniff` needs to decide


def sniff(head: bytes) -> Tuple[Optional[type], bool]:
    """(inflater class or None for plain tar, decided) from a shard's first bytes; `decided` is
    False while `head` is too short to tell (it is a prefix of a codec's magic)."""
    if head[:2] == GZIP_MAGIC:
        return GzipInflater, True
    if head[:6] == XZ_MAGIC:
        return XzInflater, True
    if head[:4] == LZMA_MAGIC:
        return LzmaInflater, True
    if len(head) >= MAGIC_BYTES and _is_bz2(head):
        return Bz2Inflater, True
    undecided = (
        (len(head) < 2 and GZIP_MAGIC.startswith(head))
        or (len(head) < 6 and XZ_MAGIC.startswith(head))
        or (len(head) < 4 and LZMA_MAGIC.startswith(head))
        or (len(head) < MAGIC_BYTES and _could_be_bz2(head))
    )
    return None, not undecided


def _could_be_bz2(head: bytes) -> bool:
    """Whether `head` (shorter than MAGIC_BYTES) may still grow into a bzip2 stream's start."""
    if not b"BZh".startswith(head[:3]) or (len(head) > 3 and head[3:4] not in b"123456789"):
        return False
    return _BZ2_BLOCK.startswith(head[4:]) or _BZ2_END.startswith(head[4:])
