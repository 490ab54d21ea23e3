"""`extract`: a shard's members into a directory, refusing anything that would land outside it."""

from __future__ import annotations

import os
from typing import Optional

from .._base.errors import FormatError, UsageError
from .._shard.members import iter_members
from .._shard.origin import open_origin
from ._common import say

__all__ = ["cmd_extract", "safe_target"]


def safe_target(root: str, name: str, url: Optional[str] = None, offset: Optional[int] = None) -> str:
    """The extraction path for a member name, refusing anything that would land outside root
    (or be root itself: an empty name)."""
    root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, name))
    if not name.strip("/"):
        raise UsageError("member has an empty name: nothing to extract it to", url=url, member=name, offset=offset)
    if os.path.isabs(name) or not target.startswith(root + os.sep):
        raise UsageError("member would be extracted outside the target directory", url=url, member=name, offset=offset)
    return target


def cmd_extract(args) -> int:
    os.makedirs(args.dest, exist_ok=True)
    count = left_out = 0
    written = set()  # targets of this shard's members: a second member of one name is an error

    def other(name: str, kind: str, offset: int) -> None:  # links are never followed or made
        nonlocal left_out
        left_out += 1
        say(f"left out {name!r}: a {kind} (offset {offset}), not a file", err=True)

    for name, data, offset in iter_members(open_origin(args.url), args.url, others=other):
        if "\0" in name:
            shown = name.replace("\0", "\\0")
            raise UsageError("member name holds a NUL byte", url=args.url, member=shown, offset=offset)
        target = safe_target(args.dest, name, args.url, offset)
        if target in written:  # (the loader refuses the shard for it too)
            raise FormatError("duplicate file name in tar file: extracting it would overwrite the first",
                              url=args.url, member=name, offset=offset)
        written.add(target)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        except OSError as exn:  # e.g. a file "a" and then "a/b.txt"
            raise UsageError(f"cannot extract: {exn.strerror}", url=args.url, member=name, offset=offset) from exn
        count += 1
    more = f"; left out {left_out} links or special files" if left_out else ""
    say(f"extracted {count} members to {args.dest}{more}")
    return 0
