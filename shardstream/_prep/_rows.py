"""The rows `create` plans with: one per sample, naming where each field's bytes come from."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

__all__ = ["IMAGE_SUFFIXES", "Listing", "Ref", "Row", "safe_key"]

IMAGE_SUFFIXES = frozenset("jpg jpeg png webp bmp gif tif tiff ppm pgm pbm pnm".split())
UNSAFE_KEY = re.compile(r"[.\s]")


class Ref(NamedTuple):
    """A field whose bytes are read, when the shard is written, from a path or URL."""

    url: str


class Row(NamedTuple):
    """One planned sample. `key` None: the source sample's own key (resharding). `size`: input
    payload bytes, None where unknown (URLs). `origin`: (source shard number, sample number)."""

    key: Optional[str]
    fields: Tuple[Tuple[str, Union[bytes, Ref]], ...]
    size: Optional[int]
    origin: Optional[Tuple[int, int]] = None


@dataclass
class Listing:
    """A listed source: its kind, rows in input order, the class map (ImageFolder) and the
    source shards (resharding; rows' origins index into it)."""

    kind: str
    rows: List[Row]
    classes: Optional[Dict[str, int]] = None
    shard_urls: List[str] = field(default_factory=list)
    shard_counts: List[int] = field(default_factory=list)  # the samples each source shard was counted to hold


def safe_key(text: str) -> str:
    """A sample key that every reader splits the same way: no dots (webdataset splits the
    extension at the first dot) and no whitespace (DALI's index is space-separated)."""
    return UNSAFE_KEY.sub("_", text)
