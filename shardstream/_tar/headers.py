"""Tar header fields as tarfile reads them: NUL-terminated text, octal and GNU base-256 numbers,
the header checksum (unsigned or signed bytes), PAX records. Pure functions, no I/O."""

from __future__ import annotations

import struct
import zlib

__all__ = ["changes_member", "header_checksum_ok", "number_field", "pax_records", "text_field"]


def changes_member(pax_key: str) -> bool:
    return pax_key in ("path", "size") or pax_key.startswith("GNU.sparse.")


def text_field(field: bytes) -> str:
    """A NUL-terminated string field, decoded like tarfile does on Linux."""
    return field.partition(b"\0")[0].decode("utf-8", "surrogateescape")


def number_field(field: bytes) -> int:
    """A numeric field, exactly as tarfile.nti reads it; ValueError if it is not a number."""
    if field[0] in (0o200, 0o377):  # GNU base-256 for values that do not fit in octal
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0o377 else n
    return int(field.partition(b"\0")[0].decode("ascii").strip() or "0", 8)


def header_checksum_ok(hdr: bytes) -> bool:
    """Exact header checksum check, unsigned or signed bytes (old tars used signed char)."""
    field = hdr[148:156]
    try:
        stored = number_field(field)
    except ValueError:
        return False
    # adler32's low 16 bits are (1 + byte sum) mod 65521: exact for up to 65520 // 255 bytes of
    # any value, so sum each 256-byte half separately.
    total = (zlib.adler32(hdr[:256]) & 0xFFFF) + (zlib.adler32(hdr[256:]) & 0xFFFF) - 2
    if stored == total - sum(field) + 256:
        return True
    return stored == 256 + sum(struct.unpack_from("148b8x356b", hdr))


def pax_records(payload: bytes) -> dict:
    """Parse "%d %s=%s\\n" PAX records the way tarfile does (stop at the first malformed one)."""
    records = {}
    pos = 0
    while True:
        space = payload.find(b" ", pos)
        if space <= pos or not payload[pos:space].isdigit():
            break
        equals = payload.find(b"=", space + 1)
        if equals <= space + 1:
            break
        length = int(payload[pos:space])
        if length == 0:
            raise ValueError("zero-length PAX record")
        keyword = payload[space + 1 : equals].decode("utf-8", "surrogateescape")
        records[keyword] = payload[equals + 1 : pos + length - 1].decode("utf-8", "surrogateescape")
        pos += length
    return records
