"""webdataset's `writer` module: TarWriter, ShardWriter and the encoders, under the same names.

The implementation lives in `_writer.encode` (encoders) and `_writer.tarwriter` (destinations and writers); the
divergences from webdataset are listed in their docstrings.
"""

from ._writer.encode import (
    add_handlers,
    bytestr,
    cbor_dumps,
    default_handlers,
    encode_based_on_extension,
    encode_based_on_extension1,
    imageencoder,
    make_encoder,
    make_handlers,
    mp_dumps,
    numpy_dumps,
    numpy_npz_dumps,
    tenbin_dumps,
    torch_dumps,
)
from ._writer.tarwriter import ShardWriter, TarWriter
from .gopen import gopen

__all__ = [
    "ShardWriter",
    "TarWriter",
    "add_handlers",
    "bytestr",
    "cbor_dumps",
    "default_handlers",
    "encode_based_on_extension",
    "encode_based_on_extension1",
    "gopen",
    "imageencoder",
    "make_encoder",
    "make_handlers",
    "mp_dumps",
    "numpy_dumps",
    "numpy_npz_dumps",
    "tenbin_dumps",
    "torch_dumps",
]
