"""An exception across processes: pickled whole where it can be rebuilt from its pickle, else as
its class, args, attributes and notes, rebuilt without calling its `__init__` (an exception whose
`__init__` takes other arguments than it passes on to `Exception` cannot be unpickled; torch's
DataLoader turns those into RuntimeError, which `except TheirError` misses)."""

from __future__ import annotations

import importlib
import pickle
from typing import Any, Dict, Optional, Type

from .._base.errors import add_note

__all__ = ["exception_from", "exception_payload"]

_SHELL = "shardstream-exception-shell"


def _picklable(value: Any) -> bool:
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:
        return False
    return True


def exception_payload(exc: BaseException) -> Optional[bytes]:
    """Bytes that `exception_from` turns back into `exc` (its type, args, attributes and notes),
    or None when not even that survives a pickle."""
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)  # some exceptions pickle but cannot be rebuilt
        return payload
    except Exception:
        pass
    args = exc.args if _picklable(exc.args) else (str(exc),)
    attributes: Dict[str, Any] = {k: v for k, v in vars(exc).items() if k != "__notes__" and _picklable(v)}
    notes = [str(note) for note in getattr(exc, "__notes__", ())]
    try:
        return pickle.dumps((_SHELL, type(exc).__module__, type(exc).__qualname__, args, attributes, notes))
    except Exception:
        return None


def _class(module: str, qualname: str) -> Optional[Type[BaseException]]:
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:
        return None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def exception_from(payload: Optional[bytes]) -> Optional[BaseException]:
    """The exception `exception_payload` described, or None when it cannot be rebuilt here."""
    if payload is None:
        return None
    try:
        obj = pickle.loads(payload)
    except Exception:
        return None
    if isinstance(obj, BaseException):
        return obj
    if not (isinstance(obj, tuple) and len(obj) == 6 and obj[0] == _SHELL):
        return None
    _tag, module, qualname, args, attributes, notes = obj
    cls = _class(module, qualname)
    if cls is None:
        return None
    try:
        exc = cls.__new__(cls)  # (BaseException.__new__: no __init__, whatever arguments it wants)
        exc.args = tuple(args)
        vars(exc).update(attributes)
    except Exception:
        return None
    for note in notes:
        add_note(exc, note)
    return exc
