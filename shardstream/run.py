"""Run an unmodified webdataset script on shardstream.

    python -m shardstream.run train.py --args ...
    python -m shardstream.run -m package.module --args ...
"""

from __future__ import annotations

import runpy
import sys

from ._shim import install_as_webdataset

USAGE = "usage: python -m shardstream.run (SCRIPT | -m MODULE) [ARGS...]"


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        raise SystemExit(0 if argv else 2)
    install_as_webdataset()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
