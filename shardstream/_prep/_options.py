"""What `shardstream create` is asked to do: one frozen, validated options object."""

from __future__ import annotations

import math

import os
from dataclasses import dataclass
from typing import Optional

from .._base.errors import OptionError, UsageError
from .._fetch.listing import SHARD_SUFFIXES

__all__ = ["CreateOptions", "Reencode"]

INPUTS = ("auto", "imagefolder", "files", "manifest", "shards")
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class Reencode:
    """Image re-encoding: downscale so the longer side is at most `max_side` (None: keep the
    size), write JPEG at `quality`. `all_images`: re-encode images that need no downscaling too."""

    max_side: Optional[int]
    quality: int
    all_images: bool


def _source_date_epoch() -> int:
    """The fixed member mtime: SOURCE_DATE_EPOCH (reproducible-builds convention), else 0."""
    try:
        return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    except ValueError:
        raise UsageError("SOURCE_DATE_EPOCH must be an integer (seconds since 1970)") from None


@dataclass(frozen=True)
class CreateOptions:
    """Options of `shardstream create SRC DEST` (see `shardstream create --help`)."""

    source: str
    dest: str
    input: str = "auto"
    pattern: str = "shard-%06d.tar"
    maxcount: int = 10000
    maxsize: Optional[float] = None
    seed: Optional[int] = None
    max_side: Optional[int] = None
    quality: Optional[int] = None
    workers: Optional[int] = None
    threads: int = 4
    engine: str = "local"
    ray_address: Optional[str] = None
    rank: int = 0
    world_size: int = 1
    skip_errors: bool = False
    overwrite: bool = False
    rekey: bool = False
    classes: Optional[str] = None
    url_col: Optional[str] = None
    caption_col: Optional[str] = None
    label_col: Optional[str] = None
    key_col: Optional[str] = None
    dali_index: bool = True
    progress: bool = True
    mtime: Optional[int] = None

    def __post_init__(self) -> None:
        if self.input not in INPUTS:
            raise OptionError(f"--input must be one of {', '.join(INPUTS)}, not {self.input!r}")
        if self.engine not in ENGINES:
            raise OptionError(f"--engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.maxcount < 1:
            raise OptionError("--maxcount must be at least 1")
        if self.maxsize is not None and not 0 < self.maxsize < math.inf:  # (nan and inf too)
            raise OptionError(f"--maxsize must be a positive number of bytes, got {self.maxsize}")
        if self.max_side is not None and self.max_side < 1:
            raise OptionError("--max-side must be at least 1")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise OptionError("--quality must be between 1 and 100")
        if self.workers is not None and self.workers < 1:
            raise OptionError("--workers must be at least 1")
        if self.threads < 1:
            raise OptionError("--threads must be at least 1")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise OptionError(f"--rank must be in [0, --world-size); got rank {self.rank} of {self.world_size}")
        if self.world_size > 1 and self.engine == "ray":
            raise OptionError("--rank/--world-size partition by hand, the Ray engine partitions itself: not both")
        if self.world_size > 1 and self.skip_errors:
            raise OptionError(
                "--skip-errors with --world-size > 1: rank 0 writes sizes.json from the planned counts, which "
                "skipped samples would make wrong; fix or drop the failing rows, or use one machine or --engine ray"
            )
        if self.ray_address is not None and self.engine != "ray":
            raise OptionError("--ray-address needs --engine ray")
        check_pattern(self.pattern)
        if self.mtime is None:
            object.__setattr__(self, "mtime", _source_date_epoch())

    @property
    def reencode(self) -> Optional[Reencode]:
        if self.max_side is None and self.quality is None:
            return None
        return Reencode(self.max_side, self.quality or 90, all_images=self.quality is not None)


def check_pattern(pattern: str) -> None:
    """A shard name pattern must name files inside DEST, one per shard number.

    Raises:
        OptionError: no %-number in it, a path separator, a leading dot, an unknown suffix.
    """
    try:
        first, second = pattern % 0, pattern % 1
    except (TypeError, ValueError):
        raise OptionError(f"--pattern {pattern!r} needs one %-number, e.g. train-%06d.tar") from None
    if first == second:
        raise OptionError(f"--pattern {pattern!r} gives every shard the same name")
    if "/" in first or "\\" in first or first.startswith(".") or first in ("", "sizes.json"):
        raise OptionError(f"--pattern {pattern!r}: shard names are file names inside DEST (no '/', no leading '.')")
    if not first.endswith(SHARD_SUFFIXES):
        raise OptionError(f"--pattern {pattern!r} must end in one of {', '.join(SHARD_SUFFIXES)}")
