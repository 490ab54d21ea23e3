"""Shard sets for differential tests, written with stdlib tarfile so that neither library under
test made them. Covers USTAR, GNU long names, PAX with non-ASCII names, .tar.gz, uneven shard
sizes, multi-dot names, upper-case extensions, directories, symlinks, empty members, meta files
and samples with missing components.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import tarfile
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image

Member = Tuple[str, bytes]


def _image(seed: int, fmt: str, mode: str = "RGB", size=(24, 16)) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 255, size=(size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(arr.squeeze(-1) if channels == 1 else arr, mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _npy(seed: int) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.float32).reshape(2, 3) + seed)
    return buf.getvalue()


def sample_members(index: int, *, prefix: str = "", exts=("jpg", "cls", "json", "txt")) -> List[Member]:
    """The members of one sample: key = prefix + sNNNN."""
    key = f"{prefix}s{index:04d}"
    payload = {
        "jpg": lambda: _image(index, "JPEG"),
        "png": lambda: _image(index, "PNG", "RGBA"),
        "gray.png": lambda: _image(index, "PNG", "L"),
        "seg.png": lambda: _image(index + 1, "PNG", "RGB"),
        "cls": lambda: str(index % 10).encode(),
        "json": lambda: json.dumps({"index": index, "caption": f"sample {index}"}).encode(),
        "txt": lambda: f"a caption for sample {index}".encode(),
        "npy": lambda: _npy(index),
        "txt.gz": lambda: gzip.compress(f"zipped {index}".encode(), mtime=0),
    }
    members = []
    for ext in exts:
        data = payload[ext.lower()]() if ext.lower() in payload else f"{ext}:{index}".encode()
        members.append((f"{key}.{ext}", data))
    return members


def tar_bytes(members: List[Member], *, fmt=tarfile.USTAR_FORMAT, extra=None) -> bytes:
    """Members (and `extra(tar)` for special entries) as a tar archive, written by stdlib tarfile."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1700000000
            info.mode = 0o444
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            extra(tar)
    return buf.getvalue()


def zero_members(count: int, size: int = 1 << 20) -> List[Member]:
    """`count` members `k000.npy`, ... of `size` zero bytes each: a shard that compresses to almost nothing."""
    return [(f"k{i:03d}.npy", bytes(size)) for i in range(count)]


def write_tar(path: str, members: List[Member], *, fmt=tarfile.USTAR_FORMAT, extra=None, gz: bool = False) -> str:
    """Write members (and `extra(tar)` for special entries) to a tar file with stdlib tarfile."""
    raw = tar_bytes(members, fmt=fmt, extra=extra)
    with open(path, "wb") as f:
        f.write(gzip.compress(raw, mtime=0) if gz else raw)
    return path


def corrupt_header(src: str, dst: str, member: int) -> int:
    """Copy the tar at src to dst with the header checksum of its member-th member broken; return
    that header's byte offset (where the reader must say the shard went wrong)."""
    with open(src, "rb") as f:
        raw = f.read()
    offset = [m.offset for m in tarfile.open(fileobj=io.BytesIO(raw))][member]
    data = bytearray(raw)
    data[offset + 10] ^= 0x5A  # a byte of the name field: the stored checksum no longer matches
    with open(dst, "wb") as f:
        f.write(bytes(data))
    return offset


def _dir_and_links(tar: tarfile.TarFile) -> None:
    d = tarfile.TarInfo("zz_dir")
    d.type = tarfile.DIRTYPE
    tar.addfile(d)
    s = tarfile.TarInfo("zz_link.txt")
    s.type = tarfile.SYMTYPE
    s.linkname = "s0000.txt"
    tar.addfile(s)


def make_shardset(root: str) -> List[str]:
    """Write the differential shard set under `root`; return the shard paths in order."""
    os.makedirs(root, exist_ok=True)
    shards: List[str] = []

    # 0: USTAR, 7 plain samples, a directory entry first, meta files, an empty member.
    members: List[Member] = [("__index__", b"meta"), ("__meta__/info.json", b"{}")]
    for i in range(7):
        members += sample_members(i)
    members.append(("s0007.txt", b""))
    shards.append(write_tar(os.path.join(root, "shard-000.tar"), members, extra=_dir_and_links))

    # 1: GNU format, long names (> 100 bytes), multi-dot and upper-case extensions.
    longdir = "very/" + "long-directory-name/" * 6
    members = []
    for i in range(10, 23):
        members += sample_members(i, prefix=longdir, exts=("JPG", "Cls", "gray.png", "seg.PNG"))
    shards.append(write_tar(os.path.join(root, "shard-001.tar"), members, fmt=tarfile.GNU_FORMAT))

    # 2: PAX, non-ASCII names; missing components in some samples.
    members = []
    for i in range(30, 41):
        exts = ("png", "cls", "json") if i % 3 else ("png", "json")
        members += sample_members(i, prefix="données/ünïcode-名前-", exts=exts)
    shards.append(write_tar(os.path.join(root, "shard-002.tar"), members, fmt=tarfile.PAX_FORMAT))

    # 3: gzip-compressed, a single sample (uneven sizes).
    shards.append(write_tar(os.path.join(root, "shard-003.tar.gz"), sample_members(50, exts=("npy", "txt.gz", "cls")), gz=True))

    # 4: 37 samples, arrays and gzipped text.
    members = []
    for i in range(60, 97):
        members += sample_members(i, exts=("npy", "cls", "txt"))
    shards.append(write_tar(os.path.join(root, "shard-004.tar"), members))

    # 5: same keys as shard 4's last sample at its start (samples must not span shards).
    members = sample_members(96, exts=("json",)) + sample_members(97, exts=("cls", "json"))
    shards.append(write_tar(os.path.join(root, "shard-005.tar"), members))
    return shards


def random_payload_shard(seed: int, samples: int, payload: int) -> bytes:
    """A USTAR shard of `samples` samples: a random `payload`-byte .bin and a .txt naming it."""
    rng = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for ext, data in (("bin", rng.randbytes(payload)), ("txt", f"sample {seed}/{i}".encode())):
                info = tarfile.TarInfo(f"s{seed}{i:03d}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_served(root: str, names: List[str], samples: int, payload: int) -> Dict[str, bytes]:
    """Write random_payload_shard(n) as root/names[n]; returns {name: bytes}."""
    contents = {name: random_payload_shard(n, samples, payload) for n, name in enumerate(names)}
    for name, data in contents.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    return contents


def payload_digests(samples) -> list:
    """(key, sha256 of .bin, .txt) of each sample of random_payload_shard shards."""
    return [(s["__key__"], hashlib.sha256(s["bin"]).hexdigest(), s["txt"].decode()) for s in samples]


HUGE_CLAIM = (8 << 30) - 1  # ~8 GiB: the most an octal USTAR size field holds


def liar_shard(follow_mib: int) -> bytes:
    """A tar whose one member header ("s0.bin") claims HUGE_CLAIM bytes, followed by only
    `follow_mib` MiB of random bytes."""
    header = tarfile.TarInfo("s0.bin")
    header.size = HUGE_CLAIM
    return header.tobuf(tarfile.USTAR_FORMAT) + os.urandom(1 << 20) * follow_mib


def fails_at_header(read, match: str = "needs 8589935104 bytes from its header"):
    """Run `read()`, which must raise the FormatError matching `match`; return that error and the
    peak of Python's traced allocations meanwhile (the shard must not be buffered)."""
    import tracemalloc

    import pytest

    import shardstream as wds

    tracemalloc.start()
    try:
        with pytest.raises(wds.FormatError, match=match) as caught:
            read()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return caught.value, peak
