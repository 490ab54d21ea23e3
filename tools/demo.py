"""`make demo`: make a small synthetic shard set, serve it over a local HTTP server, stream it
through decode + batch, and print throughput and per-stage stats.
"""

from __future__ import annotations

import io
import os
import sys
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))

import shardstream as wds  # noqa: E402
from shardserver import start_subprocess, stop_subprocess  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo-data")
SHARDS, PER_SHARD = 8, 96


def make_shards(root: str) -> None:
    """Write SHARDS shards of JPEG + class + caption samples (skipped if they already exist)."""
    last = os.path.join(root, f"demo-{SHARDS - 1:06d}.tar")
    if os.path.exists(last):
        return
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:240, 0:320]
    with wds.ShardWriter(os.path.join(root, "demo-%06d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i in range(SHARDS * PER_SHARD):
            phase = rng.uniform(0, 6.28, size=3)
            img = np.stack([127 + 100 * np.sin(xx / (20 + 7 * c) + yy / 31 + phase[c]) for c in range(3)], -1)
            img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=90)
            sink.write({"__key__": f"sample{i:06d}", "jpg": buf.getvalue(), "cls": i % 10, "txt": f"sample {i}"})


def center_crop(img: np.ndarray, size: int = 224) -> np.ndarray:
    h, w = img.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    return img[top : top + size, left : left + size]


def main() -> None:
    make_shards(ROOT)
    proc, base = start_subprocess(ROOT, latency_ms=10)
    try:
        urls = f"{base}/demo-{{000000..{SHARDS - 1:06d}}}.tar"
        print(f"streaming {SHARDS * PER_SHARD} samples from {urls}")
        dataset = (
            wds.WebDataset(urls, shardshuffle=False)
            .decode("rgb8")
            .to_tuple("jpg", "cls")
            .map_tuple(center_crop, None)
            .batched(32)
        )
        start = time.perf_counter()
        it = iter(dataset)
        first = None
        samples = 0
        for images, labels in it:
            first = first or time.perf_counter() - start
            samples += len(labels)
        elapsed = time.perf_counter() - start
        print(f"{samples} samples in {elapsed:.2f}s: {samples / elapsed:.0f} samples/s, first batch after {first * 1e3:.0f} ms")
        print(f"batch: images {images.shape} {images.dtype}, labels {labels.shape} {labels.dtype}")
        stats = it.stats()
        if stats is not None:
            print(stats.format())
    finally:
        stop_subprocess(proc)


if __name__ == "__main__":
    main()
