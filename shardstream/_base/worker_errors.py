"""An error's location across a DataLoader worker boundary.

torch's DataLoader rebuilds a worker's exception in the main process from its formatted text
alone (`type(exn)(text)`), so our errors' `url`, `member` and `offset` came back None (and a
DecodingError took the text as its url). The worker notes them as JSON (`mark_location`);
WebLoader puts them back on the rebuilt error (`restore_location`).
"""

from __future__ import annotations

import json
import re

from .errors import ShardStreamError

__all__ = ["mark_location", "restore_location"]

_WHERE = "shardstream-where: "
_EXTRA = ("key", "k", "reason")  # DecodingError's own attributes


def mark_location(exn: BaseException) -> None:
    """Add a note holding the error's location as JSON, before it leaves a DataLoader worker:
    torch rebuilds a worker's exception from its text alone (`restore_location` reads it back)."""
    if isinstance(exn, ShardStreamError) and hasattr(exn, "add_note"):
        if not any(note.startswith(_WHERE) for note in getattr(exn, "__notes__", ())):
            where = {"url": exn.url, "member": exn.member, "offset": exn.offset}
            where.update((name, getattr(exn, name)) for name in _EXTRA if hasattr(exn, name))
            exn.add_note(_WHERE + json.dumps(where, default=str))


_WHERE_NOTE = re.compile(rf"^{_WHERE}(\{{.*\}})$", re.MULTILINE)


def restore_location(exn: BaseException) -> None:
    """The location `mark_location` wrote into a worker's error, back on the error torch rebuilt
    from its text (`type(exn)(text)`: a DecodingError takes that text as its url)."""
    if not isinstance(exn, ShardStreamError):
        return
    text = str(exn)
    found = _WHERE_NOTE.search(text)
    if found is None:
        return
    try:
        where = json.loads(found.group(1))
    except ValueError:
        return
    if exn.url is not None and _WHERE_NOTE.search(exn.url):  # the text went in as the url
        exn.message = exn.url
        exn.args = (exn.url,)
    exn.url, exn.member, exn.offset = where.get("url"), where.get("member"), where.get("offset")
    for name in _EXTRA:
        if name in where and hasattr(exn, name):
            setattr(exn, name, where[name])
