"""The decode workload: JPEG decode, center crop 224, batches of 64, the way training code reads ImageNet.

The pipeline is the same code for both libraries (only the imported module differs):

    wds.WebDataset(urls, shardshuffle=False).decode("pil").map(center_crop).to_tuple("jpg", "cls").batched(64)

webdataset runs it directly and inside `torch.utils.data.DataLoader(ds, batch_size=None, num_workers=N)`;
shardstream runs it directly and inside `shardstream.WebLoader(ds, batch_size=None, num_workers=N)`.
The "limit" row is an upper bound: the single-thread rate of decode + crop alone (Pillow, no tar reading,
no pipeline), times the machine's core count.
"""

from __future__ import annotations

import importlib
import io
import os
import tarfile
from typing import Callable, Iterable, Iterator

import numpy as np
from PIL import Image

from harness import Config

__all__ = ["BATCH", "CROP", "NAME", "center_crop", "configs", "count", "make_pass"]

NAME = "decode"
CROP = 224
BATCH = 64
LIMIT_IMAGES = 400  # decoded by the limit pass: enough for a stable rate, small enough to keep in memory


def configs(workers: list[int]) -> list[Config]:
    """webdataset direct and in DataLoader workers, shardstream direct and in WebLoader workers, the limit."""
    return [
        Config(NAME, "webdataset", "webdataset"),
        *(Config(NAME, f"webdataset-dl{n}", "webdataset", num_workers=n) for n in workers),
        Config(NAME, "shardstream", "shardstream"),
        *(Config(NAME, f"shardstream-wl{n}", "shardstream", num_workers=n) for n in workers),
        Config(NAME, f"limit (1 thread x {os.cpu_count()})", "limit", rate_scale=os.cpu_count() or 1,
               full_pass=False),
    ]


def center_crop_image(image: Image.Image, size: int = CROP) -> np.ndarray:
    """The central `size` x `size` pixels of `image` as an HWC uint8 array."""
    left, top = (image.width - size) // 2, (image.height - size) // 2
    return np.asarray(image.crop((left, top, left + size, top + size)))


def center_crop(sample: dict) -> dict:
    """Replace the sample's decoded `jpg` by its center crop (a map stage)."""
    sample["jpg"] = center_crop_image(sample["jpg"])
    return sample


def pipeline(wds, urls: list[str], **dataset_options):
    """The benchmarked pipeline, written against the webdataset API of module `wds`.

    `dataset_options` go to `WebDataset` (the remote workload passes `cache_dir`, `shards_in_flight`).
    """
    dataset = wds.WebDataset(urls, shardshuffle=False, **dataset_options)
    return dataset.decode("pil").map(center_crop).to_tuple("jpg", "cls").batched(BATCH)


def first_jpegs(urls: list[str], limit: int) -> list[bytes]:
    """The payloads of the first `limit` `.jpg` members of the shards, read with stdlib tarfile."""
    jpegs: list[bytes] = []
    for url in urls:
        with tarfile.open(url) as tar:
            for member in tar:
                if member.name.endswith(".jpg"):
                    jpegs.append(tar.extractfile(member).read())
                    if len(jpegs) == limit:
                        return jpegs
    return jpegs


def decode_and_crop(jpegs: list[bytes]) -> Iterator[tuple[np.ndarray, list[int]]]:
    """Decode and crop `jpegs` on this thread, yielding batches shaped like the pipeline's."""
    for start in range(0, len(jpegs), BATCH):
        crops = []
        for data in jpegs[start:start + BATCH]:
            with Image.open(io.BytesIO(data)) as image:
                crops.append(center_crop_image(image.convert("RGB")))
        yield np.stack(crops), [0] * len(crops)


def make_pass(config: Config, urls: list[str]) -> Callable[[], Iterable]:
    """Import the library (or load the limit's JPEGs); each call of the result starts one pass."""
    if config.library == "limit":
        jpegs = first_jpegs(urls, LIMIT_IMAGES)
        return lambda: decode_and_crop(jpegs)
    wds = importlib.import_module(config.library)
    if config.num_workers == 0:
        return lambda: pipeline(wds, urls)
    if config.library == "webdataset":
        from torch.utils.data import DataLoader

        return lambda: DataLoader(pipeline(wds, urls), batch_size=None, num_workers=config.num_workers)
    return lambda: wds.WebLoader(pipeline(wds, urls), batch_size=None, num_workers=config.num_workers)


def count(batch) -> tuple[int, int]:
    """Samples in a batch `(images, labels)`, and the bytes of its image array or tensor."""
    images, labels = batch
    return len(labels), int(images.nbytes)
