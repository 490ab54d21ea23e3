"""glibc allocator tuning for payload copies.

Every payload becomes a fresh `bytes` object. With glibc's default trim threshold (128 KiB) the
heap top is handed back to the kernel as soon as a few samples are freed, and the next payloads
fault their pages in again (the kernel zeroes each 4 KiB page): measured here, that doubles the
cost of copying a 110 KB JPEG out of a shard. Keeping up to 64 MiB of freed heap for reuse
removes those faults. Opt out with SHARDSTREAM_MALLOC_TUNING=0; a MALLOC_TRIM_THRESHOLD_ set by
the user is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

__all__ = ["TRIM_THRESHOLD", "tune_malloc"]

log = logging.getLogger(__name__)

TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter number
_done = False
_lock = threading.Lock()


def tune_malloc() -> bool:
    """Raise glibc's trim threshold once per process; True if it was changed now or before."""
    global _done
    with _lock:
        if _done:
            return True
        _done = True
        if os.environ.get("SHARDSTREAM_MALLOC_TUNING", "1") == "0" or "MALLOC_TRIM_THRESHOLD_" in os.environ:
            return False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc
            return False
        ok = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        log.debug("mallopt(M_TRIM_THRESHOLD, %d) -> %s", TRIM_THRESHOLD, ok)
        return ok
