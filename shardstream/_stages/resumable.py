"""The stage-state contract: how every stage, source and loader takes part in saving and
resuming a pass. This module is the one place it is written down.

Two parts:

- **Traits** (`ResumeTraits`), read with `traits(stage)`: what the pipeline may assume about a
  stage when it cuts a pass (saves a position) and resumes it. A stage declares them with one
  class or instance attribute, `resume_traits`; a generator function with `clean_cut` or
  `declare(f, ...)`. A stage that declares nothing gets the safe default (none of them): it is
  replayed by counting its outputs.
- **State** (the `Stateful` and `EpochAware` protocols, torchdata.nodes' `get_state`/`reset` in
  torch's `state_dict` spelling): objects that hold state across passes (DataPipeline, WebLoader,
  SubprocessLoader, DevicePrefetcher, ShardScheduler) save it as plain data and load it into a
  fresh copy; stages whose order depends on the epoch take `set_epoch`.

`tests/test_resume.py` runs one resume harness over every implementation; a test there fails
when a class of the package declares traits or state without a harness case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Protocol, TypeVar, runtime_checkable

__all__ = ["CLEAN_CUT", "EpochAware", "NO_TRAITS", "ResumeTraits", "Stateful", "clean_cut", "declare", "traits"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ResumeTraits:
    """What a pipeline may assume about a stage when it saves and resumes a pass.

    clean_cut: whenever it yields, every input it has pulled has been passed on or dropped for
        good, and it keeps no other state: a pass can be cut after any of its outputs and a fresh
        copy continues from there (maps, filters, batching; not a shuffle buffer or a slice).
    seekable: a source the engine can enter at a saved position (shard, sample, byte offset)
        instead of replaying the pass (the shard reader).
    replayable: run again on the same inputs, it yields the same order (seeded shuffles): a resume
        may recompute its order instead of replaying the pass.
    skip_on_resume: left out of a resumed pass (a check that a pass is not empty: a pass resumed
        near its end may rightly have nothing left).
    deterministic: False when its choices come from an unseeded random source: a resumed run
        cannot make them again (the pipeline warns).
    other_processes: its items are produced in other processes (a DataLoader with workers, a
        SubprocessLoader): the pipeline iterates it in the caller's thread, without an engine.
    """

    clean_cut: bool = False
    seekable: bool = False
    replayable: bool = False
    skip_on_resume: bool = False
    deterministic: bool = True
    other_processes: bool = False


NO_TRAITS = ResumeTraits()
CLEAN_CUT = ResumeTraits(clean_cut=True)


def traits(stage: Any) -> ResumeTraits:
    """The resume traits of a stage: its `resume_traits`, or for a curried generator function
    (StreamStage) its function's, which may also be a function of the stage's arguments
    (`f.resume_traits(*args, **kw) -> ResumeTraits`: a shuffle is replayable when seeded);
    NO_TRAITS when it declares none."""
    found = getattr(stage, "resume_traits", None)
    if found is None and hasattr(stage, "f") and hasattr(stage, "kw"):  # a StreamStage
        found = getattr(stage.f, "resume_traits", None)
        if callable(found) and not isinstance(found, ResumeTraits):
            found = found(*stage.args, **stage.kw)
    return found if isinstance(found, ResumeTraits) else NO_TRAITS


def declare(f: F, **flags: bool) -> F:
    """Declare resume traits on a generator function or an object; returns it."""
    f.resume_traits = ResumeTraits(**flags)  # type: ignore[attr-defined]
    return f


def clean_cut(f: F) -> F:
    """Mark a generator stage as a *clean cut* (see ResumeTraits.clean_cut): maps, filters and
    batching qualify; a shuffle buffer, an unbatcher or a slice (it counts) do not."""
    return declare(f, clean_cut=True)


@runtime_checkable
class Stateful(Protocol):
    """Saves its state as plain data (ints, strings, lists, dicts) and loads it into a fresh copy,
    which then continues where the saved one stood. States carry a format and a fingerprint
    (`_resume.statecheck`)."""

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state: Dict[str, Any]) -> None: ...


@runtime_checkable
class EpochAware(Protocol):
    """Its order depends on the epoch; the pipeline passes the epoch on before each pass."""

    def set_epoch(self, epoch: int) -> None: ...
