"""Video and audio decoding through optional backends (torchvision, torchaudio), as in webdataset.

Both handlers return None for keys they do not handle, and raise UsageError naming the package
to install when their backend is missing.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

from ._errors import UsageError
from ._imagedecode import last_extension

__all__ = ["torch_audio", "torch_video"]

_VIDEO_EXTENSIONS = frozenset("mp4 ogv mjpeg avi mov h264 mpg webm wmv".split())
_AUDIO_EXTENSIONS = frozenset("flac mp3 sox wav m4a ogg wma".split())


def _via_temp_file(extension: str, data: bytes, load: Callable[[str], Any]) -> Any:
    # Both backends read from a path, not from bytes.
    with tempfile.TemporaryDirectory() as dirname:
        fname = os.path.join(dirname, f"file.{extension}")
        with open(fname, "wb") as stream:
            stream.write(data)
        return load(fname)


def torch_video(key: str, data: bytes) -> Any:
    """Decode video with torchvision.io.read_video: (video, audio, info); None for other keys."""
    extension = last_extension(key)
    if extension not in _VIDEO_EXTENSIONS:
        return None
    try:
        import torchvision.io
    except ImportError as exn:
        raise UsageError("torch_video needs torchvision (and av): pip install torchvision av") from exn
    return _via_temp_file(extension, data, lambda f: torchvision.io.read_video(f, pts_unit="sec"))


def torch_audio(key: str, data: bytes) -> Any:
    """Decode audio with torchaudio.load: (waveform, sample_rate); None for other keys."""
    extension = last_extension(key)
    if extension not in _AUDIO_EXTENSIONS:
        return None
    try:
        import torchaudio  # type: ignore
    except ImportError as exn:
        raise UsageError("torch_audio needs torchaudio: pip install torchaudio") from exn
    return _via_temp_file(extension, data, torchaudio.load)
