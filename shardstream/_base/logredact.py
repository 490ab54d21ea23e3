"""Redaction for other libraries' log records: botocore logs each request's headers and its signed
canonical request at DEBUG, the session token with them. (Apart from `redact`, which the sans-IO
tar reader imports: no logging there.)"""

from __future__ import annotations

import logging
import re

from .redact import _HEADER_NAME, MASK, redact

__all__ = ["redact_loggers"]

# a header on a line of its own, as botocore's signer logs its canonical request: x-amz-security-token:...
_HEADER_LINE = re.compile(rf"(?im)^((?:{_HEADER_NAME})\s*:)[^\n]+")


class _Redacting(logging.Filter):
    """Redacts a record's message (its arguments formatted in first) before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's to report, not ours
            return True
        hidden = _HEADER_LINE.sub(rf"\1{MASK}", redact(message))
        if hidden != message:
            record.msg, record.args = hidden, ()
        return True


_FILTER = _Redacting()


def redact_loggers(*prefixes: str) -> None:
    """Put the redacting filter on every logger there is now under `prefixes` (a library's: a
    logger's filter does not reach its children, so each gets it). botocore logs its requests'
    headers and signed canonical requests at DEBUG: the session token with them."""
    manager = logging.Logger.manager
    for name in list(manager.loggerDict):
        if name.startswith(prefixes) or name in prefixes:
            found = manager.loggerDict[name]
            if isinstance(found, logging.Logger) and _FILTER not in found.filters:
                found.addFilter(_FILTER)
