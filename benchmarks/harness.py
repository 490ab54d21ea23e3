"""Benchmark configurations, results, and running one configuration in a fresh subprocess.

A *workload* is a module in this folder (`raw.py`, `decode.py`) with this contract:

    NAME: str
    def configs(workers: list[int]) -> list[Config]
        The configurations to compare, webdataset baselines first.
    def make_pass(config: Config, urls: list[str]) -> Callable[[], Iterable]
        Untimed setup (imports, building the pipeline); the returned function starts one timed pass.
    def count(item) -> tuple[int, int]
        Samples and payload bytes in one item that a pass yields (a sample, or a batch).

Adding a workload means writing such a module and listing it in `WORKLOADS`; the child process
(`measure.py`), the report and `run.py` need no change.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

__all__ = ["WORKLOADS", "Config", "Rep", "Result", "check_same_payload", "run_config"]

WORKLOADS = ("raw", "decode")
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Config:
    """One thing to measure: a library set up in one way, running one workload.

    Attributes:
        workload: the workload module's name.
        name: unique within the workload, shown in the table (e.g. "webdataset-dl2").
        library: "webdataset", "shardstream" or "limit" (a computed upper bound).
        num_workers: DataLoader worker processes (0: iterate in the measuring process).
        rate_scale: the measured rate is multiplied by this (the limit: one thread times the core count).
        full_pass: a pass visits every sample of the corpus (checked against the corpus size).
    """

    workload: str
    name: str
    library: str
    num_workers: int = 0
    rate_scale: int = 1
    full_pass: bool = True

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}")
        if self.num_workers < 0 or self.rate_scale < 1:
            raise ValueError(f"bad config {self}")


@dataclass(frozen=True)
class Rep:
    """One timed pass.

    Attributes:
        wall_s: from starting the pass to its end (DataLoader workers shut down included).
        first_s: from starting the pass to the first item (worker start-up included).
        cpu_s: user+sys CPU of the process and its children during the pass, less the memory sampler's.
        peak_pss_mb: the highest PSS of the process tree seen by the sampler (every ~50 ms).
    """

    samples: int
    bytes: int
    wall_s: float
    first_s: float
    cpu_s: float
    peak_pss_mb: float

    @property
    def rate(self) -> float:
        """Samples per second of this pass."""
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Result:
    """A configuration's repetitions, summarised: the fastest pass, and the peak memory of all passes."""

    config: Config
    reps: list[Rep] = field(default_factory=list)
    setup_s: float = 0.0
    error: Optional[str] = None

    @property
    def best(self) -> Optional[Rep]:
        """The fastest repetition (least wall time), or None when the run failed."""
        return min(self.reps, key=lambda r: r.wall_s) if self.reps else None

    @property
    def rate(self) -> float:
        """Samples/s of the fastest repetition, times the config's scale."""
        return self.best.rate * self.config.rate_scale if self.best else 0.0

    @property
    def peak_pss_mb(self) -> float:
        """The peak PSS over all repetitions."""
        return max((r.peak_pss_mb for r in self.reps), default=0.0)

    def to_json(self) -> dict:
        """A JSON-ready dict with the raw repetitions and the summary figures."""
        best = self.best
        return {
            "config": asdict(self.config),
            "error": self.error,
            "setup_s": self.setup_s,
            "reps": [asdict(r) for r in self.reps],
            "summary": None if best is None else {
                "samples_per_s": self.rate,
                "wall_s": best.wall_s,
                "first_sample_s": best.first_s,
                "cpu_s_per_1k": 1000 * best.cpu_s / best.samples if best.samples else None,
                "peak_pss_mb": self.peak_pss_mb,
            },
        }


def run_config(config: Config, urls: list[str], *, repeat: int, expected_samples: int,
               timeout_s: float) -> Result:
    """Measure `config` in a fresh Python subprocess (`measure.py`) and check its sample counts."""
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps({"config": asdict(config), "urls": urls, "repeat": repeat}))
        command = [sys.executable, str(HERE / "measure.py"), str(spec_path), str(result_path)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Result(config, error=f"timed out after {timeout_s:.0f} s")
        if proc.returncode != 0 or not result_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return Result(config, error=f"exit {proc.returncode}: {tail[0]}")
        data = json.loads(result_path.read_text())
    result = Result(config, reps=[Rep(**r) for r in data["reps"]], setup_s=data["setup_s"])
    wrong = [r.samples for r in result.reps if config.full_pass and r.samples != expected_samples]
    if wrong:
        result.error = f"saw {wrong[0]} samples, corpus has {expected_samples}"
    return result


def check_same_payload(results: list[Result]) -> None:
    """Flag full-pass results whose payload bytes differ from the workload's first full-pass result.

    Every configuration of a workload reads the same corpus, so a difference means a library skipped or
    altered data, and its speed would not be comparable.
    """
    reference: dict[str, int] = {}
    for result in results:
        if result.error or not result.config.full_pass:
            continue
        for rep in result.reps:
            expected = reference.setdefault(result.config.workload, rep.bytes)
            if rep.bytes != expected:
                result.error = f"payload {rep.bytes} bytes, expected {expected}"
                break
