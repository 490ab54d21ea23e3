"""benchmarks/harness.py: one configuration measured in several fresh processes (`--processes`)
reads as one result whose headline is the median first pass, and a failure says which process."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "harness.py")


@pytest.fixture(scope="module")
def harness():
    # loaded from its file: putting benchmarks/ on sys.path would let its modules (raw, decode,
    # report, ...) shadow others for the rest of the session
    spec = importlib.util.spec_from_file_location("bench_harness", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up while the class is made)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def rep(harness, wall, peak=300.0):
    return harness.Rep(samples=1000, bytes=10_000, wall_s=wall, first_s=0.1, cpu_s=0.5, peak_pss_mb=peak,
                       base_pss_mb=250.0)


def run(harness, config, *walls, error=None, stats=None):
    return harness.Result(config, reps=[rep(harness, w, peak=100 * w) for w in walls], error=error, stats=stats,
                          setup_s=walls[0] if walls else 0.0)


@pytest.fixture()
def config(harness):
    return harness.Config("raw", "shardstream", "shardstream")


def test_the_headline_is_the_median_first_pass_and_best_of_n_spans_every_process(harness, config):
    merged = harness.merge([run(harness, config, 2.0, 1.0), run(harness, config, 4.0, 3.0),
                            run(harness, config, 3.0, 0.5, 2.5, stats="last")])
    assert [r.wall_s for r in merged.firsts] == [2.0, 4.0, 3.0]
    assert merged.first.wall_s == 3.0 and merged.rate == pytest.approx(1000 / 3.0)
    assert merged.peak_pss_mb == 300.0 and merged.added_pss_mb == pytest.approx(50.0)  # the median pass's own
    assert merged.best.wall_s == 0.5 and merged.best_rate == pytest.approx(2000.0)
    assert merged.passes_per_process == [2, 2, 3] and len(merged.reps) == 7
    assert merged.setup_s == 4.0 and merged.stats == "last" and merged.error is None
    summary = json.loads(json.dumps(merged.to_json()))
    assert summary["passes_per_process"] == [2, 2, 3] and len(summary["firsts"]) == 3
    assert summary["summary"]["samples_per_s"] == pytest.approx(1000 / 3.0)


def test_an_even_count_takes_the_faster_middle_pass(harness, config):
    merged = harness.merge([run(harness, config, w) for w in (4.0, 1.0, 3.0, 2.0)])
    assert merged.first.wall_s == 2.0


def test_one_process_is_the_plain_first_pass(harness, config):
    merged = harness.merge([run(harness, config, 5.0, 1.0)])
    assert merged.first.wall_s == 5.0 and merged.passes_per_process == [2]
    unmerged = run(harness, config, 5.0, 1.0)  # (a Result straight from run_config: no firsts yet)
    assert unmerged.first.wall_s == 5.0


def test_a_failed_process_fails_the_configuration_and_is_named(harness, config):
    merged = harness.merge([run(harness, config, 2.0), run(harness, config, error="timed out after 600 s"),
                            run(harness, config, 3.0, error="exit 1: boom")])
    assert merged.error == "process 2/3: timed out after 600 s"
    assert [r.wall_s for r in merged.firsts] == [2.0, 3.0]  # (kept in results.json all the same)
    assert harness.merge([run(harness, config, error="exit 1: boom")]).error == "exit 1: boom"
    with pytest.raises(ValueError):
        harness.merge([])



def test_configs_with_short_first_passes_get_more_processes_up_to_the_most(harness, config):
    slow, failed = harness.Config("raw", "slow", "shardstream"), harness.Config("raw", "failed", "shardstream")
    configs = [config, slow, failed]
    runs = {config.key: [run(harness, config, 0.5, 0.25) for _ in range(3)],  # 1.5 s of first passes
            slow.key: [run(harness, slow, 2.0) for _ in range(3)],
            failed.key: [run(harness, failed, 0.1, error="exit 1: boom")]}
    assert harness.wanting_more(configs, runs, 15, 3.0) == [config]  # not the long nor the failed one
    runs[config.key] += [run(harness, config, 0.5) for _ in range(3)]  # 3.0 s now, in 6 processes
    assert harness.wanting_more(configs, runs, 15, 3.0) == []
    assert harness.wanting_more(configs, runs, 15, 3.5) == [config]
    assert harness.wanting_more(configs, runs, 6, 3.5) == []  # no more than the most
