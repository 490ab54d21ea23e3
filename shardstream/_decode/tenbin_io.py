"""tenbin over streams and `.ten` files (webdataset's `tenbin.write` / `read` / `save` / `load`).

The chunk layout is `_decode.tenbin`'s: magic, int64 length, data padded to 64 bytes. A chunk cut short
raises ValueError (webdataset's `read_chunk` returns the short data).
"""

from __future__ import annotations

import struct
import sys
from typing import IO, Any, Optional, Sequence

import numpy as np

from .tenbin import bytedata, bytelen, decode_list, encode_list, magic_bytes, roundup

__all__ = ["load", "read", "read_chunk", "save", "write", "write_chunk"]

_INT64 = struct.Struct("@q")


def write_chunk(stream: IO[bytes], buf: Any) -> None:
    """Write one chunk: magic, length, data, padding."""
    nbytes = bytelen(buf)
    stream.write(magic_bytes)
    stream.write(_INT64.pack(nbytes))
    stream.write(bytedata(buf))
    padding = roundup(nbytes) - nbytes
    if padding > 0:
        stream.write(b"\0" * padding)


def _read_exactly(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ValueError("premature EOF")
    return data


def read_chunk(stream: IO[bytes]) -> Optional[bytes]:
    """Read one chunk; None at the end of the stream.

    Raises:
        ValueError: a bad magic number, a negative length or a truncated chunk.
    """
    head = stream.read(8)
    if head == b"":
        return None
    if head != magic_bytes:
        raise ValueError("magic number does not match")
    (nbytes,) = _INT64.unpack(_read_exactly(stream, 8))
    if nbytes < 0:
        raise ValueError("negative nbytes")
    data = _read_exactly(stream, nbytes)
    padding = roundup(nbytes) - nbytes
    if padding > 0:
        _read_exactly(stream, padding)
    return data


def write(stream: IO[bytes], l: Sequence[np.ndarray], infos: Optional[Sequence[str]] = None) -> None:
    """Write the arrays `l` as chunks."""
    for chunk in encode_list(l, infos=infos):
        write_chunk(stream, chunk)


def read(stream: IO[bytes], n: int = sys.maxsize, infos: Any = False) -> Any:
    """Read up to `n` arrays (all, by default) from a stream of chunks."""
    chunks = []
    for _ in range(n):
        header = read_chunk(stream)
        if header is None:
            break
        data = read_chunk(stream)
        if data is None:
            raise ValueError("premature EOF")
        chunks += [header, data]
    return decode_list(chunks, infos=infos)


def _check_name(fname: str, nocheck: bool) -> None:
    if not nocheck and not fname.endswith(".ten"):
        raise ValueError("file name should end in .ten")


def save(fname: str, *arrays: np.ndarray, infos: Optional[Sequence[str]] = None, nocheck: bool = False) -> None:
    """Write arrays to a `.ten` file."""
    _check_name(fname, nocheck)
    with open(fname, "wb") as stream:
        write(stream, arrays, infos=infos)


def load(fname: str, infos: Any = False, nocheck: bool = False) -> Any:
    """Read every array of a `.ten` file."""
    _check_name(fname, nocheck)
    with open(fname, "rb") as stream:
        return read(stream, infos=infos)
