"""The receive low-water mark (`_fetch/lowat.py`) against a real HTTP server: a wake-up carries a
batch of a fast transfer's bytes, and the mark never holds back bytes a reader needs (a server
that stalls mid-body, a reader that stops pulling near a body's end, a body's end over TLS)."""

from __future__ import annotations

import json
import statistics
import sys
import time

import pytest
from looptools import write_files

from shardstream._fetch import lowat
from shardstream._fetch.loop import run_coroutine
from shardstream._fetch.options import FetchOptions
from shardstream._fetch.registry import fetch_stream
from shardstream._fetch.stream import open_stream

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not lowat.ENABLED, reason="the receive low-water mark is used on Linux only"),
]

KIB, MIB = 1 << 10, 1 << 20
OPTIONS = FetchOptions(backoff_base=0.01, backoff_max=0.05, chunk_size=256 * KIB, prefetch_bytes=1 * MIB,
                       stall_timeout=5, parallel_parts=1)
SIZES = {"big.bin": 2 * MIB + 3, **{f"tail{i}.bin": size for i, size in enumerate((600_000, 700_000, 900_000))}}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("served"), SIZES, seed=1)


def _chunk_sizes(url, options):
    async def sizes():
        return [len(chunk) async for chunk in fetch_stream(url, options=options)]

    return run_coroutine(sizes()).result(20)


def test_a_wake_up_carries_a_batch_of_the_servers_writes(server, files):
    """The server writes 16 KiB at a time, at 8 MB/s: without the mark, each write is a chunk."""
    server.options.chunk_size, server.options.bandwidth = 16 * KIB, 8e6
    sizes = _chunk_sizes(server.url("big.bin"), OPTIONS)
    assert sum(sizes) == len(files[1]["big.bin"])
    assert statistics.median(sizes) >= 3 * 16 * KIB, sizes


def test_bytes_sent_before_a_server_stall_arrive_during_it(server, files):
    """The bytes before a stall, past the last whole batch, are fewer than the mark: they must not
    wait for the stall's end (the watchdog drops the mark of a transfer that gets nothing)."""
    data = files[1]["big.bin"]
    server.options.fail_first_fault, server.options.stall_seconds = "stall", 1.5
    server.options.bandwidth = 16e6  # (batches of ~160 KiB)
    for fraction in (0.3, 0.41, 0.53):  # (a cut at a batch's end holds nothing back: try three)
        server.options.cut_fraction, server.options.fail_first = fraction, {"big.bin": 1}
        cut = int(len(data) * fraction)
        got, arrived = 0, None
        started = time.monotonic()
        with open_stream(server.url("big.bin"), options=OPTIONS) as stream:
            for chunk in stream:
                got += len(chunk)
                if arrived is None and got >= cut:
                    arrived = time.monotonic() - started
        assert got == len(data)
        assert arrived is not None and arrived < 0.75, f"the {cut} bytes before the stall took {arrived:.2f} s"
    assert server.stats.faults["stall"] == 3


def test_a_reader_that_stops_near_a_bodys_end_is_not_timed_out(server, files):
    """The reader stops pulling for three stall timeouts with the body's last bytes still in the
    kernel, fewer than the mark: they must arrive (else aiohttp's read timeout fires: a retry)."""
    options = OPTIONS.replace(stall_timeout=0.5, prefetch_bytes=256 * KIB)
    server.options.bandwidth = 16e6  # (batches of ~160 KiB)
    for name in ("tail0.bin", "tail1.bin", "tail2.bin"):  # (where the reader stops: 64 KiB in)
        with open_stream(server.url(name), options=options) as stream:
            first = next(stream)
            time.sleep(1.5)
            assert first + b"".join(stream) == files[1][name]
            assert stream.stats.retries == 0, name



def _certificates(folder):
    """A CA and a server certificate for 127.0.0.1 that it signed: (ca.pem, server.pem, key.pem)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardstream test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = [str(folder / name) for name in ("ca.pem", "server.pem", "key.pem")]
    for path, data in zip(paths, (ca.public_bytes(serialization.Encoding.PEM),
                                  leaf.public_bytes(serialization.Encoding.PEM),
                                  key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))):
        with open(path, "wb") as f:
            f.write(data)
    return paths


_TLS_CHILD = """
import json, sys, time
from shardstream._fetch import lowat
from shardstream._fetch.options import FetchOptions
from shardstream._fetch.stream import open_stream
url, cut, lowat.QUIET_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
options = FetchOptions(chunk_size=256 << 10, prefetch_bytes=1 << 20, stall_timeout=5, parallel_parts=1, retries=0)
sizes, arrived, started = [], None, time.monotonic()
with open_stream(url, options=options) as stream:
    for chunk in stream:
        sizes.append(len(chunk))
        if arrived is None and sum(sizes) >= cut:
            arrived = time.monotonic() - started
print(json.dumps({"sizes": sizes, "arrived": arrived}))
"""


def _tls_child(url, cut, quiet, ca, uvloop=None):
    """Run _TLS_CHILD in a fresh process that trusts `ca` (SSL_CERT_FILE is read at aiohttp's
    import), on uvloop ("1") or asyncio's loop ("0"), or as the environment says (None)."""
    import os
    import subprocess

    env = {**os.environ, "SSL_CERT_FILE": ca, **({} if uvloop is None else {"SHARDSTREAM_UVLOOP": uvloop})}
    child = subprocess.run([sys.executable, "-c", _TLS_CHILD, url, str(cut), str(quiet)],
                           env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_over_tls_batches_and_never_holds_back_the_bytes_before_a_stall(files, tmp_path):
    """Over HTTPS the plaintext a reader was fed lags the bytes read from the socket by up to a TLS
    record: the mark keeps that much below what is left, so the bytes before a stall still come
    at once, and each body's end comes without the watchdog's help (the client trusts the test CA
    through SSL_CERT_FILE, as a private CA's users do)."""
    import ssl

    from shardserver import ShardServer

    ca, cert, key = _certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    data = files[1]["big.bin"]
    with ShardServer(files[0], ssl_context=context, chunk_size=16 * KIB, bandwidth=8e6) as server:
        assert server.url("big.bin").startswith("https://")
        server.options.fail_first_fault, server.options.stall_seconds = "stall", 1.5
        results = []
        for fraction in (0.3, 0.41, 0.53):
            server.options.cut_fraction, server.options.fail_first = fraction, {"big.bin": 1}
            cut = int(len(data) * fraction)
            results.append(_tls_child(server.url("big.bin"), cut, lowat.QUIET_S, ca))
        assert server.stats.faults["stall"] == 3
        # Without a stall, and without the watchdog: a mark above the bytes left on the wire (a
        # TLS record's plaintext read but not fed) would hold each body's end until the timeout.
        server.options.fail_first, server.options.bandwidth = {}, 30e6
        for uvloop in ("0", "1", "0"):  # (asyncio's TLS keeps a record's part where uvloop's did not, here)
            started = time.monotonic()
            assert sum(_tls_child(server.url("big.bin"), 0, 3600.0, ca, uvloop)["sizes"]) == len(data)
            assert time.monotonic() - started < 4.0  # (stall_timeout is 5 s; the child's start ~1 s)
    for fraction, result in zip((0.3, 0.41, 0.53), results):
        assert sum(result["sizes"]) == len(data)
        assert result["arrived"] < 0.75, f"the bytes before a stall at {fraction} took {result['arrived']:.2f} s"
    every = [size for result in results for size in result["sizes"]]
    assert statistics.median(every) >= 3 * 16 * KIB
