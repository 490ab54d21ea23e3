"""Child processes of a test that start together and report through JSON files."""

from __future__ import annotations

import json
from typing import Any, List, Sequence


def run_children(procs: Sequence[Any], outs: Sequence[str], timeout: float) -> List[Any]:
    """Start `procs`, wait up to `timeout` s for each, require exit status 0 from every one, and
    return what each wrote to its file in `outs` (JSON)."""
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    return results
