"""split_by_node never reads a dataset just to count it: the rule of `_split` (world size 1: no
reads; cheap counts: equal samples per rank; remote shards without counts: webdataset's shard
split with a warning; count_shards=True: one parallel counting read that fills the cache),
proven against a real HTTP server that counts every request."""

import json
import os
import warnings

import pytest

import shardstream as wds
import shardstream._resume.equal_split as split_module
import webdataset

from shardsets import sample_members, write_tar
from needs import needs_torch

SIZES = [3, 9, 4, 12, 5, 7, 2, 6]  # uneven on purpose: 48 samples in 8 shards


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    index = 0
    for n, size in enumerate(SIZES):
        write_tar(str(root / f"part-{n}.tar"), [m for i in range(index, index + size) for m in sample_members(i, exts=("cls",))])
        index += size
    return str(root), None


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test starts as a fresh process would: no sizes.json read yet, no warning given."""
    import shardstream._shard.counts as counts

    monkeypatch.setattr(counts, "_sizes_files", {})
    monkeypatch.setattr(split_module, "_warned", False)
    monkeypatch.delenv("SHARDSTREAM_COUNT_SHARDS", raising=False)


def _urls(server):
    return [server.url(f"part-{n}.tar") for n in range(len(SIZES))]


def _layout(monkeypatch, rank, world):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def _keys(dataset):
    return [k for (k,) in dataset.to_tuple("__key__")]


def _shard_requests(server):
    """Requests for each shard's bytes (a one-byte size probe, `_fetch.parts._learn_size`, not counted)."""
    return {path: n for path, n in server.stats.snapshot().fetches.items() if path.endswith(".tar")}


def test_one_rank_reads_nothing_to_split(monkeypatch, server):
    _layout(monkeypatch, 0, 1)
    ds = wds.WebDataset(_urls(server), shardshuffle=False, nodesplitter=wds.split_by_node)
    it = iter(ds)
    next(it)
    assert "sizes.json" not in server.stats.snapshot().path_requests  # not even a sizes.json probe
    assert all(n == 1 for n in _shard_requests(server).values())  # no shard read twice (its size probe aside)
    assert all(n <= 1 for n in server.stats.snapshot().size_probes.values())
    rest = [s["__key__"] for s in it]
    assert len(rest) == sum(SIZES) - 1
    assert _shard_requests(server) == {f"part-{n}.tar": 1 for n in range(len(SIZES))}


def test_remote_shards_without_counts_split_like_webdataset(monkeypatch, server):
    """No counting pass: each rank requests only its own shards, once, and gets webdataset's split."""
    urls = _urls(server)
    for rank in range(2):
        server.stats.reset()
        split_module._warned = False
        _layout(monkeypatch, rank, 2)
        ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
        mine = urls[rank::2]
        names = {u.rsplit("/", 1)[1] for u in mine}
        expected = _keys(webdataset.WebDataset(urls, shardshuffle=False, nodesplitter=webdataset.split_by_node))
        server.stats.reset()
        with pytest.warns(UserWarning, match="shardstream index"):
            it = iter(ds)
            first = next(it)
        # no counting pass before the first sample (not even a size probe of another rank's shard)
        assert {p for p in server.stats.snapshot().path_requests if p.endswith(".tar")} <= names
        assert [first["__key__"]] + [s["__key__"] for s in it] == expected
        assert _shard_requests(server) == dict.fromkeys(names, 1)
        assert set(server.stats.snapshot().size_probes) <= names  # nothing of another rank's shards


def test_the_uncounted_warning_is_given_once(monkeypatch, server):
    _layout(monkeypatch, 0, 2)
    ds = wds.WebDataset(_urls(server), shardshuffle=False, nodesplitter=wds.split_by_node)
    with pytest.warns(UserWarning, match="count_shards=True"):
        _keys(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _keys(ds)
        _keys(wds.WebDataset(_urls(server), shardshuffle=False, nodesplitter=wds.split_by_node))


def test_sizes_json_beside_remote_shards_gives_equal_work(monkeypatch, server, files, tmp_path):
    root = files[0]
    with open(os.path.join(root, "sizes.json"), "w") as f:
        json.dump({f"part-{n}.tar": size for n, size in enumerate(SIZES)}, f)
    try:
        got = []
        for rank in range(3):
            server.stats.reset()
            _layout(monkeypatch, rank, 3)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got.append(_keys(wds.WebDataset(_urls(server), shardshuffle=10, seed=1, nodesplitter=wds.split_by_node)))
            assert server.stats.snapshot().path_requests["sizes.json"] <= 2  # one read (fsspec may HEAD first)
        assert [len(k) for k in got] == [16, 16, 16]
        assert len({k for keys in got for k in keys}) == 48
    finally:
        os.remove(os.path.join(root, "sizes.json"))


def test_counts_given_in_code(monkeypatch, server):
    counts = {f"part-{n}.tar": size for n, size in enumerate(SIZES)}  # by file name, as sizes.json has them
    got = []
    for rank in range(2):
        server.stats.reset()
        _layout(monkeypatch, rank, 2)
        splitter = wds.EqualSplit(seed=3, counts=counts)
        got.append(_keys(wds.WebDataset(_urls(server), shardshuffle=False, nodesplitter=splitter)))
        assert "sizes.json" not in server.stats.snapshot().path_requests
    assert [len(k) for k in got] == [24, 24] and len(set(got[0] + got[1])) == 48


def test_count_shards_reads_each_shard_once_through_the_cache(monkeypatch, server, tmp_path):
    """The opt-in counting read fills the disk cache: the origin serves each shard exactly once
    for counting and loading together, and the ranks get equal work."""
    urls = _urls(server)
    got = []
    for rank in range(2):
        server.stats.reset()
        _layout(monkeypatch, rank, 2)
        splitter = wds.EqualSplit(seed=0, count_shards=True)
        cache = tmp_path / f"cache{rank}"
        cache.mkdir()
        ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=splitter, cache_dir=str(cache))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got.append(_keys(ds))
        assert _shard_requests(server) == {f"part-{n}.tar": 1 for n in range(len(SIZES))}
    assert [len(k) for k in got] == [24, 24] and len(set(got[0] + got[1])) == 48


def test_count_shards_from_the_environment(monkeypatch, server):
    monkeypatch.setenv("SHARDSTREAM_COUNT_SHARDS", "1")
    _layout(monkeypatch, 1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keys = _keys(wds.WebDataset(_urls(server), shardshuffle=False, nodesplitter=wds.split_by_node))
    assert len(keys) == 24


def test_count_shards_names_a_missing_shard(monkeypatch, server):
    _layout(monkeypatch, 0, 2)
    urls = _urls(server) + [server.url("missing.tar")]
    ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.EqualSplit(count_shards=True))
    with pytest.raises(FileNotFoundError, match="missing.tar"):
        _keys(ds)


def test_plain_function_on_urls_that_are_not_files(monkeypatch):
    """webdataset's split_by_node as a function: every world_size-th item, nothing opened."""
    urls = [f"http://nowhere.invalid/shard-{i}.tar" for i in range(7)] + [f"/no/such/dir/{i}.tar" for i in range(3)]
    for rank in range(3):
        _layout(monkeypatch, rank, 3)
        assert list(wds.split_by_node(urls)) == list(webdataset.split_by_node(urls)) == urls[rank::3]
        assert list(wds.shardlists.split_by_node(iter(urls))) == urls[rank::3]


@pytest.mark.parametrize("world", [1, 2])
def test_a_pipeline_over_urls_that_are_not_files_is_not_opened_to_split(monkeypatch, world):
    """DataPipeline(SimpleShardList, split_by_node, split_by_worker) lists the same shards as
    webdataset's without opening any (webdataset's own tests do this)."""
    urls = [f"/no/such/dir/shard-{i}.tar" for i in range(7)]
    for rank in range(world):
        _layout(monkeypatch, rank, world)
        ours = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker)
        theirs = webdataset.DataPipeline(webdataset.SimpleShardList(urls), webdataset.split_by_node, webdataset.split_by_worker)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the uncounted warning, at world size 2
            assert [item["url"] for item in ours] == [item["url"] for item in theirs]


@needs_torch
def test_split_by_node_after_the_shard_reader_splits_samples_like_webdataset(monkeypatch, server):
    """A small validation set spread over ranks sample by sample: the splitter then gets samples,
    not shards, and splits them one by one as webdataset does. A loader's state (which asks the
    splitter how it splits) reads no shard to find out."""
    urls = _urls(server)[:3]
    for rank in range(3):
        _layout(monkeypatch, rank, 3)
        theirs = webdataset.DataPipeline(webdataset.SimpleShardList(urls), webdataset.tarfile_to_samples(),
                                         webdataset.split_by_node)
        ours = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), wds.split_by_node)
        expected = [s["__key__"] for s in theirs]
        assert len(expected) == len(range(rank, sum(SIZES[:3]), 3))
        server.stats.reset()
        loader = wds.WebLoader(ours, batch_size=None, num_workers=0)
        assert loader.state_dict()["layout"]["node_split"] == "items"
        assert _shard_requests(server) == {}
        assert [s["__key__"] for s in loader] == expected
        # A shard reader of the user's own (OpenCLIP's tarfile_to_samples_nothrow): the splitter
        # sees the first item is a sample before it counts anything.
        ours = wds.DataPipeline(wds.SimpleShardList(urls), lambda src: wds.tarfile_samples(src), wds.split_by_node)
        assert wds.WebLoader(ours, batch_size=None).state_dict()["layout"]["node_split"] == "items"
        assert [s["__key__"] for s in ours] == expected


def test_local_gzip_shards_are_not_inflated_to_count(monkeypatch, tmp_path):
    shards = [write_tar(str(tmp_path / f"z-{n}.tar.gz"), sample_members(n, exts=("cls",)), gz=True) for n in range(4)]
    _layout(monkeypatch, 1, 2)
    with pytest.warns(UserWarning, match="no known sample count"):
        keys = _keys(wds.WebDataset(shards, shardshuffle=False, nodesplitter=wds.split_by_node))
    assert keys == ["s0001", "s0003"]


def test_elastic_resume_needs_counts_and_says_so(monkeypatch, server):
    urls = _urls(server)
    states = []
    for rank in range(2):
        _layout(monkeypatch, rank, 2)
        ds = wds.WebDataset(urls, shardshuffle=False, seed=1, nodesplitter=wds.split_by_node).to_tuple("__key__")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            it = iter(ds)
            next(it)
        states.append(ds.state_dict())
        assert states[-1]["layout"]["node_split"] == "shards"
    _layout(monkeypatch, 0, 3)
    ds = wds.WebDataset(urls, shardshuffle=False, seed=1, nodesplitter=wds.split_by_node).to_tuple("__key__")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.load_state_dict(states)
        with pytest.raises(wds.UsageError, match="sample count"):
            list(ds)


def _rewritten(tmp_path, extra_fields: bool, samples: int):
    """Three indexed local shards of 6 samples, then shard 1 rewritten in place (same keys
    with fields added, or more samples) with its .idx and sizes.json left as they were."""
    urls = []
    for shard in range(3):
        path = str(tmp_path / f"s-{shard}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(6):
                sink.write({"__key__": f"k{shard}_{i}", "txt": "caption", "cls": str(i)})
        urls.append(path)
    from shardstream.cli import main

    assert main(["index", str(tmp_path), "-q"]) == 0
    with wds.TarWriter(urls[1]) as sink:
        for i in range(samples):
            sink.write({"__key__": f"k1_{i}", "txt": "edited", "cls": str(i), **({"extra": "x"} if extra_fields and i < 2 else {})})
    return urls


def _ranks(urls, world, monkeypatch):
    results = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        try:
            results.append([s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)])
        except wds.FormatError as exn:
            results.append(exn)
    return results


def test_a_stale_idx_is_an_error_not_split_samples(tmp_path, monkeypatch, capsys):
    """The loader seeks by a shard's .idx to start mid-shard: where the shard was rewritten
    after it was indexed, the key there is not the one the .idx names (a sample went to one rank
    whole and to the next without a field, another was lost); verify says so too."""
    urls = _rewritten(tmp_path, extra_fields=True, samples=6)
    errors = [r for r in _ranks(urls, 4, monkeypatch) if isinstance(r, Exception)]
    assert errors and all("stale index" in str(e) and e.url == urls[1] for e in errors)
    from shardstream.cli import main

    assert main(["verify", str(tmp_path), "--no-decode", "-q"]) == 1
    assert "FAIL stale index: its .idx says sample 1 is 'k1_1' at byte" in capsys.readouterr().out


def test_a_count_below_the_shard_s_samples_is_an_error_not_lost_samples(tmp_path, monkeypatch):
    """sizes.json says 6, the shard now holds 8 (no .idx): the range that ends at the counted
    end sees another sample begin, and says the count is stale (its samples were never read)."""
    urls = _rewritten(tmp_path, extra_fields=False, samples=8)
    for idx in tmp_path.glob("*.idx"):
        idx.unlink()
    results = _ranks(urls, 2, monkeypatch)
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors and all("holds more samples than its sample count" in str(e) for e in errors)


def test_a_count_below_the_shard_s_samples_under_a_continuing_handler_skips_the_shard(tmp_path, monkeypatch):
    """Under warn_and_continue the stale count's error went to the per-member handler, which
    went on inside the shard: the last sample came out again for every member left (10 times
    here), and the ranks were unequal. It is the shard's error now: counted, and the next shard
    follows."""
    urls = _rewritten(tmp_path, extra_fields=False, samples=8)
    for idx in tmp_path.glob("*.idx"):
        idx.unlink()
    keys, errors = [], 0
    for rank in range(2):
        _layout(monkeypatch, rank, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            it = iter(wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node,
                                     handler=wds.warn_and_continue).to_tuple("__key__"))
            keys += [k for (k,) in it]
        errors += it.stats().source["errors"]
    assert len(keys) == len(set(keys)) == 18 and errors == 1  # (the error comes after the range's last sample)


@pytest.mark.parametrize("workers", [0, 2])
@needs_torch
def test_a_count_of_0_for_a_shard_with_samples_is_an_error_not_lost_samples(tmp_path, monkeypatch, workers):
    """sizes.json says 0 (indexed while it was written), the shard holds 8: a shard counted
    empty is in no rank's plan, so its samples were silently never read. One worker of one rank
    now looks that it is empty; a shard that is, passes."""
    urls = _rewritten(tmp_path, extra_fields=False, samples=8)
    for idx in tmp_path.glob("*.idx"):
        idx.unlink()
    empty = str(tmp_path / "s-3.tar")
    with wds.TarWriter(empty):
        pass
    sizes = json.loads((tmp_path / "sizes.json").read_text())
    (tmp_path / "sizes.json").write_text(json.dumps(dict(sizes, **{"s-1.tar": 0, "s-3.tar": 0})))
    errors, keys = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = wds.WebLoader(wds.WebDataset(urls + [empty], shardshuffle=False, nodesplitter=wds.split_by_node),
                               batch_size=None, num_workers=workers)
        try:
            keys += [s["__key__"] for s in loader]
        except wds.FormatError as exn:
            errors.append(exn)
    assert len(errors) == 1 and "says 0" in str(errors[0]) and errors[0].url == urls[1], (errors, keys)
    (tmp_path / "sizes.json").write_text(json.dumps(dict(sizes, **{"s-1.tar": 8, "s-3.tar": 0})))
    monkeypatch.setattr("shardstream._shard.counts._sizes_files", {})  # (read once a process)
    keys = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        keys += [s["__key__"] for s in wds.WebDataset(urls + [empty], shardshuffle=False, nodesplitter=wds.split_by_node)]
    assert sorted(keys) == sorted(f"k{s}_{i}" for s in range(3) for i in range(8 if s == 1 else 6))


def _counted_shards(root, sizes):
    """Shards of `sizes` samples (keys numbered across them) and their sizes.json."""
    import io
    import tarfile

    shards, at, counts = [], 0, {}
    for n, size in enumerate(sizes):
        path = str(root / f"part-{n}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(at, at + size):
                info = tarfile.TarInfo(f"{i:06d}.cls")
                info.size = len(str(i))
                tar.addfile(info, io.BytesIO(str(i).encode()))
        at += size
        shards.append(path)
        counts[os.path.basename(path)] = size
    (root / "sizes.json").write_text(json.dumps(counts))
    return shards, at


@pytest.mark.parametrize("with_epoch", [False, True])
@needs_torch
def test_an_elastic_resume_with_empty_shards_or_a_per_worker_epoch(tmp_path, monkeypatch, with_epoch):
    """Two ranks save, one rank resumes. Shards counted 0 were checked by pieces put before the
    plan, so saved slice indexes moved and 55 of 123 samples were lost; a with_epoch length per
    worker (OpenCLIP's ceil(N / (batch x world x workers))) differs on the new layout, and the
    settings check refused the resume."""
    import math

    shards, total = _counted_shards(tmp_path, [0, 40, 12, 23, 0, 31, 17])

    def build(world):
        ds = wds.WebDataset(shards, shardshuffle=False, seed=3, nodesplitter=wds.split_by_node).to_tuple("__key__")
        ds = ds.batched(4)
        if with_epoch:
            ds = ds.with_epoch(math.ceil(total / (4 * world)))
        return wds.WebLoader(ds, batch_size=None, num_workers=0)

    before, states = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = build(2)
        it = iter(loader)
        before += [key for _ in range(3) for key in next(it)[0]]
        states.append(loader.state_dict())
        del it
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    loader = build(1)
    loader.load_state_dict(states)
    after = [key for batch in loader for key in batch[0]]
    assert len(set(before + after)) >= total - 2  # (every sample, but fewer than world size left over)
    if not with_epoch:  # (with_epoch goes round again to fill its length: repeats are its rule)
        assert len(set(before + after)) == len(before + after)


_GROUP_CHILD = r"""
import sys, tempfile, torch
import torch.distributed as dist
import shardstream as wds

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
split = wds.EqualSplit(seed=1, group=dist.new_group([0]))
ds = wds.WebDataset(sys.argv[1], shardshuffle=False, nodesplitter=split).to_tuple("__key__")
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
print(sorted(key for key, in loader))
dist.destroy_process_group()
"""


@needs_torch
def test_a_splitter_given_a_process_group_goes_to_spawned_workers(tmp_path):
    """A process group does not pickle: EqualSplit(group=...) under spawn or forkserver
    DataLoader workers (the default start method from Python 3.14) failed with "cannot pickle
    ProcessGroup". The workers get the rank and world size it gave."""
    import subprocess
    import sys

    paths = [write_tar(str(tmp_path / f"g{n}.tar"), [m for i in range(n * 5, n * 5 + 5) for m in sample_members(i, exts=("cls",))])
             for n in range(4)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _GROUP_CHILD, "::".join(paths)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=root))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str([f"s{i:04d}" for i in range(20)])


@needs_torch
def test_the_plan_over_a_shard_list_is_made_once_and_follows_a_changed_list(monkeypatch, files):
    """Over a million shards the scheduler costs seconds to make: a loader's main process makes
    it (its forked workers inherit it) and later passes over the same list keep it; a list
    that changes between passes gets its own plan."""
    made = []
    real = split_module.ShardScheduler

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(split_module, "ShardScheduler", counting)
    _layout(monkeypatch, 1, 2)
    paths = [os.path.join(files[0], f"part-{n}.tar") for n in range(len(SIZES))]
    shards = list(paths)
    dataset = wds.DataPipeline(lambda: iter(list(shards)), wds.EqualSplit(shuffle=False), wds.tarfile_to_samples())
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert len(_keys(loader)) == 24
    assert len(made) == 1  # made in this process, before the workers were forked
    shards[:] = paths[:4]  # 28 samples
    assert len(_keys(loader)) == 14
    assert len(made) == 2


def _fake_replay(epoch, rank, world, worker, workers, length, n):
    """A stand-in for a seeded shuffle buffer's replay: `n` offsets, seeded by the worker."""
    import random

    return sorted(random.Random(repr((epoch, rank, world, worker, workers, length))).sample(range(length), n))


def _saved_layout(scheduler, epoch, world, workers, previous, rng, seek):
    """Every rank's saved state on one layout after random deliveries (seek or count positions)."""
    from shardstream._plan.elastic import ranges_length

    origin = (scheduler.rebase(split_module.resume_state(scheduler, previous, _fake_replay), world, workers)
              if previous else scheduler.fresh_state(epoch, world, workers))
    states = []
    for rank in range(world):
        per_worker, positions = {}, {}
        for worker in range(workers):
            length = ranges_length(scheduler.part_ranges(origin, rank, world, worker, workers))
            pieces = split_module._pieces(scheduler.resume_plan(origin, rank, world, worker, workers))
            if seek and pieces and rng.random() < 0.8:
                piece = rng.randrange(len(pieces))
                positions[worker] = [0, piece, rng.randrange(pieces[piece].count), None]
                per_worker[worker] = 1
            elif not seek and length:
                per_worker[worker] = n = rng.randint(0, length)
                positions[worker] = [0, n]
        states.append({"epoch": epoch, "layout": {"rank": rank, "world_size": world, "num_workers": workers},
                       "per_worker": per_worker, "positions": positions, "split": previous})
    return states


def test_a_new_rank_s_resume_state_reads_as_the_whole_one_does():
    """resume_state(wanted=...) replays only the old workers a new rank draws on and gives the
    others stand-in positions: each new rank's plan must be the one the whole state gives, over
    chained elastic histories with seek and count positions, "drop" and "wrap"."""
    import random

    from shardstream._plan.scheduler import ShardScheduler
    from shardstream._plan.shards import SchedulerConfig, Shard

    compared = 0
    for trial in range(200):
        rng = random.Random(trial)
        sizes = [rng.choice([0, 1, 3, 7, 12, 30]) for _ in range(rng.randint(1, 9))] + [20]
        config = SchedulerConfig(seed=trial, remainder=rng.choice(["drop", "wrap"]))
        scheduler = ShardScheduler([Shard(f"s{i}", n) for i, n in enumerate(sizes)], config)
        history = None
        try:
            for _level in range(rng.randint(1, 3)):
                history = _saved_layout(scheduler, 1, rng.randint(1, 5), rng.randint(1, 3), history, rng,
                                        seek=rng.random() < 0.5)
            whole = split_module.resume_state(scheduler, history, _fake_replay)
        except wds.UsageError:
            continue  # (a layout with fewer samples than ranks)
        world, workers = rng.randint(1, 6), rng.randint(1, 3)
        for rank in range(world):
            mine = split_module.resume_state(scheduler, history, _fake_replay, (world, {rank}))
            for worker in range(workers):
                assert (scheduler.resume_plan(mine, rank, world, worker, workers)
                        == scheduler.resume_plan(whole, rank, world, worker, workers)), (trial, rank, worker)
                compared += 1
    assert compared > 300
