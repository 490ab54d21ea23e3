"""An error's location across a DataLoader worker boundary.

torch's DataLoader rebuilds a worker's exception in the main process from its formatted text
alone (`type(exn)(text)`), so our errors' `url`, `member` and `offset` would come back None (and
a DecodingError would take the text as its url). A worker notes them as JSON (`mark_location`);
the rebuilt error reads them back as it is made (`errors.worker_where`), under any DataLoader.
"""

from __future__ import annotations

import json

from .errors import WHERE_NOTE, ShardStreamError

__all__ = ["mark_location"]

_EXTRA = ("key", "k", "reason", "cache_path")  # DecodingError's and CorruptCacheFile's own attributes


def mark_location(exn: BaseException) -> None:
    """Add a note holding the error's location as JSON, before it leaves a DataLoader worker:
    torch rebuilds a worker's exception from its text alone (`errors.worker_where` reads it back)."""
    if isinstance(exn, ShardStreamError) and hasattr(exn, "add_note"):
        if not any(note.startswith(WHERE_NOTE) for note in getattr(exn, "__notes__", ())):
            where = {"url": exn.url, "member": exn.member, "offset": exn.offset}
            where.update((name, getattr(exn, name)) for name in _EXTRA if hasattr(exn, name))
            exn.add_note(WHERE_NOTE + json.dumps(where, default=str))
