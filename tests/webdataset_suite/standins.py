"""Stand-ins for the data webdataset's tests read: its `testdata/` folder (not in the sdist) and
the shards it fetches from storage.googleapis.com, written here with the layout the tests
expect, and served from 127.0.0.1.

- testdata/imagenet-000000.tgz: 47 samples with cls, png, wnid and xml members; the first png is
  600x793 RGB (the tests check that shape), the others are small noisy images, so the file is
  larger than the 10 KiB that the truncation tests cut it to.
- testdata/compressed.tar: one sample with a gzip-compressed `txt.gz` holding "hello\\n".
- testdata/tendata.tar: 100 samples, each a `.ten` field with two 28x28 float64 arrays.
- webdataset/openimages/openimages-train-{000000..000099,000321}.tar: samples with jpg and json.
- webdataset/testdata/sample.tgz: one sample, key "10", cls "0" and a png.

The tenbin fields are written by hand from the format (magic, length, padding, int64 headers),
not by either library under test.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import tarfile

import numpy as np
from PIL import Image

__all__ = ["make_standins"]


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_600_000_000
    tf.addfile(info, io.BytesIO(data))


def _image(height: int, width: int, seed: int, fmt: str, noise: bool) -> bytes:
    if noise:
        pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    else:
        y, x = np.mgrid[0:height, 0:width]
        pixels = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), np.full_like(x, seed)], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def _tenbin(*arrays: np.ndarray) -> bytes:
    def chunk(data: bytes) -> bytes:
        return b"~TenBin~" + struct.pack("@q", len(data)) + data + b"\0" * (-len(data) % 64)

    def code(text: str) -> int:
        return struct.unpack("@q", text.encode("ascii").ljust(8, b"\0"))[0]

    out = b""
    for a in arrays:
        header = np.array([code("f8"), code(""), a.ndim, *a.shape], dtype="i8").tobytes()
        out += chunk(header) + chunk(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return out


def _testdata(root: str) -> None:
    os.makedirs(root, exist_ok=True)
    with tarfile.open(os.path.join(root, "imagenet-000000.tgz"), "w:gz") as tf:
        for i in range(47):
            key = f"n01440764_{i:05d}"
            _add(tf, f"{key}.cls", str(i % 1000).encode())
            png = _image(793, 600, i, "PNG", noise=False) if i == 0 else _image(24, 32, i, "PNG", noise=True)
            _add(tf, f"{key}.png", png)
            _add(tf, f"{key}.wnid", b"n01440764")
            _add(tf, f"{key}.xml", f"<annotation><filename>{key}</filename></annotation>".encode())
    with tarfile.open(os.path.join(root, "compressed.tar"), "w") as tf:
        _add(tf, "compressed/hello.txt.gz", gzip.compress(b"hello\n", mtime=0))
    with tarfile.open(os.path.join(root, "tendata.tar"), "w") as tf:
        for i in range(100):
            xs = np.full((28, 28), float(i))
            _add(tf, f"{i:06d}.ten", _tenbin(xs, xs.T + 0.5))


def _remote(root: str) -> None:
    shards = os.path.join(root, "webdataset", "openimages")
    os.makedirs(shards, exist_ok=True)
    for n in [*range(100), 321]:
        with tarfile.open(os.path.join(shards, f"openimages-train-{n:06d}.tar"), "w") as tf:
            for i in range(4):
                key = f"{n:06d}{i:04d}"
                _add(tf, f"{key}.jpg", _image(24, 32, n * 10 + i, "JPEG", noise=True))
                _add(tf, f"{key}.json", json.dumps([{"label": i, "shard": n}]).encode())
    samples = os.path.join(root, "webdataset", "testdata")
    os.makedirs(samples, exist_ok=True)
    with tarfile.open(os.path.join(samples, "sample.tgz"), "w:gz") as tf:
        _add(tf, "10.cls", b"0")
        _add(tf, "10.png", _image(16, 16, 10, "PNG", noise=False))


def make_standins(root: str) -> None:
    """Write `root/testdata/...` and the served tree `root/webdataset/...`."""
    _testdata(os.path.join(root, "testdata"))
    _remote(root)
