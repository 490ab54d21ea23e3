"""The fused image path: decode + crop + resize to a target size in one handler.

`imagehandler("rgb8", size=224, crop="center")` gives what `.decode("pil")` followed by
torchvision's `Resize(256)` + `CenterCrop(224)` gives (crop="random": `RandomResizedCrop(224)`),
with less work per image:

- the crop box is chosen from the header, before any pixel is decoded;
- JPEGs are decoded at 1/2, 1/4 or 1/8 size by the decoder's DCT scaling (Pillow `draft`, or
  simplejpeg where asked for) when the crop still covers the target at that size;
- the crop and the resize are one resampling pass over the crop box (never a full-size resize
  followed by a crop), with Pillow's reducing gap for large factors; or, with resizer="torch",
  torch's antialiased uint8 kernels (a port of Pillow's to AVX2: ~2.5x faster here), on
  Pillow's sampling grid: a center crop resizes like Resize (from pixel 0, with neighbours)
  and keeps the crop, a random crop cuts its whole-pixel box and resizes it.

The fastest pair on 500x375 JPEGs is backend="simplejpeg" + resizer="torch": torch reads
simplejpeg's numpy array where it lies, while a Pillow image needs a copy to reach torch, which
at that size costs what torch saves.

The pixels differ from the plain path within a small tolerance (the README gives the measured
figures; tests/test_fusedimage.py bounds them). The plain `.decode("rgb8")` path is unchanged.
"""

from __future__ import annotations

import io
import math
import random
import sys
import threading
from typing import Any, Iterable, Optional, Tuple, Union

import numpy as np

from .._base.threadnames import POOL_THREAD_PREFIX
from .image import IMAGE_EXTENSIONS, FieldHandler, _pil, _to_array, imagespecs, simplejpeg_or_none

__all__ = ["CROPS", "FusedImageHandler", "center_box", "random_box", "resize_box"]

CROPS = ("center", "random", None)
Box = Tuple[float, float, float, float]
_RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
_BACKENDS = ("pillow", "simplejpeg")
_RESIZERS = ("pillow", "torch")
# Pillow filter: torch's antialiased kernel (the op behind F.interpolate(antialias=True), whose
# out= form writes HWC memory directly), its support
_TORCH_KERNELS = {2: ("_upsample_bilinear2d_aa", 1.0), 3: ("_upsample_bicubic2d_aa", 2.0)}
_JPEG_SOI = b"\xff\xd8\xff"
# Converting after the resize gives the same pixels as before it (and is cheaper) for these.
_CONVERT_AFTER = {("L", "RGB"), ("L", "RGBA"), ("RGB", "RGBA"), ("L", "L"), ("RGB", "RGB")}


def _center_resized(width: int, height: int, out_h: int, out_w: int, fraction: float) -> Tuple[int, int]:
    """The (width, height) of torchvision's `Resize(S)` that precedes the center crop."""
    short = round(min(out_h, out_w) / fraction)
    if width <= height:
        return short, int(short * height / width)
    return int(short * width / height), short


def center_box(width: int, height: int, out_h: int, out_w: int, fraction: float) -> Box:
    """The source box of torchvision's `Resize(S)` + `CenterCrop((out_h, out_w))`.

    S = round(min(out_h, out_w) / fraction): fraction 0.875 with 224 is Resize(256). Where the crop
    overhangs the resized image (a non-square crop wider or taller than it), the box is the whole
    image on that axis, and `center_padding` says where it lands in the zero-padded output, as
    torchvision's CenterCrop pads.
    """
    new_w, new_h = _center_resized(width, height, out_h, out_w, fraction)
    top, left = int(round((new_h - out_h) / 2.0)), int(round((new_w - out_w) / 2.0))
    sx, sy = width / new_w, height / new_h
    return (max(0.0, left * sx), max(0.0, top * sy), min(float(width), (left + out_w) * sx),
            min(float(height), (top + out_h) * sy))


def center_padding(width: int, height: int, out_h: int, out_w: int,
                   fraction: float) -> Optional[Tuple[Tuple[int, int], Tuple[int, int]]]:
    """Where the crop overhangs the resized image: (the size the box resizes to, its (left, top)
    in the zero output), as torchvision's CenterCrop pads ((crop - size) // 2 before); else None."""
    new_w, new_h = _center_resized(width, height, out_h, out_w, fraction)
    if out_w <= new_w and out_h <= new_h:
        return None
    inner = (min(out_w, new_w), min(out_h, new_h))
    return inner, ((out_w - new_w) // 2 if out_w > new_w else 0, (out_h - new_h) // 2 if out_h > new_h else 0)


def random_box(width: int, height: int, scale: Tuple[float, float], ratio: Tuple[float, float],
               rng: Any) -> Box:
    """The box of torchvision's `RandomResizedCrop.get_params` (same algorithm, `rng` a Random)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top, left = rng.randint(0, height - h), rng.randint(0, width - w)
            return (float(left), float(top), float(left + w), float(top + h))
    in_ratio = width / height  # fallback: a center crop with the ratio clamped into range
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return (float(left), float(top), float(left + w), float(top + h))


def resize_box(width: int, height: int, size: Union[int, Tuple[int, int]]) -> Tuple[int, int]:
    """Output (height, width) of torchvision's `Resize(size)`: an int sets the shorter side."""
    if not isinstance(size, int):
        return size[0], size[1]
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if hasattr(torch.ops.aten, "_upsample_bicubic2d_aa") else None


class FusedImageHandler(FieldHandler):
    """Decode, crop and resize images to a fixed size in one step (see the module docstring).

    Args:
        imagespec: an image spec of `imagespecs` ("rgb8", "torchrgb", "pil", ...).
        extensions: the (lower-case) extensions this handler decodes.
        size: output size: an int (a square for crops; the shorter side for crop=None) or
            (height, width).
        crop: "center" (Resize + CenterCrop), "random" (RandomResizedCrop) or None (Resize only).
        crop_fraction: center crop: the crop's share of the resized shorter side (0.875 with
            size 224 is torchvision's Resize(256) + CenterCrop(224)).
        scale, ratio: random crop: area fraction and aspect ratio ranges (torchvision's).
        resample: Pillow filter name ("bilinear", as torchvision) or number.
        reducing_gap: Pillow's reducing gap (None: resample from full resolution).
        backend: the decoder: "pillow", or "simplejpeg" (where installed: YCbCr and gray
            JPEGs; anything else falls back to Pillow); "auto" (the default): simplejpeg where
            it is installed, else Pillow.
        resizer: "pillow", or "torch" (where installed: torch's antialiased uint8 bilinear or
            bicubic resampling of RGB and gray images, no reducing gap; RGBA results, whose
            alpha Pillow premultiplies, stay with Pillow); "auto" (the default): torch when this
            process has already imported it (shardstream does not import torch on its own) and
            the filter is bilinear or bicubic, else Pillow. "auto" is decided when the handler is
            made, and a copy sent to a DataLoader worker keeps that choice.
        seed: seed of this handler's own random generator for crop="random"; None uses the
            `random` module (which DataLoader reseeds in each worker).

    Raises:
        ValueError: unknown spec, crop, filter or backend, or bad sizes.
    """

    def __init__(
        self,
        imagespec: str,
        extensions: Iterable[str] = IMAGE_EXTENSIONS,
        *,
        size: Union[int, Tuple[int, int], None] = None,
        crop: Optional[str] = None,
        crop_fraction: float = 0.875,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        resample: Union[str, int] = "bilinear",
        reducing_gap: Optional[float] = 3.0,
        backend: str = "auto",
        resizer: str = "auto",
        seed: Optional[int] = None,
    ) -> None:
        if imagespec not in imagespecs:
            raise ValueError("Unknown imagespec: %s" % imagespec)
        if crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}, got {crop!r}")
        if size is None:
            raise ValueError("the fused image path needs size= (an int or (height, width))")
        if isinstance(size, int):
            sizes: Tuple[int, ...] = (size,)
        else:
            sizes = tuple(size)
            if len(sizes) != 2:
                raise ValueError(f"size must be an int or (height, width), got {size!r}")
        if not all(isinstance(s, int) and s > 0 for s in sizes):
            raise ValueError(f"size must hold positive ints, got {size!r}")
        if not 0 < crop_fraction <= 1:
            raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction}")
        if not (0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1]):
            raise ValueError(f"bad scale {scale} or ratio {ratio}")
        if isinstance(resample, str):
            if resample.lower() not in _RESAMPLE:
                raise ValueError(f"resample must be one of {sorted(_RESAMPLE)}, got {resample!r}")
            resample = _RESAMPLE[resample.lower()]
        if backend == "auto":
            backend = "simplejpeg" if simplejpeg_or_none() is not None else "pillow"
        if resizer == "auto":
            torch_ready = "torch" in sys.modules and resample in _TORCH_KERNELS and _torch() is not None
            resizer = "torch" if torch_ready else "pillow"
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        if backend == "simplejpeg" and simplejpeg_or_none() is None:
            raise ValueError("backend='simplejpeg' needs simplejpeg: pip install simplejpeg")
        if resizer not in _RESIZERS:
            raise ValueError(f"resizer must be one of {_RESIZERS}, got {resizer!r}")
        if resizer == "torch":
            if resample not in _TORCH_KERNELS:
                raise ValueError("resizer='torch' resamples with 'bilinear' or 'bicubic' only")
            if _torch() is None:
                raise ValueError("resizer='torch' needs torch >= 2.1: pip install torch")
        self.imagespec = imagespec
        self.extensions = set(extensions)
        self.size, self.crop, self.crop_fraction = size, crop, crop_fraction
        self.scale: Tuple[float, float] = (scale[0], scale[1])
        self.ratio: Tuple[float, float] = (ratio[0], ratio[1])
        self.resample, self.reducing_gap, self.backend, self.seed = resample, reducing_gap, backend, seed
        self.resizer = resizer
        self._rng: Any = random if seed is None else random.Random(seed)
        self._lock = threading.Lock()
        self._jpeg: Any = simplejpeg_or_none() if backend == "simplejpeg" else None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"], state["_jpeg"]
        if self.seed is None:
            del state["_rng"]  # the module, not picklable: the copy uses its own process's
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._jpeg = simplejpeg_or_none() if self.backend == "simplejpeg" else None
        if self.seed is None:
            self._rng = random

    def decode_field(self, data: bytes, extension: str) -> Any:
        return self.decode(data)

    def geometry(self, width: int, height: int) -> Tuple[Box, Tuple[int, int]]:
        """The source box and the output (width, height) for an image of that size (a center crop
        that overhangs the image: see `center_padding`)."""
        if self.crop is None:
            out_h, out_w = resize_box(width, height, self.size)
            return (0.0, 0.0, float(width), float(height)), (out_w, out_h)
        out_h, out_w = (self.size, self.size) if isinstance(self.size, int) else self.size
        if self.crop == "center":
            return center_box(width, height, out_h, out_w, self.crop_fraction), (out_w, out_h)
        with self._lock:
            return random_box(width, height, self.scale, self.ratio, self._rng), (out_w, out_h)

    def decode(self, data: bytes) -> Any:
        """Decode, crop and resize image bytes regardless of extension."""
        atype, etype, mode = imagespecs[self.imagespec]
        target = mode.upper()
        decoded = None
        if self._jpeg is not None and data[:3] == _JPEG_SOI:
            decoded = self._decode_simplejpeg(data, target)
        if decoded is None:
            decoded = self._decode_pillow(data, target)
        source, box, factor, out, padding = decoded
        if padding is not None:  # the box resizes to the part of the output inside the image
            inner, corner = padding
            image = self._resample(source, box, factor, inner, target)
            image = _padded(image if isinstance(image, np.ndarray) else np.asarray(image.convert(target)), out, corner)
        else:
            image = self._resample(source, box, factor, out, target, chw=atype == "torch")
        if isinstance(image, np.ndarray):  # torch's: an HWC view, over CHW memory for torch specs
            if atype != "torch":
                image = np.ascontiguousarray(image)  # a center crop's rows cut out of a wider resize
            return _pil().fromarray(image) if atype == "pil" else _to_array(image, atype, etype)
        if image.mode != target:
            image = image.convert(target)
        if atype == "pil":
            return image
        return _to_array(np.asarray(image), atype, etype)

    def _resample(self, source: Any, box: Box, factor: float, out: Tuple[int, int], target: str,
                  chw: bool = False) -> Any:
        """The box of `source` (a PIL image or an HWC array, decoded at `factor`) at size `out`
        (torch's result: an HWC view, over CHW memory with `chw`)."""
        box = (box[0] * factor, box[1] * factor, box[2] * factor, box[3] * factor)
        grid = self.crop != "random"
        # torch can't start a resize between two pixels: a random box that DCT scaling moved off
        # whole pixels goes to Pillow (moving it half a pixel costs up to 5 levels on average)
        if self.resizer == "torch" and target in ("RGB", "L") and (grid or all(_whole(v) for v in box)):
            if not isinstance(source, np.ndarray):  # torch wants writable memory: np.array copies
                source = np.array(source if source.mode == target else source.convert(target))
            return _resize_torch(source, box, out, self.resample, grid=grid, chw=chw)
        if isinstance(source, np.ndarray):
            source = _pil().fromarray(source[:, :, 0] if source.shape[2] == 1 else source)
        if (source.mode, target) not in _CONVERT_AFTER:
            source = source.convert(target)  # as the plain path does: convert, then resize
        return source.resize(out, self.resample, box=box, reducing_gap=self.reducing_gap)

    def _padding(self, width: int, height: int, out: Tuple[int, int]) -> Any:
        if self.crop != "center":
            return None
        return center_padding(width, height, out[1], out[0], self.crop_fraction)

    def _decode_pillow(self, data: bytes, target: str) -> Tuple[Any, Box, float, Tuple[int, int], Any]:
        with io.BytesIO(data) as stream:
            image = _pil().open(stream)
            width, height = image.size
            box, out = self.geometry(width, height)
            padding = self._padding(width, height, out)
            reduction = 1
            if image.format == "JPEG":
                reduction = _reduction(box, out if padding is None else padding[0])
                wanted = (max(1, width // reduction), max(1, height // reduction))
                drafted = image.draft("L" if target == "L" else "RGB", wanted)
                if drafted is not None:
                    reduction = round(width / drafted[1][2])  # draft's box: the size over its scale
            image.load()
        return image, box, 1.0 / reduction, out, padding

    def _decode_simplejpeg(self, data: bytes, target: str) -> Optional[Tuple[Any, Box, float, Tuple[int, int], Any]]:
        jpeg = self._jpeg
        try:
            height, width, colorspace, _ = jpeg.decode_jpeg_header(data)
        except ValueError:
            return None  # Pillow decides what is wrong with it
        if colorspace not in ("Gray", "YCbCr"):
            return None  # CMYK/YCCK/RGB JPEGs: Pillow's conversions are the reference
        limit = _pil().MAX_IMAGE_PIXELS
        if limit is not None and height * width > limit:
            return None  # Pillow's decompression-bomb check decides (a warning, or an error past twice it)
        box, out = self.geometry(width, height)
        padding = self._padding(width, height, out)
        # Only 1/2, 1/4, 1/8: libjpeg-turbo's 5/8 decodes as slowly as full size and 6/8, 7/8
        # slower (500x375: 1.18, 1.35, 1.53 ms against 1.21), more than a smaller resize saves.
        reduction = _reduction(box, out if padding is None else padding[0])
        try:
            pixels = jpeg.decode_jpeg(data, "GRAY" if target == "L" else "RGB",
                                      min_height=-(-height // reduction), min_width=-(-width // reduction))
        except ValueError:
            return None  # truncated or corrupt: Pillow raises (or decodes it) as the plain path does
        return pixels, box, _jpeg_factor(width, pixels.shape[1]), out, padding


def _padded(image: np.ndarray, out: Tuple[int, int], corner: Tuple[int, int]) -> np.ndarray:
    """`image` (HWC, or HW) at `corner` (left, top) of a zero image of size `out` (width, height)."""
    height, width = image.shape[:2]
    padded = np.zeros((out[1], out[0]) + image.shape[2:], image.dtype)
    padded[corner[1]:corner[1] + height, corner[0]:corner[0] + width] = image
    return padded

    def __repr__(self) -> str:
        return (f"imagehandler({self.imagespec!r}, size={self.size!r}, crop={self.crop!r}, "
                f"backend={self.backend!r}, resizer={self.resizer!r})")


def _reduction(box: Box, out: Tuple[int, int]) -> int:
    """The largest DCT reduction (8, 4, 2 or 1) at which the box still covers the output."""
    ratio = min((box[2] - box[0]) / out[0], (box[3] - box[1]) / out[1])
    for reduction in (8, 4, 2):
        if ratio >= reduction:
            return reduction
    return 1


def _jpeg_factor(original: int, decoded: int) -> float:
    """The M/8 scaling factor libjpeg-turbo used: decoded = ceil(original * M / 8)."""
    for m in range(1, 17):
        if math.ceil(original * m / 8) == decoded:
            return m / 8
    return decoded / original


def _torch_axis(start: float, end: float, out: int, size: int, support: float,
                grid: bool) -> Tuple[int, int, int, float]:
    """One axis of a box resize as torch can do it: (first, last) source pixel to crop, the
    first output pixel to keep, and the scale (source pixels per output pixel).

    Pillow samples output pixel i of a box resize at start + (i + 0.5) * scale; torch samples
    at crop start + (i + 0.5) * scale, so the crop must start on that grid. With `grid` (a
    center crop: Resize, then CenterCrop) the box lies on the grid of a whole-image resize: it
    is resized from pixel 0 with its neighbours, then cut out (k output pixels skipped).
    Otherwise (random crops: RandomResizedCrop's order) the box, on whole pixels, is cut out,
    then resized (a box off them, which callers avoid, has its edges moved to the nearest one).
    """
    scale = (end - start) / out
    skip = round(start / scale)
    if grid and abs(start - skip * scale) < 1e-6:
        if _whole(size / scale):
            return 0, size, skip, scale  # exactly Resize's grid: torch computes that scale itself
        last = min(size, math.ceil(end + support * max(scale, 1.0)) + 1)  # all the filter reads
        return 0, last, skip, scale
    first, last = min(round(start), size - 1), min(size, round(end))
    return first, max(last, first + 1), 0, (max(last, first + 1) - first) / out


def _whole(value: float) -> bool:
    return abs(value - round(value)) < 1e-6


_pool_thread = threading.local()


def _one_intra_op_thread(torch: Any) -> None:
    """On the engine's decode pool threads, torch's intra-op threads only oversubscribe the cores
    the pool already keeps busy (OpenMP's spinning cost ~10% CPU per image here): give each pool
    thread one. With the OpenMP backend the setting is the calling thread's, and torch also keeps
    it as the default of threads that first use torch afterwards (threads that used it before,
    the main thread among them, keep theirs): a thread started later that wants more sets its own."""
    if getattr(_pool_thread, "checked", False):
        return
    _pool_thread.checked = True
    if threading.current_thread().name.startswith(POOL_THREAD_PREFIX) and _openmp(torch):
        torch.set_num_threads(1)


def _openmp(torch: Any) -> bool:
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def _resize_torch(pixels: np.ndarray, box: Box, out: Tuple[int, int], resample: int, grid: bool,
                  chw: bool) -> np.ndarray:
    """The box of an HWC (or HW) uint8 array at size `out` (width, height), resampled by
    torch's antialiased kernels on Pillow's sampling grid (`grid`: see `_torch_axis`); an HWC
    (HW) uint8 view, over CHW memory with `chw` (what torch specs want), else over HWC memory."""
    torch = _torch()
    _one_intra_op_thread(torch)
    kernel, support = _TORCH_KERNELS[resample]
    height, width = pixels.shape[:2]
    x0, x1, skip_x, scale_x = _torch_axis(box[0], box[2], out[0], width, support, grid)
    y0, y1, skip_y, scale_y = _torch_axis(box[1], box[3], out[1], height, support, grid)
    crop = pixels.reshape(height, width, -1)[y0:y1, x0:x1]
    if x1 - x0 < width:
        # torch copies a strided input with its intra-op threads, slowly from a pool thread
        crop = np.ascontiguousarray(crop)
    lengths = ((y1 - y0) / scale_y, (x1 - x0) / scale_x)
    scales: Tuple[Optional[float], Optional[float]]
    if all(_whole(n) for n in lengths):  # a whole-size resize: torch computes the scale as Pillow does
        size, scales = (round(lengths[0]), round(lengths[1])), (None, None)
    else:
        size, scales = (skip_y + out[1], skip_x + out[0]), (1.0 / scale_y, 1.0 / scale_x)
    channels = crop.shape[2]
    result = np.empty((channels, *size) if chw else (*size, channels), np.uint8)
    target = torch.from_numpy(result if chw else result.transpose(2, 0, 1)).unsqueeze(0)
    source = torch.from_numpy(crop.transpose(2, 0, 1)).unsqueeze(0)  # NCHW over channels-last memory
    getattr(torch.ops.aten, kernel).out(source, list(size), False, *scales, out=target)
    view = (result.transpose(1, 2, 0) if chw else result)[skip_y:skip_y + out[1], skip_x:skip_x + out[0]]
    return view[:, :, 0] if channels == 1 else view
