"""Generate (or reuse) the media benchmark's own corpora: large JPEGs, video clips, sounds.

- `large`: JPEGs of 1024-2048 px per side (quality 90), photo-like at about 2-3 bits per pixel
  (what camera photos resized to 2 MP run at; the ImageNet-like corpus's synthetic noise makes
  ~5), with `cls`.
- `video`: mp4 clips (libx264, yuv420p, 25 fps, 2 s, 320x240, moving shapes on a noisy field).
- `audio-flac`, `audio-mp3`: 5 s stereo sounds at 44.1 kHz (chords and noise).

Each corpus lives in its own folder under benchmarks/out with a manifest, and is reused while
the manifest matches (the same rule as corpus.py).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

import corpus

__all__ = ["MediaSpec", "ensure_media_corpus", "large_photo"]

OUT = Path(__file__).resolve().parent / "out"
FORMAT_VERSION = 1
LARGE_SHAPES = [(2048, 1536), (1536, 2048), (1600, 1200), (1920, 1080), (1024, 1024), (1280, 960), (2048, 1152)]


@dataclass(frozen=True)
class MediaSpec:
    """One media corpus: its kind ("large", "video", "audio-flac", "audio-mp3") and size."""

    kind: str
    samples: int
    shards: int = 4
    seed: int = 0
    version: int = FORMAT_VERSION

    @property
    def directory(self) -> Path:
        return OUT / f"{self.kind}-{self.samples}x{self.shards}"


def large_photo(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A photo-like image with camera-like noise (see the module docstring): corpus.natural_image
    with larger shapes, finer texture and less noise."""
    return corpus.natural_image(rng, width, height, shapes=(4, 10), min_box=40, blur=2.0, texture_step=4,
                                texture=(10, 18), noise=(5, 9))


def _large_items(spec: MediaSpec, rng: np.random.Generator):
    distinct = [corpus.encode_jpeg(large_photo(rng, *LARGE_SHAPES[i % len(LARGE_SHAPES)])) for i in range(24)]
    for index in range(spec.samples):
        key = f"sample{index:07d}"
        jpeg = corpus.with_comment(distinct[int(rng.integers(len(distinct)))], key)
        yield key, {"jpg": jpeg, "cls": str(int(rng.integers(1000))).encode()}


def _clip(rng: np.random.Generator, seconds: float = 2.0, fps: int = 25, size=(240, 320)) -> bytes:
    import av

    height, width = size
    background = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    background = np.asarray(Image.fromarray(background).filter(ImageFilter.GaussianBlur(3)))
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "20"}
        for i in range(int(seconds * fps)):
            frame = np.roll(background, 3 * i, axis=1).astype(np.int16)
            frame[40 + i % 100 : 100 + i % 100, 60 + 2 * i % 200 : 140 + 2 * i % 200] += 60
            frame += rng.integers(-12, 13, frame.shape, dtype=np.int16)
            image = av.VideoFrame.from_ndarray(frame.clip(0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(image):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _sound(rng: np.random.Generator, fmt: str, codec: str, seconds: float = 5.0, rate: int = 44100) -> bytes:
    import av

    t = np.arange(int(seconds * rate)) / rate
    notes = rng.uniform(110, 880, 3)
    wave = sum(0.2 * np.sin(2 * np.pi * f * t) for f in notes) + rng.normal(0, 0.02, t.shape)
    stereo = np.stack([wave, np.roll(wave, 100)]).astype(np.float32)
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "stereo"
        step = stream.codec_context.frame_size or 4096
        for start in range(0, stereo.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(stereo[:, start : start + step]),
                                               format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = rate, start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _media_items(spec: MediaSpec, rng: np.random.Generator):
    # A few distinct payloads, reused: generation stays fast, decode cost is per payload anyway.
    if spec.kind == "video":
        distinct, ext = [_clip(rng) for _ in range(12)], "mp4"
    else:
        fmt, codec = {"audio-flac": ("flac", "flac"), "audio-mp3": ("mp3", "libmp3lame")}[spec.kind]
        distinct, ext = [_sound(rng, fmt, codec) for _ in range(12)], fmt
    for index in range(spec.samples):
        payload = distinct[index % len(distinct)]
        yield f"sample{index:07d}", {ext: payload, "cls": str(index % 10).encode()}


def _write(spec: MediaSpec, directory: Path) -> list:
    rng = np.random.default_rng(spec.seed)
    items = list((_large_items if spec.kind == "large" else _media_items)(spec, rng))
    directory.mkdir(parents=True)
    per_shard = -(-len(items) // spec.shards)
    paths = []
    for shard in range(spec.shards):
        path = directory / f"{spec.kind}-{shard:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, members in items[shard * per_shard : (shard + 1) * per_shard]:
                for ext, payload in members.items():
                    corpus.add_member(tar, f"{key}.{ext}", payload)
        paths.append(path)
    return paths


def ensure_media_corpus(spec: MediaSpec, log=print) -> list:
    """The shard paths of `spec`'s corpus, generating it unless a matching one exists."""
    directory = spec.directory
    if not corpus.is_reusable(directory, spec):
        started = time.perf_counter()
        staging = directory.with_name(directory.name + f".tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        paths = _write(spec, staging)
        files = {p.name: p.stat().st_size for p in paths}
        (staging / corpus.MANIFEST).write_text(json.dumps({"spec": asdict(spec), "files": files,
                                                            "bytes": sum(files.values())}, indent=1))
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
        log(f"corpus: wrote {spec.samples} {spec.kind} samples, {sum(files.values()) / 1e6:.1f} MB, "
            f"to {directory} in {time.perf_counter() - started:.1f} s")
    manifest = corpus.read_manifest(directory)
    return [str(directory / name) for name in sorted(manifest["files"])]
