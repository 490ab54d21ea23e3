"""Where `create` and `index` write: a local directory or any fsspec URL (s3://, gs://, memory://).

Local files are written under a hidden temporary name inside the directory and renamed when
complete, so a reader never sees half a shard and nothing lands outside DEST. Remote objects
are written through fsspec; a failed write is discarded, not committed.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, BinaryIO, Iterator, List, Optional, Tuple

from .._base.errors import UsageError
from .._base.processes import left_by_dead_writer, temp_name
from .._fetch.open import local_path_of
from .._base.redact import redact

__all__ = ["Destination"]

# fsspec protocols of object stores: a "folder" is a key prefix, and the first path part a bucket.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})


class Destination:
    """A directory to write named files into (picklable: workers rebuild their own client)."""

    def __init__(self, url: str) -> None:
        if url.startswith(("http://", "https://", "pipe:")) or url == "-":
            raise UsageError(f"cannot write to {redact(url)}: give a directory or a writable URL (s3://, gs://, ...)")
        self.url = url.rstrip("/") or url
        self.local: Optional[str] = local_path_of(url)
        self._fs: Optional[Tuple[Any, str]] = None

    def __getstate__(self) -> dict:
        return {"url": self.url, "local": self.local, "_fs": None}

    def _remote(self) -> Tuple[Any, str]:
        if self._fs is None:
            import fsspec

            try:
                self._fs = fsspec.core.url_to_fs(self.url)
            except (ImportError, ValueError) as exn:
                raise UsageError(f"cannot write to {redact(self.url)}: {exn}") from None
        return self._fs

    def _named(self, name: str) -> str:
        """`name` if it names a file directly in this destination; else a UsageError. A shard's
        name comes from its URL (percent-decoded): `.%2F..%2F..%2Fx.tar` must not write, or
        delete, `../../x.tar.idx` outside the destination."""
        separators = {"/", os.sep, os.altsep or "/"}
        if (not name or name in (".", "..") or "\0" in name or any(sep in name for sep in separators)
                or os.path.isabs(name)):
            raise UsageError(f"refusing to write {name!r} in {redact(self.url)}: not a plain file name "
                             "(a shard URL whose name holds a path, after percent-decoding)")
        return name

    def where(self, name: str) -> str:
        """The path or URL of `name` in this destination (redact before showing it)."""
        name = self._named(name)
        return os.path.join(self.local, name) if self.local is not None else f"{self.url}/{name}"

    def prepare(self) -> None:
        """Create the directory (local) or check that it can be reached (remote). Temp files
        of this host's writers that are gone (a worker killed mid-shard) are removed."""
        if self.local is not None:
            os.makedirs(self.local, exist_ok=True)
            for name in os.listdir(self.local):
                if left_by_dead_writer(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.local, name))
            return
        fs, root = self._remote()
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        if protocols & _OBJECT_STORES:  # (no folders to make; `makedirs` would create a missing bucket)
            bucket = root.split("/", 1)[0]
            if not fs.exists(bucket):
                raise UsageError(f"cannot write to {redact(self.url)}: no bucket {bucket!r} (or no access to it); "
                                 "create it first (a mistyped name would have made a new bucket)")
            return
        with contextlib.suppress(NotImplementedError):
            fs.makedirs(root, exist_ok=True)

    def exists(self, name: str) -> bool:
        name = self._named(name)
        if self.local is not None:
            return os.path.exists(os.path.join(self.local, name))
        fs, root = self._remote()
        return bool(fs.exists(f"{root}/{name}"))

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[BinaryIO]:
        """A binary stream for `name`; the file appears only when the block ends without error."""
        name = self._named(name)
        if self.local is not None:
            final = os.path.join(self.local, name)
            temp = os.path.join(self.local, temp_name(name))
            try:
                with open(temp, "wb") as f:
                    yield f
                os.replace(temp, final)
            finally:
                if os.path.exists(temp):
                    os.unlink(temp)
            return
        fs, root = self._remote()
        f = fs.open(f"{root}/{name}", "wb")
        try:
            yield f
        except BaseException:
            discard = getattr(f, "discard", None)
            if discard is not None:
                discard()
            raise
        f.close()

    def names(self) -> List[str]:
        """The names of the files directly in this destination."""
        if self.local is not None:
            return sorted(n for n in os.listdir(self.local) if os.path.isfile(os.path.join(self.local, n)))
        fs, root = self._remote()
        try:
            listed = fs.ls(root, detail=False)
        except FileNotFoundError:  # an object store prefix with nothing under it yet
            return []
        return sorted(str(path).rstrip("/").rsplit("/", 1)[-1] for path in listed)

    def remove(self, name: str) -> None:
        """Delete `name` if it is there."""
        name = self._named(name)
        if self.local is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.local, name))
            return
        fs, root = self._remote()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{root}/{name}")

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.open(name) as f:
            f.write(data)
