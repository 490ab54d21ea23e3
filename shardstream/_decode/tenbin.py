"""The tenbin (`.ten`) tensor format: lists of numpy arrays as one buffer (webdataset's `tenbin`).

A buffer is a series of chunks, each `magic (8 bytes) | nbytes (int64) | data padded to 64 bytes`;
each array is a header chunk (`dtype code, info, ndim, dims...` as int64) followed by a data
chunk. Integers use the machine's byte order, as webdataset's `tenbin` does, so buffers are
byte-identical to webdataset's on the same machine. Streams and files: `_decode.tenbin_io`.

Divergences from webdataset 1.0.2 (each only where webdataset fails or contradicts itself):
- uint32 works (webdataset's table misspells it "unit32", so it can neither write nor read it).
- 0-d arrays work (webdataset passes a float count to `np.frombuffer` and raises TypeError).
- `check_infos` with a list compares it with the actual infos (webdataset's raises for any
  non-empty list); `check_acceptable_input_type` refuses 64-bit types unless `allow64`
  (webdataset's refuses every type *but* the 64-bit ones).
- encoders take bytes as well as arrays and memoryviews, and non-contiguous arrays.
"""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = [
    "bytedata",
    "bytelen",
    "check_acceptable_input_type",
    "check_infos",
    "decode_buffer",
    "decode_chunks",
    "decode_header",
    "decode_list",
    "encode_buffer",
    "encode_chunks",
    "encode_header",
    "encode_list",
    "long_to_short",
    "magic",
    "magic_bytes",
    "magic_str",
    "roundup",
    "short_to_long",
    "str64",
    "unstr64",
]

long_to_short = {
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
short_to_long = {short: long for long, short in long_to_short.items()}
_INT64 = struct.Struct("@q")

Buffer = Union[bytes, bytearray, memoryview]


def bytelen(a: Any) -> int:
    """The length of an array or buffer in bytes."""
    if hasattr(a, "nbytes"):
        return a.nbytes
    if isinstance(a, (bytearray, bytes)):
        return len(a)
    raise ValueError(a, "cannot determine nbytes")


def bytedata(a: Any) -> Any:
    """The raw bytes of an array (a memoryview, C order) or the buffer itself."""
    if isinstance(a, (bytearray, bytes, memoryview)):
        return a
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data
    if hasattr(a, "data"):
        return a.data
    raise ValueError(a, "cannot return bytedata")


def str64(s: str) -> int:
    """Pack up to 8 ASCII characters into one int64, NUL-padded."""
    return _INT64.unpack(s.encode("ascii").ljust(8, b"\0"))[0]


def unstr64(i: int) -> str:
    """The characters packed by `str64`."""
    return _INT64.pack(int(i)).decode("ascii").strip("\0")


magic_str = "~TenBin~"
magic = str64(magic_str)
magic_bytes = unstr64(magic).encode("ascii")


def roundup(n: int, k: int = 64) -> int:
    """`n` rounded up to a multiple of `k`."""
    return k * ((n + k - 1) // k)


def check_acceptable_input_type(data: Sequence[np.ndarray], allow64: bool) -> None:
    """Raise ValueError for dtypes tenbin cannot hold, and for 64-bit ones unless `allow64`."""
    for a in data:
        if a.dtype.name not in long_to_short:
            raise ValueError("unsupported dataypte")
        if not allow64 and a.dtype.name in ("float64", "int64", "uint64"):
            raise ValueError("64 bit datatypes not allowed unless explicitly enabled")


def check_infos(data: List[np.ndarray], infos: List[str], required_infos: Any = None) -> Any:
    """`data`, or `(data, infos)` when `required_infos` is True; a list of required infos must
    match the actual ones (ValueError otherwise)."""
    if required_infos is False or required_infos is None:
        return data
    if required_infos is True:
        return data, infos
    if not isinstance(required_infos, (tuple, list)):
        raise ValueError("required_infos must be tuple or list")
    for required, actual in zip(required_infos, infos):
        if required != actual:
            raise ValueError(f"actual info {actual} doesn't match required info {required}")
    return data


def encode_header(a: np.ndarray, info: str = "") -> bytes:
    """The header chunk of an array: dtype code, info, rank and dimensions as int64."""
    if a.ndim >= 10:
        raise ValueError("too many dimensions")
    if a.nbytes != int(np.prod(a.shape)) * a.itemsize:
        raise ValueError("mismatch between size and shape")
    if a.dtype.name not in long_to_short:
        raise ValueError(f"unsupported array type {a.dtype.name}")
    header = [str64(long_to_short[a.dtype.name]), str64(info), a.ndim, *a.shape]
    return np.array(header, dtype="i8").tobytes()


def decode_header(h: Buffer) -> Tuple[tuple, np.dtype, str]:
    """(shape, dtype, info) from a header chunk."""
    fields = np.frombuffer(h, dtype="i8")
    code = unstr64(fields[0])
    if code not in short_to_long:
        raise ValueError("unsupported array type")
    rank = int(fields[2])
    return tuple(int(d) for d in fields[3 : 3 + rank]), np.dtype(short_to_long[code]), unstr64(fields[1])


def encode_list(l: Sequence[np.ndarray], infos: Optional[Sequence[str]] = None) -> List[Buffer]:
    """Header and data chunks, alternating, for the arrays `l` (infos cycle if shorter; the
    parameter names are webdataset's, for keyword calls)."""
    if infos is None:
        infos = [""]
    elif len(l) != len(infos):
        raise ValueError(f"length of list {l} must match length of infos {infos}")
    chunks: List[Buffer] = []
    for i, a in enumerate(l):
        chunks += [encode_header(a, infos[i % len(infos)]), bytedata(a)]
    return chunks


def decode_list(l: Sequence[Buffer], infos: Any = False) -> Any:
    """Arrays (read-only views of the chunks) from `l`, alternating header and data chunks."""
    arrays, names = [], []
    for header, data in zip(l[::2], l[1::2]):
        shape, dtype, info = decode_header(header)
        count = 1
        for dim in shape:
            count *= dim
        arrays.append(np.frombuffer(data, dtype=dtype, count=count).reshape(shape))
        names.append(info)
    return check_infos(arrays, names, infos)


def encode_chunks(l: Sequence[Buffer]) -> bytearray:
    """One buffer of the chunks `l`, each with magic, length and padding to 64 bytes."""
    out = bytearray(sum(16 + roundup(bytelen(c)) for c in l))
    offset = 0
    for chunk in l:
        n = bytelen(chunk)
        out[offset : offset + 8] = magic_bytes
        _INT64.pack_into(out, offset + 8, n)
        out[offset + 16 : offset + 16 + n] = chunk
        offset += 16 + roundup(n)
    return out


def decode_chunks(buf: Buffer) -> List[Buffer]:
    """The chunks of a buffer (slices of it, no copies)."""
    view = memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf
    chunks = []
    offset, total = 0, len(view)
    while offset < total:
        if view[offset : offset + 8] != magic_bytes:
            raise ValueError("magic bytes mismatch")
        (nbytes,) = _INT64.unpack_from(view, offset + 8)
        if nbytes < 0:
            raise ValueError("negative nbytes")
        offset += 16
        chunks.append(view[offset : offset + nbytes])
        offset += roundup(nbytes)
    return chunks


def encode_buffer(l: List[np.ndarray], infos: Optional[Sequence[str]] = None) -> bytearray:
    """Encode a list of arrays into one tenbin buffer.

    Args:
        l: the arrays, in order.
        infos: optional per-array info strings (at most 8 ASCII characters each).

    Raises:
        ValueError: `l` is not a list, or an array has an unsupported dtype or rank.
    """
    if not isinstance(l, list):
        raise ValueError("requires list")
    return encode_chunks(encode_list(l, infos=infos))


def decode_buffer(buf: Buffer, infos: Any = False) -> Any:
    """Decode a tenbin buffer into a list of arrays (read-only views when `buf` is bytes).

    Args:
        buf: the encoded buffer.
        infos: True returns `(arrays, info_strings)`; a list of info strings must match.

    Raises:
        ValueError: the buffer is not valid tenbin data.
    """
    return decode_list(decode_chunks(memoryview(buf).cast("B")), infos=infos)
