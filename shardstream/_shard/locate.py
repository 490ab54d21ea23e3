"""Where a member of a shard starts, found when an error needs it and not before: a decode error
names its sample's field, and the byte offset of that member comes from a walk of the shard's
headers (a local uncompressed file: its header pages only). The last few shards' walks are kept:
a shard with many bad samples is walked once."""

from __future__ import annotations

import collections
import os
import threading
from typing import Dict, Optional, Tuple

from .._base.errors import set_member_locator
from .._fetch.open import local_path_of
from .members import is_compressed_file, mapped_member_batches
from .samples import _field

__all__ = ["locate_member"]

_KEPT = 4  # shards whose walks are kept
_walks: "collections.OrderedDict[Tuple[str, int, int], Dict[str, int]]" = collections.OrderedDict()
_lock = threading.Lock()


def locate_member(url: str, member: str) -> Optional[int]:
    """The offset of the first header of `member` ("key.field", as a sample names it) in the
    shard at `url`, or None (not a local
    uncompressed file, not in it, unreadable). Never raises."""
    path = local_path_of(url)
    if path is None:
        return None
    try:
        info = os.stat(path)
        key = (path, info.st_size, info.st_mtime_ns)
        with _lock:
            offsets = _walks.get(key)
            if offsets is not None:
                _walks.move_to_end(key)
        if offsets is None:
            if is_compressed_file(path):
                return None  # (a walk would inflate the whole shard)
            offsets = {}
            for batch in mapped_member_batches(path, url, payloads=False):
                for name, _data, offset in batch:
                    field = _field(name, None, None)  # (as samples name their fields: "key.ext", lower case)
                    if field is not None:
                        offsets.setdefault(f"{field[0]}.{field[1]}", offset)
            with _lock:
                _walks[key] = offsets
                while len(_walks) > _KEPT:
                    _walks.popitem(last=False)
        return offsets.get(member)
    except Exception:  # noqa: BLE001 - an error's location is best effort: never an error of its own
        return None


set_member_locator(locate_member)
