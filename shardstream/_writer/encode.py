"""Encoders for writing samples: field values to bytes, chosen by the field's extension.

The same encoders, by the same extensions, as webdataset 1.0.2's `writer` module: text, ints,
json, npy/npz, msgpack, cbor, tenbin, pickle, torch and images (PIL images or arrays).
Divergences from webdataset 1.0.2 (each only where webdataset fails or misleads):
- cbor uses `cbor2` when the `cbor` package (webdataset's choice) is not installed.
- "pbm" and "pgm" fields are written (as 1-bit / 8-bit gray netpbm); webdataset asks Pillow for
  writers named PBM/PGM, which do not exist, and raises KeyError.
- Encoding errors are UsageError, a ValueError subclass, where webdataset raises ValueError.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re
from typing import Any, Callable, Dict, Union

import numpy as np

from .._decode import tenbin as _tenbin
from .._base.errors import UsageError

__all__ = [
    "add_handlers",
    "bytestr",
    "cbor_dumps",
    "default_handlers",
    "encode_based_on_extension",
    "encode_based_on_extension1",
    "imageencoder",
    "make_encoder",
    "make_handlers",
    "mp_dumps",
    "numpy_dumps",
    "numpy_npz_dumps",
    "tenbin_dumps",
    "torch_dumps",
]


_NETPBM_MODES = {"PBM": "1", "PGM": "L"}


def imageencoder(image: Any, format: str = "PNG") -> bytes:  # noqa: A002 - webdataset's name
    """Compress a PIL image or an HWC/HW array (uint8, or float in [0, 1]) with Pillow.

    Raises:
        ValueError: float values outside [0, 1].
    """
    import PIL.Image

    assert isinstance(image, (PIL.Image.Image, np.ndarray)), type(image)
    if isinstance(image, np.ndarray):
        if image.dtype in (np.dtype("f"), np.dtype("d")):
            if np.amin(image) <= -0.001 or np.amax(image) >= 1.001:
                raise ValueError(f"image values out of range {np.amin(image)} {np.amax(image)}")
            image = np.array(np.clip(image, 0.0, 1.0) * 255.0, "uint8")
        assert image.ndim in (2, 3)
        if image.ndim == 3:
            assert image.shape[2] in (1, 3)
        image = PIL.Image.fromarray(image)
    if format.upper() == "JPG":
        format = "JPEG"
    elif format.upper() in {"IMG", "IMAGE"}:
        format = "PPM"
    elif format.upper() in _NETPBM_MODES:
        # Pillow has no "PBM"/"PGM" writer (webdataset raises KeyError): its PPM writer picks
        # the variant from the mode, so convert to that mode and write PPM.
        image = image.convert(_NETPBM_MODES[format.upper()])
        format = "PPM"
    # Case-sensitive on purpose: webdataset passes quality=100 for "JPEG" and "tiff" only.
    opts = {"quality": 100} if format in {"JPEG", "tiff"} else {}
    with io.BytesIO() as result:
        image.save(result, format=format, **opts)
        return result.getvalue()


def bytestr(data: Any) -> bytes:
    """Return bytes as they are, and anything else as its ASCII `str()`."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("ascii")
    return str(data).encode("ascii")


def torch_dumps(data: Any) -> bytes:
    """Serialize with torch.save."""
    import torch

    stream = io.BytesIO()
    torch.save(data, stream)
    return stream.getvalue()


def numpy_dumps(data: np.ndarray) -> bytes:
    """Serialize an array in `.npy` format."""
    stream = io.BytesIO()
    np.lib.format.write_array(stream, data)
    return stream.getvalue()


def numpy_npz_dumps(data: Dict[str, np.ndarray]) -> bytes:
    """Serialize a dict of arrays in compressed `.npz` format."""
    assert isinstance(data, dict)
    for k, v in data.items():
        assert isinstance(k, str)
        assert isinstance(v, np.ndarray)
    stream = io.BytesIO()
    np.savez_compressed(stream, **data)  # type: ignore[arg-type]  # numpy's stub types **kwds as its flags
    return stream.getvalue()


def tenbin_dumps(x: Any) -> memoryview:
    """Serialize an array, or a list of arrays, in tenbin (`.ten`) format."""
    return memoryview(_tenbin.encode_buffer(x if isinstance(x, list) else [x]))


def cbor_dumps(x: Any) -> bytes:
    """Serialize with `cbor` (webdataset's choice) or, when it is missing, `cbor2`."""
    try:
        import cbor  # type: ignore
    except ImportError:
        import cbor2 as cbor
    return cbor.dumps(x)


def mp_dumps(x: Any) -> bytes:
    """Serialize with msgpack."""
    import msgpack

    return msgpack.packb(x)


def add_handlers(d: Dict[str, Callable], keys: Union[str, list], value: Callable) -> None:
    """Register `value` in `d` for each of `keys` (a list or a space-separated string)."""
    if isinstance(keys, str):
        keys = keys.split()
    for k in keys:
        d[k] = value


def _image_encoder(fmt: str) -> Callable[[Any], bytes]:
    return lambda data: imageencoder(data, fmt)


def make_handlers() -> Dict[str, Callable[[Any], bytes]]:
    """Return webdataset's default encoders, by extension."""
    handlers: Dict[str, Callable[[Any], bytes]] = {}
    add_handlers(handlers, "cls cls2 class count index inx id", lambda x: str(x).encode("ascii"))
    add_handlers(handlers, "txt text transcript", lambda x: x.encode("utf-8"))
    add_handlers(handlers, "html htm", lambda x: x.encode("utf-8"))
    add_handlers(handlers, "pyd pickle", pickle.dumps)  # writing pickles is safe; reading is opt-in
    add_handlers(handlers, "pth", torch_dumps)
    add_handlers(handlers, "npy", numpy_dumps)
    add_handlers(handlers, "npz", numpy_npz_dumps)
    add_handlers(handlers, "ten tenbin tb", tenbin_dumps)
    add_handlers(handlers, "json jsn", lambda x: json.dumps(x).encode("utf-8"))
    add_handlers(handlers, "mp msgpack msg", mp_dumps)
    add_handlers(handlers, "cbor", cbor_dumps)
    add_handlers(handlers, "jpg jpeg img image", _image_encoder("jpg"))
    for fmt in ("png", "pbm", "pgm", "ppm"):
        add_handlers(handlers, fmt, _image_encoder(fmt))
    add_handlers(handlers, "tiff tif", _image_encoder("tiff"))
    return handlers


default_handlers = make_handlers()


def encode_based_on_extension1(data: Any, tname: str, handlers: Dict[str, Callable]) -> Any:
    """Encode one value by the extension of its field name; bytes and str need no handler.

    Metadata fields (names starting with "_") must be str and are returned unchanged; a ".gz"
    suffix gzip-compresses the encoded value.

    Raises:
        UsageError: metadata that is not a str, or no handler for the extension.
    """
    if tname[0] == "_":
        if not isinstance(data, str):
            raise UsageError("the values of metadata must be of string type")
        return data
    compress = tname.endswith(".gz")
    if compress:
        tname = tname[:-3]
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, bytes):
        extension = re.sub(r".*\.", "", tname).lower()
        handler = handlers.get(extension)
        if handler is None:
            raise UsageError(f"no handler found for {extension}")
        data = handler(data)
    return gzip.compress(data) if compress else data


def encode_based_on_extension(sample: Dict[str, Any], handlers: Dict[str, Callable]) -> Dict[str, Any]:
    """Encode every field of a sample with `encode_based_on_extension1`."""
    return {k: encode_based_on_extension1(v, k, handlers) for k, v in list(sample.items())}


def make_encoder(spec: Union[bool, None, dict, Callable]) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    """Turn an `encoder=` option into a sample -> encoded sample function.

    False/None: no encoding; True: the default handlers; a dict: those handlers by extension;
    a callable: used as it is.
    """
    if spec is False or spec is None:
        return lambda sample: sample
    if callable(spec):
        return spec
    if isinstance(spec, dict) or spec is True:
        handlers = default_handlers if spec is True else spec
        return lambda sample: encode_based_on_extension(sample, handlers)
    raise UsageError(f"{spec}: unknown encoder spec")
