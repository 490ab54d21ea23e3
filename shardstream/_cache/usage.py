"""The disk tier's usage ledger: the committed bytes of a cache directory, kept in one small file so
that a commit need not list the directory.

Listing the directory costs O(files): ~100 ms for 20,000 cached shards and their sidecars, and a
commit does it under the node-wide evict lock, so 8 ranks committing at once queue behind each
other's listings. The ledger turns the common commit into one read and one rename. A listing
(`DiskTier._scan`) still runs, and rewrites the ledger with what it counted, when the ledger is
missing or unreadable, when a commit past the bound finds no more files to evict among those the
last listing saw (`DiskTier._evict_oldest`), and once the last listing is `RESCAN_S` old (files
added or removed behind the cache's back, dead writers' temp files).

Files the tier itself finds invalid or corrupt are taken off the ledger as they are removed
(left on it, they made the next commits evict good files). Between listings the ledger
over-counts what was removed behind its back (files deleted by hand), which brings the next
listing sooner and may evict files that fit; it misses what was added
behind its back (files copied in by hand, or committed by a version of this library without the
ledger), which the next listing counts, `RESCAN_S` later at most. Callers hold the evict lock for
every read-modify-write.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import NamedTuple, Optional

__all__ = ["RESCAN_S", "Usage", "read_usage", "write_usage"]

RESCAN_S = 300.0  # list the directory at least this often (seconds), even when nothing asks for it


class Usage(NamedTuple):
    """What the ledger says: `total` committed bytes, counted by a listing at `listed_at` (wall
    clock, seconds) and kept up to date by the commits since."""

    total: int
    listed_at: float

    def stale(self, now: Optional[float] = None) -> bool:
        """True once the last listing is RESCAN_S old (or in the future: a clock that jumped)."""
        age = (time.time() if now is None else now) - self.listed_at
        return not 0 <= age < RESCAN_S


def read_usage(path: str) -> Optional[Usage]:
    """The ledger at `path`, or None when it is missing or does not parse (list the directory)."""
    try:
        with open(path, "rb") as stream:
            fields = stream.read(128).split()
        total, listed_at = int(fields[0]), float(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    return Usage(total, listed_at) if total >= 0 else None


def write_usage(path: str, usage: Usage) -> None:
    """Replace the ledger at `path` atomically (a crash leaves the old one or the new one)."""
    temp = f"{path}.{secrets.token_hex(4)}.tmp"
    try:
        with open(temp, "wb") as stream:
            stream.write(f"{usage.total} {usage.listed_at:.3f}\n".encode())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
