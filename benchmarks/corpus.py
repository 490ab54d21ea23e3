"""Generate (or reuse) an ImageNet-like WebDataset corpus for the benchmarks.

Each sample has four members: `jpg` (about 500x375, JPEG quality 90, ~100-140 KB), `cls` (an integer
label as text), `json` (a small metadata dict) and `txt` (a caption). Generation stays fast by rendering
a few dozen distinct images once and reusing their encoded bytes; every sample still gets unique bytes,
because a JPEG comment segment carrying the sample key is spliced in after the SOI marker (decoders skip
it, so decode cost is that of the base image).

Usage:
    .venv/bin/python benchmarks/corpus.py [--samples 4000] [--shards 16] [--out benchmarks/out/corpus]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = ["CorpusSpec", "DEFAULT_DIR", "ensure_corpus", "main"]

DEFAULT_DIR = Path(__file__).resolve().parent / "out" / "corpus"
MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # bump when the generated content changes, so stale corpora are rebuilt
SHAPES = [(500, 375), (500, 375), (500, 375), (375, 500), (500, 333)]
WORDS = "a the dog cat bird car tree house boat field river city snow beach red small old running".split()


@dataclass(frozen=True)
class CorpusSpec:
    """What a corpus holds; equal specs mean a corpus on disk can be reused."""

    samples: int = 4000
    shards: int = 16
    distinct_images: int = 64
    seed: int = 0
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.samples < 1 or self.shards < 1 or self.shards > self.samples:
            raise ValueError(f"need 1 <= shards <= samples, got {self.shards} shards, {self.samples} samples")


def natural_image(rng: np.random.Generator, width: int, height: int, *, shapes=(3, 9), min_box: int = 20,
                  blur: float = 1.5, texture_step: int = 3, texture=(22, 40), noise=(20, 32)) -> np.ndarray:
    """Render a photo-like RGB image: smooth colour field, blurred shapes, texture and sensor noise
    (the keywords tune them: how many shapes and their least size, the blur, the texture's grain
    and strength range, the noise's sigma range)."""
    grid = rng.integers(0, 256, (3, 4, 3), dtype=np.uint8)
    canvas = Image.fromarray(grid).resize((width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(*shapes))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = [x0, y0, x0 + int(rng.integers(min_box, width // 2)), y0 + int(rng.integers(min_box, height // 2))]
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    pixels = np.asarray(canvas.filter(ImageFilter.GaussianBlur(blur)), dtype=np.float32)
    # Texture and noise are what make JPEG sizes realistic; their strengths vary per image.
    grain = rng.normal(0, 1, (height // texture_step, width // texture_step)).astype(np.float32)
    grain = np.asarray(Image.fromarray(grain, mode="F").resize((width, height), Image.BICUBIC))
    pixels += rng.uniform(*texture) * grain[..., None]
    pixels += rng.normal(0, rng.uniform(*noise), pixels.shape).astype(np.float32)
    return pixels.clip(0, 255).astype(np.uint8)


def encode_jpeg(pixels: np.ndarray, quality: int = 90) -> bytes:
    """Encode an RGB array as JPEG with Pillow."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def with_comment(jpeg: bytes, text: str) -> bytes:
    """Return `jpeg` with a COM segment holding `text` right after the SOI marker."""
    payload = text.encode()
    return jpeg[:2] + b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def base_images(spec: CorpusSpec, rng: np.random.Generator) -> list[bytes]:
    """Encode `spec.distinct_images` images, half of them as mirrored copies of the other half."""
    count = min(spec.distinct_images, spec.samples)
    images: list[bytes] = []
    while len(images) < count:
        width, height = SHAPES[int(rng.integers(len(SHAPES)))]
        pixels = natural_image(rng, width, height)
        images.append(encode_jpeg(pixels))
        if len(images) < count:
            images.append(encode_jpeg(np.ascontiguousarray(pixels[:, ::-1])))
    return images


def shard_sizes(spec: CorpusSpec, rng: np.random.Generator) -> list[int]:
    """Split `spec.samples` into `spec.shards` uneven, non-empty shard sizes."""
    weights = rng.uniform(0.5, 1.5, spec.shards)
    sizes = np.floor(weights / weights.sum() * (spec.samples - spec.shards)).astype(int) + 1
    sizes[: spec.samples - int(sizes.sum())] += 1
    return [int(s) for s in sizes]


def sample_members(index: int, jpeg: bytes, rng: np.random.Generator) -> dict[str, bytes]:
    """The members of one sample, keyed by extension."""
    label = int(rng.integers(1000))
    meta = {"label": label, "source": "synthetic", "index": index, "score": round(rng.random(), 4)}
    caption = " ".join(WORDS[int(i)] for i in rng.integers(len(WORDS), size=int(rng.integers(5, 15))))
    return {"jpg": jpeg, "cls": str(label).encode(), "json": json.dumps(meta).encode(),
            "txt": caption.encode()}


def add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    """Append one regular file with fixed metadata, so output is byte-for-byte reproducible."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(payload), 1700000000, 0o644
    info.uname = info.gname = "bench"
    tar.addfile(info, io.BytesIO(payload))


def write_corpus(spec: CorpusSpec, directory: Path) -> list[Path]:
    """Write the shards of `spec` into `directory` (which must not exist yet); return the shard paths."""
    rng = np.random.default_rng(spec.seed)
    images = base_images(spec, rng)
    directory.mkdir(parents=True)
    paths, index = [], 0
    for shard, size in enumerate(shard_sizes(spec, rng)):
        path = directory / f"train-{shard:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(size):
                key = f"sample{index:07d}"
                jpeg = with_comment(images[int(rng.integers(len(images)))], key)
                for ext, payload in sample_members(index, jpeg, rng).items():
                    add_member(tar, f"{key}.{ext}", payload)
                index += 1
        paths.append(path)
    return paths


def read_manifest(directory: Path) -> dict | None:
    """The manifest of a corpus directory, or None when missing or unreadable."""
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def is_reusable(directory: Path, spec: CorpusSpec) -> bool:
    """True when `directory` holds a complete corpus built from `spec`."""
    manifest = read_manifest(directory)
    if manifest is None or manifest.get("spec") != asdict(spec):
        return False
    return all((directory / name).is_file() and (directory / name).stat().st_size == size
               for name, size in manifest["files"].items())


def ensure_corpus(spec: CorpusSpec, directory: Path = DEFAULT_DIR, log=print) -> list[str]:
    """Return the shard paths of a corpus for `spec` in `directory`, generating it unless it exists."""
    directory = Path(directory)
    if not is_reusable(directory, spec):
        started = time.perf_counter()
        staging = directory.with_name(directory.name + f".tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        paths = write_corpus(spec, staging)
        files = {p.name: p.stat().st_size for p in paths}
        manifest = {"spec": asdict(spec), "files": files, "bytes": sum(files.values())}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
        log(f"corpus: wrote {spec.samples} samples in {spec.shards} shards, "
            f"{manifest['bytes'] / 1e6:.1f} MB, to {directory} in {time.perf_counter() - started:.1f} s")
    manifest = read_manifest(directory)
    return [str(directory / name) for name in sorted(manifest["files"])]


def main(argv: list[str] | None = None) -> None:
    """Command line: generate or reuse a corpus and print its shard count and size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=CorpusSpec.samples)
    parser.add_argument("--shards", type=int, default=CorpusSpec.shards)
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    paths = ensure_corpus(CorpusSpec(samples=args.samples, shards=args.shards), args.out)
    size = sum(os.path.getsize(p) for p in paths)
    print(f"corpus: {len(paths)} shards, {size / 1e6:.1f} MB in {args.out}")


if __name__ == "__main__":
    main()
