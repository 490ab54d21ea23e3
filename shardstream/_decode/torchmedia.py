"""webdataset's `torch_video` and `torch_audio` handlers, decoded with PyAV from bytes.

Results have the layout of the functions webdataset calls: `torch_video` gives
torchvision.io.read_video's `(video, audio, info)` (video (T, H, W, C) uint8, audio (C, N)
float32, info {"video_fps", "audio_fps"}); `torch_audio` gives torchaudio.load's
`(waveform, sample_rate)` (float32 (C, N) in [-1, 1]). webdataset writes each sample to a
temporary file for those libraries; PyAV reads the bytes in memory. Without PyAV, the old path
(temporary file, torchvision / torchaudio) is taken. Audio is float32 whatever the source's
sample format (read_video hands int16 sources over as int16).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, List

import numpy as np

from .audio import AudioOptions, decode_audio
from .._base.errors import UsageError
from .image import last_extension
from .mediaio import first_stream, import_av, media_errors, open_media

__all__ = ["read_video", "torch_audio", "torch_video"]

# webdataset's lists (case-sensitive, as there): these two names decode what they decoded there.
_TORCH_VIDEO_EXTENSIONS = frozenset("mp4 ogv mjpeg avi mov h264 mpg webm wmv".split())
_TORCH_AUDIO_EXTENSIONS = frozenset("flac mp3 sox wav m4a ogg wma".split())


def _have_av() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def _via_temp_file(extension: str, data: bytes, load: Callable[[str], Any]) -> Any:
    # The fallback backends read from a path, not from bytes.
    with tempfile.TemporaryDirectory() as dirname:
        fname = os.path.join(dirname, f"file.{extension}")
        with open(fname, "wb") as stream:
            stream.write(data)
        return load(fname)


def read_video(data: bytes, extension: str = "") -> Any:
    """All frames (rgb24) and the first audio stream of a clip, as torchvision.io.read_video."""
    import torch

    av = import_av("video decoding")
    container = open_media(data, extension, "video")
    try:
        with media_errors(extension, "video"):
            video = first_stream(container, "video", extension)
            video.codec_context.thread_count = 1
            audio = container.streams.audio[0] if container.streams.audio else None
            streams = [video] if audio is None else [video, audio]
            resampler = None if audio is None else av.AudioResampler(format="fltp")
            frames: List[Any] = []
            sounds: List[Any] = []
            for packet in container.demux(streams):
                for frame in packet.decode():
                    if packet.stream is video:
                        frames.append(frame.to_ndarray(format="rgb24"))
                    else:
                        assert resampler is not None  # a packet of the audio stream
                        sounds.extend(out.to_ndarray() for out in resampler.resample(frame))
            if resampler is not None:
                sounds.extend(out.to_ndarray() for out in resampler.resample(None))
            if not frames:
                raise ValueError(f"no video frames decoded from this {extension or 'file'} (a zero-length stream)")
            info = {"video_fps": float(video.average_rate or video.guessed_rate or 0)}
            if audio is not None:
                info["audio_fps"] = audio.codec_context.sample_rate or audio.rate
    finally:
        container.close()
    vframes = torch.from_numpy(np.stack(frames))
    if sounds:
        aframes = torch.from_numpy(np.ascontiguousarray(np.concatenate(sounds, axis=1), dtype=np.float32))
    else:
        aframes = torch.empty((1, 0), dtype=torch.float32)
    return vframes, aframes, info


def torch_video(key: str, data: bytes) -> Any:
    """Decode video like torchvision.io.read_video: (video, audio, info); None for other keys."""
    extension = last_extension(key)
    if extension not in _TORCH_VIDEO_EXTENSIONS:
        return None
    if _have_av():
        return read_video(data, extension)
    try:
        import torchvision.io
    except ImportError as exn:
        raise UsageError("torch_video needs PyAV: pip install av") from exn
    return _via_temp_file(extension, data, lambda f: torchvision.io.read_video(f, pts_unit="sec"))


def torch_audio(key: str, data: bytes) -> Any:
    """Decode audio like torchaudio.load: (waveform, sample_rate); None for other keys."""
    extension = last_extension(key)
    if extension not in _TORCH_AUDIO_EXTENSIONS:
        return None
    if _have_av():
        return decode_audio(data, AudioOptions("torch"), extension)
    try:
        import torchaudio  # type: ignore
    except ImportError as exn:
        raise UsageError("torch_audio needs PyAV: pip install av") from exn
    return _via_temp_file(extension, data, torchaudio.load)
