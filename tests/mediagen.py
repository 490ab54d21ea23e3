"""Tiny clips and sounds for the media tests, written with PyAV itself (in memory).

Every frame and every sound is known: frame i of a clip is a flat grey of level 16 + 8 * i
(so a decoded frame's mean tells its index), and a sound is a 440 Hz sine of amplitude 0.5.
`video_params` / `audio_params` list the formats with the codec this PyAV wheel can write, and a
skip mark with the reason for those it cannot.
"""

from __future__ import annotations

import io
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

av = pytest.importorskip("av")

# extension -> (container format, encoder, pixel format)
VIDEO_FORMATS: Dict[str, Tuple[str, str, str]] = {
    "mp4": ("mp4", "libx264", "yuv420p"),
    "webm": ("webm", "libvpx", "yuv420p"),
    "mkv": ("matroska", "libx264", "yuv420p"),
    "avi": ("avi", "mpeg4", "yuv420p"),
    "mov": ("mov", "mpeg4", "yuv420p"),
}
# extension -> (container format, encoder, sample rate, sample format or None)
AUDIO_FORMATS: Dict[str, Tuple[str, str, int]] = {
    "wav": ("wav", "pcm_s16le", 16000),
    "flac": ("flac", "flac", 16000),
    "mp3": ("mp3", "libmp3lame", 16000),
    "ogg": ("ogg", "libopus", 48000),
    "m4a": ("ipod", "aac", 16000),
    "opus": ("opus", "libopus", 48000),
}


def can_encode(codec: str) -> Optional[str]:
    """None when this PyAV can write `codec`, else why not."""
    try:
        av.codec.Codec(codec, "w")
    except Exception as exn:  # UnknownCodecError and friends
        return f"this PyAV wheel has no {codec} encoder ({exn})"
    return None


def _params(formats: dict) -> List:
    params = []
    for ext, spec in formats.items():
        reason = can_encode(spec[1])
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(ext, id=ext, marks=marks))
    return params


def video_params() -> List:
    """pytest params over the video extensions, skipped where the encoder is missing."""
    return _params(VIDEO_FORMATS)


def audio_params() -> List:
    """pytest params over the audio extensions, skipped where the encoder is missing."""
    return _params(AUDIO_FORMATS)


def level(index: int) -> int:
    """The grey level of frame `index`."""
    return 16 + 8 * index


def make_video(ext: str = "mp4", frames: int = 12, size: Tuple[int, int] = (32, 48), fps: int = 10,
               audio: bool = False) -> bytes:
    """A clip of `frames` flat grey frames of (height, width) `size` at `fps`."""
    fmt, codec, pix = VIDEO_FORMATS[ext]
    reason = can_encode(codec)
    if reason:
        pytest.skip(reason)
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.height, stream.width = size
        stream.pix_fmt = pix
        if codec == "libx264":
            stream.options = {"preset": "ultrafast"}
        sound = container.add_stream("aac", rate=16000) if audio else None
        if sound is not None:
            sound.layout = "mono"
        for i in range(frames):
            pixels = np.full((size[0], size[1], 3), level(i), np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            _encode_sound(container, sound, frames / fps, 16000, 1)
    return buf.getvalue()


def _encode_sound(container, stream, seconds: float, rate: int, channels: int) -> None:
    total = int(seconds * rate)
    wave = (0.5 * np.sin(2 * np.pi * 440 * np.arange(total) / rate)).astype(np.float32)
    layout = "mono" if channels == 1 else "stereo"
    step = stream.codec_context.frame_size or 1024
    for start in range(0, total, step):
        chunk = np.tile(wave[start : start + step], (channels, 1))
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout=layout)
        frame.sample_rate, frame.pts = rate, start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def make_audio(ext: str = "wav", seconds: float = 0.5, channels: int = 1, rate: Optional[int] = None) -> bytes:
    """A 440 Hz sine of amplitude 0.5 (the same on every channel)."""
    fmt, codec, default_rate = AUDIO_FORMATS[ext]
    reason = can_encode(codec)
    if reason:
        pytest.skip(reason)
    rate = rate or default_rate
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono" if channels == 1 else "stereo"
        _encode_sound(container, stream, seconds, rate, channels)
    return buf.getvalue()
