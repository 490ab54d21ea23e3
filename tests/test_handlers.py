"""The warn_* handlers report each failure once: one warning, no second copy in the log (or on
stderr, where a plain script without logging set up would show both)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
from shardsets import corrupt_header, sample_members, write_tar

import shardstream as wds

warnings.filterwarnings("ignore", message=".*shardshuffle.*")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def shards(tmp_path):
    good1 = write_tar(str(tmp_path / "good1.tar"), [m for i in range(4) for m in sample_members(i, exts=("cls", "json"))])
    good2 = write_tar(str(tmp_path / "good2.tar"), [m for i in range(10, 14) for m in sample_members(i, exts=("cls", "json"))])
    corrupt = str(tmp_path / "corrupt.tar")
    offset = corrupt_header(good1, corrupt, 4)  # sample 2's first header
    badjson = write_tar(str(tmp_path / "badjson.tar"), [
        *sample_members(0, exts=("cls", "json")), ("s0001.cls", b"1"), ("s0001.json", b"{not json"),
        *sample_members(2, exts=("cls", "json")),
    ])
    return {"good1": good1, "good2": good2, "corrupt": corrupt, "offset": offset, "badjson": badjson}


def _reports(make_dataset, caplog, needle):
    """Run the dataset; return its keys and every report (warning or log record) containing needle."""
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        keys = [s["__key__"] for s in make_dataset()]
    reports = [str(w.message) for w in seen if needle in str(w.message)]
    reports += [r.getMessage() for r in caplog.records if needle in r.getMessage()]
    return keys, reports


def test_a_skipped_shard_is_reported_once(shards, caplog):
    urls = [shards["good1"], shards["corrupt"], shards["good2"]]
    keys, reports = _reports(
        lambda: wds.WebDataset(urls, shardshuffle=False, handler=wds.warn_and_continue), caplog, "corrupt.tar"
    )
    # the corrupt shard's first sample is whole (its second was cut short by the bad header)
    assert keys == ["s0000", "s0001", "s0002", "s0003", "s0000", "s0010", "s0011", "s0012", "s0013"]
    assert len(reports) == 1, reports
    assert reports[0].startswith("skipped after error: FormatError(")
    assert shards["corrupt"] in reports[0] and f"offset={shards['offset']}" in reports[0]


def test_a_sample_that_fails_to_decode_is_reported_once(shards, caplog):
    keys, reports = _reports(
        lambda: wds.WebDataset(shards["badjson"], shardshuffle=False).decode(handler=wds.warn_and_continue),
        caplog, "JSONDecodeError",
    )
    assert keys == ["s0000", "s0002"]
    assert len(reports) == 1, reports
    assert shards["badjson"] in reports[0] and "s0001.json" in reports[0]


@pytest.mark.parametrize("threads", [0, 2])
def test_a_failing_map_is_reported_once_per_sample(shards, caplog, threads):
    def fail_odd(sample):
        if int(sample["cls"]) % 2:
            raise ValueError(f"odd sample {sample['__key__']}")
        return sample

    def dataset():
        ds = wds.WebDataset(shards["good1"], shardshuffle=False).map(fail_odd, handler=wds.warn_and_continue)
        return ds.with_engine(threads=threads) if threads else ds

    keys, reports = _reports(dataset, caplog, "odd sample")
    assert keys == ["s0000", "s0002"]
    where = f"in stage 'map(fail_odd)' on sample '{{}}' of {shards['good1']}"  # the map knew nothing of the shard
    assert sorted(reports) == [
        f"skipped after error: ValueError('odd sample {key}') (raised {where.format(key)})" for key in ("s0001", "s0003")
    ]


def test_warn_and_stop_reports_once_and_stops(shards, caplog):
    urls = [shards["good1"], shards["corrupt"], shards["good2"]]
    keys, reports = _reports(
        lambda: wds.WebDataset(urls, shardshuffle=False, handler=wds.warn_and_stop), caplog, "corrupt.tar"
    )
    assert keys == ["s0000", "s0001", "s0002", "s0003", "s0000"]
    assert len(reports) == 1 and reports[0].startswith("stopped after error: FormatError("), reports


SCRIPT = """
import sys
import shardstream as wds
urls = sys.argv[1:]
print(len(list(wds.WebDataset(urls, shardshuffle=False, handler=wds.warn_and_continue))))
"""


def test_a_plain_script_shows_a_skipped_shard_once_on_stderr(shards):
    """No logging configured, default warning filters: what a user running a script sees."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", SCRIPT, shards["good1"], shards["corrupt"], shards["good2"]],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["9"]
    assert done.stderr.count("bad tar header checksum") == 1, done.stderr
