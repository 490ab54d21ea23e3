"""Helpers for the cache tests: write a shard through a tier, and hook into the disk tier's commits."""

from __future__ import annotations

from typing import Callable

from shardstream._cache.disk import DiskTier


def before_commits(monkeypatch, hook: Callable[[DiskTier, str], None]) -> None:
    """Run `hook(tier, url)` on the committing thread right before each `DiskTier` commit (the
    sidecar and the rename), for the rest of the test."""
    real = DiskTier._commit

    def commit(self, url, *args):
        hook(self, url)
        return real(self, url, *args)

    monkeypatch.setattr(DiskTier, "_commit", commit)


def put(tier, url: str, data: bytes, chunk: int = 7) -> bool:
    """Write `data` through a tier writer in small chunks and commit it; whether it was committed."""
    writer = tier.writer(url)
    assert writer is not None
    for i in range(0, len(data), chunk):
        writer.write(data[i : i + chunk])
    return writer.commit()
