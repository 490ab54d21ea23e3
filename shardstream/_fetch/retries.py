"""What every fetcher does between attempts, and what a user sees of it: one backoff rule, one
way of logging retries (the first retry of a transfer is a WARNING: a flaky server shows up in
the log at once), and a watchdog that warns about a silent transfer long before its stall
timeout gives up on it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from typing import Any, Callable, Dict, Optional, Tuple

from .._base.errors import FetchTimeout
from .._base.redact import redact

__all__ = ["PROGRESS_BYTES", "Silence", "backoff_delay", "log_retry", "made_progress", "stall_body", "watch"]

log = logging.getLogger(__name__)

# An attempt that delivers at least this much before it fails starts the retry count again (a
# long flaky download is not cut short); less is no progress (a server that sends a byte per
# connection, then stalls, would otherwise be retried for ever).
PROGRESS_BYTES = 64 << 10


def made_progress(before: int, after: int, end: Optional[int] = None) -> bool:
    """Whether an attempt that moved a transfer from byte `before` to `after` (of `end`, when
    known) counts as progress: PROGRESS_BYTES, or the rest of the object if that is less."""
    wanted = PROGRESS_BYTES if end is None else min(PROGRESS_BYTES, max(1, end - before))
    return after - before >= wanted


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
    """A transfer's signs of life, for the watchdog: `beat(n)` for every chunk of n bytes.

    A transfer lives while it delivers PROGRESS_BYTES per `stall_timeout` of the server's time,
    not merely a byte: a server that drips a byte a second never trips aiohttp's read timeout
    (the longest silence), so the watchdog calls `abort` (the fetcher's, while a body is read)
    to fail the attempt as a stall. Time the reader holds a chunk, and a back-off, are ours,
    not the server's: neither counts."""

    __slots__ = ("url", "stall_timeout", "since", "got", "last", "held_at", "warned", "warned_slow", "abort")

    def __init__(self, url: str, stall_timeout: float) -> None:
        self.url, self.stall_timeout = url, stall_timeout
        self.since = self.last = time.monotonic()  # when the bytes counted in `got` began to come; the last one
        self.got = 0
        self.held_at: Optional[float] = None
        self.warned = self.warned_slow = False  # (said it is silent; said it is too slow)
        self.abort: Optional[Callable[[], Any]] = None  # fails the attempt reading a body now

    def beat(self, nbytes: int = 0) -> None:
        """`nbytes` more arrived (0: the reader gave a chunk back)."""
        now = time.monotonic()
        if self.held_at is not None:  # (the reader's time is moved out of the server's)
            self.since += now - self.held_at
            self.last += now - self.held_at
            self.held_at = None
        if nbytes:
            self.got += nbytes
            self.last, self.warned = now, False
        if self.got >= PROGRESS_BYTES:
            self.since, self.got, self.warned_slow = now, 0, False

    def hold(self) -> None:
        """The transfer waits for its reader, not for the server: no silence until the next `beat`.
        (A reader that pauses for a training step's checkpoint is no stall of the server's.)"""
        if self.held_at is None:
            self.held_at = time.monotonic()

    def rest(self, seconds: float) -> None:
        """The transfer waits `seconds` on purpose (a back-off): it counts afresh from then on."""
        self.since = self.last = time.monotonic() + seconds
        self.got, self.held_at = 0, None
        self.warned = self.warned_slow = False

    def quiet(self, now: float) -> Tuple[float, float]:
        """Seconds of the server's time that brought under PROGRESS_BYTES, and since its last
        byte (both 0 while held)."""
        return (0.0, 0.0) if self.held_at is not None else (now - self.since, now - self.last)


def stall_body(response: Any, silence: Silence, offset: int, what: str = "") -> FetchTimeout:
    """The watchdog's verdict on a body that comes too slowly (`Silence`): fail the read of the
    aiohttp `response` with a FetchTimeout (retried; the connection is then closed, not pooled:
    its body was not read to the end), and return that error."""
    error = FetchTimeout(f"{what}stalled: under {PROGRESS_BYTES >> 10} KiB in {silence.stall_timeout:g} s "
                         "(stall_timeout)", url=silence.url, offset=offset)
    response.content.set_exception(error)
    return error


TICK = 1.0


def warn_after(stall_timeout: float) -> float:
    """How long a transfer may be silent before a warning: a third of its stall timeout, at most 10 s."""
    return min(10.0, stall_timeout / 3)


def _tick(silence: Silence) -> float:
    """How often to look at a transfer: a quarter of its warning time (at most TICK)."""
    return max(0.05, min(TICK, warn_after(silence.stall_timeout) / 4))


class _Watchdog:
    """One event loop's watched transfers and the task that looks at them. Each loop has its own:
    streams run on the shared loop and on loops of their own (`asyncio.run` per call), and a task
    must neither outlive its loop in our state nor look at another loop's transfers."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.silences: Dict[int, Silence] = {}
        self.task: Optional["asyncio.Task[None]"] = None
        self.sleeping = TICK  # how long the task sleeps between looks now

    def add(self, silence: Silence) -> None:
        self.silences[id(silence)] = silence
        if self.task is not None and not self.task.done() and _tick(silence) < self.sleeping:
            self.task.cancel()  # (asleep for longer than this transfer may be silent: start over)
            self.task = None
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(_watch(self))


_dogs: Dict[asyncio.AbstractEventLoop, _Watchdog] = {}


class watch:
    """`with watch(url, options) as silence:` registers a transfer with its loop's watchdog."""

    def __init__(self, url: str, options: Any) -> None:
        self.silence = Silence(url, options.stall_timeout)
        self.dog: Optional[_Watchdog] = None

    def __enter__(self) -> Silence:
        loop = asyncio.get_running_loop()
        self.dog = _dogs.get(loop)
        if self.dog is None:  # (a new loop: forget the ones closed since, each transfer need not look)
            for closed in [other for other in _dogs if other.is_closed()]:
                del _dogs[closed]
            self.dog = _dogs[loop] = _Watchdog(loop)
        self.dog.add(self.silence)
        return self.silence

    def __exit__(self, *exc: object) -> None:
        if self.dog is not None:
            self.dog.silences.pop(id(self.silence), None)


def _forget_after_fork() -> None:
    """A forked child has a loop of its own: the parent's watchdogs and transfers are not its."""
    _dogs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


async def _watch(dog: _Watchdog) -> None:
    while dog.silences:
        dog.sleeping = min(_tick(silence) for silence in dog.silences.values())
        await asyncio.sleep(dog.sleeping)
        now = time.monotonic()
        for silence in list(dog.silences.values()):
            slow, silent = silence.quiet(now)
            if slow >= silence.stall_timeout and silence.abort is not None:
                abort, silence.abort = silence.abort, None
                abort()
                continue
            early = warn_after(silence.stall_timeout)
            if not silence.warned and silent >= early:
                silence.warned = True
                log.warning("no bytes from %s for %g s; it is retried after %g s without a byte (stall_timeout)",
                            redact(silence.url), round(silent, 1), silence.stall_timeout)
            elif not silence.warned_slow and silent < early <= slow / 2:  # (bytes still come, too few)
                silence.warned_slow = True
                log.warning("only %d bytes from %s in %g s; it is retried once %g s bring under %d KiB "
                            "(stall_timeout)", silence.got, redact(silence.url), round(slow, 1),
                            silence.stall_timeout, PROGRESS_BYTES >> 10)
