"""Per-sample decoding with webdataset's handler chains (`Decoder`, `Continue`; the basic handlers are in `basic.py`).

A Decoder runs `pre + handlers + post` on every field; the first handler that returns something
other than None wins, and a `Continue` hands a new (key, data) to the handlers after it. Results
are those of webdataset 1.0.2's `autodecode`; the work per field is less: the handlers that
cannot match a field name (image handlers, `handle_extension` handlers, `basichandlers`,
`gzfilter`) are dropped once per field name instead of being asked for every sample.

Safety divergence: unpickling (`pyd`, `pickle`, `pkl`) and `torch.load` (`pth`) run code from
the data, so they are refused with a UsageError unless enabled by `allow_pickle()`, the
environment variable SHARDSTREAM_ALLOW_PICKLE=1, or `Decoder(..., allow_pickle=True)`.
"""

from __future__ import annotations

import gzip
import logging
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

from .audio import AudioHandler
from .basic import basichandlers, pickle_setting
from .._base.errors import ShardStreamError, UsageError, locate_member, notes_state, worker_where
from .fusedimage import FusedImageHandler
from .image import (
    IMAGE_EXTENSIONS,
    ImageHandler,
    imagehandler,
    imagespecs,
)
from .torchmedia import torch_audio, torch_video
from .._base.redact import redact
from .video import VideoHandler

__all__ = [
    "Continue",
    "Decoder",
    "DecodingError",
    "IMAGE_EXTENSIONS",
    "ImageHandler",
    "call_extension_handler",
    "default_decoder",
    "default_post_handlers",
    "default_pre_handlers",
    "gzfilter",
    "handle_extension",
    "imagehandler",
    "imagespecs",
    "torch_audio",
    "torch_video",
]

log = logging.getLogger(__name__)

Handler = Callable[[str, Any], Any]

# --- extension handlers, Continue, gzfilter --------------------------------------------------------


def _matches(key: str, targets: Iterable[Tuple[str, ...]]) -> bool:
    parts = key.lower().split(".")
    return any(len(t) <= len(parts) and tuple(parts[-len(t) :]) == t for t in targets)


def call_extension_handler(key: str, data: bytes, f: Callable, extensions: Iterable[str]) -> Any:
    """Return f(data) when `key` ends with one of `extensions` (dotted, case-insensitive)."""
    return f(data) if _matches(key, [tuple(e.split(".")) for e in extensions]) else None


class _ExtensionHandler:
    """What `handle_extension` returns: a handler that knows its extensions."""

    def __init__(self, extensions: str, f: Callable[[bytes], Any]) -> None:
        self.extensions = extensions.lower().split()
        self.f = f
        self._targets = [tuple(e.split(".")) for e in self.extensions]

    def accepts(self, key: str) -> bool:
        return _matches(key, self._targets)

    def __call__(self, key: str, data: bytes) -> Any:
        return self.f(data) if _matches(key, self._targets) else None

    def __repr__(self) -> str:
        return f"handle_extension({' '.join(self.extensions)!r}, {self.f!r})"


def handle_extension(extensions: str, f: Callable[[bytes], Any]) -> Handler:
    """Make a handler calling f(data) for keys ending with any of the space-separated extensions.

    An extension may hold dots ("seg.jpg" matches "x.seg.jpg" but not "x.jpg"); case is ignored.
    """
    return _ExtensionHandler(extensions, f)


class Continue:
    """Returned by a handler to pass a new (key, data) on to the handlers after it."""

    def __init__(self, key: str, data: Any) -> None:
        self.key, self.data = key, data


def gzfilter(key: str, data: bytes) -> Optional[Continue]:
    """Decompress `.gz` fields and continue decoding them under the key without `.gz`."""
    if not key.endswith(".gz"):
        return None
    return Continue(key[:-3], gzip.decompress(data))


default_pre_handlers: List[Handler] = [gzfilter]
default_post_handlers: List[Handler] = [basichandlers]


# Handler classes whose `accepts(key)` says exactly which fields they may decode.
_OWN_HANDLERS = (ImageHandler, _ExtensionHandler, FusedImageHandler, VideoHandler, AudioHandler)


def _extension_sets(handlers: List[Handler]) -> List[Tuple[Any, FrozenSet[str]]]:
    """(handler, a copy of its `extensions`) for the handlers whose `accepts` reads that
    attribute: a user may replace or edit it between samples."""
    return [(h, frozenset(getattr(h, "extensions"))) for h in handlers
            if type(h) in _OWN_HANDLERS and type(h) is not _ExtensionHandler]


def _may_match(handler: Handler, key: str) -> bool:
    # Only handlers whose matching rule we own can be skipped; any other callable must be asked.
    if handler is basichandlers:
        return True  # `decoders` may change at run time, so never skip it
    if handler is gzfilter:
        return key.endswith(".gz")
    if type(handler) in _OWN_HANDLERS:
        return handler.accepts(key)  # type: ignore[attr-defined]  # the classes in _OWN_HANDLERS have it
    return True


# --- the Decoder ---------------------------------------------------------------------------------

_MAX_PLANS = 4096  # distinct field names remembered per Decoder; more means odd data, start over


class DecodingError(ShardStreamError):
    """A field of a sample could not be decoded; the cause is chained as __cause__.

    Attributes (as in webdataset): url, key (the sample's __key__), k (the field), sample; and
    reason: what went wrong, from the cause (also in the message), or None.
    """

    def __init__(
        self, url: Any = None, key: Any = None, k: Any = None, sample: Any = None, reason: Any = None
    ) -> None:
        where = worker_where(url) if key is None and k is None else None
        if where is not None:  # torch rebuilding a worker's error from its text: DecodingError(text)
            message, url = url, where.get("url")
            key, k, reason = where.get("key"), where.get("k"), where.get("reason")
        self.key, self.k, self.sample, self.reason = key, k, sample, reason
        member = f"{key}.{k}" if key is not None and k is not None else k
        if where is None:
            message = f"cannot decode field {k!r} of sample {key!r}"
            message = message if reason is None else f"{message}: {reason}"
        url = None if url is None else str(url)
        super().__init__(message, url=url, member=member,
                         offset=locate_member(url, member) if where is None else where.get("offset"))

    def __reduce__(self):  # the sample can be large or unpicklable: leave it behind
        return (DecodingError, (self.url, self.key, self.k, None, self.reason), notes_state(self))


def _reason(exn: BaseException, limit: int = 300) -> str:
    """A decode error's cause in one short line, credentials redacted."""
    text = redact(f"{type(exn).__name__}: {exn}").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Decoder:
    """Decode samples with a chain of handlers: `pre + handlers + post`.

    Args:
        handlers: the main handlers, a list of callables (key, data) -> value or None.
        pre: handlers run first (default: [gzfilter]).
        post: handlers run last (default: [basichandlers]).
        only: field names (list, set, or space-separated string) to decode; others pass through.
        partial: pass values that are not bytes through instead of failing on them.
        allow_pickle: when not None, allow or forbid unpickling while this decoder runs,
            overriding allow_pickle() and SHARDSTREAM_ALLOW_PICKLE.
    """

    def __init__(
        self,
        handlers: List[Handler],
        pre: Optional[List[Handler]] = None,
        post: Optional[List[Handler]] = None,
        only: Any = None,
        partial: bool = False,
        *,
        allow_pickle: Optional[bool] = None,
    ) -> None:
        assert isinstance(handlers, list), f"handlers = {handlers} must be a list"
        if isinstance(only, str):
            only = only.split()
        self.only = only if only is None else set(only)
        pre = default_pre_handlers if pre is None else pre
        post = default_post_handlers if post is None else post
        assert all(callable(h) for h in handlers), f"one of {handlers} not callable"
        assert all(callable(h) for h in pre), f"one of {pre} not callable"
        assert all(callable(h) for h in post), f"one of {post} not callable"
        self.handlers = list(pre) + handlers + list(post)
        self.partial = partial
        self.allow_pickle = allow_pickle
        self._plans: Dict[str, Tuple[Tuple[int, Handler], ...]] = {}
        self._planned_for = list(self.handlers)
        self._planned_extensions = _extension_sets(self._planned_for)

    def _refresh_plans(self) -> None:
        # Someone may have edited self.handlers, or a handler's `extensions` (webdataset reads
        # them on every call); then the cached plans no longer apply.
        if self.handlers != self._planned_for or any(
            handler.extensions != extensions for handler, extensions in self._planned_extensions
        ):
            self._plans = {}
            self._planned_for = list(self.handlers)
            self._planned_extensions = _extension_sets(self._planned_for)

    def _plan(self, key: str) -> Tuple[Tuple[int, Handler], ...]:
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans = {}
            plan = tuple((i, h) for i, h in enumerate(self._planned_for) if _may_match(h, key))
            self._plans[key] = plan
        return plan

    def _decode_field(self, key: str, data: Any) -> Any:
        start = 0  # after a Continue, only the handlers after the one that returned it run
        while True:
            for index, handler in self._plan(key):
                if index < start:
                    continue
                result = handler(key, data)
                if isinstance(result, Continue):
                    key, data, start = result.key, result.data, index + 1
                    break
                if result is not None:
                    return result
            else:
                return data

    def decode1(self, key: str, data: Any) -> Any:
        """Decode one field named `key` (without the leading dot)."""
        self._refresh_plans()
        with pickle_setting(self.allow_pickle):
            return self._decode_field("." + key, data)

    def decode(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        """Decode all fields of a sample into a new dict.

        Raises:
            DecodingError: a field failed to decode (the cause is chained).
            UsageError: a refused operation (e.g. unpickling), with the field as location.
        """
        assert isinstance(sample, dict), sample
        self._refresh_plans()
        with pickle_setting(self.allow_pickle):
            return self._decode_sample(sample)

    def _decode_sample(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        result = {}
        only, partial = self.only, self.partial
        for k, v in list(sample.items()):
            try:
                if k[:2] == "__":
                    if isinstance(v, bytes):
                        try:
                            v = v.decode("utf-8")
                        except UnicodeDecodeError:
                            log.warning("cannot decode %s as utf-8: %r", k, v[:64])
                    result[k] = v
                elif only is not None and k not in only:
                    result[k] = v
                else:
                    assert v is not None
                    if partial and not isinstance(v, bytes):
                        result[k] = v
                    else:
                        assert isinstance(v, bytes), f"k,v = {k}, {v}"
                        result[k] = self._decode_field("." + k, v)
            except UsageError as exn:
                # A refusal is about configuration, not about this sample's bytes: keep its type.
                member = f"{sample.get('__key__')}.{k}"
                url = sample.get("__url__")
                raise exn.with_location(url=None if url is None else str(url), member=member)
            except Exception as exn:
                raise DecodingError(
                    key=sample.get("__key__", None), url=sample.get("__url__", None), k=k, sample=sample,
                    reason=_reason(exn),
                ) from exn
        return result

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        """Decode an entire sample (same as `decode`)."""
        assert isinstance(sample, dict), (len(sample), sample)
        return self.decode(sample)


default_decoder = Decoder(default_pre_handlers + default_post_handlers)
