"""Benchmark configurations, results, and running one configuration in a fresh subprocess.

A *workload* is a module in this folder (`raw.py`, `decode.py`, `remote.py`) with this contract:

    NAME: str
    def configs(workers: list[int]) -> list[Config]
        The configurations to compare, webdataset baselines first.
    def make_pass(config: Config, urls: list[str]) -> Callable[[], Iterable]
        Untimed setup (imports, building the pipeline); the returned function starts one timed pass.
        It may also have a `prepare()` method, called untimed before each pass (e.g. to empty a
        cache), and a `close()` method, called once after the last pass.
    def count(item) -> tuple[int, int]
        Samples and payload bytes in one item that a pass yields (a sample, or a batch).
    def comparisons() -> list[Comparison]          (optional)
        Ratios between two configurations printed under the table, with an optional target.

Adding a workload means writing such a module and listing it in `WORKLOADS`; the child process
(`measure.py`), the report and `run.py` need no change. A module's configurations may fall into
several table sections (`Config.workload`) when `Config.module` names the module; configurations
with `source` "http" or "s3" get the URLs of the servers that `run.py` starts (`servers.py`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

__all__ = ["SOURCES", "WORKLOADS", "Comparison", "Config", "Rep", "Result", "check_same_payload", "merge",
           "run_config", "wanting_more"]

WORKLOADS = ("raw", "decode", "remote")  # the workload modules
SOURCES = ("local", "http", "s3")
CACHE_MODES = ("", "cold", "warm", "filled")
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Config:
    """One thing to measure: a library set up in one way, running one workload.

    Attributes:
        workload: the table section (e.g. "raw", "http-raw"); also the module unless `module` is set.
        name: unique within the workload, shown in the table (e.g. "webdataset-dl2").
        library: "webdataset", "shardstream" or "limit" (a computed upper bound).
        num_workers: DataLoader worker processes (0: iterate in the measuring process).
        rate_scale: the measured rate is multiplied by this (the limit: one thread times the core count).
        full_pass: a pass visits every sample of the corpus (checked against the corpus size).
        module: the workload module run in the child, when it differs from `workload`.
        source: where the shards come from: "local" files, the "http" server or the "s3" server.
        pipeline: what a pass does, for modules that run several ("raw", "decode"); payload bytes are
            compared between all configurations with the same pipeline (else the same workload).
        shards_in_flight: shardstream's remote shards downloading at once (0: the library default).
        cache: shardstream's disk cache: "" off, "cold" (emptied before every pass: stream-through),
            "warm" (filled by an untimed pass, so every timed pass reads it), "filled" (filled by
            another process before this one's passes: a later job on the node).
        baseline: this configuration is its workload's ratio reference (else: the fastest webdataset).
        world_size: > 1 runs as rank 0 of that many (RANK/WORLD_SIZE) with `split_by_node`: a pass
            reads that rank's share, so it is not a full pass.
        count_shards: shardstream's splitter counts uncounted shards by reading them first.
    """

    workload: str
    name: str
    library: str
    num_workers: int = 0
    rate_scale: int = 1
    full_pass: bool = True
    module: str = ""
    source: str = "local"
    pipeline: str = ""
    shards_in_flight: int = 0
    cache: str = ""
    baseline: bool = False
    world_size: int = 1
    count_shards: bool = False

    def __post_init__(self) -> None:
        if self.module_name not in WORKLOADS:
            raise ValueError(f"unknown workload module {self.module_name!r}")
        if self.source not in SOURCES or self.cache not in CACHE_MODES:
            raise ValueError(f"bad source or cache in {self}")
        if self.num_workers < 0 or self.rate_scale < 1 or self.shards_in_flight < 0 or self.world_size < 1:
            raise ValueError(f"bad config {self}")

    @property
    def module_name(self) -> str:
        """The workload module that runs this configuration in the child."""
        return self.module or self.workload

    @property
    def key(self) -> str:
        """"workload/name": unique in a run, how comparisons name configurations."""
        return f"{self.workload}/{self.name}"


@dataclass(frozen=True)
class Comparison:
    """A ratio printed under the table: `numerator`'s samples/s over `denominator`'s.

    Attributes:
        label: what the ratio means (e.g. "HTTP decode / local decode").
        numerator, denominator: `Config.key`s ("workload/name").
        target: the least ratio that counts as met for samples/s, the largest for memory (None:
            reported only).
        measure: what is divided: "rate" (samples/s), "pss" (the first pass's peak PSS MB),
            "added" (the PSS the first pass added to the process tree) or "base" (the tree's PSS
            just before the first pass: interpreter, torch, the library's import).
        over: the denominator's measure when it is not `measure` (a floor: "base" over "pss").
    """

    label: str
    numerator: str
    denominator: str
    target: Optional[float] = None
    measure: str = "rate"  # or "pss", "added" or "base": memory, lower is better
    over: Optional[str] = None


@dataclass(frozen=True)
class Rep:
    """One timed pass.

    Attributes:
        wall_s: from starting the pass to its end (DataLoader workers shut down included).
        first_s: from starting the pass to the first item (worker start-up included).
        cpu_s: user+sys CPU of the process and its children during the pass, less the memory sampler's.
        peak_pss_mb: the highest PSS of the process tree seen by the sampler (every ~50 ms).
        base_pss_mb: the process tree's PSS just before the pass (interpreter, torch, the library).
        server_cpu_s: user+sys CPU of the server process during the pass (None: local files). On a
            machine the server shares, it is CPU the loader does not get.
    """

    samples: int
    bytes: int
    wall_s: float
    first_s: float
    cpu_s: float
    peak_pss_mb: float
    base_pss_mb: float = 0.0
    server_cpu_s: Optional[float] = None

    @property
    def rate(self) -> float:
        """Samples per second of this pass."""
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Result:
    """A configuration's passes, summarised: the first pass of a fresh process (the median one when
    it ran in several fresh processes, `merge`), and the fastest of all passes."""

    config: Config
    reps: list[Rep] = field(default_factory=list)
    firsts: list[Rep] = field(default_factory=list)  # the first pass of each fresh process
    passes_per_process: list[int] = field(default_factory=list)  # how `reps` splits by process
    setup_s: float = 0.0
    error: Optional[str] = None
    corpus_bytes: int = 0
    stats: Optional[str] = None  # shardstream's `it.stats().format()` after the last pass

    @property
    def mb_per_s(self) -> Optional[float]:
        """Shard bytes read per second by the first pass (MB = 1e6 bytes), if it was a full pass."""
        first = self.first
        if first is None or not self.config.full_pass or not self.corpus_bytes or first.wall_s <= 0:
            return None
        return self.corpus_bytes / first.wall_s / 1e6

    @property
    def verdict(self) -> Optional[str]:
        """The `verdict:` line of the shardstream stats, without the prefix."""
        for line in (self.stats or "").splitlines():
            if line.startswith("verdict:"):
                return line[len("verdict:"):].strip()
        return None

    @property
    def first(self) -> Optional[Rep]:
        """The first pass of the fresh process: what a training job sees every epoch (its DataLoader
        workers are fresh processes), so the headline figures are its. Over several fresh processes,
        the median one by wall time (the lower middle of an even count)."""
        firsts = self.firsts or self.reps[:1]
        if not firsts:
            return None
        return sorted(firsts, key=lambda r: r.wall_s)[(len(firsts) - 1) // 2]

    @property
    def best(self) -> Optional[Rep]:
        """The fastest repetition (least wall time), or None when the run failed."""
        return min(self.reps, key=lambda r: r.wall_s) if self.reps else None

    @property
    def rate(self) -> float:
        """Samples/s of the first pass, times the config's scale (the headline)."""
        return self.first.rate * self.config.rate_scale if self.first else 0.0

    @property
    def best_rate(self) -> float:
        """Samples/s of the fastest pass, times the config's scale (the second column)."""
        return self.best.rate * self.config.rate_scale if self.best else 0.0

    @property
    def peak_pss_mb(self) -> float:
        """The first pass's peak PSS, as the headline figures are the first pass's (each pass's
        own peak is in `reps`)."""
        return self.first.peak_pss_mb if self.first else 0.0

    @property
    def added_pss_mb(self) -> Optional[float]:
        """What the first pass added to the process tree's PSS (its peak less the PSS just before
        it): the loader's threads or worker processes, its buffers and what it imported lazily,
        without the interpreter, torch and the library's import that both sides share. None when
        an untimed pass ran in the process before it (a warm cache's filling pass): its base
        already holds all that."""
        first = self.first
        if first is None or self.config.cache == "warm":
            return None
        return max(0.0, first.peak_pss_mb - first.base_pss_mb)

    def value(self, measure: str) -> float:
        """The figure a `Comparison` divides: "rate" (samples/s), "pss" (the first pass's peak PSS),
        "added" (`added_pss_mb`) or "base" (the PSS before the first pass); 0.0 when there is none."""
        first = self.first
        figures = {"rate": self.rate, "pss": self.peak_pss_mb, "added": self.added_pss_mb,
                   "base": first.base_pss_mb if first else 0.0}
        return figures[measure] or 0.0

    def to_json(self) -> dict:
        """A JSON-ready dict with the raw repetitions and the summary figures."""
        first = self.first
        return {
            "config": asdict(self.config),
            "error": self.error,
            "setup_s": self.setup_s,
            "reps": [asdict(r) for r in self.reps],
            "firsts": [asdict(r) for r in self.firsts],
            "passes_per_process": self.passes_per_process,
            "stats": self.stats,
            "summary": None if first is None else {
                "samples_per_s": self.rate,
                "best_samples_per_s": self.best_rate,
                "mb_per_s": self.mb_per_s,
                "wall_s": first.wall_s,
                "first_sample_s": first.first_s,
                "cpu_s_per_1k": 1000 * first.cpu_s / first.samples if first.samples else None,
                "server_cpu_s_per_1k": (1000 * first.server_cpu_s / first.samples
                                        if first.samples and first.server_cpu_s is not None else None),
                "peak_pss_mb": self.peak_pss_mb,
                "added_pss_mb": self.added_pss_mb,
            },
        }


def merge(runs: list[Result]) -> Result:
    """One configuration's results from several fresh processes as one: every pass, the first pass
    of each process (the headline is the median one, every first-pass column included), the slowest
    set-up, the last process's stats. Failed when any process failed: the error says which."""
    if not runs:
        raise ValueError("merge() needs at least one result")
    merged = Result(runs[0].config, corpus_bytes=runs[0].corpus_bytes)
    for index, run in enumerate(runs):
        merged.reps += run.reps
        merged.firsts += run.firsts or run.reps[:1]
        merged.passes_per_process.append(len(run.reps))
        merged.setup_s = max(merged.setup_s, run.setup_s)
        merged.stats = run.stats or merged.stats
        if run.error and not merged.error:
            merged.error = run.error if len(runs) == 1 else f"process {index + 1}/{len(runs)}: {run.error}"
    return merged


def wanting_more(configs: list[Config], runs: dict[str, list[Result]], most: int, total_s: float) -> list[Config]:
    """The configurations that get one more fresh process: none failed, fewer than `most` ran,
    and their first passes add up to less than `total_s` seconds."""
    def wants(results: list[Result]) -> bool:
        if len(results) >= most or any(r.error for r in results):
            return False
        return sum(rep.wall_s for rep in merge(results).firsts) < total_s
    return [config for config in configs if wants(runs[config.key])]


def run_config(config: Config, urls: list[str], *, repeat: int, expected_samples: int,
               timeout_s: float, warm: Optional[list[str]] = None, env: Optional[dict] = None,
               corpus_bytes: int = 0, server_pid: Optional[int] = None) -> Result:
    """Measure `config` in a fresh Python subprocess (`measure.py`) and check its sample counts.

    `urls` are what the workload reads; `warm` the local shard files the child reads once first
    (default: `urls`, which must then be local); `env` is set in the child's environment (a None
    value unsets the variable); `server_pid` the server process whose CPU each pass also measures.
    """
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec = {"config": asdict(config), "urls": urls, "warm": urls if warm is None else warm,
                "repeat": repeat, "server_pid": server_pid}
        spec_path.write_text(json.dumps(spec))
        command = [sys.executable, str(HERE / "measure.py"), str(spec_path), str(result_path)]
        child_env = dict(os.environ)
        for name, value in (env or {}).items():
            if value is None:
                child_env.pop(name, None)
            else:
                child_env[name] = value
        try:
            returncode, output = _run_child(command, child_env, timeout_s)
        except subprocess.TimeoutExpired:
            return Result(config, error=f"timed out after {timeout_s:.0f} s", corpus_bytes=corpus_bytes)
        if returncode != 0 or not result_path.exists():
            tail = output.strip().splitlines()[-1:] or ["no output"]
            return Result(config, error=f"exit {returncode}: {tail[0]}", corpus_bytes=corpus_bytes)
        data = json.loads(result_path.read_text())
    result = Result(config, reps=[Rep(**r) for r in data["reps"]], setup_s=data["setup_s"],
                    corpus_bytes=corpus_bytes, stats=data.get("stats"))
    wrong = [r.samples for r in result.reps if config.full_pass and r.samples != expected_samples]
    if wrong:
        result.error = f"saw {wrong[0]} samples, corpus has {expected_samples}"
    return result


def _run_child(command: list[str], env: dict, timeout_s: float) -> tuple[int, str]:
    """Run `command` in a new session; return its exit code and stderr (else stdout).

    On a timeout or any exception here (Ctrl-C, SIGTERM turned into SystemExit) the child's whole
    process group is killed: DataLoader workers and `curl` pipes included, which a SIGKILLed parent
    would otherwise leave behind (torch workers of a dead parent can hang forever).
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        _kill_group(proc)  # workers a crashed child left behind
    return proc.returncode, stderr or stdout


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads and reap `proc` (its pipes close once all are dead)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
    proc.communicate()


def check_same_payload(results: list[Result]) -> None:
    """Flag full-pass results whose payload bytes differ from the first full-pass result doing the same.

    Every configuration of a workload (or, where set, of a pipeline: raw over local files, HTTP and S3
    alike) reads the same corpus, so a difference means a library skipped or altered data, and its
    speed would not be comparable.
    """
    reference: dict[str, int] = {}
    for result in results:
        if result.error or not result.config.full_pass:
            continue
        for rep in result.reps:
            expected = reference.setdefault(result.config.pipeline or result.config.workload, rep.bytes)
            if rep.bytes != expected:
                result.error = f"payload {rep.bytes} bytes, expected {expected}"
                break
