"""Video decoding with PyAV from bytes: `videohandler(...)` as a decode spec.

    ds.decode(wds.videohandler("torchrgb8", uniform=8, size=112))   # (8, 3, 112, h) uint8

Frames are chosen while decoding (the first n, n spread uniformly, a time window, a target fps),
only chosen frames are converted, and the conversion and the resize are one swscale pass. The
output follows the image specs: numpy specs give (T, H, W, C) (T, H, W for "l" specs), torch
specs (T, C, H, W) (T, H, W), float specs are scaled to [0, 1], "pil" gives a list of images.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np

from .image import imagespecs
from .mediaio import VIDEO_EXTENSIONS, MediaHandler, first_stream, media_errors, open_media

__all__ = ["VideoHandler", "VideoOptions", "decode_video", "videohandler"]

_FORMATS = {"l": "gray", "rgb": "rgb24", "rgba": "rgba"}
_LAYOUTS = ("THWC", "TCHW", "CTHW")


@dataclass(frozen=True)
class VideoOptions:
    """What to decode from a clip, validated on creation.

    Attributes:
        spec: an image spec ("rgb8", "torchrgb8", "torchrgb", "l8", "pil", ...).
        frames: the first n frames (with `fps`: at most n frames).
        uniform: n frames spread uniformly over the clip or window (the first and the last
            included); shorter clips repeat frames.
        start, end: a time window in seconds (end excluded).
        fps: resample to this frame rate: the frame shown at each tick of the new rate.
        size: resize: an int sets the shorter side (aspect kept), or (height, width).
        layout: "THWC", "TCHW" or "CTHW" (default: THWC for numpy, TCHW for torch).
        info: return (frames, info dict) instead of frames alone.
        threads: FFmpeg decoding threads per clip (1: the decode pool parallelises clips).
        interpolation: swscale's resize filter ("BILINEAR", "AREA", "BICUBIC", ...).
    """

    spec: str = "rgb8"
    frames: Optional[int] = None
    uniform: Optional[int] = None
    start: Optional[float] = None
    end: Optional[float] = None
    fps: Optional[float] = None
    size: Union[int, Tuple[int, int], None] = None
    layout: Optional[str] = None
    info: bool = False
    threads: int = 1
    interpolation: str = "BILINEAR"

    def __post_init__(self) -> None:
        if self.spec not in imagespecs:
            raise ValueError(f"unknown video spec {self.spec!r}: one of {sorted(imagespecs)}")
        for name in ("frames", "uniform"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.uniform is not None and (self.frames is not None or self.fps is not None):
            raise ValueError("uniform= picks its own frames: it cannot be combined with frames= or fps=")
        if self.fps is not None and not self.fps > 0:
            raise ValueError(f"fps must be positive, got {self.fps}")
        if self.start is not None and self.start < 0 or (
            self.end is not None and self.end <= (self.start or 0.0)
        ):
            raise ValueError(f"bad time window start={self.start}, end={self.end}")
        if self.size is not None:
            sizes = (self.size,) if isinstance(self.size, int) else tuple(self.size)
            if len(sizes) not in (1, 2) or not all(isinstance(s, int) and s > 0 for s in sizes):
                raise ValueError(f"size must be an int or (height, width) of positive ints, got {self.size!r}")
        if self.layout is not None and self.layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {self.layout!r}")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(f"threads must be an int >= 0, got {self.threads!r}")


def _out_size(width: int, height: int, size: Union[int, Tuple[int, int], None]) -> Tuple[int, int]:
    """(width, height) after resizing; an int sets the shorter side (even sizes are not forced)."""
    if size is None:
        return width, height
    if not isinstance(size, int):
        return size[1], size[0]
    if width <= height:
        return size, max(1, round(height * size / width))
    return max(1, round(width * size / height)), size


def _timed_frames(container: Any, stream: Any) -> Iterator[Tuple[float, Any]]:
    """Decoded frames with their time in seconds from the stream's start (from pts, else from the
    frame rate): `start=`/`end=` and `info["pts"]` count from the clip's first frame, whatever
    timestamp its container starts at (an MPEG-PS clip's first is ~0.5 s)."""
    rate = float(stream.average_rate or stream.guessed_rate or 0) or None
    origin = None
    if stream.start_time is not None and stream.time_base is not None:
        origin = float(stream.start_time * stream.time_base)
    for index, frame in enumerate(container.decode(stream)):
        time = frame.time
        if time is None:
            time = index / rate if rate else float(index)
        elif origin is None:
            origin = time
        yield round(time - (origin or 0.0), 9), frame  # (0.74 - 0.54 is 0.19999999999999996)


def _select(options: VideoOptions, frames: Iterator[Tuple[float, Any]], count: int, rate: float) -> List[Tuple[float, Any]]:
    """The chosen (time, frame) pairs, in order; `count` is the stream's frame count (0: unknown)."""
    start = options.start or 0.0
    end = float("inf") if options.end is None else options.end
    if options.fps is not None:
        return _resampled(frames, options, start, end, rate)
    if options.uniform is None:
        return list(itertools.islice(_window(frames, start, end), options.frames))
    if count and options.start is None and options.end is None:
        return _uniform_by_index(frames, count, options.uniform)
    every = list(_window(frames, start, end))
    if not every:
        return []
    return [every[i] for i in np.linspace(0, len(every) - 1, options.uniform).round().astype(int)]


def _window(frames: Iterator[Tuple[float, Any]], start: float, end: float) -> Iterator[Tuple[float, Any]]:
    for time, frame in frames:
        if time >= end:
            return
        if time >= start:
            yield time, frame


def _uniform_by_index(frames: Iterator[Tuple[float, Any]], count: int, n: int) -> List[Tuple[float, Any]]:
    # The frame count is known: keep only the chosen frames, stop after the last one.
    wanted = np.linspace(0, count - 1, n).round().astype(int).tolist()
    chosen: List[Tuple[float, Any]] = []
    for index, item in enumerate(frames):
        while wanted and wanted[0] == index:
            chosen.append(item)
            wanted.pop(0)
        if not wanted:
            break
    if chosen and len(chosen) < n:  # the container counted more frames than it decodes to
        chosen.extend(chosen[-1:] * (n - len(chosen)))
    return chosen


def _resampled(frames: Iterator[Tuple[float, Any]], options: VideoOptions, start: float, end: float,
               rate: float) -> List[Tuple[float, Any]]:
    # Ticks at the new rate from the window start (else the first frame); each tick gets the
    # frame on screen then: frame i shows from its time until frame i+1's.
    # Tick k is at origin + k / fps (computed, not summed: no drift), and a tick within a
    # millionth of a step of a frame's start belongs to that frame: a clip of 12 frames at 10 fps
    # asked for fps=10 gives 12 frames, not a 13th at 1.2000000000000002 s.
    assert options.fps is not None  # the fps mode
    step, limit = 1.0 / float(options.fps), options.frames
    slack = step * 1e-6
    chosen: List[Tuple[float, Any]] = []
    origin: Optional[float] = None
    previous: Optional[Tuple[float, Any]] = None

    def tick() -> float:
        return origin + len(chosen) * step  # type: ignore[operator]  # only once origin is set

    def show_previous_until(stop: float) -> None:
        while origin is not None and tick() < stop - slack and tick() < end - slack and (
                limit is None or len(chosen) < limit):
            chosen.append((tick(), previous[1]))  # type: ignore[index]  # a tick exists only after a frame

    for time, frame in frames:
        if origin is None and time >= start:
            origin = start if options.start is not None and previous is not None else time
        if previous is not None:
            show_previous_until(time)
        if origin is not None and (tick() >= end - slack or limit is not None and len(chosen) >= limit):
            return chosen
        previous = (time, frame)
    if previous is not None:
        show_previous_until(previous[0] + (1.0 / rate if rate else step))
    return chosen


def decode_video(data: bytes, options: VideoOptions = VideoOptions(), extension: str = "") -> Any:
    """Decode a clip's frames as `options` say.

    Raises:
        ValueError: the bytes are empty, cut short, not a readable container, hold no video
            stream, or no frame falls in the selection.
    """
    atype, etype, mode = imagespecs[options.spec]
    container = open_media(data, extension, "video")
    try:
        with media_errors(extension, "video"):
            stream = first_stream(container, "video", extension)
            stream.codec_context.thread_count = options.threads
            if options.threads != 1:
                stream.thread_type = "AUTO"
            rate = float(stream.average_rate or stream.guessed_rate or 0)
            chosen = _select(options, _timed_frames(container, stream), stream.frames or 0, rate)
            if not chosen:
                raise ValueError(f"no video frames decoded from this {extension or 'file'} "
                                 "(a zero-length stream, or nothing in the time window)")
            first = chosen[0][1]
            width, height = _out_size(first.width, first.height, options.size)
            frames = _convert([frame for _, frame in chosen], width, height, mode, atype, options)
            duration = float(stream.duration * stream.time_base) if stream.duration else None
    finally:
        container.close()
    result = _to_output(frames, atype, etype, mode, options.layout)
    if not options.info:
        return result
    return result, {"fps": rate, "pts": [time for time, _ in chosen], "duration": duration,
                    "size": (first.height, first.width)}


def _convert(frames: List[Any], width: int, height: int, mode: str, atype: str, options: VideoOptions) -> Any:
    from av.video.reformatter import VideoReformatter

    reformatter = VideoReformatter()  # keeps its swscale context from frame to frame
    converted, previous = [], None
    for frame in frames:
        if frame is not previous:  # a frame chosen twice (fps above the clip's) converts once
            out = reformatter.reformat(frame, width=width, height=height, format=_FORMATS[mode],
                                       interpolation=options.interpolation, threads=1)
            array = out.to_ndarray()
        converted.append(array)
        previous = frame
    if atype == "pil":
        from .image import _pil

        return [_pil().fromarray(a, mode.upper()) for a in converted]
    return np.stack(converted)


def _to_output(frames: Any, atype: str, etype: Optional[str], mode: str, layout: Optional[str]) -> Any:
    if atype == "pil":
        return frames
    if etype == "float":
        frames = frames.astype(np.float32)
        frames /= 255.0
    layout = layout or ("THWC" if atype == "numpy" else "TCHW")
    if frames.ndim == 4 and layout != "THWC":
        order = (0, 3, 1, 2) if layout == "TCHW" else (3, 0, 1, 2)
        frames = np.ascontiguousarray(frames.transpose(order))
    if atype == "numpy":
        return frames
    import torch

    return torch.from_numpy(frames)


class VideoHandler(MediaHandler):
    """A decode handler for video fields: `VideoOptions` for the listed extensions, None otherwise."""

    name = "videohandler"
    decode = staticmethod(decode_video)

    def __init__(self, spec: str = "rgb8", extensions: Iterable[str] = VIDEO_EXTENSIONS, **options: Any) -> None:
        super().__init__(VideoOptions(spec, **options), extensions)


def videohandler(spec: str = "rgb8", extensions: Iterable[str] = VIDEO_EXTENSIONS, **options: Any) -> VideoHandler:
    """A decode spec for video (see `VideoOptions` for the options), in the style of `imagehandler`."""
    return VideoHandler(spec, extensions, **options)
