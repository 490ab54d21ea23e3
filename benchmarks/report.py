"""Present benchmark results: the table on stdout, results.json, and a bar plot."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Optional

from harness import Comparison, Result

__all__ = ["baseline_of", "format_comparisons", "format_table", "format_verdicts", "plot", "write_json"]

COLUMNS = ("workload", "config", "samples/s", "best of N", "MB/s", "ratio", "first ms", "CPU s/1k", "server CPU",
           "peak PSS MB", "added MB")
COLOURS = {"webdataset": "#8c8c8c", "shardstream": "#1f77b4", "limit": "#2ca02c"}


def baseline_of(results: list[Result], workload: str) -> Optional[Result]:
    """What ratios of `workload` are measured against: its configuration marked `baseline`, else its
    fastest successful webdataset configuration (None when there is neither, or it failed)."""
    ok = [r for r in results if r.config.workload == workload and r.error is None and r.first]
    marked = [r for r in results if r.config.workload == workload and r.config.baseline]
    if marked:
        return marked[0] if any(r is marked[0] for r in ok) else None
    return max((r for r in ok if r.config.library == "webdataset"), key=lambda r: r.rate, default=None)


def ratio(result: Result, results: list[Result]) -> Optional[float]:
    """`result`'s rate over its workload's baseline rate, or None when either is missing."""
    base = baseline_of(results, result.config.workload)
    if base is None or result.error or not result.first:
        return None
    return result.rate / base.rate


def row(result: Result, results: list[Result]) -> list[str]:
    """One table row; a failed configuration shows its error instead of figures."""
    config, first = result.config, result.first
    if result.error or first is None:
        return [config.workload, config.name, f"FAILED: {result.error}", *[""] * (len(COLUMNS) - 3)]
    scaled = config.rate_scale != 1  # the limit: per-pass figures are of one thread, not comparable
    rel = ratio(result, results)
    mb_per_s = result.mb_per_s
    return [
        config.workload,
        config.name,
        f"{result.rate:,.0f}",
        f"{result.best_rate:,.0f}",
        "-" if mb_per_s is None else f"{mb_per_s:,.1f}",
        "-" if rel is None else f"{rel:.2f}x",
        "-" if scaled else f"{1000 * first.first_s:.0f}",
        "-" if scaled else f"{1000 * first.cpu_s / first.samples:.2f}",
        "-" if scaled or first.server_cpu_s is None else f"{1000 * first.server_cpu_s / first.samples:.2f}",
        "-" if scaled else f"{result.peak_pss_mb:.0f}",
        "-" if scaled or result.added_pss_mb is None else f"{result.added_pss_mb:.0f}",
    ]


def format_table(results: list[Result], header: str) -> str:
    """The results as an aligned text table under `header`, with a footer naming the baselines."""
    rows = [list(COLUMNS)] + [row(r, results) for r in results]
    widths = [max(len(r[i]) for r in rows if len(r[i]) < 40) for i in range(len(COLUMNS))]
    lines = [header, ""]
    for cells in rows:
        padded = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        lines.append("  ".join(padded).rstrip())
        if cells is rows[0]:
            lines.append("  ".join("-" * w for w in widths))
    bases = {r.config.workload: baseline_of(results, r.config.workload) for r in results}
    names = ", ".join(f"{w}: {b.config.name if b else 'none'}" for w, b in bases.items())
    ratio_line = (f"ratio = samples/s over the workload's baseline: its fastest webdataset config, or the "
                  f"config marked as its reference ({names})")
    lines += ["", "samples/s, MB/s, first ms, CPU s/1k, server CPU, peak PSS MB: the first pass of a fresh process (what a training job "
              "sees each epoch; with --processes, the median of the processes' first passes); best of N: the fastest pass",
              "CPU s/1k = CPU seconds of the loader's process tree per 1,000 samples; server CPU = the same for the "
              "HTTP or S3 server process (on this machine it shares the cores with the loader)",
              "MB/s = shard bytes read per second (1 MB = 1e6 bytes); added MB = the first pass's peak PSS less "
              "the process's PSS just before it (what the loader added: its workers or threads, buffers, lazy imports; "
              "'-' after an untimed pass in the same process)",
              ratio_line]
    return "\n".join(lines)


def _by_key(results: list[Result]) -> dict[str, Result]:
    return {r.config.key: r for r in results}


def format_comparisons(results: list[Result], comparisons: list[Comparison]) -> str:
    """One line per comparison: the ratio, its target and whether it was met ("" when none apply)."""
    found = _by_key(results)
    rows = []
    for comparison in comparisons:
        top, bottom = found.get(comparison.numerator), found.get(comparison.denominator)
        if top is None or bottom is None:
            continue  # a configuration not selected in this run
        measure, over = comparison.measure, comparison.over or comparison.measure
        if top.error or bottom.error or not top.value(measure) or not bottom.value(over):
            value, verdict = "n/a", "(a configuration failed)"
        else:
            rel = top.value(measure) / bottom.value(over)
            value = f"{rel:.2f}x"
            if comparison.target is None:
                verdict = ""
            elif measure == "rate":
                verdict = f"target >= {comparison.target:.2f}: " + ("met" if rel >= comparison.target else "MISSED")
            else:
                verdict = f"target <= {comparison.target:.2f}: " + ("met" if rel <= comparison.target else "MISSED")
        rows.append((comparison.label, value, verdict))
    if not rows:
        return ""
    width = max(len(label) for label, _, _ in rows)
    lines = ["comparisons (samples/s over samples/s; memory: the first pass's peak PSS, or what it added, over the same):"]
    lines += [f"  {label.ljust(width)}  {value:>6}  {verdict}".rstrip() for label, value, verdict in rows]
    return "\n".join(lines)


def format_verdicts(results: list[Result]) -> str:
    """shardstream's own verdict of each configuration's last pass: which stage limited it."""
    lines = [f"  {r.config.key}: {r.verdict}" for r in results if r.verdict and not r.error]
    return "\n".join(["shardstream verdicts (last pass, it.stats().verdict()):", *lines]) if lines else ""


def write_json(results: list[Result], meta: dict, path: Path) -> None:
    """Write the run's metadata and every configuration's repetitions and summary to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "results": [r.to_json() for r in results]}
    path.write_text(json.dumps(payload, indent=1) + "\n")


def plot(results: list[Result], header: str, path: Path) -> None:
    """A horizontal bar chart of samples/s, one panel per workload, bars labelled with their ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.config.workload for r in results))
    heights = [sum(r.config.workload == w for r in results) for w in workloads]
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 1.2 + 0.45 * sum(heights) + 0.6 * len(workloads)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, workload in zip(axes[:, 0], workloads):
        shown = [r for r in results if r.config.workload == workload]
        names = [r.config.name for r in shown]
        rates = [r.rate for r in shown]
        bars = ax.barh(names, rates, color=[COLOURS.get(r.config.library, "#999") for r in shown])
        for bar, result in zip(bars, shown):
            if result.config.library == "limit":
                bar.set_hatch("//")
                bar.set_alpha(0.6)
            rel = ratio(result, results)
            label = "failed" if result.error else ("" if rel is None else f" {rel:.2f}x")
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{workload}: samples/s (higher is better)", fontsize=10, loc="left")
        ax.set_xlim(0, max(rates + [1]) * 1.15)
        ax.tick_params(labelsize=8)
    title = textwrap.fill(header, width=130)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.012 * title.count("\n")))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
