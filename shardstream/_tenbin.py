"""The tenbin (`.ten`) tensor format: read and write lists of numpy arrays.

A buffer is a series of chunks, each `magic (8 bytes) | nbytes (int64) | data padded to 64 bytes`;
each array is a header chunk (`dtype code, info, ndim, dims...` as int64) followed by a data
chunk. Integers use the machine's byte order, as webdataset's `tenbin` does, so buffers are
byte-identical to webdataset's on the same machine.

Divergences from webdataset 1.0.2 (both only where webdataset fails):
- uint32 works (webdataset's table misspells it "unit32", so it can neither write nor read it).
- 0-d arrays work (webdataset passes a float count to `np.frombuffer` and raises TypeError).
"""

from __future__ import annotations

import struct
from typing import List, Sequence, Union

import numpy as np

__all__ = ["decode_buffer", "encode_buffer"]

_LONG_TO_SHORT = {
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
}
_SHORT_TO_LONG = {short: long for long, short in _LONG_TO_SHORT.items()}
_MAGIC = b"~TenBin~"
_INT64 = struct.Struct("@q")

Buffer = Union[bytes, bytearray, memoryview]


def _str64(text: str) -> int:
    """Pack up to 8 ASCII characters into one int64, NUL-padded (webdataset's `str64`)."""
    return _INT64.unpack(text.encode("ascii").ljust(8, b"\0"))[0]


def _unstr64(value: int) -> str:
    return _INT64.pack(int(value)).decode("ascii").strip("\0")


def _roundup(n: int, k: int = 64) -> int:
    return k * ((n + k - 1) // k)


def _encode_header(array: np.ndarray, info: str = "") -> bytes:
    if array.ndim >= 10:
        raise ValueError("too many dimensions")
    if array.dtype.name not in _LONG_TO_SHORT:
        raise ValueError(f"unsupported array type {array.dtype.name}")
    header = [_str64(_LONG_TO_SHORT[array.dtype.name]), _str64(info), array.ndim, *array.shape]
    return np.array(header, dtype="i8").tobytes()


def encode_buffer(arrays: Sequence[np.ndarray], infos: Sequence[str] = None) -> bytearray:
    """Encode a list of arrays into one tenbin buffer.

    Args:
        arrays: the arrays, in order.
        infos: optional per-array info strings (at most 8 ASCII characters each).

    Raises:
        ValueError: `arrays` is not a list, or an array has an unsupported dtype or rank.
    """
    if not isinstance(arrays, list):
        raise ValueError("requires list")
    if infos is None:
        infos = [""]
    elif len(arrays) != len(infos):
        raise ValueError(f"length of list {arrays} must match length of infos {infos}")
    chunks: List[bytes] = []
    for i, array in enumerate(arrays):
        chunks.append(_encode_header(array, infos[i % len(infos)]))
        # Non-contiguous arrays are written in C order, as their shape says.
        chunks.append(np.ascontiguousarray(array).tobytes())
    out = bytearray(sum(16 + _roundup(len(c)) for c in chunks))
    offset = 0
    for chunk in chunks:
        out[offset : offset + 8] = _MAGIC
        _INT64.pack_into(out, offset + 8, len(chunk))
        out[offset + 16 : offset + 16 + len(chunk)] = chunk
        offset += 16 + _roundup(len(chunk))
    return out


def _decode_chunks(buf: memoryview) -> List[memoryview]:
    chunks = []
    offset, total = 0, len(buf)
    while offset < total:
        if buf[offset : offset + 8] != _MAGIC:
            raise ValueError("magic bytes mismatch")
        (nbytes,) = _INT64.unpack_from(buf, offset + 8)
        if nbytes < 0:
            raise ValueError("negative nbytes")
        offset += 16
        chunks.append(buf[offset : offset + nbytes])
        offset += _roundup(nbytes)
    return chunks


def decode_buffer(buf: Buffer, infos: bool = False):
    """Decode a tenbin buffer into a list of arrays (read-only views when `buf` is bytes).

    Args:
        buf: the encoded buffer.
        infos: when True, return `(arrays, info_strings)` instead of just the arrays.

    Raises:
        ValueError: the buffer is not valid tenbin data.
    """
    chunks = _decode_chunks(memoryview(buf).cast("B"))
    arrays, names = [], []
    for header, data in zip(chunks[::2], chunks[1::2]):
        fields = np.frombuffer(header, dtype="i8")
        code = _unstr64(fields[0])
        if code not in _SHORT_TO_LONG:
            raise ValueError("unsupported array type")
        rank = int(fields[2])
        shape = tuple(int(d) for d in fields[3 : 3 + rank])
        count = 1
        for dim in shape:
            count *= dim
        arrays.append(np.frombuffer(data, dtype=_SHORT_TO_LONG[code], count=count).reshape(shape))
        names.append(_unstr64(fields[1]))
    return (arrays, names) if infos is True else arrays
