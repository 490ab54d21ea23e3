"""The engine: ordering, fusion, errors with stage names, handlers, bounded memory, stats,
prompt and complete shutdown, DataLoader workers and pickling."""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time
import traceback
import warnings

import pytest

import shardstream as wds
from shardstream._engine.segments import split_segments
from needs import needs_torch

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


def keys(items):
    return [x["__key__"] if isinstance(x, dict) else x for x in items]


def test_segments_fuse_consecutive_sample_stages():
    ds = wds.DataPipeline(
        wds.SimpleShardList(["a"]), wds.tarfile_to_samples(), wds.decode(), wds.map(len), wds.batched(2), wds.map(len)
    )
    kinds = [(s.kind, len(s.stages)) for s in split_segments(ds.pipeline)]
    assert kinds == [("stream", 2), ("parallel", 2), ("stream", 1), ("parallel", 1)]


@pytest.mark.parametrize("threads", [1, 3])
def test_ordered_output_equals_sequential(shardset, threads):
    def build():
        return wds.WebDataset(shardset, shardshuffle=False).decode().map(lambda s: {**s, "n": len(s)})

    sequential = list(build().with_engine(enabled=False))
    engine = list(build().with_engine(threads=threads))
    assert keys(engine) == keys(sequential)
    assert [s["n"] for s in engine] == [s["n"] for s in sequential]


def test_unordered_output_has_the_same_samples(shardset):
    def slow_on_some(sample):
        if sample["__key__"].endswith("3"):
            time.sleep(0.01)
        return sample

    ds = wds.WebDataset(shardset, shardshuffle=False).map(slow_on_some)
    expected = sorted(keys(ds.with_engine(enabled=False)))
    got = keys(ds.with_engine(threads=4, ordered=False))
    assert sorted(got) == expected


def test_user_exception_names_the_stage_and_keeps_the_traceback(shardset):
    def explode(sample):
        raise KeyError("boom in user code")

    ds = wds.WebDataset(shardset, shardshuffle=False).map(explode)
    with pytest.raises(KeyError) as info:
        list(ds)
    notes = getattr(info.value, "__notes__", [])
    assert any("map(explode)" in n for n in notes) or not hasattr(info.value, "add_note")
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "explode" in frames


@pytest.mark.parametrize("engine", [True, False])
def test_a_stage_on_tuples_names_the_sample_with_the_engine_on_or_off(shardset, engine):
    """The note on an error of a stage that sees tuples (map_tuple after to_tuple) names the
    sample and its URL as it came into the fused stages, with the engine off too (plain
    generators: also DataLoader workers with fewer than 2 cores each), not only on the engine."""
    def odd(key):
        if key.endswith("3"):
            raise IndexError("odd key")
        return key

    ds = wds.WebDataset(shardset, shardshuffle=False).to_tuple("__key__", "__url__").map_tuple(odd, None)
    with pytest.raises(IndexError) as info:
        list(ds.with_engine(enabled=engine))
    notes = getattr(info.value, "__notes__", [])
    assert any(n.startswith("shardstream: raised in stage 'map_tuple' on sample '") and " of " in n for n in notes), notes


def test_handlers_keep_their_meaning_on_the_engine(shardset):
    def fail_some(sample):
        if sample["__key__"] in ("s0002", "s0005"):
            raise ValueError("bad sample")
        return sample

    ds = wds.WebDataset(shardset, shardshuffle=False)
    with pytest.warns(UserWarning):
        skipped = keys(ds.map(fail_some, handler=wds.warn_and_continue))
    assert "s0002" not in skipped and "s0005" not in skipped and "s0006" in skipped
    stopped = keys(ds.map(fail_some, handler=wds.ignore_and_stop))
    assert stopped == ["s0000", "s0001"]


@pytest.mark.parametrize("engine", [{}, {"ordered": False}, {"enabled": False}])
def test_a_map_that_raises_stopiteration_is_an_error_not_the_end_of_the_pass(shardset, engine):
    """A function that calls next() on an exhausted iterator (a user's bug): the StopIteration
    went up through the engine's __next__ as the end of the pass, losing the rest of the epoch
    without an error. It is a RuntimeError, as a generator's is (PEP 479; webdataset's too)."""
    first = None

    def f(sample):
        nonlocal first
        first = first or sample["__key__"]
        if sample["__key__"] != first:
            next(iter([]))
        return sample

    with pytest.raises(RuntimeError, match="raised StopIteration"):
        list(wds.WebDataset(shardset, shardshuffle=False).map(f).with_engine(**engine))


def _slowly(src):
    for sample in src:
        time.sleep(0.005)
        yield sample


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["engine", "engine+map", "generators", "webloader"])
@needs_torch
def test_closing_an_iterator_from_another_thread_ends_the_loop(shardset, how):
    """A watchdog thread closes the iterator the training loop waits on: the loop went on with a
    whole new pass (its samples twice), or got the engine's private Stopped, or (WebLoader) the
    close raised "generator already executing" and the loop went on."""
    ds = wds.WebDataset(shardset, shardshuffle=False).compose(_slowly)
    if how == "engine+map":
        ds = ds.map(lambda s: s)
    elif how == "generators":
        ds = ds.with_engine(enabled=False)
    if how == "webloader":
        it = iter(wds.WebLoader(ds.to_tuple("__key__"), batch_size=None, num_workers=2))
    else:
        it = iter(ds.to_tuple("__key__"))
    keys = [next(it)[0]]
    closer = threading.Timer(0.2, it.close)
    closer.start()
    keys += [key for (key,) in it]
    closer.join()
    assert len(keys) == len(set(keys)) and len(keys) < len(list(wds.WebDataset(shardset, shardshuffle=False)))


def test_exception_in_a_stream_stage_reaches_the_consumer(shardset):
    def bad_stream(src):
        for i, x in enumerate(src):
            if i == 3:
                raise RuntimeError("stream stage failed")
            yield x

    with pytest.raises(RuntimeError, match="stream stage failed"):
        list(wds.WebDataset(shardset, shardshuffle=False).compose(bad_stream).map(len))


def test_memory_is_bounded_with_a_slow_consumer():
    produced = []

    def source():
        for i in range(100000):
            produced.append(i)
            yield {"__key__": str(i), "x": b"."}

    ds = wds.DataPipeline(source, wds.map(lambda s: s), wds.batched(4)).with_engine(threads=2, max_chunk=8, queue_chunks=2)
    it = iter(ds)
    next(it)
    time.sleep(0.5)
    # source -> (<= inflight tasks of <= max_chunk) -> batched -> (<= queue_chunks chunks of <= max_chunk batches)
    bound = 4 * 8 + 8 + 2 * 8 * 4 + 64
    assert len(produced) <= bound, len(produced)
    it.close()


def test_large_batches_wait_a_few_at_a_time_not_a_queue_of_chunks():
    """Slow, large batches (of decoded images) go one per chunk, and a queue of 8 chunks held 8
    of them: 1.8 GB with 154 MB batches where webdataset in the caller's thread holds ~3. The
    queues hold `queue_bytes` (64 MiB) of them beyond one chunk."""
    batches = []

    def counted(src):
        for batch in src:
            time.sleep(0.01)  # (slow: a batch a chunk)
            batches.append(len(batches))
            yield batch

    source = [{"__key__": str(i)} for i in range(96)]
    ds = wds.DataPipeline(lambda: iter(source), wds.map(lambda s: {"x": bytes(4 << 20)}), wds.batched(8), counted)
    it = iter(ds)
    started = time.monotonic()
    next(it)
    time.sleep(1.0)
    assert len(batches) <= 1 + 2 + 1 + 1, len(batches)  # the consumer's, 64 MiB queued, one over, one in hand
    assert len(list(it)) == 12 - 1 and time.monotonic() - started < 10


def test_stats_are_structured_and_name_the_bottleneck(shardset):
    def slow(sample):
        time.sleep(0.002)
        return sample

    total = len(list(wds.WebDataset(shardset, shardshuffle=False)))
    ds = wds.WebDataset(shardset, shardshuffle=False).map(slow).listed(4)
    it = iter(ds)
    n = sum(len(b) for b in it)
    stats = it.stats()
    assert n == total and stats.delivered == (total + 3) // 4
    by_kind = {s["kind"]: s for s in stats.stages}
    assert by_kind["parallel"]["items"] == total
    assert by_kind["parallel"]["avg_item_ms"] >= 1.5 and by_kind["parallel"]["p90_item_ms"] >= 1.5
    assert stats.source["bytes"] == sum(os.path.getsize(p) for p in shardset)
    assert stats.source["shards"] == len(shardset)
    assert "map(slow)" in stats.verdict()
    assert ds.stats() is not None and "verdict" in ds.stats().as_dict()
    assert "verdict:" in stats.format()


def _spin(sample):
    """Two milliseconds or so of pure Python in steps that let go of the GIL between them, as
    Pillow's decode does: with several threads, each step waits for the GIL."""
    total = 0
    for _ in range(20):
        for i in range(2_000):
            total += i
        time.sleep(0)
    return sample


@needs_torch
def test_the_default_pool_stops_at_eight_threads_and_the_verdict_names_the_gil(shardset, monkeypatch):
    """On a many-core machine the default pool is capped (past a few cores the GIL, not the cores,
    bounds Python per-sample work), and a GIL-bound parallel stage says so and points to processes."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    names = set()

    def remember(sample):
        names.add(threading.current_thread().name)
        return _spin(sample)

    it = iter(wds.WebDataset(shardset, shardshuffle=False).map(remember))
    n = sum(1 for _ in it)
    stats = it.stats()
    parallel = [s for s in stats.stages if s["kind"] == "parallel"]
    assert n > 0 and parallel[0]["workers"] == 8 and 1 <= len(names) <= 8
    assert stats.cores == 64 and 0 < stats.cores_used < 0.6 * 8  # (this machine has 2 cores)
    assert "map(remember)" in stats.verdict() and "holds the GIL" in stats.verdict()
    assert "WebLoader(dataset, num_workers=N)" in stats.verdict()
    assert stats.wall_s == it.stats().wall_s and stats.cpu_s == it.stats().cpu_s  # frozen at the end
    assert "process CPU" in stats.format()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert wds.EngineConfig().resolved_threads() == 3  # cores + 1 below the cap
    assert wds.EngineConfig(threads=12).resolved_threads() == 12  # asked for: not capped


def test_the_verdict_names_the_gil_only_when_the_cores_idle():
    from shardstream._engine.stats import PipelineStats

    stage = {"name": "decode", "kind": "parallel", "workers": 8, "utilisation": 0.9}
    busy = PipelineStats(wall_s=10.0, delivered=100, stages=[stage], consumer_wait_s=9.0, cpu_s=70.0, cores=8)
    idle = PipelineStats(wall_s=10.0, delivered=100, stages=[stage], consumer_wait_s=9.0, cpu_s=20.0, cores=8)
    unknown = PipelineStats(wall_s=10.0, delivered=100, stages=[stage], consumer_wait_s=9.0)
    assert "GIL" not in busy.verdict() and "GIL" in idle.verdict() and "GIL" not in unknown.verdict()
    assert "decode" in busy.verdict() and "2.0 of its 8 cores" in idle.verdict()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_abandoned_iterators_release_threads_and_files(shardset):
    ds = wds.WebDataset(shardset, shardshuffle=False).decode().map(lambda s: s)
    for it in (iter(ds), iter(ds)):  # warm up the shared pool
        next(it)
    del it
    gc.collect()
    time.sleep(0.2)
    threads0, fds0 = threading.active_count(), _fds()
    for i in range(1000):
        it = iter(ds)
        for _ in range(i % 7):
            next(it)
        if i % 3 == 0:
            it.close()
        del it  # garbage-collected mid-stream
    gc.collect()
    deadline = time.time() + 10
    while time.time() < deadline and (threading.active_count() > threads0 or _fds() > fds0):
        time.sleep(0.1)
    assert threading.active_count() <= threads0
    assert _fds() <= fds0


def test_break_and_keyboard_interrupt_stop_promptly(shardset):
    ds = wds.WebDataset(shardset, shardshuffle=False).map(lambda s: s)
    base = threading.active_count()
    start = time.time()
    try:
        for i, _ in enumerate(ds):
            if i == 5:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    gc.collect()
    while threading.active_count() > base and time.time() - start < 5:
        time.sleep(0.05)
    assert threading.active_count() <= base
    assert time.time() - start < 5


def test_engine_is_configurable_globally_and_per_dataset(shardset):
    previous = wds.engine_defaults()
    try:
        wds.set_engine_defaults(threads=3)
        assert wds.WebDataset(shardset, shardshuffle=False).resolved_engine_config().threads == 3
        assert wds.WebDataset(shardset, shardshuffle=False).with_engine(threads=1).resolved_engine_config().threads == 1
    finally:
        wds.set_engine_defaults(**{k: getattr(previous, k) for k in ("threads", "ordered", "enabled")})
    for bad in (dict(threads=0), dict(threads=2.5), dict(max_chunk=0), dict(ordered="no"), dict(enabled=None)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            wds.WebDataset(shardset, shardshuffle=False).with_engine(**bad)


def test_pipelines_pickle(shardset):
    ds = wds.WebDataset(shardset, shardshuffle=False).decode().to_tuple("__key__", "cls", handler=wds.ignore_and_continue)
    list(ds)  # stats objects exist now; pickling must still work
    clone = pickle.loads(pickle.dumps(ds))
    assert list(clone) == list(ds)


@pytest.mark.parametrize("num_workers", [0, 2])
@needs_torch
def test_dataloader_workers_run_the_engine(shardset, num_workers):
    import torch.utils.data

    ds = wds.WebDataset(shardset, shardshuffle=False).decode().to_tuple("__key__", handler=wds.ignore_and_continue)
    loader = wds.WebLoader(ds, batch_size=None, num_workers=num_workers)
    got = sorted(k for (k,) in loader)
    expected = sorted(k for (k,) in ds)
    assert got == expected
    plain = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers)
    assert sorted(k for (k,) in plain) == expected


@needs_torch
def test_a_webloader_with_persistent_workers_lets_them_go_when_it_goes(shardset):
    """A WebLoader was a reference cycle (a bound method of its own among its stages), so the
    persistent workers its DataLoader keeps lived on until a garbage collection, whose finalizer
    then held the thread it ran in ~5 s per loader (30 s in one test, inside an event loop)."""
    import gc
    import multiprocessing

    def make():
        return wds.WebLoader(wds.WebDataset(shardset, shardshuffle=False).to_tuple("__key__"),
                             batch_size=None, num_workers=2, persistent_workers=True)

    list(make())  # torch's first DataLoader imports modules, in cycles that hold its callers' frames
    gc.collect()
    gc.disable()  # (as between a program's collections)
    try:
        loader = make()
        first, second = list(loader), list(loader)
        assert sorted(first) == sorted(second) and multiprocessing.active_children()
        loader = loader.shuffle(10)  # (a composed copy: the original goes with the name)
        assert sorted(loader) == sorted(first)
        del loader
        deadline = time.monotonic() + 10  # (torch joins them; the last may take a moment to be reaped)
        while multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()


@pytest.mark.parametrize("how", ["deepcopy", "copy", "with_engine", "compose"])
@needs_torch
def test_a_copy_of_a_webloader_keeps_its_own_count_and_outlives_the_original(shardset, how):
    """The stage that counts a WebLoader's items holds its loader weakly (above); every kind of
    copy gets a stage of its own that serves the copy, not the original (whose count it used to
    take), and that still works once the original is gone."""
    import copy

    loader = wds.WebLoader(wds.WebDataset(shardset, shardshuffle=False).to_tuple("__key__"), batch_size=None)
    clone = {"deepcopy": copy.deepcopy, "copy": copy.copy, "with_engine": lambda w: w.with_engine(threads=2),
             "compose": lambda w: w.compose(lambda src: src)}[how](loader)
    expected = len(list(wds.WebDataset(shardset, shardshuffle=False)))
    count = len(list(clone))
    assert count == expected and clone.state_dict()["per_worker"] == {"0": count}
    assert loader.state_dict()["per_worker"] == {}  # the original has handed out nothing
    del loader
    gc.collect()
    assert len(list(clone)) == expected


def _one_core(_worker_id):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _thread_name(sample):
    return threading.current_thread().name


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
@pytest.mark.parametrize("threads", [None, 2])
@needs_torch
def test_workers_with_a_core_or_less_each_run_without_engine_threads(shardset, threads):
    """Two workers with one core each: the processes are the parallelism, so each runs its pipeline
    in its own thread (as webdataset does); with `threads` set, the engine runs as asked."""
    ds = wds.WebDataset(shardset, shardshuffle=False).map(_thread_name)
    if threads is not None:
        ds = ds.with_engine(threads=threads)
    loader = wds.WebLoader(ds, batch_size=None, num_workers=2, worker_init_fn=_one_core)
    names = list(loader)
    assert len(names) == len(list(wds.WebDataset(shardset, shardshuffle=False)))
    if threads is None:
        assert set(names) == {"MainThread"}
    else:
        assert "MainThread" not in set(names)


def test_with_epoch_restarts_passes_on_the_engine(shardset):
    ds = wds.WebDataset(shardset, shardshuffle=False).with_epoch(150)
    first = keys(ds)
    assert len(first) == 150
    assert keys(ds) == first


def test_the_source_counts_samples_of_shards_left_or_broken_part_way(tmp_path):
    """stats.source["samples"] was added when a shard ended cleanly: 0 after leaving a shard
    part way (mid-pass too, while the shard was read), and a broken shard's samples, delivered
    under warn_and_continue, were not counted."""
    for name in ("a", "b"):
        with wds.TarWriter(str(tmp_path / f"{name}.tar")) as sink:
            for i in range(200):
                sink.write({"__key__": f"{name}{i:03d}", "txt": "x" * 100})
    # (read-ahead held to a sample or so: with the default queues, the source could finish the
    # small shard before the consumer had taken 100, and the shard count was 1 about 1 run in 4)
    it = iter(wds.WebDataset(str(tmp_path / "a.tar"), shardshuffle=False).with_engine(queue_chunks=1, max_chunk=1))
    for _ in range(100):
        next(it)
    assert 0 < it.stats().source["samples"] < 200 and it.stats().source["shards"] == 0  # (counted in steps)
    it.close()
    raw = (tmp_path / "b.tar").read_bytes()
    (tmp_path / "b.tar").write_bytes(raw[: len(raw) // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(wds.WebDataset([str(tmp_path / "a.tar"), str(tmp_path / "b.tar")], shardshuffle=False,
                                 handler=wds.warn_and_continue))
        delivered = sum(1 for _ in it)
    source = it.stats().source
    assert source["samples"] == delivered > 200 and source["shards"] == 1 and source["errors"] == 1


def test_an_iterator_started_before_fork_is_refused_in_the_child_not_left_waiting(tmp_path):
    """The pass's threads stay in the parent: the child's next() waited for ever. It is a
    UsageError now, and a new iterator in the child reads the whole pass."""
    from shardsets import sample_members, write_tar

    path = write_tar(str(tmp_path / "f.tar"), [m for i in range(40) for m in sample_members(i, exts=("cls",))])
    dataset = wds.WebDataset(path, shardshuffle=False).with_engine(threads=2, max_chunk=1)
    it = iter(dataset)
    next(it)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once (no atexit, no pytest)
        try:
            started = time.monotonic()
            try:
                for _ in range(50):
                    next(it)
                outcome = "went on"
            except wds.UsageError as exc:
                outcome = "refused" if "before fork" in str(exc) and time.monotonic() - started < 5 else repr(exc)
            outcome += f" {sum(1 for _ in dataset)}"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            outcome = repr(exc)
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    try:
        deadline = time.monotonic() + 30
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:  # (a child left waiting)
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)
        outcome = os.read(read, 1000).decode()
    finally:
        os.close(read)
    assert outcome == "refused 40"
    assert sum(1 for _ in it) == 39  # (the parent's pass goes on)


@pytest.mark.parametrize("engine", [True, False])
def test_an_iterator_dropped_where_its_close_needs_a_held_lock_does_not_deadlock(tmp_path, engine):
    """A finalizer runs wherever a garbage collection happens: a dropped iterator in a reference
    cycle (an exception kept in a local, a trainer holding its own callback) was collected on a
    stream thread inside the reader's `Counters.add`, and its close took the same lock for its
    stats: the thread waited on itself and the training loop for ever. Its close now runs on the
    janitor thread, waited for a second at most."""
    from shardsets import sample_members, write_tar
    from shardstream._shard.samples import TarShardSamples

    path = write_tar(str(tmp_path / "f.tar"), [m for i in range(40) for m in sample_members(i, exts=("cls",))])
    dataset = wds.WebDataset(path, shardshuffle=False).batched(2).with_engine(enabled=engine)
    reader = next(s for s in dataset.pipeline if isinstance(s, TarShardSamples))
    box = [iter(dataset)]
    next(box[0])
    done = threading.Event()

    def drop():
        with reader.source_stats._lock:  # as a collection inside Counters.add would hold it
            box.clear()  # the iterator's last reference: its finalizer runs here
        done.set()

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    thread.join(10)
    assert done.is_set(), "the finalizer waited for a lock its own thread held"
    assert len(list(dataset)) == 20  # and the dataset reads on, its counters free


def test_many_iterators_collected_under_a_held_lock_stall_the_thread_once(tmp_path):
    """A collection that finds several dropped iterators whose closes need a lock the collecting
    thread holds waits for the first close once (a second), not a second for each of them (12 s
    for six), and a slow close does not hold up the others."""
    import gc

    from shardsets import sample_members, write_tar
    from shardstream._shard.samples import TarShardSamples

    path = write_tar(str(tmp_path / "f.tar"), [m for i in range(400) for m in sample_members(i, exts=("cls",))])
    dataset = wds.WebDataset(path, shardshuffle=False).batched(2)
    reader = next(s for s in dataset.pipeline if isinstance(s, TarShardSamples))
    gc.disable()
    try:
        for _ in range(6):
            it = iter(dataset)
            next(it)
            it.cycle = it  # a reference cycle: only a collection frees it
        del it
        took = []

        def collect():
            started = time.monotonic()
            with reader.source_stats._lock:  # as a collection inside Counters.add would hold it
                gc.collect()
            took.append(time.monotonic() - started)

        thread = threading.Thread(target=collect, daemon=True)
        thread.start()
        thread.join(30)
    finally:
        gc.enable()
    assert took and took[0] < 3, took
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(t.name.startswith("shardstream-finalize") for t in threading.enumerate()):
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("shardstream-finalize")]
    assert len(list(dataset)) == 200
