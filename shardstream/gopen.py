"""webdataset's `gopen`: open a URL as a binary stream.

Local paths and file: URLs open directly; http(s) and s3 read through shardstream's async
fetchers (retries, Range resume); `pipe:` runs a shell command only when enabled
(`shardstream.allow_pipe(True)`, `SHARDSTREAM_ALLOW_PIPE=1` or `allow_pipe=True`); every other
scheme goes through fsspec (gs, memory, ...), unless a handler is registered in `gopen_schemes`
for it, as webdataset allows (webdataset's named openers, `gopen_curl` and the rest, are here
to register or call). `USE_AIS_FOR=gs:s3` routes those schemes to `gopen_ais`, as in webdataset.
Under `enforce_security` local files, pipes and `GOPEN_REWRITE` are refused, as in webdataset.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
from typing import IO, Any, Callable, Dict
from urllib.parse import urlparse

from ._base.errors import UsageError
from ._fetch.registry import fetches_natively
from ._fetch.open import open_url, open_writable, use_gopen_schemes
from ._fetch.openers import (
    StreamReader,
    gopen_ais,
    gopen_curl,
    gopen_error,
    gopen_file,
    gopen_gsutil,
    gopen_hf,
    gopen_htgs,
    gopen_pipe,
    open_http,
)
from ._fetch.pipe import Pipe, info, open_pipe, set_options
from ._base.redact import redact
from ._base.security import enforced

__all__ = [
    "Pipe",
    "StreamReader",
    "gopen",
    "gopen_ais",
    "gopen_curl",
    "gopen_error",
    "gopen_file",
    "gopen_gsutil",
    "gopen_hf",
    "gopen_htgs",
    "gopen_pipe",
    "gopen_schemes",
    "info",
    "reader",
    "rewrite_url",
    "set_options",
]

log = logging.getLogger(__name__)


def _default_handler(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    allow = kw.pop("allow_pipe", None)
    if url.startswith("pipe:"):
        return open_pipe(url, mode, bufsize, allow)  # type: ignore[return-value]
    if mode == "rb":
        if fetches_natively(url):  # http(s), s3 and schemes added with register_fetcher
            return open_http(url, bufsize)
        stream = open_url(url, allow_pipe=allow)
        if isinstance(stream, io.FileIO):  # a local file: buffered, as webdataset's (`peek`, `read1`)
            return io.BufferedReader(stream, buffer_size=max(bufsize, io.DEFAULT_BUFFER_SIZE))
        return stream
    return open_writable(url, mode)


_default_handler.shardstream_default = True  # type: ignore[attr-defined]  # (see _fetch.open.user_opener)

# Scheme -> opener(url, mode, bufsize, **kw), with webdataset's keys ("__default__": every other
# scheme). Users may register their own, as with webdataset: the loader, counts and the CLI then
# read that scheme through it too (without retries or Range resume: those are the fetchers').
# Our own way, `_default_handler`, stands where webdataset runs curl or gsutil.
gopen_schemes: Dict[str, Callable[..., Any]] = {
    "__default__": _default_handler,
    **dict.fromkeys(("pipe", "http", "https", "sftp", "ftps", "scp", "gs", "hf"), _default_handler),
    "ais": gopen_ais,
    "htgs": gopen_htgs,
}
for _scheme in os.environ.get("USE_AIS_FOR", "").split(":"):
    if _scheme:
        gopen_schemes[_scheme] = gopen_ais
use_gopen_schemes(gopen_schemes)


def rewrite_url(url: str) -> str:
    """Apply GOPEN_REWRITE="prefix=replacement;..." like webdataset (the first rule that matches)."""
    rules = os.environ.get("GOPEN_REWRITE")
    if not rules:
        return url
    if enforced():
        raise UsageError("rewrite_url: unsafe_gopen is False, cannot rewrite URLs using environment variables")
    for rule in rules.split(";"):
        k, v = rule.split("=", 1)
        new = re.sub("^" + k, v, url)
        if new != url:
            if int(os.environ.get("GOPEN_VERBOSE", 0)):
                log.info("GOPEN REWRITE %s -> %s", redact(url), redact(new))
            return new
    return url


def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    """Open `url` for reading ("rb") or writing ("wb"); "-" is stdin/stdout."""
    assert mode in ("rb", "wb"), mode
    if url == "-":
        return sys.stdin.buffer if mode == "rb" else sys.stdout.buffer
    url = rewrite_url(url)
    scheme = urlparse(url).scheme
    if enforced() and scheme in ("", "file"):
        raise UsageError("gopen: unsafe_gopen is False, cannot open local files", url=url)
    handler = gopen_schemes.get(scheme) if scheme else None
    if handler is None or (getattr(handler, "shardstream_builtin", False) and mode == "rb" and fetches_natively(url)):
        handler = gopen_schemes["__default__"]  # (a fetcher registered for the scheme of one of our openers)
    return handler(url, mode, bufsize, **kw)


def reader(url: str, **kw: Any) -> IO[bytes]:
    """Open `url` for reading."""
    return gopen(url, "rb", **kw)
