"""webdataset's `enforce_security` switch (`WDS_SECURE=1`, or `utils.enforce_security = True`).

When set, `pipe:` URLs, unpickling and `torch.load` are refused even where they were enabled,
and `gopen` refuses local files and `GOPEN_REWRITE`, with webdataset's messages. One
process-wide flag, read where each check applies (the `utils` facade's attribute sets it).
"""

from __future__ import annotations

import os

__all__ = ["enforce", "enforced"]

_enforced = os.environ.get("WDS_SECURE", "0").strip().lower() in ("1", "true", "yes")


def enforce(enabled: bool) -> None:
    """Turn the switch on or off for this process."""
    global _enforced
    _enforced = bool(enabled)


def enforced() -> bool:
    """Whether the switch is on."""
    return _enforced
