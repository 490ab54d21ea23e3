"""Run the shardstream-vs-webdataset benchmarks and report them.

    .venv/bin/python benchmarks/run.py [--workload raw|decode|all] [--repeat 3] [--samples 4000]
                                       [--shards 16] [--workers 1,2,4] [--quick]

Every configuration runs in its own fresh Python process. Prints a table, writes
benchmarks/out/results.json and benchmarks/out/benchmarks.png.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import corpus
import report
from harness import WORKLOADS, Config, check_same_payload, run_config

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
QUICK = {"samples": 256, "shards": 8, "repeat": 1}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; `--quick` overrides corpus size and repetitions for a smoke test."""
    parser = argparse.ArgumentParser(description="shardstream vs webdataset benchmarks")
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per config; the fastest is shown")
    parser.add_argument("--samples", type=int, default=corpus.CorpusSpec.samples)
    parser.add_argument("--shards", type=int, default=corpus.CorpusSpec.shards)
    parser.add_argument("--workers", default="1,2,4", help="DataLoader/WebLoader worker counts (decode)")
    parser.add_argument("--quick", action="store_true", help="small corpus, 1 repetition: a smoke test")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per config")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    args.workers = [int(n) for n in args.workers.split(",") if n.strip()]
    return args


def corpus_dir(spec: corpus.CorpusSpec) -> Path:
    """The default corpus folder for the default spec, a sized sibling for any other spec."""
    default = corpus.CorpusSpec()
    if (spec.samples, spec.shards) == (default.samples, default.shards):
        return corpus.DEFAULT_DIR
    return corpus.DEFAULT_DIR.with_name(f"corpus-{spec.samples}x{spec.shards}")


def version(package: str) -> str:
    """The installed version of `package`, without importing it."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "missing"


def git_revision() -> str:
    """The short commit of the repository, with "+dirty" when the working tree has changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=HERE, capture_output=True,
                               text=True).stdout
        return sha + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_meta(args: argparse.Namespace, urls: list[str]) -> dict:
    """What the figures depend on: machine, versions, corpus and repetitions."""
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "webdataset": version("webdataset"),
        "shardstream": version("shardstream"),
        "git": git_revision(),
        "samples": args.samples,
        "shards": len(urls),
        "corpus_mb": round(sum(os.path.getsize(u) for u in urls) / 1e6, 1),
        "repeat": args.repeat,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def header_line(meta: dict) -> str:
    """The one-line description printed above the table and on the plot."""
    return (f"cores={meta['cores']} python={meta['python']} torch={meta['torch']} "
            f"webdataset={meta['webdataset']} shardstream={meta['shardstream']} ({meta['git']}) | "
            f"corpus {meta['samples']} samples / {meta['shards']} shards / {meta['corpus_mb']} MB | "
            f"best of {meta['repeat']}")


def selected_configs(args: argparse.Namespace) -> list[Config]:
    """The configurations of the chosen workloads, in table order."""
    names = WORKLOADS if args.workload == "all" else [args.workload]
    return [c for name in names for c in importlib.import_module(name).configs(args.workers)]


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the corpus, run each configuration in a subprocess, report; 1 if any failed."""
    args = parse_args(argv)
    spec = corpus.CorpusSpec(samples=args.samples, shards=args.shards)
    urls = corpus.ensure_corpus(spec, corpus_dir(spec))
    meta = machine_meta(args, urls)
    results = []
    for config in selected_configs(args):
        print(f"running {config.workload}/{config.name} ...", end=" ", flush=True)
        result = run_config(config, urls, repeat=args.repeat, expected_samples=args.samples,
                            timeout_s=args.timeout)
        print(f"FAILED: {result.error}" if result.error else f"{result.rate:,.0f} samples/s", flush=True)
        results.append(result)
    check_same_payload(results)
    header = header_line(meta)
    print()
    print(report.format_table(results, header))
    report.write_json(results, meta, OUT / "results.json")
    report.plot(results, header, OUT / "benchmarks.png")
    print(f"\nwrote {OUT / 'results.json'} and {OUT / 'benchmarks.png'}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
