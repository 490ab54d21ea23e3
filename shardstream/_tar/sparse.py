"""GNU sparse members (`tar -S`), as tarfile reads them: the old GNU `S` header, whose map of
data regions sits in the header and in extension blocks after it, and the PAX formats 0.0 (a
record pair per region), 0.1 (`GNU.sparse.map`) and 1.0 (the map as text at the start of the
data). A member stores only its regions; read, it is its real size with zeros in the holes.
Pure functions, no I/O: `_tar.reader.TarReader` finds the bytes and adds the location.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from .headers import number_field

__all__ = ["Regions", "expand", "map_1_0", "old_gnu_extension", "old_gnu_header", "pax_regions"]

Regions = List[Tuple[int, int]]  # (offset in the real file, bytes stored for it), in stored order

_PAX_00_OFFSET = re.compile(rb"\d+ GNU\.sparse\.offset=(\d+)\n")
_PAX_00_BYTES = re.compile(rb"\d+ GNU\.sparse\.numbytes=(\d+)\n")


def _entries(block: bytes, start: int, count: int, keep_zero: bool) -> Regions:
    regions = []
    for at in range(start, start + 24 * count, 24):
        try:
            offset, numbytes = number_field(block[at : at + 12]), number_field(block[at + 12 : at + 24])
        except ValueError:
            break
        if keep_zero or (offset and numbytes):  # (tarfile's rule, header and extension blocks alike)
            regions.append((offset, numbytes))
    return regions


def old_gnu_header(hdr: bytes) -> Tuple[Regions, bool, int]:
    """An `S` header's first regions, whether extension blocks follow, and the real size."""
    try:
        real_size = number_field(hdr[483:495])
    except ValueError:
        raise ValueError("invalid real size in a GNU sparse header") from None
    return _entries(hdr, 386, 4, True), bool(hdr[482]), real_size


def old_gnu_extension(block: bytes) -> Tuple[Regions, bool]:
    """An extension block's regions, and whether another block follows."""
    return _entries(block, 0, 21, False), bool(block[504])


def pax_regions(records: Dict[str, str], payloads: List[bytes]) -> Optional[Tuple[Optional[Regions], int]]:
    """The regions and real size that PAX records give (`payloads`: the raw PAX headers, for 0.0's
    repeated keys), with None for regions where format 1.0 keeps them in the data (`map_1_0`);
    None where the records describe no sparse member. ValueError on malformed records."""
    if "GNU.sparse.map" in records:  # 0.1
        numbers = [int(x) for x in records["GNU.sparse.map"].split(",") if x.strip()]
        if len(numbers) % 2:
            raise ValueError("odd GNU.sparse.map")
        return list(zip(numbers[::2], numbers[1::2])), int(records["GNU.sparse.size"])
    if "GNU.sparse.size" in records:  # 0.0
        offsets = [int(m) for p in payloads for m in _PAX_00_OFFSET.findall(p)]
        sizes = [int(m) for p in payloads for m in _PAX_00_BYTES.findall(p)]
        return list(zip(offsets, sizes)), int(records["GNU.sparse.size"])
    if records.get("GNU.sparse.major") == "1" and records.get("GNU.sparse.minor") == "0":
        return None, int(records["GNU.sparse.realsize"])
    return None


def map_1_0(data: bytes) -> Tuple[Regions, int]:
    """Format 1.0's map at the start of a member's data: the regions, and where the stored
    regions begin (the map is padded to whole blocks)."""
    lines = data.split(b"\n", 1)
    count, rest, used = int(lines[0]), lines[1] if len(lines) > 1 else b"", len(lines[0]) + 1
    numbers = []
    for _ in range(2 * count):
        number, newline, rest = rest.partition(b"\n")
        if not newline:
            raise ValueError("GNU sparse map cut short")
        numbers.append(int(number))
        used += len(number) + 1
    return list(zip(numbers[::2], numbers[1::2])), (used + 511) & -512


def expand(stored: bytes, regions: Regions, real_size: int) -> bytes:
    """The member's real bytes: each region's stored bytes at its offset, zeros elsewhere (one
    join: the member once, not a bytearray and its copy)."""
    pieces: List[bytes] = []
    at = end = 0
    for offset, numbytes in regions:  # (in the order their bytes are stored: rising, as GNU tar writes them)
        if numbytes == 0 and offset >= 0:
            continue  # (an unused entry of the old header's four)
        if offset < end or numbytes < 0 or offset + numbytes > real_size or at + numbytes > len(stored):
            raise ValueError(f"GNU sparse region ({offset}, {numbytes}) past the member's {real_size} bytes, "
                             f"its {len(stored)} stored ones, or over the region before it")
        pieces += [bytes(offset - end), stored[at : at + numbytes]]
        at, end = at + numbytes, offset + numbytes
    pieces.append(bytes(real_size - end))
    return b"".join(pieces)
