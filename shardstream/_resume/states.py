"""Saved states across ranks, and the stages a resume must be able to run again.

`choose_state` picks this process's own state out of every rank's (or decides to resume
elastically); `gather_states` collects them over torch.distributed; `replay_offsets` recomputes what a
replayable (seeded) shuffle buffer handed on, for an elastic resume;
`unseeded_stages` names the random stages that make a resume inexact; `worker_view` reads the
per-worker progress of either kind of saved state.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._base.errors import UsageError
from .._plan.ranks import simulated_layout
from .._stages.contract import PipelineStage, StreamStage
from .._stages.resumable import EpochAware, traits

__all__ = ["choose_state", "gather_states", "replay_offsets", "shared_history", "unseeded_stages", "worker_passes",
           "worker_view"]


def choose_state(state: Any, layout: Dict[str, int]) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]]]:
    """(this process's own saved state, None) when `state` (one state or every rank's list)
    holds one saved on this very layout and rank, else (None, all states) to resume elastically."""
    states = [dict(s) for s in state] if isinstance(state, (list, tuple)) else [dict(state)]
    for candidate in states:
        saved = candidate.get("layout")
        if saved is None and len(states) == 1:
            return candidate, []  # saved before layouts were recorded: take it as ours
        if saved == layout:
            return candidate, []
    if any(s.get("layout") is None for s in states):
        raise UsageError("every saved state needs its layout to resume on another one")
    return None, states


def gather_states(state: Dict[str, Any], group: Any = None) -> List[Dict[str, Any]]:
    """Every rank's loader state, gathered with torch.distributed (a collective: call it on all
    ranks at the same step); [state] when not distributed. Save the list to resume on any
    world size or worker count.

    In an epoch resumed on another layout every rank's state holds the same "split" (every old
    rank's state): it is sent as a digest and the states share this rank's copy, so what the
    ranks send and hold is one history, not one per rank (pickle, as torch.save uses, then
    writes it once; JSON writes it per rank)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return [state]
    result: List[Any] = [None] * dist.get_world_size(group=group)
    split = state.get("split")
    dist.all_gather_object(result, dict(state, split=_digest(split)) if split else state, group=group)
    # (what follows depends on the gathered list alone, the same on every rank: a rank that went
    # another way would wait for ever in a collective the others never call)
    digests = {other.get("split") for other in result if isinstance(other.get("split"), str)}
    if not digests:
        return result  # no rank's epoch was resumed on another layout
    if len(digests) == 1 and all(isinstance(other.get("split"), str) for other in result):
        return [dict(other, split=split) for other in result]  # one history: this rank's copy
    dist.all_gather_object(result, state, group=group)  # states of different runs: whole, as saved
    return result


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return "split:" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def shared_history(history: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The states, their equal "split" histories made one object (a list loaded from JSON holds
    one copy per rank; chained resumes would nest them: O(ranks^2) in memory and in the next
    state saved)."""
    if not history:
        return history
    first = history[0].get("split")
    if first:
        first = shared_history(first)  # (and theirs, for resumes chained further back)
    return [dict(state, split=first) if state.get("split") == first else state for state in history]


def replay_offsets(stage: Any, epoch: int, rank: int, world: int, worker: int, workers: int,
                    length: int, count: int) -> List[int]:
    """The first `count` outputs of a fresh copy of `stage` fed 0..length-1 as (rank, worker)."""
    stage = copy.copy(stage)
    if isinstance(stage, EpochAware):
        stage.set_epoch(epoch)
    with simulated_layout(rank, world, worker, workers):
        run = stage.run if isinstance(stage, PipelineStage) else stage
        return list(itertools.islice(run(iter(range(length))), count))


def unseeded_stages(stages: Sequence[Any]) -> List[str]:
    """Names of the stages whose random choices another run cannot make again (an unseeded sample
    shuffle, rsample, RandomMix or ResampledShards without a seed: their `ResumeTraits`)."""
    names = {"_shuffle": "sample shuffle"}
    return [
        names.get(s.f.__name__, s.name) if isinstance(s, StreamStage) else type(s).__name__
        for s in stages if not traits(s).deterministic
    ]


def worker_passes(state: Optional[Dict[str, Any]]) -> Dict[int, int]:
    """The passes each DataLoader worker's copy of the pipeline had run before the saved
    iteration (a WebLoader state; empty when it does not say)."""
    saved = (state or {}).get("worker_passes") or {}
    return {int(k): int(v) for k, v in saved.items()}


def worker_view(state: Optional[Dict[str, Any]]) -> Tuple[Dict[int, int], Dict[int, Any]]:
    """(items delivered, resume position) by worker number: a WebLoader state has them per
    DataLoader worker, a DataPipeline state one of each (its process is worker 0)."""
    if not state:
        return {}, {}
    if "per_worker" not in state:
        return {0: state.get("delivered", 0)}, {0: state.get("position")}
    counts = {int(k): v for k, v in (state.get("per_worker") or {}).items()}
    return counts, {int(k): v for k, v in (state.get("positions") or {}).items()}
