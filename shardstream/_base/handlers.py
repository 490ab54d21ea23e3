"""Exception handlers with webdataset's meaning: return True to skip and go on, False to stop.

Divergence: webdataset's warn_* handlers sleep 0.5 s after each warning; ours do not, so a bad
shard costs no wall time. Warnings go through `warnings` (like webdataset) and the log.
"""

from __future__ import annotations

import logging
import warnings

from .errors import describe

__all__ = [
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]

log = logging.getLogger("shardstream.handlers")  # the name users know (the facade)


def reraise_exception(exn: BaseException) -> bool:
    """Re-raise the exception (the default: errors are loud)."""
    raise exn


def ignore_and_continue(exn: BaseException) -> bool:
    """Skip the failing item silently and go on."""
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """Stop the stream silently."""
    return False


def warn_and_continue(exn: BaseException) -> bool:
    """Warn, skip the failing item and go on."""
    message = describe(exn)
    warnings.warn(message, stacklevel=2)
    log.warning("skipped after error: %s", message)
    return True


def warn_and_stop(exn: BaseException) -> bool:
    """Warn and stop the stream."""
    message = describe(exn)
    warnings.warn(message, stacklevel=2)
    log.warning("stopped after error: %s", message)
    return False
