"""webdataset's `handlers` module: exception handlers (the code lives in `_base/handlers.py`)."""

from ._base.handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)

__all__ = [
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]
