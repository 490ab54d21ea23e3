"""Sans-IO gzip decompression for tar shards: bytes in, bytes out, corruption as `FormatError`.

Handles concatenated gzip members (as `gzip.decompress` does). On corrupt input it still returns
everything that decompressed before the bad byte, so what a caller gets does not depend on how
the input was chunked. It does no I/O; `_tar.TarReader` feeds it and adds the location.
"""

from __future__ import annotations

import zlib
from typing import Optional, Tuple

from ._errors import FormatError

__all__ = ["GZIP_MAGIC", "GzipInflater"]

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # expect a gzip header and trailer; zlib checks the CRC and size


class GzipInflater:
    """Decompress a gzip stream fed in chunks of any size.

    Attributes:
        compressed_offset: compressed bytes consumed so far.
        last_member: set it once no more output is wanted: the current member is still read to its
            end (so its CRC is checked), and whatever follows it is ignored.
        error: set (and feeding stops) once the stream turned out corrupt.
    """

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(_GZIP_WBITS)
        self._rest = b""  # compressed bytes after the end of the last member, not decompressed yet
        self.compressed_offset = 0
        self.last_member = False
        self.error: Optional[FormatError] = None

    @property
    def pending(self) -> bool:
        """True if fed bytes wait behind a member's end: call feed(b"") to go on."""
        return bool(self._rest)

    def feed(self, data: bytes) -> bytes:
        """Decompress `data` up to the end of the current gzip member; the rest waits (`pending`).

        Stopping at each member's end lets the caller set `last_member` before the next begins.
        On corrupt input, return what decompressed before the corrupt byte and set `error`.
        """
        if self._rest:
            data, self._rest = self._rest + data, b""
        if not data or self.error is not None:
            return b""
        inflate = self._inflate
        if inflate.eof:
            if self.last_member:
                return b""  # like tarfile, ignore whatever follows the archive
            # Another gzip member follows (concatenated gzip, as `cat a.gz b.gz` makes).
            inflate = self._inflate = zlib.decompressobj(_GZIP_WBITS)
        backup = inflate.copy()  # cheap next to decompressing a chunk; used only on error
        try:
            out = inflate.decompress(data)
        except zlib.error as exc:
            out, used = _salvage(backup, data)
            self.compressed_offset += used
            self.error = FormatError(f"corrupt gzip stream ({exc}) at compressed byte {self.compressed_offset}")
            return out
        if inflate.eof:
            self._rest = inflate.unused_data  # only what followed the member within `data`
        self.compressed_offset += len(data) - len(self._rest)
        return out

    def close(self) -> None:
        """Raise FormatError unless the last gzip member was complete (trailer and CRC seen)."""
        if self.error is not None:
            raise self.error
        if not self._inflate.eof:
            raise FormatError(f"truncated gzip stream (ends after {self.compressed_offset} compressed bytes)")


def _salvage(inflate, data: bytes) -> Tuple[bytes, int]:
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
