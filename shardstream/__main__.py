"""`python -m shardstream ...` runs the `shardstream` command (the same `main` as the console script)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
