"""The basic field decoders (text, ints, json, npy/npz, msgpack, cbor, tenbin, pickle, pth) that
webdataset's `basichandlers` picks by extension, and the pickle switch: the only place that
decides whether data may be unpickled (off unless enabled: pickle data can run code)."""

from __future__ import annotations

import contextvars
import io
import json
import os
import pickle
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .._base.errors import UsageError
from .._base.security import enforced
from . import tenbin as _tenbin
from .image import last_extension

__all__ = [
    "allow_pickle",
    "basichandlers",
    "cbor_loads",
    "check_pickle_allowed",
    "decoders",
    "msgpack_loads",
    "npy_loads",
    "npz_loads",
    "pickle_allowed",
    "pickle_setting",
    "pickle_switch",
    "pytorch_weights_only",
    "tenbin_loads",
    "torch_loads",
    "unpickle_loads",
]


# torch.load(weights_only=True) cannot run code, so it needs no pickle opt-in.
pytorch_weights_only = os.environ.get("WDS_PYTORCH_WEIGHTS_ONLY", "0") == "1"

# --- the pickle switch: the only place that decides whether data may be unpickled -------------

_PICKLE_ENV = "SHARDSTREAM_ALLOW_PICKLE"
_pickle_switch: Optional[bool] = None  # set by allow_pickle(); None defers to the environment
# Set by a Decoder built with allow_pickle=...; a context variable so that decoders running on
# different threads do not see each other's choice.
_pickle_override: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar(
    "shardstream_pickle_override", default=None
)


def allow_pickle(enabled: Optional[bool] = True) -> Optional[bool]:
    """Allow (or forbid) unpickling of `pyd`/`pickle`/`pkl` and `torch.load` of `pth` fields.

    Args:
        enabled: True to allow, False to forbid, None to go back to the environment variable
            SHARDSTREAM_ALLOW_PICKLE.

    Returns:
        The previous setting, so that a caller can restore it.
    """
    global _pickle_switch
    previous, _pickle_switch = _pickle_switch, enabled
    return previous


def pickle_switch() -> Optional[bool]:
    """What allow_pickle() set in this process (None: never called, or reset: the environment
    decides); a Decoder's own setting is not in it."""
    return _pickle_switch


def pickle_allowed() -> bool:
    """True when unpickling is enabled: by the current Decoder, by allow_pickle(), or the env."""
    override = _pickle_override.get()
    if override is not None:
        return override
    if _pickle_switch is not None:
        return _pickle_switch
    return os.environ.get(_PICKLE_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


class pickle_setting:
    """`with pickle_setting(value):` the pickle switch is `value` in this context only (a
    Decoder's own `allow_pickle`), whatever `allow_pickle()` and the environment say; None
    changes nothing."""

    __slots__ = ("value", "_token")

    def __init__(self, value: Optional[bool]) -> None:
        self.value = value
        self._token: Optional[contextvars.Token] = None

    def __enter__(self) -> None:
        if self.value is not None:
            self._token = _pickle_override.set(self.value)

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _pickle_override.reset(self._token)
            self._token = None


def check_pickle_allowed(what: str) -> None:
    """Raise UsageError, saying how to enable it, unless unpickling is allowed.

    Args:
        what: what was about to be unpickled, for the message (e.g. "a .pyd field").
    """
    if not pickle_allowed():
        raise UsageError(
            f"unpickling is disabled ({what}): pickle data can run arbitrary code. If you trust "
            f"the data, enable it with shardstream.allow_pickle(True), {_PICKLE_ENV}=1, or "
            "Decoder(..., allow_pickle=True) / .decode(..., allow_pickle=True)"
        )


# --- basic decoders ------------------------------------------------------------------------------


def torch_loads(data: bytes) -> Any:
    """torch.load the bytes on the CPU (refused unless pickle is allowed or weights_only is set)."""
    if enforced():  # webdataset refuses even a weights-only load under enforce_security
        # (its type too: a ValueError, which a Decoder raises as a DecodingError)
        raise ValueError("torch.loads is not allowed for security reasons when enforce_security is set.")
    if not pytorch_weights_only:
        check_pickle_allowed("a .pth field with torch.load")
    import torch

    return torch.load(io.BytesIO(data), weights_only=pytorch_weights_only, map_location="cpu")


def unpickle_loads(data: bytes) -> Any:
    """pickle.loads the bytes (refused unless pickle is allowed)."""
    if enforced():
        raise ValueError("Unpickling is not allowed for security reasons when enforce_security is set.")
    check_pickle_allowed("a pickle field")
    return pickle.loads(data)


def tenbin_loads(data: bytes) -> List[np.ndarray]:
    """Decode tenbin (`.ten`) bytes into a list of arrays."""
    return _tenbin.decode_buffer(data)


def msgpack_loads(data: bytes) -> Any:
    """Decode msgpack bytes."""
    import msgpack

    return msgpack.unpackb(data)


def npy_loads(data: bytes) -> np.ndarray:
    """Decode `.npy` bytes (object arrays are refused, as numpy does by default)."""
    return np.lib.format.read_array(io.BytesIO(data))


def npz_loads(data: bytes) -> Dict[str, np.ndarray]:
    """Decode `.npz` bytes into a dict of arrays."""
    return dict(np.load(io.BytesIO(data)))


def cbor_loads(data: bytes) -> Any:
    """Decode CBOR bytes with `cbor` (webdataset's choice) or, when it is missing, `cbor2`."""
    try:
        import cbor  # type: ignore
    except ImportError:
        import cbor2 as cbor  # webdataset raises here; cbor2 is the maintained library
    return cbor.loads(data)


def _utf8(data: bytes) -> str:
    return data.decode("utf-8")


# The decoders of `basichandlers`, by last extension. A module-level dict, like webdataset's, so
# that code adding entries to it keeps working; it is looked up per field, never cached.
decoders: Dict[str, Callable[[bytes], Any]] = {
    "txt": _utf8,
    "text": _utf8,
    "transcript": _utf8,
    "cls": int,
    "cls2": int,
    "index": int,
    "inx": int,
    "id": int,
    "json": json.loads,
    "jsn": json.loads,
    "pkl": unpickle_loads,
    "pickle": unpickle_loads,
    "pyd": unpickle_loads,
    "pth": torch_loads,
    "ten": tenbin_loads,
    "tb": tenbin_loads,
    "mp": msgpack_loads,
    "msg": msgpack_loads,
    "npy": npy_loads,
    "npz": npz_loads,
    "cbor": cbor_loads,
}


def basichandlers(key: str, data: bytes) -> Any:
    """Decode text, ints, json, npy/npz, msgpack, cbor, tenbin, pickle and pth by extension."""
    decoder = decoders.get(last_extension(key))
    return None if decoder is None else decoder(data)


