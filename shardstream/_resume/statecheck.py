"""What a saved loader state must be before it is loaded: its format, its fields, and what it
describes.

Every state a pipeline or WebLoader saves carries `format` (STATE_FORMAT) and `fingerprint`:
a digest of the shard list (URLs without their query strings, so re-signed URLs still match),
the pipeline's shape (each stage's name and its plain arguments: `batched(64)` is not
`batched(32)`, whose item counts mean other things) and its settings: every seed the user chose
(a shuffle's, the dataset's, the splitter's), buffer sizes, weights, the epoch length of
`with_epoch`. A position means nothing in another order: a state saved under seed 1 and loaded
under seed 2 would enter another shard at the saved offset. `check_state` refuses, saying what
differs: a state that is not a dict (or a list of them), one without the fields a state has,
fields of the wrong type or out of range, a newer format, or another dataset or pipeline.
States saved before formats were recorded (no `format`) load without a fingerprint check, and
states saved before settings were (no `settings` in it) without a settings check.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .._base.errors import UsageError
from .._base.redact import without_userinfo
from .._plan.urls import without_query

__all__ = ["STATE_FORMAT", "check_state", "fingerprint"]

STATE_FORMAT = 2  # 1: the states saved before this field existed
_PLAIN = (int, float, str, bool, type(None))


def _label(stage: Any) -> str:
    """A stage's name and its plain (int, str, ...) arguments: what changes what its items are."""
    name = getattr(stage, "name", None)
    if not isinstance(name, str):
        name = getattr(stage, "__name__", None) or type(stage).__name__
    args = [repr(a) for a in getattr(stage, "args", ()) if isinstance(a, _PLAIN)]
    kw = getattr(stage, "kw", None) or {}
    # (a seed drawn at random per process would refuse every resume: unseeded resumes warn instead)
    args += [f"{k}={v!r}" for k, v in sorted(kw.items()) if isinstance(v, _PLAIN) and k not in ("seed", "rng")]
    return f"{name}({', '.join(args)})" if args else name


def _identity(url: str) -> str:
    """What of a shard URL names the shard in a fingerprint: no http(s) query (re-signed URLs
    match) and no userinfo (a rotated password matches, and a shared checkpoint carries no hash
    of it: a digest per password is a test for guesses)."""
    return without_userinfo(without_query(url))


def _digest(urls: Sequence[str], identity: Callable[[str], str]) -> Dict[str, Any]:
    digest = hashlib.blake2b(digest_size=12)
    for url in urls:
        digest.update(identity(url).encode("utf-8", "surrogateescape") + b"\n")
    return {"count": len(urls), "digest": digest.hexdigest()}


def _shards(source: Any) -> Dict[str, Any]:
    urls = getattr(source, "urls", None)
    if not isinstance(urls, (list, tuple)):
        return {"source": type(source).__name__}
    # Kept on the source for its list: every state_dict() hashed every URL again (half a second
    # for a million shards, at every checkpoint).
    key = tuple(urls)  # (a copy: an edit in place is another list; comparing same strings is cheap)
    kept = getattr(source, "_shards_digest", None)
    if kept is not None and kept[0] == key:
        return dict(kept[1])
    if not all(isinstance(u, str) for u in urls):
        return {"source": type(source).__name__}
    found = _digest(urls, _identity)
    try:
        source._shards_digest = (key, found)
    except AttributeError:  # (a source that takes no attributes: hashed each time)
        pass
    return dict(found)


def _plain(value: Any) -> Any:
    """`value` as JSON gives it back (tuples as lists, numpy integers as ints, anything else JSON
    cannot hold as its repr), so that a state compares alike before and after a JSON round trip."""
    return json.loads(json.dumps(value, default=lambda v: v.__index__() if hasattr(v, "__index__") else repr(v)))


def _settings(stage: Any) -> Optional[Dict[str, Any]]:
    """What a stage's items depend on beyond its label: its own `state_settings()` (seeds the
    user chose, buffer sizes, weights), else a seed given to it as an int."""
    own = getattr(stage, "state_settings", None)
    if callable(own):
        return own() or None
    kw = getattr(stage, "kw", None) or {}
    chosen = {k: v for k, v in kw.items() if k in ("seed", "rng") and hasattr(v, "__index__") and not isinstance(v, bool)}
    return chosen or None


def fingerprint(stages: Sequence[Any], settings: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """What a state saved from a pipeline of these stages describes; `settings` are the
    pipeline's own (its seed, `with_epoch`'s length)."""
    return {"shards": _shards(stages[0]) if stages else None, "stages": [_label(s) for s in stages],
            "settings": _plain({"pipeline": dict(settings or {}), "stages": [_settings(s) for s in stages]})}


_COUNTERS = {"delivered", "passes", "loader_delivered"}


def _check_fields(state: Mapping[str, Any], kind: str) -> None:
    required = {"per_worker"} if kind == "loader" else {"delivered"}
    missing = required - set(state)
    if missing:
        raise UsageError(
            f"not a saved {kind} state: it has no {', '.join(sorted(missing))} (keys: {sorted(state)[:8]}); "
            f"pass what {'WebLoader' if kind == 'loader' else 'the dataset'}.state_dict() returned"
        )
    for key in _COUNTERS & set(state):
        value = state[key]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise UsageError(f"saved state field {key!r} must be a count >= 0, got {value!r}")
    for field in ("per_worker", "worker_passes"):
        by_worker = state.get(field) or {}
        if not isinstance(by_worker, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in by_worker.values()
        ):
            raise UsageError(f"saved state field {field!r} must map workers to counts >= 0, got {by_worker!r}")
    positions = list((state.get("positions") or {}).values()) + [state.get("position")]
    for position in positions:
        if position is None:
            continue
        ok = isinstance(position, (list, tuple)) and len(position) in (2, 4) and all(
            isinstance(v, int) and v >= 0 for v in position[:3]
        ) and (len(position) == 2 or position[3] is None or (isinstance(position[3], int) and position[3] >= 0))
        if not ok:
            raise UsageError(f"saved state has a malformed resume position {position!r}")
    epoch = state.get("epoch")
    if epoch is not None and (not isinstance(epoch, int) or epoch < 0):
        raise UsageError(f"saved state field 'epoch' must be None or an int >= 0, got {epoch!r}")


# Pipeline settings that follow the layout: OpenCLIP's with_epoch length is per DataLoader worker,
# ceil(N / (batch x world x workers)); a state resumed on another layout (elastic) has another.
_PER_WORKER = ("nsamples",)


def _saved_with_userinfo(saved: Any, source: Any) -> bool:
    """Whether `saved` is the shard digest that shardstream 0.1.0 before this check made of the
    same URLs, userinfo included: those states still load."""
    urls = getattr(source, "urls", None)
    if not isinstance(saved, Mapping) or not isinstance(urls, (list, tuple)) or not all(isinstance(u, str) for u in urls):
        return False
    if all(without_userinfo(url) == url for url in urls):
        return False
    return saved == _digest(urls, without_query)


def _check_fingerprint(saved: Mapping[str, Any], expected: Mapping[str, Any], same_layout: bool = True,
                       source: Any = None) -> None:
    if saved.get("shards") != expected["shards"] and not _saved_with_userinfo(saved.get("shards"), source):
        raise UsageError(
            f"the saved state is of another dataset: it was saved over shards {saved.get('shards')}, "
            f"this pipeline reads {expected['shards']}"
        )
    if list(saved.get("stages") or []) != expected["stages"]:
        raise UsageError(
            f"the saved state is of another pipeline: saved stages {saved.get('stages')}, "
            f"this one's {expected['stages']}"
        )
    if "settings" not in saved or saved["settings"] == expected["settings"]:
        return
    was, now = dict(saved["settings"] or {}), dict(expected["settings"])
    if not same_layout:
        was["pipeline"] = {k: v for k, v in (was.get("pipeline") or {}).items() if k not in _PER_WORKER}
        now["pipeline"] = {k: v for k, v in now["pipeline"].items() if k not in _PER_WORKER}
        if was == now:
            return
    if was.get("pipeline") != now["pipeline"]:
        differs = f"the pipeline's {was.get('pipeline')} then, {now['pipeline']} now"
    else:
        differs = "; ".join(f"stage {label!r}: {old} then, {new} now" for label, old, new in zip(
            expected["stages"], was.get("stages") or [], now["stages"]) if old != new)
    raise UsageError(f"the saved state is of the same pipeline with other settings ({differs}): its position "
                     "means other samples under these; load it with the settings it was saved with")


def check_state(state: Any, stages: Sequence[Any], kind: str,
                settings: Optional[Mapping[str, Any]] = None, layout: Optional[Mapping[str, Any]] = None,
                ) -> List[Dict[str, Any]]:
    """The saved states in `state` (one, or every rank's list), checked against a pipeline of
    `stages` and `settings` (see `fingerprint`), running on `layout` (settings that follow the
    layout are checked only on the same one); `kind` is "dataset" or "loader". Raises
    UsageError saying what is wrong."""
    if isinstance(state, Mapping):
        states = [state]
    elif isinstance(state, (list, tuple)) and state and all(isinstance(s, Mapping) for s in state):
        states = list(state)
    else:
        raise UsageError(
            "a saved state is the dict state_dict() returned, or the list of every rank's "
            f"(gather_states), got {type(state).__name__}"
            + (" (empty)" if isinstance(state, (list, tuple)) else "")
        )
    expected = fingerprint(stages, settings)
    for saved in states:
        version = saved.get("format", 1)
        if not isinstance(version, int) or version > STATE_FORMAT:
            raise UsageError(f"the state was saved by a newer shardstream (state format {version!r}); "
                             f"this one reads formats up to {STATE_FORMAT}: upgrade shardstream")
        _check_fields(saved, kind)
        if version >= 2:
            was = saved.get("layout") or {}
            same = layout is None or all(was.get(k) == layout.get(k) for k in ("world_size", "num_workers"))
            _check_fingerprint(saved.get("fingerprint") or {}, expected, same, stages[0] if stages else None)
    return [dict(s) for s in states]
