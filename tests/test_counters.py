"""Counters (`_base/counters.py`): thread-safe counts that survive pickling and forking."""

from __future__ import annotations

import multiprocessing
import pickle
import threading

import pytest
from children import kill_alive

from shardstream._base.counters import Counters


class Hits(Counters):
    FIELDS = ("hits", "misses")


def test_counts_add_and_read_as_attributes():
    counts = Hits()
    counts.add(hits=2)
    counts.add(hits=1, misses=4, other=1)
    assert counts.snapshot() == {"hits": 3, "misses": 4, "other": 1} and counts.hits == 3
    with pytest.raises(AttributeError):
        counts.nothing  # noqa: B018


def test_a_pickled_copy_keeps_its_counts_and_has_its_own_lock():
    counts = Hits()
    counts.add(hits=5)
    copy = pickle.loads(pickle.dumps(counts))
    copy.add(hits=1)
    assert (counts.hits, copy.hits) == (5, 6)


def _count_in_child(counts, out):
    counts.add(hits=1)  # deadlocks if the child's lock is the parent's, copied while held
    out.put(counts.hits)


def test_a_fork_while_another_thread_holds_the_lock_does_not_deadlock_the_child():
    counts = Hits()
    counts.add(hits=1)
    held, release = threading.Event(), threading.Event()

    def holder():
        with counts._lock:  # a cache writer thread counting a commit at the moment of the fork
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_count_in_child, args=(counts, out))
        child.start()
        try:
            assert out.get(timeout=20) == 2
            child.join(20)
            assert child.exitcode == 0
        finally:
            kill_alive([child])  # (deadlocked: the failure above says so)
    finally:
        release.set()
        thread.join(10)


def test_repr_shows_the_counts():
    counts = Hits()
    counts.add(hits=2)
    assert repr(counts) == "Hits({'hits': 2, 'misses': 0})"
