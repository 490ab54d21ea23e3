"""An epoch shared with persistent DataLoader workers: they keep the copy of the pipeline they
got when they started, so an epoch set later in the loader's process reaches them only through
shared memory, read as each of their passes starts."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import get_spawning_popen
from typing import Any, Dict

__all__ = ["EpochCell"]


class EpochCell:
    """A shared integer, -1 while no epoch is set. It crosses to a worker being started (fork,
    spawn, forkserver) as the same memory; pickled or copied otherwise (`copy.deepcopy` of a
    loader, a checkpoint of the dataset object) it is a new cell holding the same value, as a
    RawValue alone would not pickle at all there."""

    __slots__ = ("_raw",)

    def __init__(self, value: int = -1) -> None:
        self._raw = multiprocessing.RawValue("q", value)

    @property
    def value(self) -> int:
        return int(self._raw.value)

    @value.setter
    def value(self, value: int) -> None:
        self._raw.value = value

    def __getstate__(self) -> Dict[str, Any]:
        if get_spawning_popen() is not None:  # (a worker being started: the same memory)
            return {"raw": self._raw}
        return {"value": self.value}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if "raw" in state:
            self._raw = state["raw"]
        else:
            self._raw = multiprocessing.RawValue("q", state["value"])
