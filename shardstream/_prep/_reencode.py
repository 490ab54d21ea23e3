"""Image re-encoding for `create --max-side/--quality`: downscale, apply EXIF orientation, JPEG.

Deterministic for a given Pillow build: the same bytes in give the same bytes out.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Dict, Optional

from ._options import Reencode
from ._rows import IMAGE_SUFFIXES

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["reencode_fields", "reencode_image"]


def reencode_image(data: bytes, settings: Reencode) -> Optional[bytes]:
    """JPEG bytes of the image, or None where it stays as it is (within `max_side`, and only
    downscaling was asked for). Raises what Pillow raises for bytes that are no image."""
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as opened:
        side = settings.max_side
        too_big = side is not None and max(opened.size) > side
        if not too_big and not settings.all_images:
            return None
        if side is not None and too_big:
            opened.thumbnail((side, side), Image.Resampling.BICUBIC)  # JPEG: decodes at a reduced scale first
        else:
            opened.load()
        image: "Image.Image" = ImageOps.exif_transpose(opened)
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            rgba = image.convert("RGBA")
            image = Image.new("RGB", rgba.size, (255, 255, 255))
            image.paste(rgba, mask=rgba.getchannel("A"))
        elif image.mode.startswith("I;16") or image.mode == "I":
            image = _grey_to_8bit(image)
        elif image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        out = io.BytesIO()
        image.save(out, "JPEG", quality=settings.quality)
        return out.getvalue()


def _grey_to_8bit(image: "Image.Image") -> "Image.Image":
    """A 16-bit grey image (a 16-bit PNG opens as I;16 or I) scaled to 8 bits, not clipped at 255
    as Pillow's convert does (which turns it nearly white). An I image whose values fit 8 bits
    keeps them."""
    import numpy as np
    from PIL import Image

    values = np.asarray(image, dtype=np.float64)
    wide = image.mode.startswith("I;16") or (values.size and values.max() > 255)
    scaled = values / 257.0 if wide else values
    return Image.fromarray(np.clip(scaled + 0.5, 0, 255).astype(np.uint8), "L")


def reencode_fields(fields: Dict[str, bytes], settings: Reencode) -> Dict[str, bytes]:
    """The sample's fields with every image field re-encoded (and renamed to jpg) as asked."""
    result: Dict[str, bytes] = {}
    for ext, data in fields.items():
        last = ext.rpartition(".")[2]
        if last in IMAGE_SUFFIXES:
            encoded = reencode_image(data, settings)
            if encoded is not None:
                ext, data = ext[: len(ext) - len(last)] + "jpg", encoded
        if ext in result:
            raise ValueError(f"re-encoding gives two {ext!r} fields")
        result[ext] = data
    return result
