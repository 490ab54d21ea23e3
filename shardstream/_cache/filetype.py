"""What a downloaded file holds, from its first bytes: the cache's validator and webdataset's
`magic_filetype` / `get_filetype` (the latter asks the `file` command, as webdataset does)."""

from __future__ import annotations

import os
import subprocess

from .._tar.headers import header_checksum_ok

__all__ = ["check_tar_format", "get_filetype", "magic_filetype"]


def magic_filetype(fname: str) -> str:
    """`"<fname>: gzip compressed data"`, `"...: POSIX tar archive"` or `"...: data"`."""
    with open(fname, "rb") as f:
        header = f.read(512)
    if header[:2] == b"\x1f\x8b":
        return f"{fname}: gzip compressed data"
    if len(header) > 261 and header[257:262] == b"ustar":
        return f"{fname}: POSIX tar archive"
    return f"{fname}: data"


def get_filetype(fname: str) -> str:
    """The output of `file FNAME`.

    Raises:
        AssertionError: the file does not exist, or the `file` command is not available.
    """
    assert os.path.exists(fname), fname
    try:
        subprocess.run(["file", "."], stdout=subprocess.DEVNULL, check=True)
    except (subprocess.SubprocessError, FileNotFoundError):
        raise AssertionError("UNIX/Linux file command not available") from None
    return subprocess.run(["file", fname], stdout=subprocess.PIPE, text=True, check=True).stdout


def check_tar_format(fname: str) -> bool:
    """True if the file looks like a tar archive (or gzip, which may hold one).

    Broader than webdataset's check: old-style (v7) tar headers with a valid checksum and an
    empty archive (a zero block) count too.
    """
    with open(fname, "rb") as f:
        head = f.read(512)
    if head[:2] == b"\x1f\x8b":
        return True
    return len(head) == 512 and (head[257:262] == b"ustar" or head == b"\0" * 512 or header_checksum_ok(head))
