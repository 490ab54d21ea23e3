"""A directory as a shared work queue of shards (webdataset's `DirectoryShardList`).

Several processes may read the same directory: a process claims a shard by renaming
`name` to `name._<pid>_` (a rename is atomic, so exactly one claimant wins), yields the claimed
path, and when asked for the next shard recycles the previous one: `unlink` deletes it, `keep`
renames it to `<name>._done_`, `resample` renames it back so it can be claimed again. Claims
left by processes that no longer run are recycled too. Listing and renaming are I/O, so this
lives with the other listings in the fetch layer.
"""

from __future__ import annotations

import glob
import os
import random
import re
import time
from typing import Iterator, Optional

from braceexpand import braceexpand

from .._base.lazytorch import IterableDataset

__all__ = [
    "DirectoryShardList",
    "check_pid_is_running",
    "get_pid_from_filename",
    "without_last_extension",
]

_CLAIMED = re.compile(r"^(.*)\._(\d+)_$")


def check_pid_is_running(pid: int) -> bool:
    """True if a process with this id exists (signal 0 probes without sending anything)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def without_last_extension(fname: str) -> str:
    """`fname` without its last `.ext` (`a.tar._12_` -> `a.tar`)."""
    return re.sub(r"\.[^.]*$", "", fname)


def get_pid_from_filename(fname: str) -> Optional[int]:
    """The process id of a claimed shard name (`name._<pid>_`), else None."""
    match = _CLAIMED.match(fname)
    return int(match.group(2)) if match else None


class DirectoryShardList(IterableDataset):
    """Yield `{"url": path}` for shards claimed one at a time from a directory.

    Args:
        path: the directory, ending in "/".
        pattern: glob of shard names inside it; braces are expanded (webdataset's are not, so
            its default pattern matches nothing).
        poll: seconds to wait when no shard is left; None stops the iteration instead.
        timeout: stop after this many seconds of iterating.
        mode: what happens to a shard once the next one is asked for: "unlink", "keep" or
            "resample" (see the module docstring).
        select: "random" or "oldest" (by modification time).
        fate: unused (webdataset's signature).
    """

    def __init__(self, path: str, pattern: str = "*.{tar,tgz,tar.tgz}", poll: Optional[float] = 1,
                 timeout: float = 1e12, mode: str = "resample", select: str = "random", fate=None) -> None:
        assert path.endswith("/")
        assert os.path.isdir(path)
        self.path = path
        self.poll = poll
        self.pattern = pattern
        self.mode = mode
        self.select = select
        self.fate = fate
        self.timeout = timeout

    def recycle(self, activename: str) -> None:
        """Release a claimed shard according to `mode`."""
        if self.mode == "unlink":
            os.unlink(activename)
        elif self.mode == "keep":
            os.rename(activename, without_last_extension(activename) + "._done_")
        elif self.mode == "resample":
            os.rename(activename, without_last_extension(activename))

    def cleanup_files_without_processes(self) -> None:
        """Recycle claims whose process is gone (a reader that crashed mid-shard)."""
        for fname in glob.glob(os.path.join(self.path, "*._*_")):
            pid = get_pid_from_filename(fname)
            if pid is not None and not check_pid_is_running(pid):
                self.recycle(fname)

    def _choose(self, candidates):
        if self.select == "oldest":
            return min(candidates, key=lambda fn: os.stat(fn).st_mtime)
        if self.select == "random":
            return random.choice(candidates)
        raise ValueError(f"unknown selection strategy {self.select}")

    def __iter__(self) -> Iterator[dict]:
        last = time.time()
        while time.time() - last < self.timeout:
            candidates = sorted({f for pat in braceexpand(self.pattern) for f in glob.glob(self.path + pat)})
            if not candidates:
                if self.poll is None:
                    return
                time.sleep(self.poll)
                continue
            candidate = self._choose(candidates)
            activename = candidate + f"._{os.getpid()}_"
            try:
                os.rename(candidate, activename)
            except FileNotFoundError:  # another process claimed it first
                if self.poll is not None:
                    time.sleep(self.poll)
                continue
            yield dict(url=activename)
            self.recycle(activename)
            self.cleanup_files_without_processes()
