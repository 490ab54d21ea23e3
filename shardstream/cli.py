"""The `shardstream` command: make shards (create), look at them (ls, inspect, stats), check
them (verify), index them (index), time the loader on them (bench) and unpack one (extract)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, List, Optional

from ._base.errors import OptionError, ShardStreamError
from ._base.redact import redact

__all__ = ["build_parser", "main"]

EXIT_CODES = """exit status: 0 success; 1 a failure (verify found problems, a shard or sample failed, bad
input); 2 a command-line mistake; 130 interrupted (Ctrl-C)."""

EXAMPLES = {
    "create": """examples:
  shardstream create images/ shards/ --maxcount 1000 --seed 0          # ImageFolder: class folders -> jpg + cls
  shardstream create train.parquet s3://bucket/train/ --max-side 512 --quality 90 --workers 8
  shardstream create "old/train-{000..099}.tar" new/ --maxsize 1e9 --seed 1 --pattern "train-%06d.tar"
  shardstream create urls.csv shards/ --engine ray --ray-address auto  # on a Ray cluster
  shardstream create images/ /shared/shards/ --rank $SLURM_ARRAY_TASK_ID --world-size $SLURM_ARRAY_TASK_COUNT

writes DEST/<pattern> shards, a .idx and a .dali.idx beside each, sizes.json (and classes.json for
an image folder). Same input, seed and options: byte-identical shards, whatever the engine or workers.""",
    "ls": """examples:
  shardstream ls "data/train-{000000..000009}.tar" -n 20   # shard, key, field:size per sample
  shardstream ls shards/ --json                            # a create DEST; JSON lines""",
    "inspect": """examples:
  shardstream inspect "data/train-{000000..000009}.tar" -n 3
  shardstream inspect "https://host/train-000000.tar?token=..."   # the token is never printed""",
    "stats": """examples:
  shardstream stats "data/train-{000000..000099}.tar"
  shardstream stats shards/ --json > stats.json""",
    "verify": """examples:
  shardstream verify "data/train-{000000..000099}.tar"            # read every byte, decode every image
  shardstream verify shards/ --require "jpg;png,cls" -v           # every sample needs an image and a cls
  shardstream verify "s3://bucket/train-{000..099}.tar" --no-decode""",
    "index": """examples:
  shardstream index "data/train-{000000..000099}.tar"             # .idx, .dali.idx beside them, sizes.json
  shardstream index "https://host/train-{000..009}.tar" --out idx/
  shardstream index "s3://bucket/train-{000..009}.tar" --out s3://bucket/ --no-dali""",
    "extract": """examples:
  shardstream extract data/train-000000.tar out/""",
    "bench": """examples:
  shardstream bench "data/train-{000000..000099}.tar"              # raw samples/s, per-stage stats, verdict
  shardstream bench shards/ --decode rgb8 --threads 4 --limit 5000""",
    "prepare": """examples:
  shardstream prepare files/ "shards/train-%06d.tar" --maxcount 10000   # = create --input files""",
}


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `least` (else argparse's usage error, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    parse.__name__ = "count"  # argparse names the type in its messages
    return parse


POSITIVE, COUNT = _count(1), _count(0)


def _cmd(module: str, name: str) -> Callable:
    """The command function, imported when it runs (so --help stays fast)."""

    def run(args) -> int:
        import importlib

        return getattr(importlib.import_module(f"shardstream._cli.{module}"), name)(args)

    return run


def _add(sub, name: str, help: str, module: str, function: str) -> argparse.ArgumentParser:  # noqa: A002
    parser = sub.add_parser(
        name, help=help, description=help, epilog=EXAMPLES[name] + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars (they only show on a terminal)")
    parser.set_defaults(func=_cmd(module, function))
    return parser


def _add_create(sub) -> None:
    p = _add(sub, "create", "pack an image folder, a manifest or existing shards into shards", "create", "cmd_create")
    p.add_argument("src", help="a directory (ImageFolder, or files grouped by key), a manifest (.csv .tsv .jsonl "
                   ".json .parquet: paths or URLs, captions, labels, extra columns) or shards (a spec or a directory)")
    p.add_argument("dest", help="output directory or URL (s3://bucket/prefix, any fsspec URL)")
    p.add_argument("--input", default="auto", choices=("auto", "imagefolder", "files", "manifest", "shards"),
                   help="what SRC is (default: told from SRC)")
    p.add_argument("--pattern", default="shard-%06d.tar", help="shard file names (default shard-%%06d.tar; "
                   ".tar.gz/.tar.bz2/.tar.xz compress)")
    p.add_argument("--maxcount", type=POSITIVE, default=10000, help="samples per shard at most (default 10000)")
    p.add_argument("--maxsize", type=float, default=None, help="input bytes per shard, after which a new one starts")
    p.add_argument("--seed", type=int, default=None, help="shuffle samples with this seed (default: input order)")
    p.add_argument("--max-side", type=POSITIVE, default=None, help="downscale images whose longer side is larger; JPEG")
    p.add_argument("--quality", type=int, default=None, help="re-encode every image as JPEG at this quality "
                   "(with --max-side alone: 90, and only the downscaled ones)")
    p.add_argument("--workers", type=POSITIVE, default=None, help="processes (local engine; default: cores, at most one "
                   "per shard) or CPUs of the local Ray (Ray engine)")
    p.add_argument("--threads", type=POSITIVE, default=4, help="threads per worker reading and re-encoding (default 4)")
    p.add_argument("--engine", default="local", choices=("local", "ray"), help="local processes or Ray Data tasks")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join ('auto', 'ray://head:10001'); "
                   "default: a local Ray started for the job")
    p.add_argument("--rank", type=COUNT, default=0, help="write only this part of the shards (partitioning by hand)")
    p.add_argument("--world-size", type=POSITIVE, default=1, help="how many parts (--rank 0..N-1)")
    p.add_argument("--skip-errors", action="store_true", help="leave out samples that fail to download or decode")
    p.add_argument("--overwrite", action="store_true", help="replace shards and sizes.json already in DEST")
    p.add_argument("--rekey", action="store_true", help="number the samples (000000000, ...) instead of keeping keys")
    p.add_argument("--classes", default=None, help="ImageFolder: JSON list of class names, or {name: index}")
    p.add_argument("--url-col", default=None, help="manifest column of image paths or URLs (default: url, path, ...)")
    p.add_argument("--caption-col", default=None, help="manifest column for txt (default: caption, text)")
    p.add_argument("--label-col", default=None, help="manifest column for cls (default: label, cls, class)")
    p.add_argument("--key-col", default=None, help="manifest column of sample keys (default: key, else the row number)")
    p.add_argument("--no-dali", action="store_true", help="no .dali.idx files")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardstream", description=__doc__, epilog=EXIT_CODES + "\nshardstream COMMAND --help shows examples.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_create(sub)

    p = _add(sub, "ls", "list samples: shard, key, fields and their sizes", "inspect", "cmd_ls")
    p.add_argument("urls", help="shard spec (braces, '::') or a directory of shards")
    p.add_argument("-n", type=COUNT, default=None, help="at most this many samples")
    p.add_argument("--json", action="store_true", help="one JSON object per sample")

    p = _add(sub, "inspect", "print the first samples (field sizes) as JSON", "inspect", "cmd_inspect")
    p.add_argument("urls", help="shard spec (braces, '::') or a directory of shards")
    p.add_argument("-n", type=COUNT, default=5, help="how many samples (default 5)")

    p = _add(sub, "stats", "totals, fields, image sizes, samples per shard", "stats", "cmd_stats")
    p.add_argument("urls", help="shard spec (braces, '::') or a directory of shards")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--no-images", action="store_true", help="skip the image-size histogram")
    p.add_argument("--threads", type=POSITIVE, default=4, help="shards read at once (default 4)")

    p = _add(sub, "verify", "read every shard as the loader does; decode images; report problems with offsets",
             "verify", "cmd_verify")
    p.add_argument("urls", help="shard spec (braces, '::') or a directory of shards")
    p.add_argument("-v", "--verbose", action="store_true", help="a line per good shard too")
    p.add_argument("--require", default=None, help="fields every sample needs: 'jpg,txt'; 'jpg;png' means either")
    p.add_argument("--no-decode", action="store_true", help="do not decode images")
    p.add_argument("--threads", type=POSITIVE, default=4, help="shards checked at once (default 4)")

    p = _add(sub, "index", "write .idx (offsets), .dali.idx (DALI v1.2) and sizes.json (counts)", "index", "cmd_index")
    p.add_argument("urls", help="shard spec (braces, '::') or a directory of shards")
    p.add_argument("--out", default=None, help="write the index files here (directory or URL), not beside the shards")
    p.add_argument("--sizes", default=None, help="path of sizes.json (default: beside the shards, or in --out)")
    p.add_argument("--no-idx", action="store_true", help="only write sizes.json")
    p.add_argument("--no-dali", action="store_true", help="no .dali.idx files")
    p.add_argument("--threads", type=POSITIVE, default=4, help="shards read at once (default 4)")

    p = _add(sub, "extract", "extract a shard's members into a directory (safely)", "extract", "cmd_extract")
    p.add_argument("url")
    p.add_argument("dest")

    p = _add(sub, "bench", "stream shards through the loader: throughput, per-stage stats, verdict", "bench",
             "cmd_bench")
    p.add_argument("urls", help="shard spec (braces, '::') or a directory of shards")
    p.add_argument("--decode", nargs="?", const="rgb8", default=None,
                   help="decode images (a decode spec; default rgb8: numpy uint8 HWC)")
    p.add_argument("--threads", type=POSITIVE, default=None, help="engine threads (default: the engine's)")
    p.add_argument("--limit", type=COUNT, default=None, help="stop after this many samples")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = _add(sub, "prepare", "the old name of `create --input files` (SOURCE PATTERN)", "create", "cmd_prepare")
    p.add_argument("source")
    p.add_argument("pattern", help="output pattern, e.g. out/train-%%06d.tar")
    p.add_argument("--maxcount", type=POSITIVE, default=10000)
    p.add_argument("--maxsize", type=float, default=3e9)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ShardStreamError, OSError) as exn:
        print(f"error: {redact(exn)}", file=sys.stderr)
        return 2 if isinstance(exn, OptionError) else 1  # one found past argparse is still a command-line mistake
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
