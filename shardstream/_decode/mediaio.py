"""PyAV plumbing shared by the video and audio decoders: bytes in, a container out, clear errors.

Media is decoded from the bytes in memory (no temporary files). Every failure becomes a
ValueError that says what was wrong with which extension (the Decoder wraps it in a
DecodingError naming URL, sample key and field): FFmpeg errors, streams that are missing or
empty, and files cut short. FFmpeg cannot always tell a cut file from a short one (a Matroska
or MP4 file ends where the data ends), so the containers' own size fields are checked first:
RIFF (wav, avi), ISO BMFF (mp4, mov, m4a) and EBML (mkv, webm).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any, Callable, Iterable, Iterator, Optional

from .._base.errors import UsageError
from .image import FieldHandler

__all__ = [
    "AUDIO_EXTENSIONS",
    "MediaHandler",
    "VIDEO_EXTENSIONS",
    "first_stream",
    "import_av",
    "media_errors",
    "open_media",
    "truncation",
]

VIDEO_EXTENSIONS = frozenset("mp4 m4v mov mkv webm avi ogv mpg mpeg wmv flv 3gp h264 mjpeg".split())
AUDIO_EXTENSIONS = frozenset("wav flac mp3 ogg oga opus m4a aac wma sox".split())

# Top-level ISO BMFF boxes that may come first in a file; anything else is not checked as BMFF.
_BMFF_FIRST = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"styp"}
_EBML_MAGIC = b"\x1a\x45\xdf\xa3"
_SEGMENT_ID = b"\x18\x53\x80\x67"

_av: Any = None


class MediaHandler(FieldHandler):
    """A `FieldHandler` whose subclass's `decode(data, options, extension)` does the work."""

    name = ""
    decode: Callable[[bytes, Any, str], Any]

    def __init__(self, options: Any, extensions: Iterable[str]) -> None:
        self.options = options
        self.extensions = set(e.lower() for e in extensions)

    def decode_field(self, data: bytes, extension: str) -> Any:
        return type(self).decode(data, self.options, extension)

    def __repr__(self) -> str:
        return f"{self.name}({self.options!r})"


def first_stream(container: Any, kind: str, extension: str) -> Any:
    """The container's first `kind` ("video" or "audio") stream; ValueError when it has none."""
    streams = getattr(container.streams, kind)
    if not streams:
        raise ValueError(f"no {kind} stream in this {extension or 'file'} ({container.format.name})")
    return streams[0]


def import_av(what: str) -> Any:
    """Import PyAV once; UsageError naming `what` needs it when it is not installed."""
    global _av
    if _av is None:
        try:
            import av
        except ImportError as exn:
            raise UsageError(f"{what} needs PyAV: pip install av (or shardstream[video])") from exn
        _av = av
    return _av


def _bmff_truncation(data: bytes) -> Optional[str]:
    position, end = 0, len(data)
    while position + 8 <= end:
        size = int.from_bytes(data[position : position + 4], "big")
        kind = data[position + 4 : position + 8].decode("latin-1")
        if size == 1:
            if position + 16 > end:
                return f"box {kind!r} at byte {position} has its 64-bit size cut off"
            size = int.from_bytes(data[position + 8 : position + 16], "big")
        elif size == 0:
            return None  # the last box runs to the end of the file, whatever that is
        if size < 8:
            return f"box {kind!r} at byte {position} has an impossible size {size}"
        if position + size > end:
            return f"box {kind!r} at byte {position} needs {size} bytes, {end - position} present"
        position += size
    return None if position == end else f"{end - position} stray bytes after the last box"


def _ebml_number(data: bytes, position: int) -> tuple:
    """An EBML variable-size integer at `position`: (value or None when 'unknown', its length)."""
    first = data[position]
    length = 9 - first.bit_length()  # leading zero bits + 1
    if length > 8 or position + length > len(data):
        raise ValueError("bad EBML number")
    value = first & (0xFF >> length)
    for byte in data[position + 1 : position + length]:
        value = (value << 8) | byte
    unknown = value == (1 << (7 * length)) - 1
    return (None if unknown else value), length


def _ebml_truncation(data: bytes) -> Optional[str]:
    try:
        header_size, n = _ebml_number(data, 4)
        if header_size is None:
            return None
        position = 4 + n + header_size
        if data[position : position + 4] != _SEGMENT_ID:
            return None if position < len(data) else "the file ends before its Segment"
        segment_size, n = _ebml_number(data, position + 4)
    except (ValueError, IndexError):
        return "its EBML header is cut off or malformed"
    if segment_size is None:
        return None  # a live stream: its size was never written
    needed = position + 4 + n + segment_size
    if needed > len(data):
        return f"its Segment needs {needed} bytes, {len(data)} present"
    return None


def truncation(data: bytes) -> Optional[str]:
    """Why `data` looks cut short, from its container's own size fields; None if it does not."""
    if data[:4] == b"RIFF" and len(data) >= 12:
        size = int.from_bytes(data[4:8], "little")
        # Streaming writers leave 0 or 0xFFFFFFFF; one pad byte may be missing in the wild.
        if size not in (0, 0xFFFFFFFF) and 8 + size > len(data) + 1:
            return f"its RIFF header declares {8 + size} bytes, {len(data)} present"
        return None
    if data[:4] == _EBML_MAGIC:
        return _ebml_truncation(data)
    if data[4:8] in _BMFF_FIRST:
        return _bmff_truncation(data)
    return None


@contextlib.contextmanager
def media_errors(extension: str, kind: str) -> Iterator[None]:
    """Turn FFmpeg's errors inside the block into a ValueError naming the extension."""
    av = import_av(f"{kind} decoding")
    try:
        yield
    except av.error.FFmpegError as exn:
        # str(exn) ends with the file name, which for bytes in memory is '<none>'
        reason = getattr(exn, "strerror", None) or str(exn)
        raise ValueError(f"cannot decode {extension or 'the'} {kind}: {reason}") from exn


def open_media(data: bytes, extension: str, kind: str) -> Any:
    """Open `data` as a PyAV input container, after the empty and truncation checks.

    Raises:
        ValueError: empty, cut short, or not a container FFmpeg can read.
        UsageError: PyAV is not installed.
    """
    av = import_av(f"{kind} decoding")
    name = extension or "media"
    if not data:
        raise ValueError(f"empty {name} field (0 bytes)")
    cut = truncation(data)
    if cut is not None:
        raise ValueError(f"truncated {name} {kind}: {cut}")
    with media_errors(extension, kind):
        return av.open(io.BytesIO(data), mode="r")
