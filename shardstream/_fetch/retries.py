"""What every fetcher does between attempts, and what a user sees of it: one backoff rule, one
way of logging retries (the first retry of a transfer is a WARNING: a flaky server shows up in
the log at once), and a watchdog that warns about a silent transfer long before its stall
timeout gives up on it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import time
from typing import Any, Dict, Optional

from .._base.redact import redact

__all__ = ["Silence", "backoff_delay", "log_retry", "watch"]

log = logging.getLogger(__name__)


def backoff_delay(options: Any, failures: int, retry_after: Optional[float] = None) -> float:
    """Seconds to wait before retry number `failures`: the server's Retry-After (capped), else
    full jitter over a capped exponential (it spreads out clients that failed together)."""
    if retry_after is not None:
        return min(retry_after, options.backoff_max)
    return random.uniform(0.0, min(options.backoff_max, options.backoff_base * 2 ** (failures - 1)))


def log_retry(failures: int, options: Any, url: str, offset: Optional[int], delay: float, reason: str) -> None:
    """Log a retry: WARNING for a transfer's first (and from the third on, INFO), DEBUG between."""
    level = logging.WARNING if failures == 1 else logging.INFO if failures >= 3 else logging.DEBUG
    where = "" if offset is None else f" from byte {offset}"
    log.log(level, "retry %d/%d of %s%s in %.2f s: %s", failures, options.retries, redact(url), where, delay,
            redact(reason))


class Silence:
    """A transfer's last sign of life, for the watchdog (`beat()` on every chunk)."""

    __slots__ = ("url", "stall_timeout", "last", "warned")

    def __init__(self, url: str, stall_timeout: float) -> None:
        self.url, self.stall_timeout = url, stall_timeout
        self.last = time.monotonic()
        self.warned = False

    def beat(self) -> None:
        self.last = time.monotonic()
        self.warned = False

    def hold(self) -> None:
        """The transfer waits for its reader, not for the server: no silence until the next `beat`.
        (A reader that pauses for a training step's checkpoint is no stall of the server's.)"""
        self.last = math.inf

    def rest(self, seconds: float) -> None:
        """The transfer waits `seconds` on purpose (a back-off): silence counts from then on."""
        self.last = time.monotonic() + seconds
        self.warned = False


_watched: Dict[int, Silence] = {}
_watchdog: Optional["asyncio.Task[None]"] = None
TICK = 1.0


def warn_after(stall_timeout: float) -> float:
    """How long a transfer may be silent before a warning: a third of its stall timeout, at most 10 s."""
    return min(10.0, stall_timeout / 3)


class watch:
    """`with watch(url, options) as silence:` registers a transfer with the watchdog (loop side)."""

    def __init__(self, url: str, options: Any) -> None:
        self.silence = Silence(url, options.stall_timeout)

    def __enter__(self) -> Silence:
        global _watchdog
        _watched[id(self.silence)] = self.silence
        loop = asyncio.get_running_loop()
        if _watchdog is not None and _watchdog.get_loop() is not loop:
            _watchdog = None  # another loop's (maybe closed: asyncio.run per call); this loop gets its own
        if _watchdog is not None and not _watchdog.done() and _tick(self.silence) < _sleeping:
            _watchdog.cancel()  # (asleep for longer than this transfer may be silent: start over)
            _watchdog = None
        if _watchdog is None or _watchdog.done():
            _watchdog = loop.create_task(_watch())
        return self.silence

    def __exit__(self, *exc: object) -> None:
        _watched.pop(id(self.silence), None)


def _tick(silence: Silence) -> float:
    """How often to look at a transfer: a quarter of its warning time (at most TICK)."""
    return max(0.05, min(TICK, warn_after(silence.stall_timeout) / 4))


_sleeping = TICK  # how long the watchdog sleeps between looks now


def _forget_after_fork() -> None:
    """A forked child has a loop of its own: the parent's watchdog task and transfers are not its."""
    global _watchdog
    _watchdog = None
    _watched.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


async def _watch() -> None:
    global _sleeping
    while _watched:
        _sleeping = min(_tick(silence) for silence in _watched.values())
        await asyncio.sleep(_sleeping)
        now = time.monotonic()
        for silence in list(_watched.values()):
            quiet = now - silence.last
            if not silence.warned and quiet >= warn_after(silence.stall_timeout):
                silence.warned = True
                log.warning("no bytes from %s for %.0f s; it is retried after %g s without a byte (stall_timeout)",
                            redact(silence.url), quiet, silence.stall_timeout)
