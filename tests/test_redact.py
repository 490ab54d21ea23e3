"""Redaction (`_redact`): every credential shape the issue tracker found leaking, and a property
test that generated secrets never survive, in URLs, in `pipe:` commands and in free text."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream._base.redact import redact


@pytest.mark.parametrize(
    "text, expected",
    [
        ("https://user:hunter2@host/a.tar", "https://***@host/a.tar"),
        ("http://user:p@ss@host/x.tar", "http://***@host/x.tar"),  # "@" in the password
        ("http://user:pa/ss@host/x.tar", "http://***@host/x.tar"),  # "/" in the password
        ("http://user:Zq9#frag@host:9/x.tar", "http://***@host:9/x.tar"),  # "#" in the password
        ("http://user:Zq9?qm@host/x.tar?e=a@b", "http://***@host/x.tar?e=a@b"),  # "?" in it, "@" in the query
        ("https://user:pw@host?email=a@b", "https://***@host?email=a@b"),  # no path; "@" in the query
        ("https://user:pw@host:8443?next=x@y", "https://***@host:8443?next=x@y"),
        ("http://[::1]/a.tar?mail=a@b.c", "http://[::1]/a.tar?mail=a@b.c"),  # IPv6: its colons are no password
        ("http://host:8080/a@b/x.tar", "http://host:8080/a@b/x.tar"),  # a port, "@" in the path: kept
        ("http://alice:1234/5678@127.0.0.1:9/x.tar", "http://***@127.0.0.1:9/x.tar"),  # digits and "/": no port
        ("http://bob:12/34@files.example.com/x.tar", "http://***@files.example.com/x.tar"),
        ("http://localhost:8080/v@1.2/x.tar", "http://localhost:8080/v@1.2/x.tar"),  # a host's port, "@" in the path
        ("http://h.example:80/a@b.c/x.tar", "http://h.example:80/a@b.c/x.tar"),
        ("https://h/x.tar#access_token=tok123", "https://h/x.tar#access_token=***"),  # a secret in the fragment
        ("s3://bucket/a.tar?X-Amz-Signature=abc&x=1", "s3://bucket/a.tar?X-Amz-Signature=***&x=1"),
        ("https://storage.googleapis.com/b/o.tar?X-Goog-Algorithm=GOOG4&X-Goog-Credential=sa%40p.iam&"
         "X-Goog-Signature=0a1b", "https://storage.googleapis.com/b/o.tar?X-Goog-Algorithm=GOOG4&"
         "X-Goog-Credential=***&X-Goog-Signature=***"),
        ("http://h/a.tar?private_token=t1&access_key=k1&client_secret=c1&key=k2&sig=s1&password=p1",
         "http://h/a.tar?private_token=***&access_key=***&client_secret=***&key=***&sig=***&password=***"),
        ("http://h/a.tar?token=secret#frag", "http://h/a.tar?token=***#frag"),
        ("pipe:curl -s -u bob:pw1 'https://alice:pw2@h/x.tar?token=t' -H 'Authorization: Bearer abc'",
         "pipe:curl -s -u *** 'https://***@h/x.tar?token=***' -H 'Authorization: ***'"),
        # curl's usual spellings (the security hunt): -u at the end of a cluster, secret headers
        ("pipe:curl -sfu alice:S3cret http://h/x.tar", "pipe:curl -sfu *** http://h/x.tar"),
        ("pipe:curl -sSLfu 'alice:S3cret' http://h/x.tar", "pipe:curl -sSLfu '***' http://h/x.tar"),
        ("pipe:curl -s -H 'PRIVATE-TOKEN: glpat-xyz' http://h/x.tar", "pipe:curl -s -H 'PRIVATE-TOKEN: ***' http://h/x.tar"),
        ('pipe:curl --header "X-API-Key: k123" http://h/x.tar', 'pipe:curl --header "X-API-Key: ***" http://h/x.tar'),
        ("pipe:curl --oauth2-bearer tok123 http://h/x.tar", "pipe:curl --oauth2-bearer *** http://h/x.tar"),
        ("headers={'X-Amz-Security-Token': b'tok9', 'Accept': b'*/*'}",  # botocore's request repr: bytes values
         "headers={'X-Amz-Security-Token': b'***', 'Accept': b'*/*'}"),
        ("pipe:curl -s -H 'Accept: text/plain' http://h/x.tar", "pipe:curl -s -H 'Accept: text/plain' http://h/x.tar"),
        ("stall_timeout: 30 s; no credentials: set them", "stall_timeout: 30 s; no credentials: set them"),
        ("pipe:AWS_SECRET_ACCESS_KEY=xyz aws s3 cp s3://b/x.tar -", "pipe:AWS_SECRET_ACCESS_KEY=*** aws s3 cp s3://b/x.tar -"),
        ("cannot open https://u:p@h/x.tar: refused", "cannot open https://***@h/x.tar: refused"),
        ("headers=<CIMultiDictProxy('Host': 'h', 'Authorization': 'Basic Ym9iOnB3', 'X-Amz-Security-Token': 't', "
         "'Cookie': 'a=b; c=d', 'Accept': '*/*')>",
         "headers=<CIMultiDictProxy('Host': 'h', 'Authorization': '***', 'X-Amz-Security-Token': '***', "
         "'Cookie': '***', 'Accept': '*/*')>"),
        ("{\"authorization\": \"Bearer x\", \"x-api-key\": \"k\", \"__key__\": \"s0000\", \"key\": \"v\"}",
         "{\"authorization\": \"***\", \"x-api-key\": \"***\", \"__key__\": \"s0000\", \"key\": \"v\"}"),
        ("duplicate file name in tar file: 'a.key'", "duplicate file name in tar file: 'a.key'"),
        ("/plain/path.tar", "/plain/path.tar"),
        ("http://h/train-{000..009}.tar", "http://h/train-{000..009}.tar"),
    ],
)
def test_redaction(text, expected):
    assert redact(text) == expected


SECRET = st.text(alphabet=string.ascii_letters + string.digits + "@:!$'()*+,;=%-._~", min_size=6, max_size=20).map(
    lambda s: "Zq9" + s  # never a substring of the surrounding text by chance
)
QUERY_SECRET = st.text(alphabet=string.ascii_letters + string.digits + "%-._~+/=", min_size=6, max_size=20).map(
    lambda s: "Zq9" + s
)
NAMES = st.sampled_from([
    "token", "access_token", "private_token", "key", "api_key", "access_key", "secret", "client_secret",
    "signature", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "X-Goog-Signature",
    "X-Goog-Credential", "sig", "password", "AWSAccessKeyId",
])
HOSTS = st.sampled_from(["h", "example.com", "127.0.0.1:8080", "[::1]:9000", "bucket.s3.amazonaws.com"])
SCHEMES = st.sampled_from(["http", "https", "s3", "gs", "hf"])
PATHS = st.sampled_from(["/a.tar", "/d/train-{000..009}.tar", "/x/y.tar.gz", ""])


@settings(max_examples=300, deadline=None)
@given(scheme=SCHEMES, user=st.sampled_from(["u", "user.name", "a-b"]), password=SECRET, host=HOSTS, path=PATHS,
       name=NAMES, value=QUERY_SECRET, wrapper=st.sampled_from(["{}", "pipe:curl -s '{}'", "error while reading {}: x",
                                                                 "pipe:curl -s {} | cat"]))
def test_generated_secrets_never_survive(scheme, user, password, host, path, name, value, wrapper):
    url = f"{scheme}://{user}:{password}@{host}{path}?a=1&{name}={value}&b=2"
    shown = redact(wrapper.format(url))
    assert password not in shown and value not in shown
    assert f"{scheme}://***@{host}{path}" in shown  # still says where


def test_a_comma_that_ends_a_clause_stays():
    """A rendered error ("url=..., member=..., offset=0") redacted as text keeps its commas (the
    CLI printed "api_key=*** offset=0"); a comma inside a value is still part of the secret."""
    from shardstream._base.redact import redact

    text = "cannot open (url=http://h/x.tar?api_key=SECRET, member=None, offset=0)"
    assert redact(text) == "cannot open (url=http://h/x.tar?api_key=***, member=None, offset=0)"
    assert redact("token=a,b,c next") == "token=*** next"
    assert redact("see http://u:pw@h/x?sig=abc, then") == "see http://***@h/x?sig=***, then"


def test_a_password_with_a_raw_space_is_hidden_in_the_error_naming_the_url():
    """`http://bob:hunter 2secret@host/a.tar` (typed so; aiohttp sends it): a text search for URLs
    ends at the space, and the error showed `url=http://bob:hunter 2secret@...`."""
    import shardstream as wds

    error = wds.ShardNotFound("HTTP 404 Not Found", url="http://bob:hunter 2secret@127.0.0.1:9/nope.tar", offset=0)
    assert "hunter" not in str(error) and "2secret" not in str(error) and "127.0.0.1:9/nope.tar" in str(error)
    assert "2secret" not in error.url


def test_pathlib_paths_are_shard_urls(tmp_path):
    """webdataset asserts on them; a list of `Path` gave an AttributeError from deep inside."""
    from pathlib import Path

    import shardstream as wds

    path = tmp_path / "a.tar"
    with wds.TarWriter(str(path)) as sink:
        sink.write({"__key__": "k", "txt": "x"})
    for spec in (path, [path], [Path(str(path))]):
        assert [s["__key__"] for s in wds.WebDataset(spec, shardshuffle=False)] == ["k"]


@pytest.mark.parametrize("url, expected", [
    ("http://alice:pw@h/x.tar?sig=1", "http://h/x.tar?sig=1"),
    ("http://user:pa/ss@host:8/x.tar", "http://host:8/x.tar"),  # "/" in the password
    ("s3://bucket/key@2.tar", "s3://bucket/key@2.tar"),
    ("/data/x.tar", "/data/x.tar"),
])
def test_without_userinfo(url, expected):
    from shardstream._base.redact import without_userinfo

    assert without_userinfo(url) == expected
