"""Claims taken ahead of reading: a reader that opens origin streams before it reads them (shards
in flight, ranged parts) takes each shard's node-wide claim first (`prepare`), so that processes
starting together open one origin stream per shard between them; `ShardCache.stream` then uses
the claim it finds here.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Dict

from .disk import DiskTier

__all__ = ["ClaimsAhead", "release_claims"]

logger = logging.getLogger(__name__)


def release_claims(claims: Dict[str, object]) -> None:
    """Release and forget every claim in `claims` (tier name -> claim)."""
    while claims:
        _, claim = claims.popitem()
        claim.release()  # type: ignore[attr-defined]


class ClaimsAhead:
    """The claims `prepare` took and no stream has used yet (a mixin of `ShardCache`)."""

    tiers: tuple

    def _init_claims(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._ahead: Dict[str, Dict[str, object]] = {}

    @staticmethod
    def _release(claims: Dict[str, object]) -> None:
        release_claims(claims)

    def _take_ahead(self, url: str) -> Dict[str, object]:
        """The claims `prepare(url)` took, now the caller's to use and release (maybe none)."""
        ahead = self._ahead_claims()
        with self._lock:
            return ahead.pop(url, None) or {}

    def _ahead_claims(self) -> Dict[str, Dict[str, object]]:
        """The claims `prepare` took (hold `self._lock` to use them)."""
        if self._pid != os.getpid():  # forked: the parent's claims (and lock) are not ours
            self._pid, self._lock, self._ahead = os.getpid(), threading.Lock(), {}
        return self._ahead

    def prepare(self, url: str) -> bool:
        """Call before opening an origin stream for `url` ahead of reading it: True when this
        process is to fetch it (it now holds the shared tiers' claim, which `stream(url)` uses;
        `release(url)` gives it back if the stream is never read), False when the cache will serve
        it (a tier holds it, or another process is fetching it now: `stream` follows that write).
        So processes that start together open one origin stream per shard between them."""
        for tier in self.tiers:
            if isinstance(tier, DiskTier):
                source = tier.lookup(url)
                if source is not None:
                    source.close()
                    return False
            elif url in tier:
                return False
        shared = next((tier for tier in self.tiers if tier.shared), None)
        if shared is None or shared.writing_here(url):
            return True  # no shared tier, or a second stream of ours: it bypasses the tier
        claim = shared.try_claim(url)
        if claim is None:
            return False
        ahead = self._ahead_claims()
        with self._lock:
            ahead[url] = {shared.name: claim}
        return True

    def release(self, url: str) -> None:
        """Give back a claim `prepare(url)` took and no `stream(url)` used (no-op otherwise)."""
        release_claims(self._take_ahead(url))

    def _release_unstarted(self) -> None:
        """Give back every claim `prepare` took whose stream has not begun (see `follow`)."""
        ahead = self._ahead_claims()
        with self._lock:
            held, ahead_copy = list(ahead.values()), dict(ahead)
            ahead.clear()
        if ahead_copy:
            logger.info("waiting for another process's download that has not begun: giving back the claims of %d "
                        "shards this process has not begun to read either", len(ahead_copy))
        for claims in held:
            self._release(claims)

