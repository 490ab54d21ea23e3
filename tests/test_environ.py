"""The environment's proxy and netrc settings, through the public API, against real servers: an
HTTP proxy (a second shard server, which answers absolute-form requests), NO_PROXY, netrc
credentials for a server that asks for basic auth, and one lookup per origin, not per request."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

import shardstream as wds
from shardstream._base.errors import FetchError
from shardstream._fetch import environ

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from shardserver import ShardServer  # noqa: E402

warnings.filterwarnings("ignore", message=".*shardshuffle.*")
pytestmark = pytest.mark.timeout(60)

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture()
def clean_environment(monkeypatch, tmp_path):
    """No proxy variables, a netrc that names no host, and no lookups cached from earlier tests."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    empty = tmp_path / "netrc-empty"
    empty.write_text("machine elsewhere.invalid login nobody password nothing\n")
    monkeypatch.setenv("NETRC", str(empty))
    environ.forget()
    yield monkeypatch
    environ.forget()


def _keys(samples):
    return [s["__key__"] for s in samples]


def test_http_proxy_carries_the_requests_and_no_proxy_exempts_a_host(clean_environment, shardset):
    monkeypatch = clean_environment
    root = os.path.dirname(shardset[0])
    local = _keys(wds.WebDataset(shardset, shardshuffle=False))
    with ShardServer(root) as origin, ShardServer(root) as proxy:
        urls = [origin.url(os.path.basename(p)) for p in shardset]
        monkeypatch.setenv("http_proxy", proxy.base_url)
        assert _keys(wds.WebDataset(urls, shardshuffle=False)) == local
        assert origin.stats.snapshot().requests == 0 and proxy.stats.snapshot().requests >= len(urls)
        # the variables are read again once a lookup is older than TTL
        monkeypatch.setattr(environ, "TTL", 0.0)
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        through_proxy = proxy.stats.snapshot().requests
        assert _keys(wds.WebDataset(urls, shardshuffle=False)) == local
        assert origin.stats.snapshot().requests >= len(urls) and proxy.stats.snapshot().requests == through_proxy


def test_netrc_credentials_reach_a_server_that_asks_for_them(clean_environment, shardset, tmp_path):
    monkeypatch = clean_environment
    root = os.path.dirname(shardset[0])
    local = _keys(wds.WebDataset(shardset, shardshuffle=False))
    with ShardServer(root, basic_auth=("reader", "s3cret")) as server:
        urls = [server.url(os.path.basename(p)) for p in shardset]
        with pytest.raises(FetchError, match="401"):  # no credentials for this host yet
            list(wds.WebDataset(urls, shardshuffle=False))
        netrc = tmp_path / "netrc"
        netrc.write_text("machine 127.0.0.1 login reader password s3cret\n")
        monkeypatch.setenv("NETRC", str(netrc))
        environ.forget()
        assert _keys(wds.WebDataset(urls, shardshuffle=False)) == local
        # credentials in the URL are not combined with netrc's (same origin, looked up apart)...
        with_user = [u.replace("http://", "http://reader:s3cret@") for u in urls]
        assert _keys(wds.WebDataset(with_user, shardshuffle=False)) == local
        # ... and win over them
        netrc.write_text("machine 127.0.0.1 login reader password wrong\n")
        environ.forget()
        assert _keys(wds.WebDataset(with_user, shardshuffle=False)) == local
        with pytest.raises(FetchError, match="401"):
            list(wds.WebDataset(urls, shardshuffle=False))


def test_one_lookup_per_origin_however_many_requests(clean_environment, shardset):
    monkeypatch = clean_environment
    calls = []
    lookup = environ._lookup
    monkeypatch.setattr(environ, "_lookup", lambda url: calls.append(url) or lookup(url))
    root = os.path.dirname(shardset[0])
    with ShardServer(root) as server:
        urls = [server.url(os.path.basename(p)) for p in shardset]
        small_parts = wds.FetchOptions(part_size=16 << 10)  # many ranged requests per shard
        assert len(list(wds.WebDataset(urls, shardshuffle=False, fetch_options=small_parts))) > 0
        requests = server.stats.snapshot().requests
    assert requests > 2 * len(urls) and len(calls) == 1


def _read_in_child(urls, out):
    out.put(len(list(wds.WebDataset(urls, shardshuffle=False))))


def test_a_child_forked_while_the_lock_is_held_reads_on(clean_environment, shardset):
    """The lookup table's lock held by another thread at fork time (the parent's loop thread, say)
    must not hang the child's first request."""
    import multiprocessing

    root = os.path.dirname(shardset[0])
    expected = len(list(wds.WebDataset(shardset, shardshuffle=False)))
    context = multiprocessing.get_context("fork")
    with ShardServer(root) as server:
        urls = [server.url(os.path.basename(p)) for p in shardset]
        out = context.Queue()
        with environ._lock:
            child = context.Process(target=_read_in_child, args=(urls, out))
            child.start()
        try:
            assert out.get(timeout=30) == expected
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
    assert child.exitcode == 0
