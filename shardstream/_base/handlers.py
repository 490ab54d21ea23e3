"""Exception handlers with webdataset's meaning: return True to skip and go on, False to stop.

Divergence: webdataset's warn_* handlers sleep 0.5 s after each warning; ours do not, so a bad
shard costs no wall time. Each failure is reported once, by one warning that says what was done
("skipped after error: ...") and why (the error, with its URL, member and offset). Not also in a
log record: both at once showed every failure twice (a script without logging set up prints both to
stderr); `logging.captureWarnings(True)` sends the warnings to the log.
"""

from __future__ import annotations

import warnings

from .errors import describe

__all__ = [
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]


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
    warnings.warn(f"skipped after error: {describe(exn)}", stacklevel=2)
    return True


def warn_and_stop(exn: BaseException) -> bool:
    """Warn and stop the stream."""
    warnings.warn(f"stopped after error: {describe(exn)}", stacklevel=2)
    return False
