"""Run the shardstream-vs-webdataset benchmarks and report them.

    .venv/bin/python benchmarks/run.py [--workload raw|decode|remote|all] [--repeat 3] [--samples 4000]
                                       [--shards 16] [--workers 1,2,4] [--processes 1] [--quick] [--only SECTION]

Every configuration runs in its own fresh Python process (in `--processes` of them, in turns across
the configurations, the headline being the median of their first passes). A configuration whose
first passes are short gets more processes, up to `--max-processes`, until they add up to
`--short-total` seconds: a pass of a third of a second varies by half its length from one fresh
process to the next on a shared machine, and three of them cannot tell 0.88x from 1.0x. The servers of the remote workloads (HTTP,
S3) run in their own processes, started once here and stopped on the way out (errors, Ctrl-C and
SIGTERM included). Prints a table, writes benchmarks/out/results.json and benchmarks/out/benchmarks.png.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import corpus
import report
import servers
from harness import WORKLOADS, Comparison, Config, Result, check_same_payload, merge, run_config, wanting_more

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
QUICK = {"samples": 256, "shards": 8, "repeat": 1}
SHORT_TOTAL_S = 3.0  # a config's first passes add up to this much at least, within --max-processes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; `--quick` overrides corpus size and repetitions for a smoke test."""
    parser = argparse.ArgumentParser(description="shardstream vs webdataset benchmarks")
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per config: the first is the headline, the fastest a second column")
    parser.add_argument("--samples", type=int, default=corpus.CorpusSpec.samples)
    parser.add_argument("--shards", type=int, default=corpus.CorpusSpec.shards)
    parser.add_argument("--workers", default="1,2,4",
                        help="DataLoader/WebLoader worker counts (decode; remote always uses 2 and 8)")
    parser.add_argument("--processes", type=int, default=1,
                        help="fresh processes per config, run in turns across the configs: the headline is the median first pass")
    parser.add_argument("--max-processes", type=int, default=0,
                        help="fresh processes at most for a config with short first passes (default: 5x --processes)")
    parser.add_argument("--short-total", type=float, default=SHORT_TOTAL_S,
                        help="seconds of first passes a config's median is taken over, at least (within --max-processes)")
    parser.add_argument("--quick", action="store_true", help="small corpus, 1 repetition: a smoke test")
    parser.add_argument("--only", default="", help="run only configurations whose 'section/name' contains this")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per config")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    if args.quick:
        vars(args).update(QUICK, max_processes=args.processes)
    args.max_processes = args.max_processes or 5 * args.processes
    if args.max_processes < args.processes:
        parser.error("--max-processes must be >= --processes")
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


def compile_shardstream() -> None:
    """Byte-compile the shardstream the children import, as pip compiled webdataset when it
    installed it. Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it) and the
    package runs from a checkout, every fresh process otherwise compiled shardstream from source:
    ~0.25 s of its import, and the modules a pass imports lazily inside the timed pass."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("shardstream")
    if spec is not None and spec.origin:
        compileall.compile_dir(os.path.dirname(spec.origin), quiet=2)


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
        "processes": args.processes,
        "max_processes": args.max_processes,
        "short_total_s": args.short_total,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def header_line(meta: dict) -> str:
    """The one-line description printed above the table and on the plot."""
    line = (f"cores={meta['cores']} python={meta['python']} torch={meta['torch']} "
            f"webdataset={meta['webdataset']} shardstream={meta['shardstream']} ({meta['git']}) | "
            f"corpus {meta['samples']} samples / {meta['shards']} shards / {meta['corpus_mb']} MB | "
            + (f"first pass of a fresh process, best of {meta['repeat']} beside it" if meta.get("processes", 1) == 1 else
               f"median first pass of {meta['processes']} fresh processes, best of {meta['processes']}x{meta['repeat']} beside it")
            + (f" (short passes: more processes, up to {meta['max_processes']})"
               if meta.get("max_processes", 1) > meta.get("processes", 1) else ""))
    if "http" in meta:
        http = meta["http"]
        line += (f" | http: {http['latency_ms']:g} ms to first byte, "
                 f"{http['bandwidth'] / 1e6:g} MB/s per connection")
    return line


def selected_modules(args: argparse.Namespace) -> list:
    """The chosen workload modules, in table order."""
    names = WORKLOADS if args.workload == "all" else [args.workload]
    return [importlib.import_module(name) for name in names]


def selected_configs(args: argparse.Namespace) -> list[Config]:
    """The configurations of the chosen workloads, in table order."""
    return [c for module in selected_modules(args) for c in module.configs(args.workers) if args.only in c.key]


def selected_comparisons(args: argparse.Namespace) -> list[Comparison]:
    """The comparisons the chosen workload modules define (optional in the contract)."""
    return [c for module in selected_modules(args) for c in getattr(module, "comparisons", list)()]


def start_servers(stack: contextlib.ExitStack, sources: set[str],
                  paths: list[str]) -> tuple[dict[str, servers.Remote], dict[str, str]]:
    """Start the servers `sources` need (entered on `stack`, so they stop with it).

    Returns where each started source's shards are, and why a source could not be started.
    """
    remotes, failed = {"local": servers.Remote(paths)}, {}
    starters = {"http": lambda: servers.http_server(paths), "s3": lambda: servers.s3_server(paths)}
    for source in sorted(sources - {"local"}):
        started = time.perf_counter()
        try:
            remotes[source] = stack.enter_context(starters[source]())
        except Exception as error:  # noqa: BLE001 - its configurations fail, the others still run
            failed[source] = f"{source} server did not start: {type(error).__name__}: {error}"
            print(failed[source], flush=True)
            continue
        where = remotes[source].urls[0].rsplit("/", 1)[0]
        print(f"{source}: serving the corpus at {where} (ready in {time.perf_counter() - started:.1f} s)",
              flush=True)
    return remotes, failed


def cannot_run(config: Config, failed_sources: dict[str, str]) -> str | None:
    """Why `config` cannot run here (its server failed, a tool is missing), or None."""
    if config.source in failed_sources:
        return failed_sources[config.source]
    if config.library == "webdataset" and config.source == "http" and shutil.which("curl") is None:
        return "curl not found (webdataset fetches http:// URLs by piping curl)"
    return None


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C, so the servers are stopped


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the corpus, run each configuration in a subprocess, report; 1 if any failed."""
    args = parse_args(argv)
    started = time.perf_counter()
    compile_shardstream()
    signal.signal(signal.SIGTERM, _terminate)
    spec = corpus.CorpusSpec(samples=args.samples, shards=args.shards)
    urls = corpus.ensure_corpus(spec, corpus_dir(spec))
    meta = machine_meta(args, urls)
    configs = selected_configs(args)
    if any(c.source == "http" for c in configs):
        meta["http"] = {"latency_ms": servers.HTTP_LATENCY_MS, "bandwidth": servers.HTTP_BANDWIDTH}
    corpus_bytes = sum(os.path.getsize(u) for u in urls)
    runs: dict[str, list[Result]] = {config.key: [] for config in configs}
    with contextlib.ExitStack() as stack:
        remotes, failed_sources = start_servers(stack, {c.source for c in configs}, urls)

        def run_one(config: Config, label: str) -> None:
            print(f"running {config.workload}/{config.name}{label} ...", end=" ", flush=True)
            reason = cannot_run(config, failed_sources)
            if reason is not None:
                result = Result(config, error=reason, corpus_bytes=corpus_bytes)
            else:
                remote = remotes[config.source]
                result = run_config(config, remote.urls, repeat=args.repeat, expected_samples=args.samples,
                                    timeout_s=args.timeout, warm=urls, env=remote.env,
                                    corpus_bytes=corpus_bytes, server_pid=remote.pid)
            print(f"FAILED: {result.error}" if result.error else f"{result.rate:,.0f} samples/s", flush=True)
            runs[config.key].append(result)

        for turn in range(args.processes):  # in turns, so that a drift of the machine touches every config alike
            for config in configs:
                run_one(config, f" ({turn + 1}/{args.processes})" if args.processes > 1 else "")
        while short := wanting_more(configs, runs, args.max_processes, args.short_total):  # (in turns too)
            for config in short:
                run_one(config, f" ({len(runs[config.key]) + 1}, a short pass)")
    results = [merge(runs[config.key]) for config in configs]
    meta["processes_run"] = {key: len(done) for key, done in runs.items() if len(done) != args.processes}
    check_same_payload(results)
    header = header_line(meta)
    print()
    print(report.format_table(results, header))
    if meta["processes_run"]:
        print("\nfresh processes of the configs with short first passes: "
              + ", ".join(f"{key} {n}" for key, n in meta["processes_run"].items()))
    for block in (report.format_comparisons(results, selected_comparisons(args)),
                  report.format_verdicts(results)):
        if block:
            print()
            print(block)
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    report.write_json(results, meta, OUT / "results.json")
    report.plot(results, header, OUT / "benchmarks.png")
    print(f"\nwrote {OUT / 'results.json'} and {OUT / 'benchmarks.png'} ({meta['elapsed_s']:.0f} s in all)")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the servers and the running configuration are stopped by now
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
