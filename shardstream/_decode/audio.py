"""Audio decoding with PyAV from bytes: `audiohandler(...)` as a decode spec.

    ds.decode(wds.audiohandler("torch", sample_rate=16000, channels=1))   # (waveform, 16000)

The result is `(samples, sample_rate)` like torchaudio.load: float32 samples in [-1, 1], shaped
(channels, frames) (or (frames, channels) with layout="TC"), as a numpy array or a torch
tensor. Resampling and channel mixing are FFmpeg's (swresample), in the decode pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple, Union

import numpy as np

from .mediaio import AUDIO_EXTENSIONS, MediaHandler, first_stream, import_av, media_errors, open_media

__all__ = ["AudioHandler", "AudioOptions", "audiohandler", "decode_audio"]

_CHANNELS = {1: "mono", 2: "stereo", "mono": "mono", "stereo": "stereo"}


@dataclass(frozen=True)
class AudioOptions:
    """What to decode from a sound, validated on creation.

    Attributes:
        output: "numpy" or "torch".
        sample_rate: resample to this rate (None: the file's).
        channels: 1 / "mono" or 2 / "stereo" (None: the file's channels).
        start, end: a time window in seconds (end excluded).
        layout: "CT" (channels, frames), as torchaudio, or "TC".
    """

    output: str = "numpy"
    sample_rate: Optional[int] = None
    channels: Union[int, str, None] = None
    start: Optional[float] = None
    end: Optional[float] = None
    layout: str = "CT"

    def __post_init__(self) -> None:
        if self.output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', got {self.output!r}")
        if self.sample_rate is not None and (not isinstance(self.sample_rate, int) or self.sample_rate < 1):
            raise ValueError(f"sample_rate must be a positive int, got {self.sample_rate!r}")
        if self.channels is not None and self.channels not in _CHANNELS:
            raise ValueError(f"channels must be 1, 2, 'mono' or 'stereo', got {self.channels!r}")
        if self.start is not None and self.start < 0 or (
            self.end is not None and self.end <= (self.start or 0.0)
        ):
            raise ValueError(f"bad time window start={self.start}, end={self.end}")
        if self.layout not in ("CT", "TC"):
            raise ValueError(f"layout must be 'CT' or 'TC', got {self.layout!r}")


def decode_audio(data: bytes, options: AudioOptions = AudioOptions(), extension: str = "") -> Tuple[Any, int]:
    """Decode a sound as `options` say; return (samples, sample_rate).

    Raises:
        ValueError: the bytes are empty, cut short, not a readable container, hold no audio
            stream, or no sample falls in the time window.
    """
    container = open_media(data, extension, "audio")
    try:
        with media_errors(extension, "audio"):
            samples, rate = _decode(container, options, extension)
    finally:
        container.close()
    if options.layout == "TC":
        samples = np.ascontiguousarray(samples.T)
    if options.output == "torch":
        import torch

        return torch.from_numpy(samples), rate
    return samples, rate


def _decode(container: Any, options: AudioOptions, extension: str) -> Tuple[np.ndarray, int]:
    av = import_av("audio decoding")
    stream = first_stream(container, "audio", extension)
    stream.codec_context.thread_count = 1
    rate = options.sample_rate or stream.codec_context.sample_rate or stream.rate
    # Mono is the mean of the channels and stereo from mono a copy (as librosa and torchaudio
    # users do it), not swresample's -3 dB mixes; more than two channels to stereo is FFmpeg's.
    wanted = None if options.channels is None else _CHANNELS[options.channels]
    source_channels = getattr(stream.codec_context, "channels", 0) or 0
    layout = "stereo" if wanted == "stereo" and source_channels > 2 else None
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
    # The window counts seconds from the first decoded sample, whatever timestamp the container
    # gives it (an mp3's first frame says ~0.07 s: the encoder's delay, which FFmpeg drops).
    chunks: List[np.ndarray] = []
    have = 0
    wanted_end = None if options.end is None else round(options.end * rate)
    for frame in container.decode(stream):
        for out in resampler.resample(frame):
            chunk = out.to_ndarray()
            chunks.append(chunk)
            have += chunk.shape[1]
        if wanted_end is not None and have >= wanted_end:
            break
    else:
        for out in resampler.resample(None):  # flush what the resampler holds back
            chunks.append(out.to_ndarray())
    if not chunks:
        raise ValueError(f"no audio samples decoded from this {extension or 'file'} (a zero-length stream)")
    samples = np.concatenate(chunks, axis=1) if len(chunks) > 1 else chunks[0]
    begin = 0 if options.start is None else max(0, round(options.start * rate))
    samples = samples[:, begin:wanted_end]
    if wanted == "mono" and samples.shape[0] > 1:
        samples = samples.mean(axis=0, keepdims=True)
    elif wanted == "stereo" and samples.shape[0] == 1:
        samples = np.repeat(samples, 2, axis=0)
    if samples.shape[1] == 0:
        raise ValueError(f"no audio samples in the time window [{options.start}, {options.end}) "
                         f"of this {extension or 'file'}")
    return np.ascontiguousarray(samples, dtype=np.float32), int(rate)


class AudioHandler(MediaHandler):
    """A decode handler for audio fields: `AudioOptions` for the listed extensions, None otherwise."""

    name = "audiohandler"
    decode = staticmethod(decode_audio)

    def __init__(self, output: str = "numpy", extensions: Iterable[str] = AUDIO_EXTENSIONS, **options: Any) -> None:
        super().__init__(AudioOptions(output, **options), extensions)


def audiohandler(output: str = "numpy", extensions: Iterable[str] = AUDIO_EXTENSIONS, **options: Any) -> AudioHandler:
    """A decode spec for audio (see `AudioOptions` for the options), in the style of `imagehandler`."""
    return AudioHandler(output, extensions, **options)
