"""Writing samples into tar shards: `TarWriter` (one tar) and `ShardWriter` (numbered shards).

Same options, tar members and header fields as webdataset 1.0.2's `writer` module. Destinations
are open binary file objects, local paths, "-" (stdout) and any fsspec URL (`s3://`, `memory://`).

Divergences from webdataset 1.0.2:
- `format=` is honoured (webdataset computes it and never passes it on, so its tars are always
  tarfile's default, PAX); the default, None, still gives PAX, byte for byte like webdataset.
- `pipe:` destinations are refused with UsageError: writing runs no shell commands.
- Writing to "-" flushes stdout on close instead of closing it; os.PathLike paths are accepted.
- Encoding and sample errors are UsageError, a ValueError subclass, where webdataset raises a
  plain ValueError.
- ShardWriter logs "writing <shard>" at INFO level (verbose > 0) instead of printing to stdout,
  and close() may be called twice.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import tarfile
import time
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple, Union

from .encode import make_encoder
from .._base.errors import UsageError
from .._tar.keys import is_meta
from .._fetch.open import open_writable
from .._fetch.pipe import open_pipe

__all__ = ["ShardWriter", "TarWriter", "open_destination"]

log = logging.getLogger(__name__)

_BYTES_LIKE = (bytes, bytearray, memoryview)


def open_destination(url: str) -> Tuple[BinaryIO, bool]:
    """Open a path or URL for binary writing; return (stream, whether closing it is ours to do).

    Raises:
        UsageError: a `pipe:` URL while pipes are not enabled (they run a shell command), an http(s)
            URL, a protocol fsspec does not know or whose package is missing.
    """
    if url == "-":
        return sys.stdout.buffer, False
    if url.startswith("pipe:"):
        return open_pipe(url, "wb"), True  # type: ignore[return-value]
    return open_writable(url), True  # type: ignore[return-value]


def _tar_format(format: Any) -> Optional[int]:  # noqa: A002 - webdataset's option name
    # Accepts tarfile constants and their names ("USTAR_FORMAT"), plus "ustar", "gnu", "pax".
    # (None is tarfile's default, PAX; tarfile.USTAR_FORMAT is 0, so no truth test here.)
    if format is None or format == "":
        return None
    if isinstance(format, str):
        found = getattr(tarfile, format, None)
        if found is None:
            found = getattr(tarfile, format.upper() + "_FORMAT", None)
        if not isinstance(found, int):
            raise UsageError(f"unknown tar format {format!r} (use ustar, gnu or pax)")
        return found
    return format


# Set by the reader on every sample: a member of that name would clash with it when read.
_READER_FIELDS = frozenset(("__key__", "__url__", "__local_path__"))


def _check_names(key: Any, fields: List[str]) -> None:
    """Refuse a sample whose members a reader would not read back as written (webdataset writes
    them): the reader's key is the member name up to the first "." of its last path part, its
    field names are lower-cased, and it skips webdataset's meta members (`__x__`, `__x__/...`)."""
    if not isinstance(key, str) or not key or "\0" in key:
        raise UsageError(f"sample key {key!r}: want a non-empty string without NUL")
    if "." in key.rpartition("/")[2]:
        raise UsageError(f"sample key {key!r}: a '.' in it would end the key there when read (member "
                         f"{key}.<field>); replace it")
    seen: Dict[str, str] = {}
    for field in fields:
        if not field or "\0" in field or "/" in field:
            raise UsageError(f"sample {key!r}: field name {field!r} would not read back (empty, NUL or '/')")
        if field.lower() in seen:
            raise UsageError(f"sample {key!r}: fields {seen[field.lower()]!r} and {field!r} read back as one "
                             "(field names are lower-cased when read)")
        if is_meta(f"{key}.{field}"):
            raise UsageError(f"sample {key!r}: member {key}.{field} reads as a meta member (a name that starts "
                             "and ends with '__', or a '__x__/' folder), which readers skip")
        if field.lower() in _READER_FIELDS:
            raise UsageError(f"sample {key!r}: field {field!r} is one the reader sets itself; drop it before "
                             "writing (a sample read from a shard carries it)")
        seen[field.lower()] = field


class TarWriter:
    """Write samples (dicts with a `__key__`) as tar members named `<key>.<field>`.

    Args:
        fileobj: a binary file object, a path (str or os.PathLike), "-" or an fsspec URL; names
            ending in gz, bz2 or xz are compressed accordingly.
        user, group: owner names in the tar headers.
        mode: permission bits in the tar headers.
        compress: True or "gz", "bz2", "xz"; False for none; None guesses from the file name.
        encoder: True (default encoders), False/None (bytes only), a dict or a callable.
        keep_meta: also write fields whose names start with "_" (except __key__).
        mtime: fixed member mtime, for reproducible tars; None uses the current time.
        format: tar format (tarfile constant or name); None is tarfile's default (PAX).
    """

    def __init__(
        self,
        fileobj: Union[str, BinaryIO],
        user: str = "bigdata",
        group: str = "bigdata",
        mode: int = 0o0444,
        compress: Optional[Union[bool, str]] = None,
        encoder: Union[None, bool, Dict[str, Callable], Callable] = True,
        keep_meta: bool = False,
        mtime: Optional[float] = None,
        format: Any = None,  # noqa: A002
    ) -> None:
        tar_format = _tar_format(format)
        if isinstance(fileobj, os.PathLike):
            fileobj = os.fspath(fileobj)
        self.mtime = mtime
        tarmode = self.tarmode(fileobj, compress)
        self.own_fileobj: Optional[BinaryIO] = None
        self._flush_only: Optional[BinaryIO] = None
        if isinstance(fileobj, str):
            fileobj, owned = open_destination(fileobj)
            if owned:
                self.own_fileobj = fileobj
            else:
                self._flush_only = fileobj
        self.encoder = make_encoder(encoder)
        self.keep_meta = keep_meta
        self.stream = fileobj
        extra = {} if tar_format is None else {"format": tar_format}
        try:
            self.tarstream = tarfile.open(fileobj=fileobj, mode=tarmode, **extra)  # type: ignore[call-overload]  # mode is checked above
        except BaseException:
            if self.own_fileobj is not None:
                self.own_fileobj.close()
            raise
        self.user = user
        self.group = group
        self.mode = mode
        self.compress = compress

    def __enter__(self) -> "TarWriter":
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.close()

    def close(self) -> None:
        """Finish the tar (end-of-archive blocks) and close a stream this writer opened."""
        self.tarstream.close()
        if self.own_fileobj is not None:
            self.own_fileobj.close()
            self.own_fileobj = None
        if self._flush_only is not None:
            self._flush_only.flush()
            self._flush_only = None

    def write(self, obj: Dict[str, Any]) -> int:
        """Encode and write one sample; return the number of payload bytes written.

        Raises:
            UsageError: no `__key__`, a field that is not bytes after encoding, or names that would
                not read back as written, checked on what the encoder returns (an empty key, a
                "." in the key, a meta member name, a field the reader sets, fields that differ only
                in case; webdataset writes them).
        """
        odd = [k for k in obj if not isinstance(k, str) or not k]
        if odd:  # (before the encoder, which indexes field names)
            raise UsageError(f"sample {obj.get('__key__')!r}: field names must be non-empty strings, got {odd[0]!r}")
        obj = self.encoder(obj)
        if "__key__" not in obj:
            raise UsageError("object must contain a __key__")
        # (the names written: an encoder may rename fields, or the key)
        _check_names(obj["__key__"], [k for k in obj if k != "__key__" and (self.keep_meta or k[:1] != "_")])
        for k, v in list(obj.items()):
            if k[0] != "_" and not isinstance(v, _BYTES_LIKE):
                raise UsageError(f"{k} doesn't map to a bytes after encoding ({type(v)})")
        key = obj["__key__"]
        total = 0
        for k in sorted(obj.keys()):
            if k == "__key__" or (not self.keep_meta and k[0] == "_"):
                continue
            v = obj[k]
            if isinstance(v, str):
                v = v.encode("utf-8")
            if not isinstance(v, _BYTES_LIKE):
                raise UsageError(f"converter didn't yield bytes: {k}, {type(v)}")
            info = tarfile.TarInfo(key + "." + k)
            info.size = len(v)
            info.mtime = self.mtime if self.mtime is not None else time.time()
            info.mode = self.mode
            info.uname = self.user
            info.gname = self.group
            self.tarstream.addfile(info, io.BytesIO(v))
            total += info.size
        return total

    @staticmethod
    def tarmode(fileobj: Any, compress: Optional[Union[bool, str]] = None) -> str:
        """Return the tarfile stream mode ("w|", "w|gz", ...) for a destination and `compress`."""
        name = fileobj if isinstance(fileobj, str) else ""
        if compress is False:
            return "w|"
        if compress is True or compress == "gz" or name.endswith("gz"):
            return "w|gz"
        if compress == "bz2" or name.endswith("bz2"):
            return "w|bz2"
        if compress == "xz" or name.endswith("xz"):
            return "w|xz"
        return "w|"


class ShardWriter:
    """Write samples into numbered shards, starting a new one after `maxcount` samples or
    `maxsize` payload bytes.

    Args:
        pattern: a %-pattern for shard names, e.g. "out-%06d.tar" (paths or fsspec URLs).
        maxcount: samples per shard at most.
        maxsize: payload bytes per shard, after which the next sample starts a new shard.
        post: called with each finished shard's name.
        start_shard: the number of the first shard.
        verbose: log each new shard at INFO level when > 0.
        opener: called with a shard name to get a binary stream (left open, as in webdataset).
        **kw: TarWriter options.
    """

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100000,
        maxsize: float = 3e9,
        post: Optional[Callable[[str], Any]] = None,
        start_shard: int = 0,
        verbose: int = 1,
        opener: Optional[Callable[[str], Any]] = None,
        **kw: Any,
    ) -> None:
        self.verbose = verbose
        self.kw = kw
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.post = post
        self.tarstream: Optional[TarWriter] = None
        self.shard = start_shard
        self.pattern = pattern
        self.total = 0
        self.count = 0
        self.size = 0
        self.fname: Optional[str] = None
        self.opener = opener
        self._closed = False
        self.next_stream()

    def next_stream(self) -> None:
        """Finish the current shard and open the next one."""
        self.finish()
        self.fname = self.pattern % self.shard
        if self.verbose:
            log.info(
                "writing %s (last shard: %d samples, %.1f GB; %d samples in all)",
                self.fname, self.count, self.size / 1e9, self.total,
            )
        self.shard += 1
        target = self.opener(self.fname) if self.opener else self.fname
        self.tarstream = TarWriter(target, **self.kw)
        self.count = 0
        self.size = 0

    def write(self, obj: Dict[str, Any]) -> None:
        """Write a sample, first starting a new shard when the current one is full."""
        if self._closed:
            raise UsageError("ShardWriter.write() after close()")
        if self.tarstream is None or self.count >= self.maxcount or self.size >= self.maxsize:
            self.next_stream()
        assert self.tarstream is not None  # next_stream opened one
        self.size += self.tarstream.write(obj)
        self.count += 1
        self.total += 1

    def finish(self) -> None:
        """Close the current shard and call `post` with its name."""
        if self.tarstream is not None:
            self.tarstream.close()
            assert self.fname is not None
            if callable(self.post):
                self.post(self.fname)
            self.tarstream = None

    def close(self) -> None:
        """Finish the last shard."""
        self.finish()
        self._closed = True

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *args: Any, **kw: Any) -> None:
        self.close()
