"""webdataset's member-naming rules: which members are meta files, and how a member name splits
into a sample key and a field name (extension). Pure functions, no I/O.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

__all__ = ["META_PATTERN", "base_plus_ext", "is_meta"]

META_PATTERN = r"__[^/]*__($|/)"
_META = re.compile(META_PATTERN)
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def base_plus_ext(path: str) -> Tuple[Optional[str], Optional[str]]:
    """Split "dir/name.a.b" into ("dir/name", "a.b"); (None, None) when there is no extension.

    Same result as webdataset's regex; the common case avoids the regex.
    """
    slash = path.rfind("/")
    dot = path.find(".", slash + 1)
    if dot > slash + 1 and "\n" not in path:
        return path[:dot], path[dot + 1 :]
    match = _KEY.match(path)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def is_meta(name: str) -> bool:
    """True for webdataset's meta members (`__index__`, `__meta__/x`), which are skipped."""
    if not name.startswith("__"):
        return False
    return ("/" not in name and name.endswith("__")) or _META.match(name) is not None
