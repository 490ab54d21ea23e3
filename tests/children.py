"""Child processes of a test that start together and report through JSON files."""

from __future__ import annotations

import json
from typing import Any, List, Sequence


def run_children(procs: Sequence[Any], outs: Sequence[str], timeout: float) -> List[Any]:
    """Start `procs`, then `join_children`."""
    for proc in procs:
        proc.start()
    return join_children(procs, outs, timeout)


def join_children(procs: Sequence[Any], outs: Sequence[str], timeout: float) -> List[Any]:
    """Wait up to `timeout` s for each of the started `procs` (those still running then are
    killed: a failing test leaves none behind), require exit status 0 from every one, and return
    what each wrote to its file in `outs` (JSON)."""
    try:
        for proc in procs:
            proc.join(timeout)
    finally:
        kill_alive(procs)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    return results


def kill_alive(procs: Sequence[Any]) -> None:
    """Kill and reap whichever of `procs` still run."""
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def interruptible() -> None:
    """`preexec_fn` for a child a test interrupts with SIGINT: the default disposition, which
    Python turns into KeyboardInterrupt. (A suite started in the background, `make test &` in a
    script, hands its children SIGINT ignored, and a Python child keeps it ignored.)"""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
