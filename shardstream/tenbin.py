"""webdataset's `tenbin` module: the tensor binary format (`.ten` fields)."""

from ._tenbin import decode_buffer, encode_buffer

__all__ = ["decode_buffer", "encode_buffer"]
