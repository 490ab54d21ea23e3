"""The error tree, locations in messages, redaction, pickling."""

from __future__ import annotations

import pickle

import pytest

from shardstream import (
    FetchError,
    FormatError,
    ShardNotFound,
    ShardStreamError,
    UsageError,
)
from shardstream._base.errors import redact_url
from needs import needs_torch


@pytest.mark.parametrize(
    "url, expected",
    [
        ("https://user:hunter2@host/a.tar", "https://***@host/a.tar"),
        ("s3://bucket/a.tar?X-Amz-Signature=abc&x=1", "s3://bucket/a.tar?X-Amz-Signature=***&x=1"),
        ("http://h/a.tar?token=secret", "http://h/a.tar?token=***"),
        ("/plain/path.tar", "/plain/path.tar"),
    ],
)
def test_redaction(url, expected):
    assert redact_url(url) == expected


def test_location_in_message_and_attributes():
    exc = FormatError("bad tar header", url="https://u:p@h/x.tar", member="a.jpg", offset=1024)
    assert "https://***@h/x.tar" in str(exc) and "a.jpg" in str(exc) and "1024" in str(exc)
    assert "p@" not in str(exc)
    assert (exc.member, exc.offset) == ("a.jpg", 1024)


def test_tree_and_stdlib_bases():
    assert issubclass(FormatError, ValueError) and issubclass(FormatError, ShardStreamError)
    assert issubclass(ShardNotFound, FileNotFoundError) and issubclass(ShardNotFound, FetchError)
    assert issubclass(FetchError, OSError) and issubclass(UsageError, ValueError)


def test_with_location_fills_only_unknown_fields():
    exc = FormatError("x", offset=5).with_location(url="u", offset=9, member="m")
    assert (exc.url, exc.member, exc.offset) == ("u", "m", 5)
    assert "url=u" in str(exc)


def test_errors_pickle_with_their_location():
    exc = ShardNotFound("shard not found", url="http://a:b@h/x.tar", offset=0)
    clone = pickle.loads(pickle.dumps(exc))
    assert type(clone) is ShardNotFound and str(clone) == str(exc) and clone.url == exc.url


@needs_torch
def test_errors_pickle_with_their_notes():
    """A worker's or helper's error keeps the note that names the stage that raised it."""
    from shardstream._cache.check import CorruptCacheFile
    from shardstream._decode.decoder import DecodingError

    for exc in (ShardNotFound("gone", url="u", offset=3), DecodingError(url="u", key="k", k="jpg", reason="r"),
                CorruptCacheFile("bad", cache_path="p", url="u")):
        exc.add_note("shardstream: raised in stage 'decode'")
        clone = pickle.loads(pickle.dumps(exc))
        assert type(clone) is type(exc) and clone.__notes__ == ["shardstream: raised in stage 'decode'"]
        assert str(clone) == str(exc)
    assert not hasattr(pickle.loads(pickle.dumps(ShardNotFound("gone", url="u"))), "__notes__")


def test_a_cause_that_holds_a_secret_is_chained_redacted():
    """`safe_cause`: a third-party error whose text holds a credential is replaced by a stand-in with
    the redacted text and the same traceback; a clean one is kept; one whose __str__ fails is named."""
    from shardstream._base.errors import RedactedCause, safe_cause

    clean = ValueError("plain")
    assert safe_cause(clean) is clean
    try:
        raise ConnectionError("GET http://u:pw@h/x.tar?token=abc failed")
    except ConnectionError as exn:
        secret = exn
    stand_in = safe_cause(secret)
    assert isinstance(stand_in, RedactedCause) and stand_in.__traceback__ is secret.__traceback__
    assert str(stand_in) == "ConnectionError: GET http://***@h/x.tar?token=*** failed"

    class Broken(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert "could not be shown" in str(safe_cause(Broken()))


@pytest.mark.parametrize("workers", [0, 1])
@needs_torch
def test_a_decoding_error_names_the_members_byte_offset(tmp_path, workers):
    """Errors name URL, member and offset; a DecodingError named no offset (the sample does not
    carry its members' places). It is looked up when the error is made (a local uncompressed
    shard's headers), also for one rebuilt from a DataLoader worker."""
    import io
    import tarfile

    import shardstream as wds

    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(3):
            for ext, data in (("cls", b"1"), ("JPG", b"not an image")):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        where = {m.name: m.offset for m in tar}
    dataset = wds.WebDataset(str(path), shardshuffle=False).decode("rgb8")
    with pytest.raises(wds.DecodingError) as info:
        list(wds.WebLoader(dataset, batch_size=None, num_workers=workers))
    assert info.value.member == "s0.jpg" and info.value.offset == where["s0.JPG"] == 1024
    assert "offset=1024" in str(info.value)
