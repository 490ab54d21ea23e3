"""Tar test vectors, built in memory with stdlib `tarfile` (a few headers patched by hand).

`VECTORS` maps a name to the bytes of one archive (gzip-compressed ones end in ".gz"); it is built
on first use, so importing this module is cheap. `reference_members` is the oracle: what stdlib
`tarfile` (the reader webdataset uses) lists as regular files, with names, payloads and offsets.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random
import tarfile
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

__all__ = ["NAMES", "SMALL", "VECTORS", "patch_header", "reference_members"]

Member = Tuple[str, bytes, int]  # (name, data, offset), like shardstream._tar.reader.TarMember


def reference_members(archive: bytes) -> List[Member]:
    """The regular members of `archive` as stdlib tarfile reads them (mode "r|*")."""
    if archive[:2] == b"\x1f\x8b":
        archive = gzip.decompress(archive)  # handles concatenated members; tarfile's r|gz does not
    elif archive[:3] == b"BZh":
        archive = bz2.decompress(archive)  # likewise for concatenated streams
    elif archive[:6] == b"\xfd7zXZ\x00":
        archive = lzma.decompress(archive)
    members = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|*") as tf:
        for info in tf:
            if info.isreg():
                members.append((info.name, tf.extractfile(info).read(), info.offset))
    return members


def patch_header(archive: bytes, offset: int, start: int, value: bytes, *, signed: bool = False) -> bytes:
    """Overwrite bytes `start:start+len(value)` of the header at `offset` and fix its checksum."""
    header = bytearray(archive[offset : offset + 512])
    header[start : start + len(value)] = value
    header[148:156] = b" " * 8
    total = sum((b - 256 if signed and b >= 128 else b) for b in header)
    header[148:156] = b"%06o\0 " % total
    return archive[:offset] + bytes(header) + archive[offset + 512 :]


def _rand(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _info(name: str, size: int = 0, type: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = size, type, linkname
    info.mtime, info.mode, info.uname, info.gname = 1700000000, 0o644, "user", "group"
    return info


def _tar(entries, format=tarfile.GNU_FORMAT, pax_headers: Optional[dict] = None) -> bytes:
    """entries: (name, data) for files, or (TarInfo, data-or-None) for anything else."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=format, pax_headers=pax_headers or {}) as tf:
        for what, data in entries:
            info = what if isinstance(what, tarfile.TarInfo) else _info(what, len(data))
            tf.addfile(info, None if data is None else io.BytesIO(data))
    return out.getvalue()


def _samples(n: int, seed: int) -> list:
    """n webdataset samples of 3-4 small fields (100 B .. 2 KB)."""
    rng = random.Random(seed)
    entries = []
    for i in range(n):
        for ext in ("jpg", "cls", "json", "txt")[: rng.randint(3, 4)]:
            entries.append((f"{i:06d}.{ext}", rng.randbytes(rng.randint(100, 2048))))
    return entries


def _ustar_small() -> bytes:
    return _tar(_samples(12, 1), format=tarfile.USTAR_FORMAT)


def _ustar_prefix() -> bytes:
    # Names over 100 bytes that split at a "/" are stored in the USTAR prefix field.
    long_dir = "p" * 70 + "/" + "q" * 60
    return _tar(
        [(f"{long_dir}/000001.jpg", b"a" * 10), (f"{long_dir}/000001.cls", b"7"), ("short.txt", b"s")],
        format=tarfile.USTAR_FORMAT,
    )


def _gnu_longnames() -> bytes:
    return _tar(
        [
            ("n" * 100, b"exactly 100 bytes of name, no NUL"),
            ("L" * 150 + ".jpg", _rand(2, 700)),
            ("dir-" + "d" * 120 + "/sample.a.b.txt", b"deep"),
            (_info("s" * 130, type=tarfile.SYMTYPE, linkname="t" * 200), None),
            (_info("h" * 20, type=tarfile.LNKTYPE, linkname="n" * 100), None),
            (_info("longdir-" + "x" * 110, type=tarfile.DIRTYPE), None),
            ("after-" + "z" * 200, b"last"),
        ],
        format=tarfile.GNU_FORMAT,
    )


def _pax_unicode() -> bytes:
    return _tar(
        [
            ("données/ünïcode-名前.txt", "héllo".encode()),
            ("plain.txt", b"ascii only"),
            ("数据/" + "長い名前" * 30 + ".jpg", _rand(3, 1500)),
            (_info("lien-ü", type=tarfile.SYMTYPE, linkname="données/ünïcode-名前.txt"), None),
            ("émoji-🎉.json", b"{}"),
        ],
        format=tarfile.PAX_FORMAT,
        pax_headers={"comment": "a PAX global header", "mtime": "1700000000.5"},
    )


def _large_member() -> bytes:
    return _tar([("000000.txt", b"before"), ("000000.bin", _rand(4, 3 * 1024 * 1024 + 17)), ("000001.txt", b"after")])


def _empty_members() -> bytes:
    return _tar([("e1", b""), ("e2.txt", b""), ("e3.bin", b""), ("full.txt", b"x" * 10), ("e4", b"")])


def _special_members() -> bytes:
    return _tar(
        [
            (_info("dir", type=tarfile.DIRTYPE), None),
            ("dir/file.txt", b"in dir"),
            (_info("dir/link", type=tarfile.SYMTYPE, linkname="file.txt"), None),
            (_info("dir/hard", type=tarfile.LNKTYPE, linkname="dir/file.txt"), None),
            (_info("fifo", type=tarfile.FIFOTYPE), None),
            (_info("chr", type=tarfile.CHRTYPE), None),
            (_info("blk", type=tarfile.BLKTYPE), None),
            (_info("olddir/", type=tarfile.AREGTYPE), None),  # V7 directory: AREGTYPE + trailing slash
            (_info("contiguous.bin", 300, type=tarfile.CONTTYPE), _rand(5, 300)),
            (_info("oldfile.txt", 5, type=tarfile.AREGTYPE), b"v7reg"),
            ("end.txt", b"end"),
        ]
    )


def _link_with_size() -> bytes:
    # tarfile ignores the size field of links/dirs (no data follows); so must we.
    return _tar(
        [
            ("a.txt", b"a"),
            (_info("a.lnk", 700, type=tarfile.LNKTYPE, linkname="a.txt"), None),
            (_info("a.sym", 1300, type=tarfile.SYMTYPE, linkname="a.txt"), None),
            (_info("d", 9000, type=tarfile.DIRTYPE), None),
            ("b.txt", b"b" * 600),
        ]
    )


def _unknown_type() -> bytes:
    # Unknown types are not regular files, but their data is skipped (tarfile does the same).
    return _tar(
        [
            ("a.txt", b"a"),
            (_info("volume", 1000, type=b"V"), _rand(6, 1000)),
            (_info("zed", 513, type=b"Z"), _rand(7, 513)),
            ("b.txt", b"b"),
        ]
    )


def _multidot() -> bytes:
    return _tar(
        [
            ("a.b.c.jpg", b"abc"),
            ("dir.x/y.z.png", b"yz"),
            ("dir.x/.hidden", b"h"),
            ("noext", b"n"),
            ("trailing.", b"t"),
            ("./dot/slash.txt", b"ds"),
        ]
    )


def _block_sizes() -> bytes:
    return _tar([(f"f{n}.bin", _rand(n, n)) for n in (1, 511, 512, 513, 1023, 1024, 1025, 512)])


def _no_eof() -> bytes:
    """An archive that stops right after its last member (no end-of-archive blocks)."""
    archive = _tar(_samples(3, 8))
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tf:
        last = list(tf)[-1]
    return archive[: last.offset_data + (last.size + 511) // 512 * 512]


def _base256_size() -> bytes:
    # GNU writes sizes >= 8 GiB in base-256 (high bit set); re-encode a small size that way.
    archive = _tar([("a.txt", b"a"), ("b.bin", _rand(9, 1234)), ("c.txt", b"c")])
    return patch_header(archive, 1024, 124, b"\x80" + (1234).to_bytes(11, "big"))


def _signed_checksum() -> bytes:
    # Some old tars summed the header as signed chars; that only differs for bytes >= 0x80.
    archive = _tar([("caf\udce9.txt", b"latin-1 name"), ("b.txt", b"b")], format=tarfile.GNU_FORMAT)
    return patch_header(archive, 0, 0, b"caf\xe9.txt", signed=True)


def _pax_size_override() -> bytes:
    # A PAX 'size' record wins over the header's size field; zero the header's field to prove it.
    data = _rand(10, 777)
    info = _info("overridden.bin", len(data))
    info.pax_headers = {"size": str(len(data)), "comment": "x"}
    archive = _tar([("a.txt", b"a"), (info, data), ("b.txt", b"b")], format=tarfile.PAX_FORMAT)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tf:
        offset_data = [m for m in tf if m.name == "overridden.bin"][0].offset_data
    return patch_header(archive, offset_data - 512, 124, b"00000000000\0")


def _extension_order() -> bytes:
    """Several extension headers before one member: tarfile lets the first one that sets a field win."""
    enc, err = "utf-8", "surrogateescape"

    def member(name: str, data: bytes) -> bytes:
        info = _info(name, len(data))
        return info.tobuf(tarfile.USTAR_FORMAT, enc, err) + data + bytes(-len(data) % 512)

    def longname(name: str) -> bytes:
        return tarfile.TarInfo._create_gnu_long_header(name, tarfile.GNUTYPE_LONGNAME, enc, err)

    def pax(records: dict, type: bytes = tarfile.XHDTYPE) -> bytes:
        return tarfile.TarInfo._create_pax_generic_header(records, type, enc)

    return b"".join(
        [
            longname("from-longname-1") + pax({"path": "from-pax-1"}) + member("header-1", b"1"),
            pax({"path": "from-pax-2"}) + longname("from-longname-2") + member("header-2", b"22"),
            pax({"comment": "no path"}) + longname("from-longname-3") + member("header-3", b"333"),
            pax({"path": "solaris-X"}, b"X") + member("header-4", b"4444"),
            pax({"path": "dir/trailing-slash/"}) + member("header-5", b"5"),
            member("header-6", b"6"),
            tarfile.TarInfo.create_pax_global_header({"path": "global-name"}),
            member("header-7", b"7"),
            pax({"path": "local-beats-global"}) + member("header-8", b"8"),
            bytes(1024),
        ]
    )


def _trailing_garbage() -> bytes:
    return _tar([("a.txt", b"a"), ("b.txt", b"b")]) + b"garbage after the end-of-archive blocks" * 10


def _empty_archive() -> bytes:
    return _tar([])


def _concatenated_gzip(archive: bytes) -> bytes:
    # Split at points that are not block-aligned: the tar stream continues across gzip members.
    cuts = [0, 700, len(archive) // 2 + 3, len(archive)]
    return b"".join(gzip.compress(archive[a:b], mtime=0) for a, b in zip(cuts, cuts[1:]))


_BUILDERS = {
    "ustar_small": _ustar_small,
    "ustar_prefix": _ustar_prefix,
    "gnu_longnames": _gnu_longnames,
    "pax_unicode": _pax_unicode,
    "large_member": _large_member,
    "empty_members": _empty_members,
    "special_members": _special_members,
    "link_with_size": _link_with_size,
    "unknown_type": _unknown_type,
    "multidot": _multidot,
    "block_sizes": _block_sizes,
    "no_eof": _no_eof,
    "base256_size": _base256_size,
    "signed_checksum": _signed_checksum,
    "pax_size_override": _pax_size_override,
    "extension_order": _extension_order,
    "trailing_garbage": _trailing_garbage,
    "empty_archive": _empty_archive,
}
_GZIPPED = ("ustar_small", "gnu_longnames", "pax_unicode", "large_member", "no_eof", "special_members")
_OTHER_CODECS = ("ustar_small", "pax_unicode", "large_member", "no_eof")
_CODECS = {".bz2": bz2.compress, ".xz": lzma.compress}


def _build() -> Dict[str, bytes]:
    vectors = {name: build() for name, build in _BUILDERS.items()}
    for name in _GZIPPED:
        vectors[name + ".gz"] = gzip.compress(vectors[name], mtime=0)
    vectors["concatenated.gz"] = _concatenated_gzip(vectors["ustar_small"])
    for suffix, compress in _CODECS.items():
        for name in _OTHER_CODECS:
            vectors[name + suffix] = compress(vectors[name])
        archive = vectors["ustar_small"]  # concatenated streams, cut off block boundaries
        vectors["concatenated" + suffix] = compress(archive[:700]) + compress(archive[700:])
    return vectors


class _LazyVectors(Mapping):
    """A read-only dict that builds every vector on first access."""

    _built: Optional[Dict[str, bytes]] = None

    def _all(self) -> Dict[str, bytes]:
        if self._built is None:
            type(self)._built = _build()
        return self._built  # type: ignore[return-value]

    def __getitem__(self, name: str) -> bytes:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


VECTORS: Mapping[str, bytes] = _LazyVectors()

# Every vector name, known without building them (for pytest parametrization).
NAMES = (
    tuple(_BUILDERS) + tuple(n + ".gz" for n in _GZIPPED) + ("concatenated.gz",)
    + tuple(n + suffix for suffix in _CODECS for n in (*_OTHER_CODECS, "concatenated"))
)
# Vectors small enough to feed one byte at a time.
SMALL = tuple(name for name in NAMES if "large" not in name)
