"""The two per-shard index files `create` and `index` write, and one scan that finds both.

`<shard>.idx` (ours, read by the loader to seek and count): one line per sample, "OFFSET KEY",
OFFSET being the sample's first header in the uncompressed tar stream (see `_shard.index`).

`<shard>.dali.idx` (NVIDIA DALI's `wds2idx` format, version v1.2, for `fn.readers.webdataset`):
a first line "v1.2 <samples>", then one line per sample holding, for each of its members in tar
order, "<ext> <data offset> <size> <member name>" (space separated, all on one line). The data
offset is where the member's payload starts (a multiple of 512, after its header and any PAX or
GNU long-name headers). Members are grouped as DALI does: consecutive members whose names agree
up to the first dot after the last "/"; the extension is the rest, case kept. DALI reads only
uncompressed tars, and cannot hold names with whitespace: for those shards there is no DALI index.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from .._tar.codecs import MAGIC_BYTES, sniff
from .._base.errors import FormatError
from .._shard.index import ShardSummary, summarize
from .._shard.members import iter_members
from .._tar.reader import TarMember

__all__ = ["DaliMember", "dali_split", "dali_text", "idx_text", "read_dali_index", "scan_indexes"]

DALI_VERSION = "v1.2"
DaliMember = Tuple[str, int, int, str]  # (ext, data offset, size, member name)
_EXTENSION_HEADERS = (b"x", b"g", b"L", b"K", b"X")  # PAX, PAX global, GNU long name / link, Solaris
_KEEP = 8 << 20  # bytes of the stream kept behind the newest member before trimming


def idx_text(samples: Sequence[Tuple[int, str]]) -> Optional[str]:
    """An `.idx` file's text (`OFFSET KEY` lines), or None where a key holds a newline: a line
    cannot hold it (such a shard gets no `.idx`; the loader reads it from its start)."""
    if any("\n" in key for _offset, key in samples):
        return None
    return "".join(f"{offset} {key}\n" for offset, key in samples)


def dali_text(samples: Sequence[Sequence[DaliMember]]) -> str:
    lines = [f"{DALI_VERSION} {len(samples)}\n"]
    for sample in samples:
        lines.append(" ".join(f"{ext} {offset} {size} {name}" for ext, offset, size, name in sample) + "\n")
    return "".join(lines)


def read_dali_index(text: str) -> List[List[DaliMember]]:
    """Parse a DALI v1.1 / v1.2 index (for tests and tools). Raises ValueError."""
    lines = text.splitlines()
    version, count = lines[0].split()
    if version not in ("v1.1", "v1.2"):
        raise ValueError(f"unsupported DALI index version {version}")
    width = 4 if version == "v1.2" else 3
    samples = []
    for line in lines[1 : 1 + int(count)]:
        parts = line.split()
        samples.append([
            (parts[i], int(parts[i + 1]), int(parts[i + 2]), parts[i + 3] if width == 4 else "")
            for i in range(0, len(parts), width)
        ])
    return samples


def dali_split(name: str) -> Tuple[str, str]:
    """DALI's split of a member name: (basename, extension) at the first dot after the last '/'."""
    dot = name.find(".", name.rfind("/") + 1)
    return (name, "") if dot == -1 else (name[:dot], name[dot + 1 :])


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    return int(digits, 8) if digits else 0


class _Window:
    """The byte chunks of a shard, passed through, keeping the recent uncompressed bytes so that
    the headers of members the reader has just reported can be looked at."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks
        self.buf = bytearray()
        self.base = 0
        self.compressed: Optional[bool] = None

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self.chunks:
                if self.compressed is None:
                    self.compressed = sniff(bytes(chunk[:MAGIC_BYTES]))[0] is not None
                if not self.compressed:
                    self.buf += chunk
                yield chunk
        finally:
            close = getattr(self.chunks, "close", None)
            if close is not None:
                close()

    def data_offset(self, offset: int, url: str, name: str) -> Optional[int]:
        """Where the payload of the member whose first header is at `offset` begins; None for a
        GNU sparse member (what it stores is not its data: DALI cannot read it)."""
        pos = offset - self.base
        sparse = False
        while True:
            block = self.buf[pos : pos + 512]
            if len(block) < 512:
                raise FormatError("header out of the scanned window", url=url, member=name, offset=offset)
            kind = bytes(block[156:157])
            size = (_number(bytes(block[124:136])) + 511) // 512 * 512
            if kind not in _EXTENSION_HEADERS:
                return None if sparse or kind == b"S" else self.base + pos + 512
            sparse = sparse or (kind in (b"x", b"X") and b"GNU.sparse." in self.buf[pos + 512 : pos + 512 + size])
            pos += 512 + size

    def release(self, offset: int) -> None:
        if offset - self.base > _KEEP:
            del self.buf[: offset - self.base]
            self.base = offset


def scan_indexes(
    url: str, chunks: Iterable[bytes], dali: bool = True
) -> Tuple[ShardSummary, Optional[List[List[DaliMember]]], str]:
    """Read a whole shard with the loader's tar reader: its summary (samples, offsets, fields)
    and, if asked and possible, its DALI samples; the third item says why there are none."""
    window = _Window(chunks)
    groups: List[List[DaliMember]] = []
    why = "" if dali else "not asked for"
    last = None

    def tap(members: Iterable[TarMember]) -> Iterator[TarMember]:
        nonlocal why, last
        for member in members:
            name, data, offset = member
            if not why:
                basename, ext = dali_split(name)
                if window.compressed:
                    why = "compressed shard (DALI reads plain tars)"
                elif any(c.isspace() for c in name):
                    why = f"member name with whitespace ({name!r})"
                elif basename and not basename.endswith("/"):
                    at = window.data_offset(offset, url, name)
                    if at is None:
                        why = f"GNU sparse member ({name!r}: DALI reads plain files)"
                    elif basename != last:
                        groups.append([(ext, at, len(data), name)])
                        last = basename
                    else:
                        groups[-1].append((ext, at, len(data), name))
            yield member
            window.release(offset)

    summary = summarize(url, tap(iter_members(window, url)))
    if not why and not groups:
        why = "no samples"
    return summary, (None if why else groups), why
