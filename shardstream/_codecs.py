"""Sans-IO decompression of bzip2 and xz tar shards, and telling a shard's codec from its first bytes.

`Bz2Inflater` and `XzInflater` have `GzipInflater`'s interface (`feed`, `close`, `pending`,
`last_member`, `error`, `compressed_offset`), so `_tar.TarReader` treats all three alike.
Concatenated streams (pbzip2, `cat a.xz b.xz`) are read like concatenated gzip members. Unlike
zlib, the bz2 and lzma decompressors cannot be copied, so on corrupt input the chunk holding the
corruption yields nothing (gzip salvages up to the bad byte): what comes out before a corruption
error can depend on the chunking, never what comes out of an intact stream.
"""

from __future__ import annotations

import bz2
import lzma
from typing import Any, Optional, Tuple, Type

from ._errors import FormatError
from ._gzip import GZIP_MAGIC, GzipInflater

__all__ = ["Bz2Inflater", "MAGIC_BYTES", "XzInflater", "sniff"]

# bzip2: "BZh", the block size digit, then the first block's magic (pi) or the end-of-stream
# magic (sqrt(pi)) of an empty stream: ten bytes no tar header starts with.
_BZ2_BLOCK = b"\x31\x41\x59\x26\x53\x59"
_BZ2_END = b"\x17\x72\x45\x38\x50\x90"
XZ_MAGIC = b"\xfd7zXZ\x00"


class _StreamInflater:
    """Decompress a stream of concatenated members fed in chunks of any size."""

    name = ""
    errors: Tuple[Type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._decompressor = self._new()
        self._rest = b""
        self.compressed_offset = 0
        self.last_member = False
        self.error: Optional[FormatError] = None

    def _new(self) -> Any:  # pragma: no cover - subclasses override
        raise NotImplementedError

    @property
    def pending(self) -> bool:
        """True if fed bytes wait behind a member's end: call feed(b"") to go on."""
        return bool(self._rest)

    def feed(self, data: bytes) -> bytes:
        """Decompress `data` up to the end of the current member; the rest waits (`pending`)."""
        if self._rest:
            data, self._rest = self._rest + data, b""
        if not data or self.error is not None:
            return b""
        decompressor = self._decompressor
        if decompressor.eof:
            if self.last_member:
                return b""  # like tarfile, ignore whatever follows the archive
            decompressor = self._decompressor = self._new()
        try:
            out = decompressor.decompress(data)
        except self.errors as exc:
            self.error = FormatError(f"corrupt {self.name} stream ({exc}) after compressed byte {self.compressed_offset}")
            return b""
        if decompressor.eof:
            self._rest = decompressor.unused_data
        self.compressed_offset += len(data) - len(self._rest)
        return out

    def close(self) -> None:
        """Raise FormatError unless the last member was complete."""
        if self.error is not None:
            raise self.error
        if not self._decompressor.eof:
            raise FormatError(f"truncated {self.name} stream (ends after {self.compressed_offset} compressed bytes)")


class Bz2Inflater(_StreamInflater):
    name = "bzip2"
    errors = (OSError, ValueError, EOFError)

    def _new(self) -> Any:
        return bz2.BZ2Decompressor()


class XzInflater(_StreamInflater):
    name = "xz"
    errors = (lzma.LZMAError, EOFError)

    def _new(self) -> Any:
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)


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
    if len(head) >= MAGIC_BYTES and _is_bz2(head):
        return Bz2Inflater, True
    undecided = (
        (len(head) < 2 and GZIP_MAGIC.startswith(head))
        or (len(head) < 6 and XZ_MAGIC.startswith(head))
        or (len(head) < MAGIC_BYTES and _could_be_bz2(head))
    )
    return None, not undecided


def _could_be_bz2(head: bytes) -> bool:
    """Whether `head` (shorter than MAGIC_BYTES) may still grow into a bzip2 stream's start."""
    if not b"BZh".startswith(head[:3]) or (len(head) > 3 and head[3:4] not in b"123456789"):
        return False
    return _BZ2_BLOCK.startswith(head[4:]) or _BZ2_END.startswith(head[4:])
