"""Processes on this host, and the temp files their writers leave: whether a pid is alive, and the
hidden temp-file name that carries the host and pid of its writer, so that a later process can
remove what a dead writer of its own host left (writers on other hosts may share the folder)."""

from __future__ import annotations

import os
import re
import secrets
import socket
from typing import Optional

__all__ = ["HOST", "TEMP", "left_by_dead_writer", "pid_alive", "temp_name"]

HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
# `.NAME.HOST.PID.RAND.tmp` (a cache's progress log adds `.sums` before `.tmp`)
TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>\d+)\.(?P<rand>[0-9a-f]{8})(\.sums)?\.tmp$")


def pid_alive(pid: int) -> bool:
    """False only when `pid` surely is gone on this host (dead, or a zombie nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return True
    end = text.rfind(b")")  # the command name may itself hold ") "
    return text[end + 2 : end + 3] != b"Z"


def temp_name(name: str, pid: Optional[int] = None) -> str:
    """The hidden name this host's process `pid` (this one by default) writes `name` under."""
    return f".{name}.{HOST}.{os.getpid() if pid is None else pid}.{secrets.token_hex(4)}.tmp"


def left_by_dead_writer(filename: str) -> bool:
    """Whether `filename` is a temp file (`temp_name`) of a writer of this host that is gone."""
    match = TEMP.match(filename)
    return match is not None and match["host"] == HOST and not pid_alive(int(match["pid"]))
