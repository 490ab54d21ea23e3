"""What the commands share: shard lists from a spec or a directory, progress bars, output."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, List, Optional

from .._base.errors import ShardNotFound
from .._fetch.open import local_path_of
from .._fetch.listing import expand_listings, folder_shards
from .._fetch.loop import shutdown_loop
from .._prep._rows import IMAGE_SUFFIXES
from .._base.redact import redact
from .._base.workers import WorkerPool
from .._plan.urls import expand_urls

__all__ = ["bar", "is_image", "say", "shard_urls", "worker_pool"]


def shard_urls(spec: str) -> List[str]:
    """The shards of a spec as the loader reads it (braces, `::`, globs, S3 prefixes, folders), or
    the shards in a local directory named without its trailing `/` (e.g. a `create` DEST)."""
    path = local_path_of(spec)
    if path is not None and os.path.isdir(path):
        shards = folder_shards(path)
        if not shards:
            raise ShardNotFound("no shards in this folder", url=spec)
        return shards
    return expand_listings(expand_urls(spec))


@contextlib.contextmanager
def worker_pool(threads: int, name: str) -> Iterator[WorkerPool]:
    """A pool for reading shards in parallel that stops at once on Ctrl-C (or any error): the
    shards not started are dropped and the transfers in flight are cut (the fetch loop shuts
    down), instead of waiting for them, which a stalled server makes minutes of retries."""
    pool = WorkerPool(threads, thread_name_prefix=name)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        shutdown_loop(timeout=2.0)
        raise
    pool.shutdown(wait=True)


def bar(total: Optional[int], desc: str, unit: str, quiet: bool) -> Any:
    """A tqdm bar on stderr; off with --quiet and when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=True if quiet else None, file=sys.stderr, leave=False)


def say(text: object, *, err: bool = False) -> None:
    """Print a line, credentials redacted (every line the command prints goes through here)."""
    print(redact(text), file=sys.stderr if err else sys.stdout, flush=True)


def is_image(field: str) -> bool:
    return field.rpartition(".")[2].lower() in IMAGE_SUFFIXES
