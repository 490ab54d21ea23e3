"""The error tree: one base, format / fetch / usage errors under it, and URL redaction.

Every error can carry where it happened: the shard URL (credentials redacted), the member name
inside the shard and the byte offset. Third-party errors (aiohttp, botocore, OSError) are
translated into this tree in one place per layer, at the boundary. torch's DataLoader rebuilds
a worker's error from its text alone, so a worker notes the location as JSON (`mark_location`)
and the rebuilt error reads it back as it is made (`worker_where`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar

from .redact import redact, redact_url, url_secrets

__all__ = [
    "FetchError",
    "FetchTimeout",
    "FormatError",
    "NetworkError",
    "OptionError",
    "ShardNotFound",
    "ShardStreamError",
    "UsageError",
    "RedactedCause",
    "describe",
    "locate_member",
    "notes_state",
    "redact_url",
    "set_member_locator",
    "mark_location",
    "safe_cause",
    "worker_where",
]

_E = TypeVar("_E", bound="ShardStreamError")


class ShardStreamError(Exception):
    """Base of every error shardstream raises on purpose.

    Attributes:
        url: the shard URL, already redacted, or None.
        member: the tar member name, or None.
        offset: the byte offset in the (uncompressed) shard stream, or None.
        pending: (name, header offset) of the member whose header was read and whose data had
            not all come when the shard broke, or None (set by the member readers: a sample
            the member does not belong to was complete, and is handed out before the error).
        archive_end: where the archive's end-of-archive block ended, when the error came after
            it (a header behind it), else None: every sample of the archive was complete.
    """

    pending: Optional[Tuple[str, int]] = None
    archive_end: Optional[int] = None

    def __init__(
        self,
        message: str,
        *,
        url: Optional[str] = None,
        member: Optional[str] = None,
        offset: Optional[int] = None,
    ) -> None:
        if url is None and member is None and offset is None:  # torch rebuilding a worker's error?
            where = worker_where(message)
            if where is not None:
                url, member, offset = where.get("url"), where.get("member"), where.get("offset")
        # (a third-party message may quote the URL, decoded: a signed URL's %2F as "/")
        self.message = redact_url(message)
        self.url = None if url is None else redact_url(url)
        self.member = member
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.url is not None:
            where.append(f"url={self.url}")
        if self.member is not None:
            where.append(f"member={self.member!r}")
        if self.offset is not None:
            where.append(f"offset={self.offset}")
        return f"{self.message} ({', '.join(where)})" if where else self.message

    def with_location(
        self: _E, *, url: Optional[str] = None, member: Optional[str] = None, offset: Optional[int] = None
    ) -> _E:
        """Fill in location fields that are still unknown and return self (for re-raising)."""
        if url is not None and self.url is None:
            self.url = redact_url(url)
        if member is not None and self.member is None:
            self.member = member
        if offset is not None and self.offset is None:
            self.offset = offset
        self.args = (self._render(),)
        return self

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self):  # keep location fields across pickling (DataLoader worker -> main)
        return (_rebuild, (type(self), self.message, self.url, self.member, self.offset), notes_state(self))


WHERE_NOTE = "shardstream-where: "  # a DataLoader worker's note on its error: where, as JSON
_WHERE_LINE = re.compile(rf"^{WHERE_NOTE}(\{{.*\}})$", re.MULTILINE)
# torch's ExceptionWrapper.reraise: f"Caught {type} in DataLoader worker process {n}.\nOriginal {traceback}"
_TORCH_TEXT = re.compile(r"Caught \w+ in DataLoader worker process \d+\.\n")


_WHERE_EXTRA = ("key", "k", "reason", "cache_path")  # DecodingError's and CorruptCacheFile's own attributes


def add_note(exn: BaseException, text: str) -> None:
    """`exn.add_note(text)`; before Python 3.11 (no add_note), the same `__notes__` list, which
    our messages and handlers' warnings (`describe`) read (tracebacks show notes from 3.11 on)."""
    if hasattr(exn, "add_note"):
        exn.add_note(text)
        return
    try:
        exn.__notes__ = [*getattr(exn, "__notes__", ()), text]  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # (an exception type that takes no attributes)
        pass


def mark_location(exn: BaseException) -> None:
    """Add a note holding the error's location as JSON, before it leaves a DataLoader worker:
    torch rebuilds a worker's exception from its text alone (`type(exn)(text)`), and the rebuilt
    error reads the note back as it is made (`worker_where`)."""
    if isinstance(exn, ShardStreamError):
        if not any(note.startswith(WHERE_NOTE) for note in getattr(exn, "__notes__", ())):
            where = {"url": exn.url, "member": exn.member, "offset": exn.offset}
            where.update((name, getattr(exn, name)) for name in _WHERE_EXTRA if hasattr(exn, name))
            add_note(exn, WHERE_NOTE + json.dumps(where, default=str))


def worker_where(text: object) -> Optional[Dict[str, Any]]:
    """The location a DataLoader worker noted on its error (`mark_location`), read back from the
    text torch's DataLoader rebuilds the error from (`type(exn)(text)`: the worker's traceback
    with its notes, the error's own last, after its causes'). None when `text` is not such a
    text, or holds no note."""
    if not isinstance(text, str) or WHERE_NOTE not in text or not _TORCH_TEXT.match(text):
        return None
    found = _WHERE_LINE.findall(text)
    try:
        where = json.loads(found[-1]) if found else None
    except ValueError:
        return None
    return where if isinstance(where, dict) else None


def notes_state(exn: BaseException) -> Optional[dict]:
    """The pickle state that keeps an error's notes (which stage raised it, which helper process)
    when its class rebuilds itself from its fields: None when it has none."""
    notes = getattr(exn, "__notes__", None)
    return {"__notes__": list(notes)} if notes else None


def _rebuild(cls, message, url, member, offset):
    return cls(message, url=url, member=member, offset=offset)


class FormatError(ShardStreamError, ValueError):
    """The bytes of a shard are not a valid (possibly gzip-compressed) tar archive."""


class UsageError(ShardStreamError, ValueError):
    """The caller asked for something that is not allowed or not configured (e.g. `pipe:` URLs)."""


class OptionError(UsageError):
    """An option's value is not allowed (`--maxcount 0`): on the command line a mistake there,
    which exits with 2 as argparse's own do, not a failure of the work (1)."""


class FetchError(ShardStreamError, OSError):
    """Bytes could not be fetched from a URL."""


class NetworkError(FetchError, ConnectionError):
    """A connection failed or broke; retried where that is safe."""


class FetchTimeout(FetchError, TimeoutError):
    """A connect, read or stall timeout."""


class ShardNotFound(FetchError, FileNotFoundError):
    """The URL names nothing (HTTP 404, missing S3 key, missing file); never retried."""


class RedactedCause(Exception):
    """Stands in for a third-party exception whose text held a credential (aiohttp's errors print
    the URL they were given and their request's headers): the same type name, the text redacted,
    the same traceback. Our errors chain to it (`raise ... from safe_cause(exc)`), so that neither
    a printed traceback nor a warning shows what `redact` hides."""


def _clean(exn: BaseException, secrets: Sequence[str]) -> bool:
    try:
        text, shown = str(exn), repr(exn)
    except Exception:  # noqa: BLE001 - a third party's broken __str__: stand in for it
        return False
    return redact(text, secrets) == text and redact(shown, secrets) == shown


def _text(exn: BaseException, secrets: Sequence[str]) -> str:
    try:
        return redact(str(exn), secrets)
    except Exception:  # noqa: BLE001 - (as in _clean)
        return "(its message could not be shown)"


def safe_cause(exn: Optional[BaseException], depth: int = 0, *, url: Optional[str] = None,
               secrets: Sequence[str] = ()) -> Optional[BaseException]:
    """`exn` to chain to one of our errors: itself when it and its causes hold no credential,
    else a RedactedCause in its place (its own causes made safe the same way). With the `url`
    the error is about, the pieces of its password count as credentials wherever they appear."""
    if exn is None:
        return None
    if url is not None:
        secrets = url_secrets(url)
    below = exn.__cause__ if exn.__cause__ is not None else (None if exn.__suppress_context__ else exn.__context__)
    safe_below = safe_cause(below, depth + 1, secrets=secrets) if depth < 8 else None
    if _clean(exn, secrets) and safe_below is below:
        return exn
    name = type(exn).__qualname__
    module = type(exn).__module__
    stand_in = RedactedCause(f"{name if module == 'builtins' else module + '.' + name}: {_text(exn, secrets)}")
    stand_in.__traceback__ = exn.__traceback__
    stand_in.__cause__ = safe_below
    return stand_in


_member_locator: Optional[Callable[[str, str], Optional[int]]] = None


def set_member_locator(locate: Callable[[str, str], Optional[int]]) -> None:
    """Who finds a member's offset in a shard when an error needs it (the shard reader's layer
    sets it: errors are raised by layers that know the sample, not the tar)."""
    global _member_locator
    _member_locator = locate


def locate_member(url: Optional[str], member: Optional[str]) -> Optional[int]:
    """The byte offset of `member` ("key.field") in the shard at `url`, where it is cheap to find
    (a local uncompressed shard); else None."""
    locate = _member_locator
    if locate is None or url is None or member is None:
        return None
    return locate(url, member)


NOTE_PREFIX = "shardstream: "  # our notes on third-party errors (describe() shows them)


def note_stage(exn: BaseException, stage: str, sample: object = None) -> None:
    """Add a note saying which stage raised `exn`, and on which sample (its `__key__` and
    `__url__`, when `sample` is a dict holding them): a user's map function or a `to_tuple` key
    the sample lacks knows nothing of the shard. Warnings (`describe`) and tracebacks show it."""
    text = f"{NOTE_PREFIX}raised in stage {stage!r}"
    if isinstance(sample, dict) and sample.get("__key__") is not None:
        text += f" on sample {sample['__key__']!r}"
        if sample.get("__url__") is not None:
            text += f" of {redact(str(sample['__url__']))}"
    notes = getattr(exn, "__notes__", [])
    if not any(note.startswith(f"{NOTE_PREFIX}raised in stage") for note in notes):
        add_note(exn, text)


def describe(exn: BaseException) -> str:
    """What a warning says about an error: its repr and the chain of causes (a decode error's
    reason, e.g. the JSON error, is its __cause__), credentials redacted."""
    parts, seen = [repr(exn)], {id(exn)}
    cause = exn.__cause__ or exn.__context__
    while cause is not None and id(cause) not in seen and len(parts) < 4:
        seen.add(id(cause))
        parts.append(repr(cause))
        cause = cause.__cause__ or cause.__context__
    ours = [note[len(NOTE_PREFIX):] for note in getattr(exn, "__notes__", ()) if note.startswith(NOTE_PREFIX)]
    return redact(", caused by ".join(parts) + "".join(f" ({note})" for note in ours))
