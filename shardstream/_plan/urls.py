"""Turning a shard spec into a list of URLs: braces, `::` lists, `${VAR}` substitution.

This layer opens nothing. Globs and prefixes that need a listing are expanded by the fetch layer.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, List, Union
from urllib.parse import unquote

import braceexpand

from .._base.errors import UsageError

__all__ = ["envlookup", "envsubst", "expand_urls", "shard_name", "split_sources", "without_query"]

_VAR = re.compile(r"\$\{(\w+)\}")


def envlookup(m: "re.Match[str]") -> str:
    """The value for a `${NAME}` match `m`: WDS_NAME, as webdataset reads it. Only WDS_ names:
    a spec copied from elsewhere must not send your other variables (`${AWS_SECRET_ACCESS_KEY}`)
    to its server, in a URL that no redaction can tell from a shard's name.

    Raises:
        UsageError: WDS_NAME is not set.
    """
    name = m.group(1)
    if "WDS_" + name in os.environ:
        return os.environ["WDS_" + name]
    raise UsageError(f"shard spec refers to ${{{name}}} but WDS_{name} is not set (a spec reads only "
                     "WDS_ variables, as in webdataset)")


def envsubst(s: str) -> str:
    """Replace `${NAME}` in `s` by the value of WDS_NAME, repeatedly, at most ten rounds."""
    for _ in range(10):
        expanded = _VAR.sub(envlookup, s)
        if expanded == s:
            break
        s = expanded
    return s


def split_sources(spec: str) -> List[str]:
    """A string spec's `::`-separated sources. A `::` inside brackets is no separator: it is an
    IPv6 host (`http://[::1]:8000/a.tar`), which webdataset cuts into pieces."""
    if "[" not in spec:
        return spec.split("::")
    parts, depth, start, i = [], 0, 0, 0
    while i < len(spec):
        if spec[i] == "[":
            depth += 1
        elif spec[i] == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and spec.startswith("::", i):
            parts.append(spec[start:i])
            start = i = i + 2
            continue
        i += 1
    parts.append(spec[start:])
    return parts


def expand_urls(urls: Union[str, Iterable[str]]) -> List[str]:
    """Expand a shard spec into a list of URLs.

    A string is split on `::` (not inside the brackets of an IPv6 host), each part gets `${VAR}` substitution and brace expansion
    (`train-{000..099}.tar`). Any other iterable is taken as a list of URLs as it is (the 0.2.x
    behaviour that OpenCLIP relies on; webdataset 1.0.2 crashes on a list).
    """
    if isinstance(urls, os.PathLike):
        urls = os.fspath(urls)  # type: ignore[assignment]
    if isinstance(urls, str):
        result: List[str] = []
        for part in split_sources(urls):
            result.extend(braceexpand.braceexpand(envsubst(part)))
    else:  # (pathlib paths as the strings they stand for)
        result = [os.fspath(url) if isinstance(url, os.PathLike) else url for url in urls]
    if any(isinstance(url, str) and not url.strip() for url in result):
        raise UsageError(f"an empty shard URL in {urls!r} (a stray '::', or an empty list entry)")
    return result


def without_query(url: str) -> str:
    """An http(s) URL without its query and fragment (a signed URL's signature changes, the
    object does not); any other URL or path as it is: in an S3 key or a file name, `?` and `#`
    are part of the name."""
    if url[:8].lower().startswith(("http://", "https://")):
        return url.split("#", 1)[0].split("?", 1)[0]
    return url


def shard_name(url: str) -> str:
    """The file name of a shard URL or path, without an http(s) query or fragment, and an
    http(s) name percent-decoded (`a%20b.tar` is the file `a b.tar`): what sizes.json keys,
    whether the folder was indexed on disk or over HTTP."""
    name = without_query(url).rstrip("/").rsplit("/", 1)[-1]
    return unquote(name) if url[:8].lower().startswith(("http://", "https://")) else name
