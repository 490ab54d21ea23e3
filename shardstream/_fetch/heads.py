"""The response-header phase of an HTTP request, bounded like a body.

aiohttp's `sock_read` timeout is the longest silence between two reads, so a server that sends
its status line and headers a byte every few seconds is never timed out: the header phase has no
other bound, and a request could wait for hours. `HeadDeadline` gives the headers `stall_timeout`
from the moment the request was sent (the body's rule: under 64 KiB per `stall_timeout` is a
stall, and headers are shorter than that). Time spent waiting for one of our own pooled
connections, connecting (`connect_timeout`) and resolving the host does not count: the deadline
is armed by aiohttp's trace signal for sent request headers, through `TRACE`, which every session
of ours carries, and disarmed while a redirect or a retry finds its next connection.

On Python 3.10 the scope is async-timeout's, which can turn a cancellation that arrives in the
very loop iteration the deadline fires into a TimeoutError (aio-libs/aiohttp#5979; aiohttp's own
timeouts share it there); from 3.11 on, asyncio's scope keeps a cancellation a cancellation.
"""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace
from typing import Any, Optional

import aiohttp

if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout
else:  # pragma: no cover - aiohttp depends on async-timeout before 3.11
    from async_timeout import timeout as _timeout

__all__ = ["TRACE", "HeadDeadline"]


class HeadDeadline:
    """`async with HeadDeadline(seconds) as head: resp = await session.get(..., trace_request_ctx=head)`:
    the block raises TimeoutError if the response headers are not in within `seconds` of the
    request being sent (of each request, across redirects)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._scope: Any = None

    async def __aenter__(self) -> "HeadDeadline":
        self._scope = _timeout(None)
        await self._scope.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Optional[bool]:
        return await self._scope.__aexit__(*exc)

    @property
    def expired(self) -> bool:
        """Whether the deadline ended the block."""
        expired = self._scope is not None and self._scope.expired
        return bool(expired() if callable(expired) else expired)  # (a method in asyncio, a property in async-timeout)

    def arm(self) -> None:
        self._move(asyncio.get_running_loop().time() + self.seconds)

    def disarm(self) -> None:
        self._move(None)

    def _move(self, when: Optional[float]) -> None:
        if self._scope is not None:  # (asyncio's `reschedule`; async-timeout's is `update`)
            move = getattr(self._scope, "reschedule", None) or self._scope.update
            move(when)


def _signal(method: str) -> Any:
    async def on_signal(session: Any, context: SimpleNamespace, params: Any) -> None:
        head = getattr(context, "trace_request_ctx", None)
        if isinstance(head, HeadDeadline):
            getattr(head, method)()

    return on_signal


TRACE = aiohttp.TraceConfig()
TRACE.on_request_headers_sent.append(_signal("arm"))
# Between a request's headers and the next one's (a redirect; aiohttp's own retry on a reused
# connection that the server had closed), waiting for a connection, resolving and connecting
# are not the server's answer: the deadline waits for the next request to be sent.
for _phase in (TRACE.on_request_redirect, TRACE.on_connection_queued_start, TRACE.on_connection_create_start):
    _phase.append(_signal("disarm"))
TRACE.freeze()
