"""One resume harness over every stateful stage (torchdata's test/nodes/utils.py is the model):
the items before a checkpoint plus the items after restoring it equal one uninterrupted epoch,
in the same order, for each pipeline shape."""

from __future__ import annotations

import inspect
import io
import json
import os
import pkgutil
import importlib
import warnings

import pytest
from compare import assert_same_stream
from shardserver import ShardServer
from shardsets import sample_members, write_tar

import shardstream as wds
from needs import needs_torch

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


def check_resume(build, checkpoints=(0, 1, 7, 30), seeks=None):
    """build() -> a fresh dataset or WebLoader; checkpoint after k items and resume in a fresh one.
    seeks: True asserts that the state holds seek positions (shard, sample, offset), False
    count positions (outputs of the last stage that holds samples back; see _positions)."""
    reference = build()
    full = list(reference)
    following = list(reference)  # the epoch after it
    checkpoints = sorted({min(k, len(full) - 1) for k in checkpoints})  # the last one: mid-final-item
    assert len(full) > 1
    for k in checkpoints:
        first_ds = build()
        it = iter(first_ds)
        first = [next(it) for _ in range(k)]
        state = first_ds.state_dict()
        if seeks is not None and k:
            positions = list(state["positions"].values()) if "positions" in state else [state["position"]]
            assert positions and all(p is not None and len(p) == (4 if seeks else 2) for p in positions), state
        del it
        resumed = build()
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert_same_stream(full, first + rest)
        # and the epoch after a resumed one is the epoch that followed in the uninterrupted run
        assert_same_stream(following, list(resumed))
        # a checkpoint taken in a resumed run (even before its first item) resumes exactly too
        again = build()
        again.load_state_dict(state)
        it = iter(again)
        middle = [next(it) for _ in range(min(k % 3, len(rest)))]
        state2 = again.state_dict()
        del it
        last = build()
        last.load_state_dict(state2)
        assert_same_stream(full, first + middle + list(last))


def keyed(wds_dataset):
    return wds_dataset.to_tuple("__key__", "__url__")


@wds.clean_cut
def _lowercase_keys(src):
    for key, url in src:
        yield key.lower(), url


STAGES = {
    "custom_clean_stage": lambda s: keyed(wds.WebDataset(s, shardshuffle=False)).compose(_lowercase_keys),
    "source": lambda s: keyed(wds.WebDataset(s, shardshuffle=False)),
    "decode_map": lambda s: wds.WebDataset(s, shardshuffle=False).decode().to_tuple("__key__", "cls", handler=wds.ignore_and_continue),
    "shard_shuffle": lambda s: keyed(wds.WebDataset(s, shardshuffle=3, seed=5)),
    "detshuffle": lambda s: keyed(wds.WebDataset(s, shardshuffle=3, detshuffle=True, seed=5)),
    "seeded_sample_shuffle": lambda s: keyed(wds.WebDataset(s, shardshuffle=False, seed=9).shuffle(20)),
    "explicit_seed_shuffle": lambda s: keyed(wds.WebDataset(s, shardshuffle=False)).shuffle(20, seed=7),
    "partial_batches": lambda s: keyed(wds.WebDataset(s, shardshuffle=False)).batched(7),
    "unbatched": lambda s: keyed(wds.WebDataset(s, shardshuffle=False)).batched(5).unbatched(),
    "equal_split_rank1": lambda s: keyed(wds.WebDataset(s, shardshuffle=True, seed=3, nodesplitter=wds.split_by_node)),
    "random_mix": lambda s: wds.DataPipeline(
        wds.RandomMix([keyed(wds.WebDataset(s[:3], shardshuffle=False)), keyed(wds.WebDataset(s[3:], shardshuffle=False))], [0.3, 0.7], longest=True, seed=4)
    ),
    "clean_cut_filters": lambda s: wds.DataPipeline(
        wds.SimpleShardList(s), wds.tarfile_to_samples(), wds.filters.info(n=0, stream=io.StringIO()),
        wds.filters.log_keys(os.devnull), wds.filters.xdecode(must_decode=False), wds.to_tuple("__key__", "__url__"),
    ),
    "round_robin": lambda s: wds.DataPipeline(
        wds.RoundRobin([keyed(wds.WebDataset(s[:3], shardshuffle=False)), keyed(wds.WebDataset(s[3:], shardshuffle=False))], longest=True)
    ),
}


# Resumed by position (seek), not by replaying the epoch: a shard reader followed by clean cuts.
SEEKABLE = {"source", "custom_clean_stage", "clean_cut_filters", "decode_map", "shard_shuffle", "detshuffle", "partial_batches", "equal_split_rank1"}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_resume_direct(shardset, name, monkeypatch):
    if name == "equal_split_rank1":
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
    seeks = name in SEEKABLE
    check_resume(lambda: STAGES[name](shardset), checkpoints=(0, 1, 5, 12), seeks=seeks)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", ["source", "seeded_sample_shuffle", "partial_batches"])
@needs_torch
def test_resume_webloader(shardset, name, workers):
    check_resume(
        lambda: wds.WebLoader(STAGES[name](shardset), batch_size=None, num_workers=workers),
        checkpoints=(0, 3, 11), seeks=name in SEEKABLE,
    )


@pytest.mark.parametrize("name", ["source", "seeded_sample_shuffle", "detshuffle"])
def test_resume_subprocess(shardset, name):
    """The pipeline runs in a helper process; its state follows the items received here."""
    check_resume(lambda: wds.SubprocessLoader(STAGES[name](shardset), buffer=2), checkpoints=(0, 11), seeks=name in SEEKABLE)


@pytest.mark.parametrize("name", ["seeded_sample_shuffle"])
@needs_torch
def test_resume_webloader_subprocess(shardset, name):
    check_resume(
        lambda: wds.WebLoader(STAGES[name](shardset), batch_size=None, subprocess=True),
        checkpoints=(0, 3, 11), seeks=name in SEEKABLE,
    )


@pytest.mark.parametrize("loader", ["direct", "subprocess"])
@needs_torch
def test_resume_device_prefetcher(shardset, loader):
    """The prefetcher runs ahead of the consumer; its state is that of the last batch handed out."""
    def build():
        dataset = STAGES["partial_batches"](shardset)
        return wds.DevicePrefetcher(dataset if loader == "direct" else wds.SubprocessLoader(dataset), device="cpu", depth=3)

    check_resume(build, checkpoints=(0, 2, 5), seeks=True)


@pytest.mark.parametrize("engine", [True, False])
def test_resume_with_epoch_by_position(shardset, engine):
    def build():
        ds = keyed(wds.WebDataset(shardset, shardshuffle=False)).batched(4).with_epoch(40)
        return ds if engine else ds.with_engine(enabled=False)

    check_resume(build, checkpoints=(0, 9, 20, 33), seeks=True)


@pytest.fixture(scope="module")
def big_shards(tmp_path_factory):
    """Three shards of 60 samples with 4 KB payloads (seeking must skip most of the bytes)."""
    root = tmp_path_factory.mktemp("big")
    payload = os.urandom(4096)
    return root, [
        write_tar(str(root / f"big-{n}.tar"), [
            m for i in range(60 * n, 60 * n + 60) for m in [*sample_members(i, exts=("cls",)), (f"s{i:04d}.bin", payload)]
        ])
        for n in range(3)
    ]


def _source_bytes(ds):
    return ds.stats().source["bytes"]


def test_resume_after_a_shuffle_buffer_does_not_redo_the_work_after_it(shardset):
    """Count positions: the stages up to the shuffle buffer run again (it must refill exactly),
    the map after it runs only for the items after the checkpoint."""

    def build(calls=None):
        def work(sample):
            if calls is not None:
                calls.append(sample["__key__"])
            return sample

        return wds.WebDataset(shardset, shardshuffle=False, seed=9).shuffle(20).map(work).to_tuple("__key__", "__url__")

    full = list(build())
    first_ds = build()
    it = iter(first_ds)
    first = [next(it) for _ in range(30)]
    state = first_ds.state_dict()
    assert state["position"] == [0, 30]
    it.close()
    calls = []
    resumed = build(calls)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert_same_stream(full, first + rest)
    assert len(calls) == len(rest)


def test_seeking_resume_reads_only_what_is_left(big_shards):
    """Checkpoint in the middle of the last shard: the resumed pass does not open the shards
    before it and enters the last one at the next sample's byte offset (no .idx needed)."""
    _root, shards = big_shards

    def build():
        return wds.WebDataset(shards, shardshuffle=False).to_tuple("__key__", "cls").batched(10)

    whole = build()
    full = list(whole)
    total = _source_bytes(whole)
    first_ds = build()
    it = iter(first_ds)
    first = [next(it) for _ in range(14)]  # 140 samples: 20 into the last shard
    state = first_ds.state_dict()
    assert state["position"][1:3] == [2, 20]
    resumed = build()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert_same_stream(full, first + rest)
    assert _source_bytes(resumed) < total / 3 * (40 / 60) + 8192


def _stop_and_resume(build, take, server, build_resumed=None):
    """A full pass, then a pass stopped after `take` items whose state a fresh dataset (from
    `build_resumed`, else `build`) resumes; the server's counters cover the resumed pass only.
    Returns (rest, state, the resumed dataset): the resumed pass's items, the state it resumed from."""
    full = list(build())
    first_ds = build()
    it = iter(first_ds)
    first = [next(it) for _ in range(take)]
    state = first_ds.state_dict()
    del it, first_ds
    server.stats.reset()
    resumed = (build_resumed or build)()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert_same_stream(full, first + rest)
    return rest, state, resumed


def test_seeking_resume_over_http_uses_a_range_request(big_shards):
    root, shards = big_shards
    with ShardServer(root) as server:
        urls = [server.url(os.path.basename(p)) for p in shards]

        def build():
            return wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls")

        full_bytes = sum(os.path.getsize(p) for p in shards)
        _stop_and_resume(build, 150, server)
        after = server.stats.snapshot()
        assert after.range_requests >= 1
        # the finished shards are not fetched again, not even for their size (a one-byte size probe,
        # `_fetch.parts`, of the shard being resumed aside)
        assert after.fetches == {"big-2.tar": 1}
        assert set(after.size_probes) <= {"big-2.tar"} and max(after.size_probes.values(), default=0) <= 1
        assert after.bytes_sent < full_bytes / 3 * (30 / 60) + 8192


@pytest.mark.parametrize("memory", [0, 64 << 20])
def test_seeking_resume_over_http_reads_a_cached_shard_from_the_disk_cache(big_shards, tmp_path, memory):
    """A restarted job with the node's cache: the shard it stopped in is entered at the saved
    offset in the cached copy, with no request to the origin, and the samples are those after
    the checkpoint (keys and bytes as in an uninterrupted pass). A memory tier in front, which
    only takes whole shards, does not send the resumed shard to the origin either."""
    root, shards = big_shards
    cache_dir = str(tmp_path)
    with ShardServer(root) as server:
        urls = [server.url(os.path.basename(p)) for p in shards]

        def build():
            return wds.WebDataset(
                urls, shardshuffle=False, cache_dir=cache_dir, cache_memory_bytes=memory
            ).to_tuple("__key__", "cls", "bin")

        # the full pass fills the cache; the stop is 30 samples into big-1
        rest, state, resumed = _stop_and_resume(build, 90, server)
        assert state["position"][1:3] == [1, 30] and state["position"][3] > 0
        assert [s[0] for s in rest] == [f"s{i:04d}" for i in range(90, 180)]
        assert server.stats.snapshot().path_requests == {}  # big-1 (and big-2) came from the cache
        cache = resumed.stats().cache
        assert cache["disk"]["hits"] == 2 and cache["origin"]["fetches"] == 0


def test_seeking_resume_of_a_shard_not_in_the_cache_reads_the_rest_from_the_origin(big_shards, tmp_path):
    """With an empty cache the resumed shard is read from the origin with a Range from the saved
    offset, as without a cache, and is not cached (the cache keeps whole shards only); the next
    shard, read from its start, is."""
    root, shards = big_shards
    cache_dir = str(tmp_path)
    with ShardServer(root) as server:
        urls = [server.url(os.path.basename(p)) for p in shards]

        def build(cache=None):
            return wds.WebDataset(urls, shardshuffle=False, cache_dir=cache).to_tuple("__key__", "cls")

        _, _, resumed = _stop_and_resume(build, 90, server, lambda: build(cache_dir))
        after = server.stats.snapshot()
        assert after.fetches == {"big-1.tar": 1, "big-2.tar": 1}  # (a one-byte size probe, `_fetch.parts`, aside)
        assert set(after.size_probes) <= {"big-1.tar", "big-2.tar"} and max(after.size_probes.values(), default=0) <= 1
        assert after.range_requests >= 1
        cached = resumed.stats().cache["disk"]
        assert cached["hits"] == 0 and cached["bytes_written"] == os.path.getsize(shards[2])


@needs_torch
def test_webloader_state_is_plain_data(shardset):
    loader = wds.WebLoader(STAGES["source"](shardset), batch_size=None, num_workers=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    import json

    assert json.loads(json.dumps(state)) == state
    assert sum(state["per_worker"].values()) == 5


def test_with_epoch_and_set_epoch(shardset):
    ds = STAGES["seeded_sample_shuffle"](shardset)
    ds.set_epoch(0)
    a = list(ds)
    ds.set_epoch(0)
    assert list(ds) == a
    ds.set_epoch(1)
    b = list(ds)
    assert sorted(b) == sorted(a) and b != a


def test_resampled_with_a_seed_is_reproducible_and_resumable(shardset):
    def build():
        return keyed(wds.WebDataset(shardset, resampled=True, seed=3)).with_epoch(60)

    a = list(build())
    assert a == list(build()) and len(a) == 60
    check_resume(build, checkpoints=(0, 17))


def test_weighted_sources_are_drawn_in_their_proportions(shardset):
    spec = shardset[0] + "::" + "{" + shardset[1] + "," + shardset[2] + "}"
    shards = wds.ResampledShards(spec, nshards=6000, weights="1::3", seed=7, deterministic=True, mix="random")
    draws = [d["url"] for d in shards]
    share = sum(u == shardset[0] for u in draws) / len(draws)
    assert abs(share - 0.25) < 5 * (0.25 * 0.75 / len(draws)) ** 0.5
    again = wds.ResampledShards(spec, nshards=6000, weights=[1, 3], seed=7, deterministic=True, mix="random")
    assert [d["url"] for d in again] == draws
    with pytest.raises(ValueError):
        wds.ResampledShards(spec, weights=[1])


def test_exact_mix_keeps_exact_proportions_and_resumes(shardset):
    a = wds.MockDataset("a", 1000)
    b = wds.MockDataset("b", 1000)
    mixed = list(wds.RandomMix([a, b], [1, 3], exact=True))
    for n in (4, 40, 400, 999):
        assert abs(mixed[:n].count("a") - n / 4) <= 1
    check_resume(lambda: wds.DataPipeline(wds.RandomMix([a, b], [1, 3], exact=True), wds.slice(300)), checkpoints=(0, 7, 150))


def test_webdataset_weighted_resampled_sources(shardset):
    spec = shardset[0] + "::" + "{" + shardset[4] + "," + shardset[5] + "}"
    ds = wds.WebDataset(spec, resampled=True, seed=1, weights="3::1").to_tuple("__url__").with_epoch(400)
    urls = [u for (u,) in ds]
    share = sum(u == shardset[0] for u in urls) / len(urls)
    # shard 0 (8 samples) is drawn 3x as often as shards 4 and 5 together (37 + 2 samples): about
    # 55% of the samples come from it; unweighted it would be about 17%.
    assert len(urls) == 400 and share > 0.3
    with pytest.raises(wds.UsageError):
        wds.WebDataset(spec, shardshuffle=False, weights="3::1")


# -- elastic: finish an epoch on another world size or worker count ------------------------------

UNEVEN = [5, 40, 12, 23, 8, 31, 17]  # 136 samples


@pytest.fixture(scope="module")
def uneven_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("uneven")
    shards, index = [], 0
    for n, size in enumerate(UNEVEN):
        shards.append(write_tar(str(root / f"part-{n}.tar"), [m for i in range(index, index + size) for m in sample_members(i, exts=("cls",))]))
        index += size
    return shards


def _elastic_loader(shards, workers, shuffle=0):
    ds = wds.WebDataset(shards, shardshuffle=True, seed=3, nodesplitter=wds.split_by_node)
    if shuffle == "explicit":
        ds = ds.shuffle(10, seed=11)  # webdataset's shuffle with its own seed: replayable too
    elif shuffle:
        ds = ds.shuffle(shuffle)  # seeded by (seed, epoch, rank, worker): elastic resume recomputes it
    ds = ds.to_tuple("__key__").batched(4)
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)


def _keys(batches):
    return [key for batch in batches for key in batch[0]]


def _run_ranks(monkeypatch, world, workers, build, take=None, load=None):
    """Run every rank of a layout in turn (RANK/WORLD_SIZE as torchrun sets them): each takes
    `take(rank)` batches (None: to the end); returns the keys and states per rank."""
    keys, states = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        loader = build(workers)
        if load is not None:
            loader.load_state_dict(load)
        it = iter(loader)
        n = take(rank) if take is not None else None
        got = [b for _, b in zip(range(n), it)] if n is not None else list(it)
        keys.append(_keys(got))
        states.append(loader.state_dict())
        del it
    return keys, states


@pytest.mark.parametrize("shuffle", [0, 10, "explicit"])
@pytest.mark.parametrize("new_world,new_workers", [(3, 1), (1, 3), (2, 1), (4, 2)])
@needs_torch
def test_elastic_resume_finishes_the_epoch(monkeypatch, uneven_shards, new_world, new_workers, shuffle):
    build = lambda workers: _elastic_loader(uneven_shards, workers, shuffle)  # noqa: E731
    full, _ = _run_ranks(monkeypatch, 2, 2, build)
    epoch = {k for rank in full for k in rank}
    assert len(epoch) == 136
    # ranks step in lockstep under DDP: the same number of batches each before the checkpoint
    before, states = _run_ranks(monkeypatch, 2, 2, build, take=lambda rank: 5)
    assert [len(k) for k in before] == [20, 20]
    assert all(s["positions"] for s in states)
    assert all(len(p) == (2 if shuffle else 4) for s in states for p in s["positions"].values())
    after, resumed_states = _run_ranks(monkeypatch, new_world, new_workers, build, load=states)
    delivered = [k for rank in before + after for k in rank]
    assert len(delivered) == len(set(delivered)), "a sample was repeated"
    left = 136 - 40
    assert len(set(delivered)) == 40 + left - left % new_world  # only the remainder is dropped
    assert set(delivered) <= epoch
    assert len({len(k) for k in after}) == 1  # equal work on the new layout
    # the next epoch on the new layout is a fresh, complete one
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(new_world))
    loader = build(new_workers)
    loader.load_state_dict(resumed_states)
    assert list(loader) == []  # the resumed epoch was finished
    assert len(_keys(list(loader))) == 136 // new_world


@pytest.mark.parametrize("shuffle", [0, 10])
@pytest.mark.parametrize("new_world,new_workers", [(2, 1), (3, 2), (1, 3)])
@needs_torch
def test_elastic_resume_from_one_rank(monkeypatch, uneven_shards, new_world, new_workers, shuffle):
    """On one rank the splitter counts nothing and hands whole shards to the workers; a state
    saved there still finishes its epoch on any layout (counts are found when resuming)."""
    build = lambda workers: _elastic_loader(uneven_shards, workers, shuffle)  # noqa: E731
    before, states = _run_ranks(monkeypatch, 1, 2, build, take=lambda rank: 7)
    assert states[0]["layout"]["node_split"] == "shards"
    assert len(before[0]) == 28
    after, _ = _run_ranks(monkeypatch, new_world, new_workers, build, load=states)
    delivered = [k for rank in before + after for k in rank]
    assert len(delivered) == len(set(delivered)), "a sample was repeated"
    left = 136 - 28
    assert len(delivered) == 28 + left - left % new_world
    assert len({len(k) for k in after}) == 1


@pytest.mark.parametrize("shuffle", [0, 10])
@needs_torch
def test_elastic_resume_twice(monkeypatch, uneven_shards, shuffle):
    """2x2 -> 3x1 mid-epoch -> 2x2 again: still no sample twice, only remainders dropped."""
    build = lambda workers: _elastic_loader(uneven_shards, workers, shuffle)  # noqa: E731
    before, states = _run_ranks(monkeypatch, 2, 2, build, take=lambda rank: 2)
    middle, states2 = _run_ranks(monkeypatch, 3, 1, build, take=lambda rank: 3, load=states)
    after, _ = _run_ranks(monkeypatch, 2, 2, build, load=states2)
    delivered = [k for rank in before + middle + after for k in rank]
    assert len(delivered) == len(set(delivered))
    left1 = 136 - 16
    left2 = left1 - left1 % 3 - 36
    assert len(delivered) == 16 + 36 + left2 - left2 % 2


@needs_torch
def test_elastic_resume_refuses_what_it_cannot_do(monkeypatch, uneven_shards):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    shuffled = wds.WebLoader(  # an unseeded sample shuffle: its order cannot be recomputed
        wds.WebDataset(uneven_shards, shardshuffle=True, nodesplitter=wds.split_by_node).shuffle(10).to_tuple("__key__"),
        batch_size=None, num_workers=0,
    )
    it = iter(shuffled)
    next(it)
    state = shuffled.state_dict()
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(wds.UsageError, match="shuffle"):
        shuffled.load_state_dict([state])
    with pytest.raises(wds.UsageError, match="another pipeline"):
        _elastic_loader(uneven_shards, 0).load_state_dict([dict(state, positions={})])
    unversioned = {k: v for k, v in state.items() if k not in ("format", "fingerprint")}  # as saved before formats
    with pytest.raises(wds.UsageError, match="all 2 ranks"):
        _elastic_loader(uneven_shards, 0).load_state_dict([dict(unversioned, positions={})])


# -- exact `::` mixing ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mix_sources(tmp_path_factory):
    """Source a: two shards of 10 samples; source b: one shard of 50; sizes.json beside them."""
    from shardstream._shard.index import write_sizes

    root = tmp_path_factory.mktemp("mix")
    a = [write_tar(str(root / f"a-{n}.tar"), [m for i in range(10 * n, 10 * n + 10) for m in sample_members(i, prefix="a", exts=("cls",))]) for n in range(2)]
    b = [write_tar(str(root / "b-0.tar"), [m for i in range(50) for m in sample_members(i, prefix="b", exts=("cls",))])]
    write_sizes(str(root / "sizes.json"), {"a-0.tar": 10, "a-1.tar": 10, "b-0.tar": 50})
    return "{" + ",".join(a) + "}::" + b[0]


def test_exact_mix_gives_each_source_its_share_of_samples(mix_sources):
    def keys(weights, mix=None, seed=1):
        ds = wds.WebDataset(mix_sources, resampled=True, seed=seed, weights=weights, **({"mix": mix} if mix else {}))
        return [k for (k,) in ds.to_tuple("__key__").with_epoch(900)]

    for weights, share in (("1::1", 0.5), ("3::1", 0.75)):
        drawn = keys(weights)
        assert drawn == keys(weights)  # seeded
        from_a = 0
        for n, key in enumerate(drawn, 1):
            from_a += key.startswith("a")
            assert -50 <= from_a - share * n <= 10  # ahead by one own shard, behind by one of b's
    assert keys("1::1", seed=2) != keys("1::1")
    # random draws hold shares only on average: shard-level draws of 1::1 give b (50 samples
    # per shard) about 5/7 of the samples instead of 1/2
    drawn = keys("1::1", mix="random")
    assert sum(k.startswith("b") for k in drawn) / len(drawn) > 0.6


def test_exact_mix_resumes(mix_sources):
    check_resume(
        lambda: keyed(wds.WebDataset(mix_sources, resampled=True, seed=4, weights="1::2")).batched(3).with_epoch(40),
        checkpoints=(0, 5, 17), seeks=True,
    )


@pytest.mark.parametrize("remainder,each", [("drop", 136 // 3), ("wrap", -(-136 // 3))])
def test_remainder_policy(monkeypatch, uneven_shards, remainder, each):
    keys = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        splitter = wds.EqualSplit(seed=5, remainder=remainder)
        got = [k for (k,) in wds.WebDataset(uneven_shards, shardshuffle=False, nodesplitter=splitter).to_tuple("__key__")]
        assert len(got) == each
        keys += got
    assert len(set(keys)) == min(len(keys), 136)


@needs_torch
def test_loader_counts_samples_once_not_in_every_worker(monkeypatch, uneven_shards, tmp_path):
    """Without sizes.json or .idx, local shards are counted by walking their headers, in the main
    process; the workers get the counts with the dataset instead of each walking every shard."""
    import shardstream._shard.counts as counts

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    log = tmp_path / "walks.txt"
    real = counts.walk_shard

    def walk(path, url):  # appends from any process
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {url}\n")
        return real(path, url)

    monkeypatch.setattr(counts, "walk_shard", walk)
    monkeypatch.setattr(counts, "_walked", {})
    loader = _elastic_loader(uneven_shards, 2)
    assert len(_keys(list(loader))) == 68
    lines = log.read_text().split("\n")[:-1]
    assert sorted(line.split(" ", 1)[1] for line in lines) == sorted(uneven_shards)  # once each
    assert {line.split(" ")[0] for line in lines} == {str(os.getpid())}  # in this process
    log.write_text("")
    counts._walked.clear()
    assert len(_keys(list(loader))) == 68 and log.read_text() == ""  # kept on the stage


def test_resuming_an_unseeded_pipeline_warns(shardset):
    for build in (
        lambda: keyed(wds.WebDataset(shardset, shardshuffle=False).shuffle(10)),
        lambda: keyed(wds.WebDataset(shardset, shardshuffle=10)),
    ):
        state = build().state_dict()
        with pytest.warns(UserWarning, match="unseeded"):
            build().load_state_dict(state)
    seeded = lambda: keyed(wds.WebDataset(shardset, shardshuffle=10, seed=1).shuffle(10))  # noqa: E731
    state = seeded().state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seeded().load_state_dict(state)


@needs_torch
def test_counting_in_the_main_process_does_not_advance_shard_shuffles(monkeypatch, uneven_shards):
    """OpenCLIP's shape: shard shuffle before split_by_node; the main process counts samples
    before the workers start, and the workers must still see the epoch's shard order."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def keys(workers):
        ds = wds.DataPipeline(
            wds.SimpleShardList(uneven_shards), wds.detshuffle(10, seed=5), wds.split_by_node, wds.split_by_worker,
            wds.tarfile_to_samples(), wds.to_tuple("__key__"),
        )
        ds.set_epoch(1)
        return sorted(k for (k,) in wds.WebLoader(ds, batch_size=None, num_workers=workers))

    assert keys(2) == keys(0)


@needs_torch
def test_webloader_epochs_advance_without_set_epoch(monkeypatch, uneven_shards):
    """DataLoader workers get a fresh dataset copy every epoch; the loader numbers the epochs so
    shard order and seeded sample shuffles still change, exactly as with set_epoch(0), (1), ..."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    auto = _elastic_loader(uneven_shards, 2, shuffle=10)
    first, second = _keys(list(auto)), _keys(list(auto))
    assert first != second and sorted(first) != sorted(second)  # a new split of the shards too
    explicit = _elastic_loader(uneven_shards, 2, shuffle=10)
    explicit.set_epoch(1)
    assert _keys(list(explicit)) == second
    # a state saved in the second epoch records it, and a new process resumes in it
    loader = _elastic_loader(uneven_shards, 2, shuffle=10)
    list(loader)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state["epoch"] == 1
    del it
    resumed = _elastic_loader(uneven_shards, 2, shuffle=10)
    resumed.load_state_dict(state)
    assert _keys(head) + _keys(list(resumed)) == second
    assert _keys(list(resumed)) == _keys(list(_set_epoch(_elastic_loader(uneven_shards, 2, shuffle=10), 2)))


def _set_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return loader


def _resumed_after(build, head, passes=0):
    """Run `passes` whole passes of a fresh build(), then `head` items of the next, and load its
    state (through JSON, as a checkpoint file holds it) into another fresh build(): (the items
    before the checkpoint, the resumed loader or dataset)."""
    run = build()
    for _ in range(passes):
        list(run)
    it = iter(run)
    before = [next(it) for _ in range(head)]
    state = json.loads(json.dumps(run.state_dict()))
    del it
    resumed = build()
    resumed.load_state_dict(state)
    return before, resumed


def _shards_read(monkeypatch, urls, epoch, seed=5, nodesplitter=None, **layout):
    """The shards, in order, that WebDataset(shardshuffle=100) reads in `epoch` where the layout
    variables (WORKER, NUM_WORKERS, RANK, WORLD_SIZE) say."""
    for name, value in layout.items():
        monkeypatch.setenv(name, str(value))
    ds = wds.WebDataset(urls, shardshuffle=100, seed=seed, nodesplitter=nodesplitter)
    ds.set_epoch(epoch)
    return list(dict.fromkeys(s["__url__"] for s in ds))


def test_each_worker_orders_its_shards_afresh_every_epoch(monkeypatch, uneven_shards):
    """shardshuffle=N runs after the worker split: epoch 0 is webdataset's order (every worker's
    shuffle seeded alike), later epochs are seeded per worker too. Seeded alike, two workers put
    their shards in the same positions every epoch, and whole epochs repeated (3 of 6 here)."""
    urls = uneven_shards[:6]

    def order(worker, epoch):
        return _shards_read(monkeypatch, urls, epoch, WORKER=worker, NUM_WORKERS=2)

    def positions(shards):  # the permutation a worker applied to its own shards
        return [sorted(shards).index(u) for u in shards]

    epochs = {e: (order(0, e), order(1, e)) for e in range(6)}
    first = epochs[0]
    assert positions(first[0]) == positions(first[1])  # epoch 0: webdataset's (one seed for all)
    assert {u for w in first for u in w} == set(urls)
    assert len({tuple(a + b) for a, b in epochs.values()}) == 6  # no epoch repeats another
    assert any(positions(a) != positions(b) for a, b in list(epochs.values())[1:])


def test_each_worker_reads_other_shards_every_epoch(monkeypatch, uneven_shards):
    """shardshuffle=N: epoch 0 splits the list as webdataset does (worker k: shards k, k+2, ...);
    later epochs spread the whole list in a new order (seeded by seed and epoch, alike in every
    worker) before the split, so each worker gets other shards, not the same ones reordered,
    and together the workers still read every shard once."""
    urls = uneven_shards[:6]

    def shards(worker, epoch):
        return _shards_read(monkeypatch, urls, epoch, WORKER=worker, NUM_WORKERS=2)

    subsets = []
    for epoch in range(6):
        first, second = shards(0, epoch), shards(1, epoch)
        assert sorted(first + second) == sorted(urls)  # every shard, once
        subsets.append(frozenset(first))
    assert subsets[0] == set(urls[0::2])  # webdataset's split
    assert len(set(subsets)) >= 4  # 20 possible subsets of 3; fixed before: 1


@pytest.mark.parametrize("on", ["loader", "dataset"])
@needs_torch
def test_persistent_workers_take_each_epoch_set(uneven_shards, on):
    """Persistent workers keep the copy of the dataset they started with: an epoch set later
    reaches them through the loader (it did not: every epoch repeated epoch 0's order, and a
    resumed epoch 1 mixed both orders, repeating samples)."""
    def build(persistent):
        ds = wds.WebDataset(uneven_shards, shardshuffle=5, seed=7).shuffle(10, seed=3).to_tuple("__key__")
        return ds, wds.WebLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)

    def epochs(persistent, count=3):
        ds, loader = build(persistent)
        result = []
        for epoch in range(count):
            (loader if on == "loader" else ds).set_epoch(epoch)
            result.append(list(loader))
        return result

    fresh, kept = epochs(False), epochs(True)
    assert kept == fresh and kept[0] != kept[1] != kept[2]
    _, run = build(True)
    run.set_epoch(0)
    list(run)
    run.set_epoch(1)
    it = iter(run)
    head = [next(it) for _ in range(9)]
    state = json.loads(json.dumps(run.state_dict()))
    del it
    _, resumed = build(True)
    resumed.load_state_dict(state)
    assert head + list(resumed) == fresh[1]


def test_an_unordered_pipeline_warns_that_its_resume_is_inexact(shardset):
    """Unordered engine output comes as items finish: a replay that skips as many items as were
    delivered skips other ones. Loading such a state says so (it claimed to be exact); an ordered
    one resumes exactly and silently."""
    def build(ordered):
        return keyed(wds.WebDataset(shardset, shardshuffle=False)).with_engine(threads=2, ordered=ordered)

    for ordered in (True, False):
        ds = build(ordered)
        it = iter(ds)
        head = [next(it) for _ in range(5)]
        state = ds.state_dict()
        del it
        resumed = build(ordered)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed.load_state_dict(state)
        said = [str(w.message) for w in caught if "unordered engine output" in str(w.message)]
        assert bool(said) == (not ordered)
        rest = list(resumed)
        assert len(head) + len(rest) == len(list(build(True)))
        if ordered:
            assert head + rest == list(build(True))


@pytest.mark.parametrize("epochs", ["automatic", "set_epoch"])
@pytest.mark.parametrize("mix", ["round_robin", "random_mix"])
def test_a_mix_of_shuffled_datasets_resumes_a_later_epoch_exactly(uneven_shards, mix, epochs):
    """The datasets inside RoundRobin / RandomMix follow the mix's epoch: a pipeline's set_epoch
    reaches them, and a resume in a later automatic epoch lets them count the passes before it
    (both resumed epoch 1 in the other order before: 10 of 121 samples lost and repeated)."""
    def build():
        first = keyed(wds.WebDataset(uneven_shards[:4], shardshuffle=5, seed=1))
        second = keyed(wds.WebDataset(uneven_shards[4:], shardshuffle=5, seed=2))
        if mix == "round_robin":
            return wds.DataPipeline(wds.RoundRobin([first, second], longest=True))
        return wds.DataPipeline(wds.RandomMix([first, second], [0.4, 0.6], longest=True, seed=3))

    def epoch(ds, number):
        if epochs == "set_epoch":
            ds.set_epoch(number)
        return list(ds)

    reference = build()
    expected = [epoch(reference, e) for e in range(3)]
    assert expected[0] != expected[1] != expected[2]
    run = build()
    epoch(run, 0)
    if epochs == "set_epoch":
        run.set_epoch(1)
    it = iter(run)
    head = [next(it) for _ in range(9)]
    state = json.loads(json.dumps(run.state_dict()))
    del it
    resumed = build()
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected[1]
    assert epoch(resumed, 2) == expected[2]


@needs_torch
def test_a_mix_under_webloader_workers_changes_every_epoch(uneven_shards):
    mixed = wds.DataPipeline(wds.RoundRobin([keyed(wds.WebDataset(uneven_shards[:4], shardshuffle=5, seed=1)),
                                             keyed(wds.WebDataset(uneven_shards[4:], shardshuffle=5, seed=2))],
                                            longest=True))
    loader = wds.WebLoader(mixed, batch_size=None, num_workers=2)
    epochs = []
    for number in range(2):
        loader.set_epoch(number)
        epochs.append(list(loader))
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == sorted(epochs[1])


@pytest.mark.parametrize("n", [10, 45])
@needs_torch
def test_persistent_workers_resume_a_later_with_epoch_iteration_exactly(uneven_shards, n):
    """with_epoch(n) with persistent workers: each worker's copy counts its own passes, and one
    whose share is under n wraps into another pass within an iteration, so the workers' pass
    counts differ. The state keeps each worker's (it kept one for the loader: the resume then
    read another shard order, seeking a saved offset into the wrong shard, or lost samples)."""
    def build():
        ds = keyed(wds.WebDataset(uneven_shards, shardshuffle=5, seed=3)).with_epoch(n)
        return wds.WebLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)

    reference = build()
    expected = [list(reference) for _ in range(3)]
    head, resumed = _resumed_after(build, 7, passes=1)
    assert head + list(resumed) == expected[1]
    assert list(resumed) == expected[2]


@pytest.mark.parametrize("mix", ["round_robin", "random_mix"])
@needs_torch
def test_a_webloader_over_a_mix_keeps_a_state(uneven_shards, mix):
    """A mix given straight to a WebLoader resumes as one inside a DataPipeline does (it said the
    loader needed "a shardstream dataset and batch_size=None", with batch_size=None given)."""
    def build():
        parts = [keyed(wds.WebDataset(uneven_shards[:3], shardshuffle=False)),
                 keyed(wds.WebDataset(uneven_shards[3:], shardshuffle=False))]
        mixed = wds.RoundRobin(parts, longest=True) if mix == "round_robin" else wds.RandomMix(parts, [1, 3], seed=0)
        return wds.WebLoader(mixed, batch_size=None, num_workers=0)

    full = list(build())
    head, resumed = _resumed_after(build, 7)
    assert head + list(resumed) == full
    with pytest.raises(wds.UsageError, match="needs batch_size=None .*got batch_size=4"):
        wds.WebLoader(wds.WebDataset(uneven_shards, shardshuffle=False), batch_size=4).state_dict()
    with pytest.raises(wds.UsageError, match="needs a shardstream dataset .*got list"):
        wds.WebLoader([1, 2], batch_size=None).state_dict()


def _url_and_worker(sample):
    import torch

    return sample["__url__"], torch.utils.data.get_worker_info().id


@needs_torch
def test_webloader_workers_read_other_shards_every_epoch(uneven_shards):
    """The same through real DataLoader workers, fresh copies every epoch: the WebLoader's epochs
    reach them."""
    urls = uneven_shards[:6]
    loader = wds.WebLoader(wds.WebDataset(urls, shardshuffle=100, seed=5).map(_url_and_worker), batch_size=None,
                           num_workers=2)
    subsets = set()
    for _epoch in range(3):
        by_worker: dict = {0: set(), 1: set()}
        for url, worker in loader:
            by_worker[worker].add(url)
        assert by_worker[0] | by_worker[1] == set(urls)
        assert not by_worker[0] & by_worker[1]
        subsets.add(frozenset(by_worker[0]))
    assert len(subsets) > 1


@pytest.mark.parametrize("seed", [None, 5])
def test_ranks_spread_shards_only_on_a_seed_they_share(monkeypatch, uneven_shards, seed):
    """With a node splitter of the user's at world size 2, the ranks must agree on the spread:
    with a seed chosen by the user they do (and read new shards every epoch); with a seed drawn
    per process they could not, so the list is split as it stands, as in epoch 0."""
    urls = uneven_shards[:6]
    monkeypatch.delenv("WDS_SEED", raising=False)

    def shards(rank, epoch):
        return _shards_read(monkeypatch, urls, epoch, seed=seed, nodesplitter=lambda src: wds.split_by_node(src),
                            RANK=rank, WORLD_SIZE=2)

    subsets = set()
    for epoch in range(4):
        first, second = shards(0, epoch), shards(1, epoch)
        assert sorted(first + second) == sorted(urls)  # disjoint, complete
        subsets.add(frozenset(first))
    assert (len(subsets) > 1) == (seed is not None)


@pytest.mark.parametrize("workers", [0, 2])
@needs_torch
def test_an_epoch_set_by_hand_stays_after_a_resume_as_it_does_without_one(monkeypatch, uneven_shards, workers):
    """set_epoch(e) holds for every iteration until it is set again; a loader resumed from a state
    saved under it holds it too (with workers, its later iterations counted on from e instead)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    through = _set_epoch(_elastic_loader(uneven_shards, workers, shuffle=10), 3)
    epoch3 = _keys(list(through))
    assert _keys(list(through)) == epoch3  # (it stays)
    loader = _set_epoch(_elastic_loader(uneven_shards, workers, shuffle=10), 3)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it
    resumed = _elastic_loader(uneven_shards, workers, shuffle=10)
    resumed.load_state_dict(state)
    assert _keys(head) + _keys(list(resumed)) == epoch3
    assert _keys(list(resumed)) == epoch3


@pytest.mark.parametrize("engine", [True, False])
def test_resume_in_a_later_with_epoch_pass_keeps_per_pass_shuffles(shardset, engine):
    """with_epoch runs several passes; detshuffle and seeded shuffles count them. A resume in
    pass 2 must shuffle as pass 2 did, not as a fresh pass 0."""
    def build():
        ds = keyed(wds.WebDataset(shardset[:2], shardshuffle=False, detshuffle=True, seed=967, empty_check=False)
                   .shuffle(10)).batched(2).unbatched().with_epoch(60)
        return ds if engine else ds.with_engine(enabled=False)

    check_resume(build, checkpoints=(0, 21, 33, 50), seeks=False)


@needs_torch
def test_elastic_resume_when_a_new_worker_has_nothing_left(monkeypatch, uneven_shards):
    build = lambda workers: _elastic_loader(uneven_shards, workers, shuffle=2)  # noqa: E731
    before, states = _run_ranks(monkeypatch, 2, 1, build, take=lambda rank: 16)  # 64 of 68 each
    after, _ = _run_ranks(monkeypatch, 4, 3, build, load=states)  # 8 left: 2 per rank, some workers get none
    delivered = [k for rank in before + after for k in rank]
    assert len(delivered) == len(set(delivered)) == 136


# -- found in review -------------------------------------------------------------------------------


def test_elastic_resume_from_dataset_states(monkeypatch, uneven_shards):
    """DataPipeline states (no WebLoader) carry one worker's progress; elastic resume reads it."""
    def build(_workers=None):
        return wds.WebDataset(uneven_shards, shardshuffle=True, seed=3, nodesplitter=wds.split_by_node).to_tuple("__key__")

    before, states = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = build()
        it = iter(ds)
        before += [next(it)[0] for _ in range(20)]
        states.append(ds.state_dict())
        del it
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = build()
    resumed.load_state_dict(states)
    after = [k for (k,) in resumed]
    assert len(before + after) == len(set(before + after)) == 136


def test_custom_opener_resumes_by_skipping(uneven_shards):
    def opener(url):
        with open(url, "rb") as f:
            yield f.read()

    def build():
        return wds.DataPipeline(wds.SimpleShardList(uneven_shards[:3]), wds.tarfile_to_samples(),
                                wds.to_tuple("__key__")).with_engine(enabled=False)

    from shardstream._shard.samples import TarShardSamples

    def build_with_opener():
        ds = build()
        ds.pipeline[1] = TarShardSamples(opener=opener)
        return ds

    check_resume(build_with_opener, checkpoints=(0, 7, 30), seeks=True)


@needs_torch
def test_fluid_stages_on_a_webloader_resume(shardset):
    check_resume(lambda: wds.WebLoader(STAGES["source"](shardset), batch_size=None, num_workers=0).map(lambda x: x),
                 checkpoints=(0, 7))


@needs_torch
def test_set_epoch_on_the_dataset_after_the_loader_is_built(monkeypatch, uneven_shards):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    reference = _set_epoch(_elastic_loader(uneven_shards, 1, shuffle=10), 5)
    loader = _elastic_loader(uneven_shards, 1, shuffle=10)
    loader._origin.set_epoch(5)  # what `ds.set_epoch(5)` on the caller's dataset does
    assert _keys(list(loader)) == _keys(list(reference))


@needs_torch
def test_persistent_workers_still_change_the_order_every_epoch(monkeypatch, uneven_shards):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = wds.WebDataset(uneven_shards, shardshuffle=True, seed=3, nodesplitter=wds.split_by_node).to_tuple("__key__").batched(4)
    loader = wds.WebLoader(ds, batch_size=None, num_workers=1, persistent_workers=True)
    assert _keys(list(loader)) != _keys(list(loader))


def test_state_after_leaving_the_loop_and_after_the_epoch(shardset):
    ds = keyed(wds.WebDataset(shardset, shardshuffle=False))
    full = list(ds)
    for got in ds:
        if got == full[9]:
            break
    state = ds.state_dict()  # the loop's iterator is gone
    assert state["delivered"] == 10
    resumed = keyed(wds.WebDataset(shardset, shardshuffle=False))
    resumed.load_state_dict(state)
    assert list(resumed) == full[10:]


def test_set_epoch_to_another_epoch_drops_a_loaded_state(shardset):
    def build():
        return keyed(wds.WebDataset(shardset, shardshuffle=3, seed=1))

    ds = build()
    ds.set_epoch(0)
    it = iter(ds)
    [next(it) for _ in range(5)]
    state = ds.state_dict()
    del it
    resumed = build()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the training loop moved on: epoch 1 from its start
    fresh = build()
    fresh.set_epoch(1)
    assert list(resumed) == list(fresh)


def test_unseeded_random_stages_warn_on_resume(shardset):
    sampled = lambda: keyed(wds.WebDataset(shardset, shardshuffle=False)).rsample(0.5)  # noqa: E731
    state = sampled().state_dict()
    with pytest.warns(UserWarning, match="rsample"):
        sampled().load_state_dict(state)
    mixed = lambda: wds.DataPipeline(wds.RandomMix([wds.MockDataset("a", 5), wds.MockDataset("b", 5)]))  # noqa: E731
    state = mixed().state_dict()
    with pytest.warns(UserWarning, match="RandomMix"):
        mixed().load_state_dict(state)


@pytest.mark.parametrize("kind", ["dataset", "webloader0", "persistent-workers", "persistent-workers-one-node", "resampled"])
@needs_torch
def test_resume_in_a_later_automatic_epoch(monkeypatch, uneven_shards, kind):
    """No set_epoch: each iteration is the next epoch. A checkpoint in epoch 1 resumed by a
    fresh dataset (a new process) continues epoch 1, not epoch 0's order, and epoch 2 follows.
    Persistent DataLoader workers number the epochs in their own copies: the loader counts them
    for its state (on rank 0 of 2 with split_by_node, and alone with single_node_only, the default)."""
    one_node = kind.endswith("one-node")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1" if one_node else "2")
    splitter = wds.single_node_only if one_node else wds.split_by_node

    def build():
        if kind == "resampled":
            return wds.WebDataset(uneven_shards, resampled=True, seed=4, nodesplitter=None).shuffle(8).to_tuple("__key__").with_epoch(30)
        ds = wds.WebDataset(uneven_shards, shardshuffle=True, seed=3, nodesplitter=splitter).shuffle(8).to_tuple("__key__")
        if kind.startswith("persistent-workers"):
            return wds.WebLoader(ds.batched(4), batch_size=None, num_workers=2, persistent_workers=True)
        return wds.WebLoader(ds, batch_size=None, num_workers=0) if kind == "webloader0" else ds

    reference = build()
    epoch0, epoch1, epoch2 = list(reference), list(reference), list(reference)
    assert epoch0 != epoch1
    head, resumed = _resumed_after(build, 9, passes=1)
    assert head + list(resumed) == epoch1
    assert list(resumed) == epoch2


@needs_torch
def test_loader_with_epoch_counts_the_items_before_the_checkpoint(shardset):
    check_resume(lambda: wds.WebLoader(STAGES["source"](shardset), batch_size=None, num_workers=2).with_epoch(20),
                 checkpoints=(0, 7, 19))


def test_resume_at_the_very_end_of_a_with_epoch_iteration(monkeypatch, uneven_shards):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_resume(
        lambda: wds.WebDataset(uneven_shards, shardshuffle=100, seed=711, nodesplitter=wds.split_by_node,
                               empty_check=False).to_tuple("__key__").slice(0, 72, 3).with_epoch(40),
        checkpoints=(0, 20, 39, 40),
    )


@needs_torch
def test_fewer_samples_per_rank_than_workers(monkeypatch, tmp_path):
    shard = write_tar(str(tmp_path / "tiny.tar"), [m for i in range(5) for m in sample_members(i, exts=("cls",))])
    keys = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        ds = wds.WebDataset([shard], shardshuffle=False, nodesplitter=wds.split_by_node).to_tuple("__key__")
        got = [k for (k,) in wds.WebLoader(ds, batch_size=None, num_workers=2)]
        assert len(got) == 1  # 5 // 3: one each, so one of the two workers has nothing
        keys += got
    assert len(set(keys)) == 3
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(wds.UsageError, match="fewer than the 8 ranks"):
        list(wds.WebDataset([shard], shardshuffle=False, nodesplitter=wds.split_by_node))


# Every implementation of the stage-state contract (shardstream/_stages/resumable.py: classes and
# functions declaring resume traits, classes with state_dict/load_state_dict) -> the harness runs
# that prove it resumes exactly. A new implementation fails this test until it has one.
HARNESS = {
    "DataPipeline": [f"test_resume_direct[{name}]" for name in STAGES],
    "WebLoader": ["test_resume_webloader", "test_resume_webloader_subprocess"],
    "SubprocessLoader": ["test_resume_subprocess"],
    "DevicePrefetcher": ["test_resume_device_prefetcher"],
    "ShardScheduler": ["test_resume_direct[equal_split_rank1]", "test_elastic_resume_finishes_the_epoch"],
    "TarShardSamples": ["test_resume_direct[source]"],
    "SampleStage": ["test_resume_direct[decode_map]"],
    "SeededShuffle": ["test_resume_direct[seeded_sample_shuffle]"],
    "detshuffle": ["test_resume_direct[detshuffle]"],
    "ShardShuffle": ["test_resume_direct[shard_shuffle]", "test_resume_in_a_later_automatic_epoch"],
    "ShardSpread": ["test_resume_direct[shard_shuffle]", "test_resume_in_a_later_automatic_epoch",
                    "test_each_worker_reads_other_shards_every_epoch"],
    "RandomMix": ["test_resume_direct[random_mix]"],
    "ResampledShards": ["test_resampled_with_a_seed_is_reproducible_and_resumable"],
    "_batched": ["test_resume_direct[partial_batches]"],
    "_info": ["test_resume_direct[clean_cut_filters]"],
    "_log_keys": ["test_resume_direct[clean_cut_filters]"],
    "_xdecode": ["test_resume_direct[clean_cut_filters]"],
    "check_empty": ["test_resume_direct[source]"],
    "_shuffle": ["test_resume_direct[explicit_seed_shuffle]", "test_elastic_resume_finishes_the_epoch",
                 "test_elastic_resume_refuses_what_it_cannot_do"],
    "_rsample": ["test_unseeded_random_stages_warn_on_resume"],
}


def _implementations():
    found = set()
    for info in pkgutil.walk_packages(wds.__path__, "shardstream."):
        if info.name.startswith(("shardstream._prep", "shardstream._cli")):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if getattr(obj, "__module__", None) != module.__name__ or obj is wds._stages.resumable.Stateful:
                continue
            if inspect.isclass(obj):
                if "resume_traits" in vars(obj) or {"state_dict", "load_state_dict"} <= set(vars(obj)):
                    found.add(obj.__qualname__)
            elif callable(obj) and getattr(obj, "resume_traits", None) is not None:
                found.add(obj.__qualname__)
    return found


def test_the_harness_covers_every_implementation_of_the_state_contract():
    found = _implementations()
    assert found - set(HARNESS) == set(), "add a resume harness case for these and list it in HARNESS"
    assert set(HARNESS) - found == set(), "HARNESS names what is no longer an implementation"
    tests = {name for name, obj in globals().items() if name.startswith("test_") and callable(obj)}
    for cases in HARNESS.values():
        for case in cases:
            name, _, param = case.partition("[")
            assert name in tests, case
            assert not param or param.rstrip("]") in STAGES, case


@needs_torch
def test_a_numpy_epoch_keeps_states_json(shardset):
    """`for epoch in np.arange(...)`: set_epoch takes the numpy int as an int."""
    import numpy as np

    ds = keyed(wds.WebDataset(shardset, shardshuffle=3, seed=1))
    ds.set_epoch(np.int64(1))
    loader = wds.WebLoader(keyed(wds.WebDataset(shardset, shardshuffle=3, seed=1)), batch_size=None)
    loader.set_epoch(np.int64(1))
    next(iter(ds)), next(iter(loader))
    for state in (ds.state_dict(), loader.state_dict()):
        assert json.loads(json.dumps(state))["epoch"] == 1 and type(state["epoch"]) is int


@pytest.mark.parametrize("kind", ["shardshuffle", "resampled"])
def test_an_unseeded_shard_order_resumes_inexactly_but_never_fails(uneven_shards, kind, monkeypatch):
    """Without a seed the resumed pass draws another shard order, so the saved position (item,
    sample, byte offset) would land in another shard: it is replayed instead, with the warning
    (it used to seek that other shard to the old offset: 'empty file' past its end)."""
    monkeypatch.delenv("WDS_SEED", raising=False)

    def build():
        if kind == "resampled":
            return wds.WebDataset(uneven_shards, resampled=True).to_tuple("__key__").with_epoch(60)
        return wds.WebDataset(uneven_shards, shardshuffle=True).to_tuple("__key__")

    total = sum(UNEVEN) if kind == "shardshuffle" else 60
    for _trial in range(8):
        ds = build()
        it = iter(ds)
        head = [next(it) for _ in range(30)]
        state = json.loads(json.dumps(ds.state_dict()))
        del it
        resumed = build()
        with pytest.warns(UserWarning, match="unseeded"):
            resumed.load_state_dict(state)
        assert len(head) + len(list(resumed)) == total


def test_state_dict_hashes_the_shard_list_once(monkeypatch):
    """Every state_dict() hashed every URL again for the fingerprint: half a second of CPU for
    a million shards, at every checkpoint. The digest is kept for the list."""
    import shardstream._resume.statecheck as statecheck

    urls = [f"https://127.0.0.1:1/s-{i:05d}.tar" for i in range(2000)]
    dataset = wds.WebDataset(urls, shardshuffle=False)
    hashed = []
    monkeypatch.setattr(statecheck, "without_query", lambda url: hashed.append(url) or url)
    first = dataset.state_dict()
    assert len(hashed) == len(urls)
    assert dataset.state_dict()["fingerprint"] == first["fingerprint"] and len(hashed) == len(urls)
    dataset.pipeline[0].urls = urls[:-1]  # (another list: hashed again)
    assert dataset.state_dict()["fingerprint"] != first["fingerprint"]


@pytest.fixture(scope="module")
def served_big_shards(tmp_path_factory):
    """Six shards of 60 samples (with a 2 KB payload each) and sizes.json, over HTTP."""
    from shardstream._shard.index import write_sizes

    root = tmp_path_factory.mktemp("served")
    names = []
    for n in range(6):
        members = [m for i in range(60 * n, 60 * n + 60) for m in sample_members(i, exts=("cls",))]
        members += [(f"s{i:04d}.bin", os.urandom(2048)) for i in range(60 * n, 60 * n + 60)]
        members.sort(key=lambda m: m[0])
        write_tar(str(root / f"big-{n}.tar"), members)
        names.append(f"big-{n}.tar")
    write_sizes(str(root / "sizes.json"), dict.fromkeys(names, 60))
    with ShardServer(str(root)) as server:
        yield server, names, sum(os.path.getsize(root / name) for name in names)


@needs_torch
def test_elastic_resume_after_a_seeded_shuffle_reads_each_shard_once(monkeypatch, served_big_shards):
    """The samples a shuffle buffer held at the checkpoint are holes scattered over the shards a
    worker was reading: the resumed worker reads each such shard once, in one request, not once
    per hole from its first byte (a 64x8 -> 48x8 resume read 100x the dataset)."""
    server, names, total = served_big_shards
    urls = [server.url(name) for name in names]

    def build(workers):
        ds = wds.WebDataset(urls, shardshuffle=100, seed=3, nodesplitter=wds.split_by_node)
        return wds.WebLoader(ds.shuffle(40).to_tuple("__key__").batched(4), batch_size=None, num_workers=workers)

    before, states = _run_ranks(monkeypatch, 2, 1, build, take=lambda rank: 20)  # 80 of each rank's 180
    server.stats.reset()
    after, _ = _run_ranks(monkeypatch, 3, 1, build, load=states)
    delivered = [k for rank in before + after for k in rank]
    assert len(delivered) == len(set(delivered)) == 360 - 200 % 3  # (the remainder is dropped)
    fetches = server.stats.fetches
    # each new rank's part starts and may end inside a shard, so a shard is read by at most two
    assert all(fetches[name] <= 2 for name in names), fetches
    assert server.stats.bytes_sent <= 1.5 * total


@pytest.mark.parametrize("over", ["file", "http"])
def test_ranges_of_one_shard_in_a_row_read_on_and_resume_exactly(uneven_shards, over):
    """Shard-list items that are later ranges of the shard before them are read on one stream
    (the samples between are skipped); a checkpoint inside such a run still resumes exactly."""
    root = os.path.dirname(uneven_shards[1])
    with ShardServer(root) as server:
        url = uneven_shards[1] if over == "file" else server.url(os.path.basename(uneven_shards[1]))
        ranges = [(0, 3), (5, 6), (6, 9), (20, 21), (30, 40)]  # a shard of 40 samples
        items = [{"url": url, "start": a, "stop": b} for a, b in ranges] + [{"url": uneven_shards[2], "start": 2, "stop": 4}]

        def build():
            return wds.DataPipeline(lambda: iter(items), wds.tarfile_to_samples(), wds.to_tuple("__key__"))

        expected = [f"s{5 + i:04d}" for a, b in ranges for i in range(a, b)] + ["s0047", "s0048"]
        assert [k for (k,) in build()] == expected
        if over == "http":
            assert server.stats.fetches[os.path.basename(uneven_shards[1])] == 1
        check_resume(build, checkpoints=(0, 2, 3, 4, 9, 10, 14, 16), seeks=True)


@pytest.mark.parametrize("remainder", ["drop", "wrap"])
@needs_torch
def test_an_elastic_resume_replays_only_the_old_workers_a_new_rank_draws_on(monkeypatch, uneven_shards, remainder):
    """Finding which samples a seeded shuffle buffer had handed on replays it over the old
    worker's whole part. Every new worker replayed every old worker: O(samples delivered by all
    ranks) each, 6.6 s for a 10M-sample epoch checkpointed halfway. A new rank now replays only
    the old workers whose undelivered samples can land in its share; the samples are the same."""
    import shardstream.pipeline as pipeline_module

    replays = []
    real = pipeline_module.replay_offsets

    def counting(*args, **kwargs):
        replays.append(args[1:3])  # (epoch, rank)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline_module, "replay_offsets", counting)

    def build(workers):
        ds = wds.WebDataset(uneven_shards, shardshuffle=True, seed=3,
                            nodesplitter=wds.EqualSplit(seed=3, remainder=remainder))
        return wds.WebLoader(ds.shuffle(5).to_tuple("__key__").batched(2), batch_size=None, num_workers=workers)

    before, states = _run_ranks(monkeypatch, 8, 0, build, take=lambda rank: 3)  # 6 of each rank's 17 (no workers: replays counted here)
    for new_world in (7, 3):
        replays.clear()
        after, _ = _run_ranks(monkeypatch, new_world, 0, build, load=states)
        delivered = [k for rank in before + after for k in rank]
        left = 136 - 48
        expected = 48 + (left - left % new_world if remainder == "drop" else left + -left % new_world)
        assert len(delivered) == expected and len(set(delivered)) == min(expected, 136)
        # each new rank's share is left/new_world samples: it draws on 2 or 3 of the 8 old ranks
        assert len(replays) <= new_world * (-(-8 // new_world) + 1) < 8 * new_world, replays


def test_ranges_of_an_indexed_shard_seek_rather_than_read_on(tmp_path):
    """With an .idx beside a local shard each range seeks to its first sample: the samples
    between are not read (a fault in them is not this item's, and reading them costs more)."""
    from shardstream.cli import main

    members = [m for i in range(40) for m in sample_members(i, exts=("cls", "txt"))]
    path = write_tar(str(tmp_path / "s.tar"), members)
    assert main(["index", str(tmp_path), "-q"]) == 0
    at = [name for name, _data in members].index("s0010.txt")
    members[at] = ("s0010.cls", members[at][1])  # a duplicate field in sample 10, every offset as indexed
    write_tar(path, members)
    items = [{"url": path, "start": a, "stop": b} for a, b in [(0, 3), (15, 18), (30, 32)]]
    keys = [k for (k,) in wds.DataPipeline(lambda: iter(items), wds.tarfile_to_samples(), wds.to_tuple("__key__"))]
    assert keys == [f"s{i:04d}" for i in (0, 1, 2, 15, 16, 17, 30, 31)]


@pytest.mark.parametrize("loader", ["dataset", "subprocess"])
def test_an_older_iterator_closed_late_leaves_the_newest_one_s_state(shardset, loader):
    """state_dict() describes the most recent iteration: an older iterator that is closed (or
    collected, e.g. from a reference cycle) after a newer one ended took the state back to its
    own pass, and the resume repeated samples."""
    build = lambda: keyed(wds.WebDataset(shardset, shardshuffle=False)).batched(5)  # noqa: E731
    ds = build() if loader == "dataset" else wds.SubprocessLoader(build())
    old = iter(ds)
    for _ in range(3):
        next(old)
    newest = []
    for batch in ds:
        newest.append(batch)
        if len(newest) == 8:
            break
    state = ds.state_dict()
    old.close()
    assert ds.state_dict() == state
    resumed = build()
    resumed.load_state_dict(ds.state_dict())
    assert_same_stream(list(build()), newest + list(resumed))


def test_a_states_shard_fingerprint_holds_no_password_and_survives_its_rotation():
    """The fingerprint hashed each URL's userinfo: a shared checkpoint carried a digest to test
    password guesses against, and a rotated password made the state "of another dataset"."""
    import shardstream._resume.statecheck as statecheck

    def build(password):
        return wds.WebDataset([f"http://alice:{password}@127.0.0.1:1/s-{i}.tar" for i in range(3)],
                              shardshuffle=False)

    state = build("pw1").state_dict()
    assert state["fingerprint"]["shards"] == build("other").state_dict()["fingerprint"]["shards"] == \
        wds.WebDataset([f"http://127.0.0.1:1/s-{i}.tar" for i in range(3)], shardshuffle=False).state_dict()[
            "fingerprint"]["shards"]
    build("pw2").load_state_dict(state)
    # a state saved before (userinfo hashed) still loads into the same URLs
    old = build("pw1")
    legacy = dict(state, fingerprint=dict(state["fingerprint"], shards=statecheck._digest(
        old.pipeline[0].urls, statecheck.without_query)))
    assert legacy["fingerprint"]["shards"] != state["fingerprint"]["shards"]
    old.load_state_dict(legacy)
    with pytest.raises(wds.UsageError, match="another dataset"):
        build("pw3").load_state_dict(legacy)  # (its digest was of pw1's URLs)
    with pytest.raises(wds.UsageError, match="another dataset"):
        wds.WebDataset([f"http://alice:pw1@127.0.0.1:1/t-{i}.tar" for i in range(3)], shardshuffle=False
                       ).load_state_dict(state)
