"""Image decoding with webdataset's image specs ("pil", "rgb8", "torchrgb", ...).

Results are identical to webdataset 1.0.2's `ImageHandler`: Pillow opens the bytes, loads them
and converts to L/RGB/RGBA; numpy specs give HWC arrays (uint8, or float32 in [0, 1]); torch
specs give CHW tensors (HW for L). No `draft()` shortcuts, since they change the pixels: those
live in the opt-in fused path (`imagehandler(spec, size=..., crop=...)`, `_decode.fusedimage`).

Array specs of a YCbCr or grayscale JPEG skip Pillow where simplejpeg is installed (the `jpeg`
extra; `SHARDSTREAM_SIMPLEJPEG=0` turns it off): libjpeg-turbo decodes straight to RGB (or gray)
with the GIL released throughout, the same library and settings (accurate DCT, fancy upsampling)
as Pillow's decoder where Pillow is built on libjpeg-turbo too (the only case it is used), so the
pixels are Pillow's, bit for bit. The CPU per image is the same, but Pillow holds the GIL for its
Python parts (opening, marker parsing, the tile loop, `np.asarray`'s packing), which bounds one
process on many cores: on 16, `decode("rgb8")` + a crop ran at 965-979 samples/s with Pillow and
2,237-2,439 with simplejpeg. Anything else (CMYK, a YCbCr JPEG asked for as L, RGBA, huge images,
any libjpeg warning or error) goes to Pillow, which decides as before. PIL specs keep Pillow's
decode: its image carries the file's `info` (ICC profile, EXIF, DPI).
"""

from __future__ import annotations

import io
import os
import re
from typing import Any, Iterable, Optional, Set

import numpy as np

__all__ = ["FieldHandler", "IMAGE_EXTENSIONS", "ImageHandler", "imagehandler", "imagespecs", "last_extension",
           "simplejpeg_or_none"]

# The extensions Pillow can open (webdataset's list, taken from PIL.Image.EXTENSION).
IMAGE_EXTENSIONS = (
    "blp bmp dib bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr gif grib h5 hdf png apng "
    "jp2 j2k jpc jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg mpg mpeg msp pcd pxr pbm pgm "
    "ppm pnm psd bw rgb rgba sgi ras tga icb vda vst webp wmf emf xbm xpm"
).split()

# spec -> (array type, element type, mode)
imagespecs = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}

_LAST_EXTENSION = re.compile(r".*[.]")


def last_extension(key: str) -> str:
    """Return what follows the last dot of `key` (all of it if there is none).

    Same as webdataset's `re.sub(r".*[.]", "", key)`, without the regex for ordinary keys; the
    regex is kept for keys holding a newline, where `.` stops matching and results differ.
    """
    if "\n" in key:
        return _LAST_EXTENSION.sub("", key)
    return key.rpartition(".")[2]


_pil_image: Any = None


def _pil():
    # Pillow is optional and slow to import; look it up once, not per image.
    global _pil_image
    if _pil_image is None:
        import PIL.Image

        _pil_image = PIL.Image
    return _pil_image


_simplejpeg_module: Any = False  # False: not looked up yet; None: not installed (or turned off)
_JPEG_START = b"\xff\xd8\xff"
_FAST_COLORSPACES = {"rgb": ("YCbCr", "Gray"), "l": ("Gray",)}  # a YCbCr JPEG as L: Pillow's luma, not Y


def simplejpeg_or_none() -> Any:
    """The simplejpeg module, or None where it is not installed (the fused path's backend)."""
    try:
        import simplejpeg  # type: ignore
    except ImportError:
        return None
    return simplejpeg


def _simplejpeg() -> Any:
    """simplejpeg where the plain path may use it: installed, not turned off, and Pillow decoding
    with libjpeg-turbo too (IJG libjpeg 7 and later upsample chroma differently: other pixels)."""
    global _simplejpeg_module
    if _simplejpeg_module is False:
        module = None
        if os.environ.get("SHARDSTREAM_SIMPLEJPEG", "1").lower() not in ("0", "false", "no", "off"):
            module = simplejpeg_or_none()
            if module is not None:
                from PIL import features

                if not features.check_feature("libjpeg_turbo"):
                    module = None
        _simplejpeg_module = module
    return _simplejpeg_module


def _jpeg_pixels(data: bytes, mode: str) -> Optional[np.ndarray]:
    """The pixels Pillow would give for `data` converted to `mode` ("rgb": HWC, "l": HW), decoded
    by simplejpeg; None where this path does not apply, and Pillow decides."""
    colorspaces = _FAST_COLORSPACES.get(mode)
    if colorspaces is None or data[:3] != _JPEG_START:
        return None
    simplejpeg = _simplejpeg()
    if simplejpeg is None:
        return None
    try:
        height, width, colorspace, _subsampling = simplejpeg.decode_jpeg_header(data)
        limit = _pil().MAX_IMAGE_PIXELS
        if colorspace not in colorspaces or (limit is not None and height * width > limit):
            return None  # (over the limit: Pillow's decompression-bomb warning or error)
        # strict: libjpeg's warnings (a cut-short file, a corrupt segment) are errors, so that a
        # damaged JPEG gets Pillow's result or Pillow's error, never libjpeg's repair.
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB" if mode == "rgb" else "GRAY", strict=True)
    except Exception:  # whatever failed, Pillow decides (and raises its own error if it fails too)
        return None
    return pixels if mode == "rgb" else pixels.reshape(pixels.shape[:2])


class FieldHandler:
    """A decode handler for the fields whose last extension is in `extensions` (lower case):
    `decode_field(data, extension)` for those, None for the others (the next handler's turn)."""

    extensions: Set[str]

    def accepts(self, key: str) -> bool:
        """True when a field named `key` is one this handler decodes (used to skip it early)."""
        return last_extension(key).lower() in self.extensions

    def __call__(self, key: str, data: bytes) -> Optional[Any]:
        extension = last_extension(key).lower()
        if extension not in self.extensions:
            return None
        return self.decode_field(data, extension)

    def decode_field(self, data: bytes, extension: str) -> Any:  # pragma: no cover - subclasses override
        raise NotImplementedError


class ImageHandler(FieldHandler):
    """Decode image bytes according to `imagespec`; return None for other extensions.

    Args:
        imagespec: one of the keys of `imagespecs`, e.g. "rgb8", "torchrgb", "pil".
        extensions: the (lower-case) extensions this handler decodes.

    Raises:
        ValueError: unknown image spec.
    """

    def __init__(self, imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> None:
        if imagespec not in imagespecs:
            raise ValueError("Unknown imagespec: %s" % imagespec)
        self.imagespec = imagespec.lower()
        self.extensions = set(extensions)

    def decode_field(self, data: bytes, extension: str) -> Any:
        return self.decode(data)

    def decode(self, data: bytes) -> Any:
        """Decode image bytes regardless of extension."""
        atype, etype, mode = imagespecs[self.imagespec]
        if atype != "pil":
            fast = _jpeg_pixels(data, mode)
            if fast is not None:
                return _to_array(fast, atype, etype)
        with io.BytesIO(data) as stream:
            img = _pil().open(stream)
            img.load()
            # convert() copies even when the mode already matches; a PIL result needs that copy
            # (a plain Image, detached from the closed stream), an array result does not.
            if atype == "pil" or img.mode != mode.upper():
                img = img.convert(mode.upper())
        if atype == "pil":
            return img
        pixels = np.asarray(img)
        if _fix_channels(pixels, mode) is pixels:  # always, in practice: convert() did the work
            return _to_array(pixels, atype, etype)
        # webdataset's order, which matters only when a channel fix-up happens.
        if etype == "float":
            pixels = pixels.astype(np.float32) / 255.0
        pixels = _fix_channels(pixels, mode)
        if atype == "numpy":
            return pixels
        import torch

        if pixels.ndim == 3:
            return torch.from_numpy(pixels.transpose(2, 0, 1).copy())
        return torch.from_numpy(pixels.copy())


def _to_array(pixels: np.ndarray, atype: str, etype: Optional[str]) -> Any:
    # HWC -> CHW first, so that the float conversion also does the layout copy in the same pass;
    # the float32 values are those of webdataset's `astype(float32) / 255.0`.
    if atype == "torch" and pixels.ndim == 3:
        pixels = pixels.transpose(2, 0, 1)
    if etype == "float":
        pixels = pixels.astype(np.float32, order="C")
        pixels /= 255.0
    elif atype == "torch" and not (pixels.flags.writeable and pixels.flags.c_contiguous):
        pixels = pixels.copy()  # np.asarray(img) is read-only; torch wants writable memory
    if atype == "numpy":
        return pixels
    import torch

    return torch.from_numpy(pixels)


def _fix_channels(result: np.ndarray, mode: str) -> np.ndarray:
    # After convert() the channel count already matches; webdataset keeps these fix-ups, and so
    # do we, so that any Pillow mode that converts oddly still gives the same shapes.
    assert result.ndim in (2, 3), result.shape
    if mode == "l":
        if result.ndim == 3:
            result = np.mean(result[:, :, :3], axis=2)
    elif mode == "rgb":
        if result.ndim == 2:
            result = np.repeat(result[:, :, np.newaxis], 3, axis=2)
        elif result.shape[2] == 4:
            result = result[:, :, :3]
    elif mode == "rgba":
        if result.ndim == 2:
            result = np.repeat(result[:, :, np.newaxis], 4, axis=2)
            result[:, :, 3] = 255
        elif result.shape[2] == 3:
            result = np.concatenate([result, 255 * np.ones(result.shape[:2])], axis=2)
    return result


def imagehandler(imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS, **fused: Any) -> Any:
    """Create an ImageHandler (webdataset's lower-case alias).

    With keyword options (`size=224, crop="center"`, ...) it returns the fused decode + crop +
    resize handler instead (`_decode.fusedimage.FusedImageHandler`, which documents the options).
    """
    if not fused:
        return ImageHandler(imagespec, extensions)
    from .fusedimage import FusedImageHandler

    return FusedImageHandler(imagespec, extensions, **fused)
