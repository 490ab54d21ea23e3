"""webdataset's `Pipe`: a subprocess's stdout (or stdin) as a stream whose exit status is checked.

`open_pipe` is the one place a `pipe:` URL becomes a shell command for `gopen` and the writers:
refused unless pipes are enabled (`allow_pipe`), and always under `enforce_security`.
"""

from __future__ import annotations

import logging
import os
from subprocess import PIPE, Popen
from typing import Any, Dict, Optional, Sequence

from .._base.errors import FetchError, UsageError
from .open import pipe_allowed
from .._base.redact import redact
from .._base.security import enforced

__all__ = ["Pipe", "info", "open_pipe", "set_options"]

log = logging.getLogger(__name__)

# Extra context for exit-status errors and GOPEN_VERBOSE logs (webdataset's `gopen.info`).
info: Dict[str, Any] = {}


class Pipe:
    """A stream over a subprocess's stdout (mode "r...") or stdin (mode "w...").

    Reads and writes poll the process; once it has exited, its status is checked, and a
    status outside `ignore_status` (0 is always accepted) raises FetchError (an OSError, as
    webdataset's IOError) unless `ignore_errors`. `close` waits up to `timeout` seconds.

    Args:
        *args, **kw: passed to subprocess.Popen.
        mode: "rb" / "wb" (only the first letter matters).
        timeout: seconds to wait for the process on close.
        ignore_errors: never raise for the exit status.
        ignore_status: further statuses to accept (141 is SIGPIPE: the reader stopped early).
    """

    def __init__(self, *args: Any, mode: Optional[str] = None, timeout: float = 7200.0,
                 ignore_errors: bool = False, ignore_status: Sequence[int] = (), **kw: Any) -> None:
        self.ignore_errors = ignore_errors
        self.ignore_status: Sequence[int] = [0, *ignore_status]
        self.timeout = timeout
        self.args = (args, kw)
        self.status: Optional[int] = None
        if not mode or mode[0] not in "rw":
            raise ValueError(f"{mode}: unknown mode")
        if mode[0] == "r":
            self.proc = Popen(*args, stdout=PIPE, **kw)  # type: ignore[call-overload]  # webdataset's Popen pass-through
            self.stream = self.proc.stdout
        else:
            self.proc = Popen(*args, stdin=PIPE, **kw)  # type: ignore[call-overload]
            self.stream = self.proc.stdin
        if self.stream is None:
            raise ValueError(f"{args}: couldn't open")

    def __str__(self) -> str:
        return redact(f"<Pipe {self.args}>")

    def check_status(self) -> None:
        """Check the exit status if the process has ended."""
        if self.proc.poll() is not None:
            self.wait_for_child()

    def wait_for_child(self) -> None:
        """Wait for the process and raise for an unexpected exit status."""
        if self.status is not None:
            return
        self.status = self.proc.wait()
        if int(os.environ.get("GOPEN_VERBOSE", 0)):
            log.info("pipe exit [%s %s:%s] %s %s", self.status, os.getpid(), self.proc.pid, redact(str(self.args)), info)
        if self.status not in self.ignore_status and not self.ignore_errors:
            raise FetchError(redact(f"{self.args}: exit {self.status} {info}"))

    def read(self, *args: Any, **kw: Any) -> bytes:
        result = self.stream.read(*args, **kw)
        self.check_status()
        return result

    def write(self, *args: Any, **kw: Any) -> int:
        result = self.stream.write(*args, **kw)
        self.check_status()
        return result

    def readLine(self, *args: Any, **kw: Any) -> bytes:  # noqa: N802 - webdataset's name
        """One line (webdataset's spelling; it called a method streams do not have)."""
        result = self.stream.readline(*args, **kw)
        self.check_status()
        return result

    readline = readLine

    def flush(self) -> None:
        self.stream.flush()

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def close(self) -> None:
        """Close the stream, wait for the process and check its status."""
        if not self.stream.closed:
            self.stream.close()
            self.status = self.proc.wait(self.timeout)
            if self.status not in self.ignore_status and not self.ignore_errors:
                raise FetchError(redact(f"{self.args}: exit {self.status} {info}"))

    def __enter__(self) -> "Pipe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from garbage collection
            pass


def set_options(obj: Any, timeout: Optional[float] = None, ignore_errors: Optional[bool] = None,
                ignore_status: Optional[Sequence[int]] = None, handler: Any = None) -> bool:
    """Set Pipe options on `obj` if it is a Pipe; return whether it was one."""
    if not isinstance(obj, Pipe):
        return False
    if timeout is not None:
        obj.timeout = timeout
    if ignore_errors is not None:
        obj.ignore_errors = ignore_errors
    if ignore_status is not None:
        obj.ignore_status = ignore_status
    if handler is not None:
        obj.handler = handler  # type: ignore[attr-defined]  # webdataset's set_options sets it too
    return True


def open_pipe(url: str, mode: str = "rb", bufsize: int = 8192, allow: Optional[bool] = None) -> Pipe:
    """Run the shell command of a `pipe:` URL and return its stdout ("rb") or stdin ("wb").

    Raises:
        UsageError: pipes are not enabled, or enforce_security is set.
        ValueError: an unknown mode.
    """
    assert url.startswith("pipe:"), url
    if enforced():
        raise UsageError("gopen_pipe: unsafe_gopen is False, cannot open pipe URLs", url=url)
    if not pipe_allowed(allow):
        raise UsageError(
            "pipe: URLs run a shell command and are off by default; enable them with "
            "shardstream.allow_pipe(True) or SHARDSTREAM_ALLOW_PIPE=1", url=url)
    if mode[0] not in "rw":
        raise ValueError(f"{mode}: unknown mode")
    # 141 / -13: SIGPIPE, the reader stopped early (the shell's status, or the command's own).
    return Pipe(url[5:], mode=mode, shell=True, bufsize=bufsize, ignore_status=[141, -13])  # noqa: S604
