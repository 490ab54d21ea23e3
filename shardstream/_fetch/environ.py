"""What the environment says about an http(s) origin: the proxy to reach it through (HTTP_PROXY,
HTTPS_PROXY, NO_PROXY, the proxy's netrc credentials) and the origin's own netrc credentials, as
aiohttp's `trust_env=True` reads them, looked up once a minute per origin instead of per request.

aiohttp with `trust_env=True` makes two executor round trips on every request: one reads netrc for
the host's credentials, one reads the proxy variables and netrc again. A shard fetched as ranged
parts makes a request per part (254 in a pass over the benchmark's 485 MB), and py-spy put 10-15%
of the fetch path's CPU there. The session runs with `trust_env=False` and each request gets these
settings instead, from the same aiohttp helpers, on a thread (netrc may sit on a slow home
directory). The raw pipeline's first pass over the benchmark's HTTP server (50 ms to first byte,
25 MB/s per connection; five fresh processes each, alternating, 2 cores) went from 2,020 to 2,262
samples/s and from 0.43 to 0.37 CPU s per 1,000 samples (medians).

A variable set or a netrc file changed while the process runs is seen within `TTL` seconds. One
difference from aiohttp's own reading: a redirect to another origin keeps the first origin's proxy
and gets no netrc credentials of its own (aiohttp looked both up again for every hop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import urllib.parse
import weakref
from typing import Any, Dict, NamedTuple, Tuple

__all__ = ["TTL", "OriginSettings", "forget", "origin_settings"]

log = logging.getLogger(__name__)

TTL = 60.0  # seconds a lookup is trusted
_Key = Tuple[str, str, bool]
# per event loop (the futures are the loop's): origin -> (when looked up, future of the settings)
_settings: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[_Key, Tuple[float, asyncio.Future]]]" = (
    weakref.WeakKeyDictionary())
_lock = threading.Lock()


class OriginSettings(NamedTuple):
    """What a request to an origin takes from the environment: `session.get` keywords (`proxy`,
    `proxy_auth`) and headers (an Authorization from netrc)."""

    keywords: Dict[str, Any]
    headers: Dict[str, str]


_NONE = OriginSettings({}, {})


def _lookup(url: str) -> OriginSettings:
    """The settings for `url`: its proxy and the proxy's credentials, unless NO_PROXY exempts the
    host; the host's netrc credentials, unless the URL carries its own. (A header, not aiohttp's
    deprecated `auth=`; aiohttp drops it on a redirect to another origin, as it drops `auth`.)"""
    from aiohttp import helpers
    from yarl import URL

    target = URL(url)
    keywords: Dict[str, Any] = {}
    headers: Dict[str, str] = {}
    try:
        keywords["proxy"], keywords["proxy_auth"] = helpers.get_env_proxy_for_url(target)
    except LookupError:  # no proxy for this scheme, or NO_PROXY names the host
        pass
    if target.host is not None and target.user is None:
        found = helpers.netrc_from_env()
        if found is not None:
            try:
                headers["Authorization"] = helpers.basicauth_from_netrc(found, target.host).encode()
            except LookupError:
                pass
    return OriginSettings(keywords, headers)


async def origin_settings(url: str) -> OriginSettings:
    """The environment's settings for a request to `url` (see `_lookup`): cached per origin for
    `TTL` seconds; concurrent first requests to one origin share one lookup."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # aiohttp refuses the URL itself, with an error the fetcher redacts
        return _NONE
    # (no port parsing: it may raise; whether the URL names a user: then netrc is not asked)
    key = (parts.scheme, parts.netloc.rpartition("@")[2].lower(), "@" in parts.netloc)
    loop = asyncio.get_running_loop()
    now = time.monotonic()
    try:
        with _lock:
            cache = _settings.setdefault(loop, {})
            entry = cache.get(key)
            if entry is None or (now - entry[0] > TTL and entry[1].done()):
                entry = (now, loop.run_in_executor(None, _lookup, url))
                cache[key] = entry
        return await asyncio.shield(entry[1])
    except asyncio.CancelledError:
        raise
    except Exception as exn:  # noqa: BLE001 - a broken environment must not fail the fetch
        # (the type only: a message, or a URL that does not parse, may hold credentials)
        log.debug("shardstream: reading the environment's proxy settings failed: %s", type(exn).__name__)
        return _NONE


def forget() -> None:
    """Drop every cached lookup (the next request of each origin reads the environment again)."""
    with _lock:
        _settings.clear()


def _after_fork_in_child() -> None:
    """A forked child starts afresh: the parent's loop thread may have held the lock at fork time,
    and its lookups are futures of the parent's loop."""
    global _lock, _settings
    _lock = threading.Lock()
    _settings = weakref.WeakKeyDictionary()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
