"""shardstream: stream WebDataset tar shards into PyTorch training, fast.

`import shardstream as wds` runs code written for webdataset 1.0.2 and for the 0.2.x API.
"""

from . import (
    autodecode,
    cache,
    compat,
    filters,
    gopen,
    handlers,
    mix,
    pipeline,
    shardlists,
    tariterators,
    utils,
)
from ._engine.config import EngineConfig, engine_defaults, set_engine_defaults
from ._decode.basic import allow_pickle
from ._base.errors import (
    FetchError,
    FetchTimeout,
    FormatError,
    NetworkError,
    ShardNotFound,
    ShardStreamError,
    UsageError,
)
from ._cache.check import CorruptCacheFile
from ._fetch.options import FetchOptions
from ._fetch.registry import register_fetcher
from ._fetch.open import allow_pipe
from ._resume.states import gather_states
from ._shard.samples import TarShardSamples
from ._shim import install_as_webdataset
from ._stages.contract import clean_cut
from ._engine.stats import PipelineStats
from ._loader.subprocess import SubprocessLoader
from ._tar.reader import TarMember, TarReader
from .autodecode import (
    Continue,
    Decoder,
    DecodingError,
    audiohandler,
    gzfilter,
    handle_extension,
    imagehandler,
    pytorch_weights_only,
    torch_audio,
    torch_loads,
    torch_video,
    videohandler,
)
from .cache import LRUCleanup, pipe_cleaner
from .compat import FluidInterface, FluidWrapper, WebDataset, WebLoader
from .extradatasets import MockDataset, with_epoch, with_length
from .filters import (
    Cached,
    LMDBCached,
    associate,
    batched,
    decode,
    detshuffle,
    extract_keys,
    getfirst,
    info,
    map,
    map_dict,
    map_tuple,
    pipelinefilter,
    rename,
    rename_keys,
    rsample,
    select,
    shuffle,
    slice,
    to_tuple,
    transform_with,
    unbatched,
    unlisted,
    xdecode,
)
from .gopen import gopen, gopen_schemes  # type: ignore[no-redef]  # as in webdataset: the function shadows the module
from .handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from .mix import RandomMix, RoundRobin
from .pipeline import DataPipeline
from .prefetch import DevicePrefetcher
from .shardlists import (
    EqualSplit,
    MultiShardSample,
    ResampledShards,
    SimpleShardList,
    non_empty,
    resampled,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from .tariterators import tarfile_samples, tarfile_to_samples
from .utils import PipelineStage, repeatedly
from .writer import ShardWriter, TarWriter, numpy_dumps, torch_dumps

__version__ = "0.1.0"

__all__ = [
    "Cached",
    "Continue",
    "CorruptCacheFile",
    "DataPipeline",
    "Decoder",
    "DecodingError",
    "DevicePrefetcher",
    "EngineConfig",
    "EqualSplit",
    "FetchError",
    "FetchOptions",
    "FetchTimeout",
    "FluidInterface",
    "FluidWrapper",
    "FormatError",
    "LMDBCached",
    "LRUCleanup",
    "MockDataset",
    "MultiShardSample",
    "NetworkError",
    "PipelineStage",
    "PipelineStats",
    "RandomMix",
    "ResampledShards",
    "RoundRobin",
    "ShardNotFound",
    "ShardStreamError",
    "ShardWriter",
    "SimpleShardList",
    "SubprocessLoader",
    "TarMember",
    "TarReader",
    "TarShardSamples",
    "TarWriter",
    "UsageError",
    "WebDataset",
    "WebLoader",
    "allow_pickle",
    "allow_pipe",
    "associate",
    "audiohandler",
    "autodecode",
    "batched",
    "cache",
    "clean_cut",
    "compat",
    "decode",
    "detshuffle",
    "engine_defaults",
    "extract_keys",
    "filters",
    "gather_states",
    "getfirst",
    "gopen",
    "gopen_schemes",
    "gzfilter",
    "handle_extension",
    "handlers",
    "ignore_and_continue",
    "ignore_and_stop",
    "imagehandler",
    "info",
    "install_as_webdataset",
    "map",
    "map_dict",
    "map_tuple",
    "mix",
    "non_empty",
    "numpy_dumps",
    "pipe_cleaner",
    "pipeline",
    "pipelinefilter",
    "pytorch_weights_only",
    "register_fetcher",
    "rename",
    "rename_keys",
    "repeatedly",
    "reraise_exception",
    "resampled",
    "rsample",
    "select",
    "set_engine_defaults",
    "shardlists",
    "shardspec",
    "shuffle",
    "single_node_only",
    "slice",
    "split_by_node",
    "split_by_worker",
    "tarfile_samples",
    "tarfile_to_samples",
    "tariterators",
    "to_tuple",
    "torch_audio",
    "torch_dumps",
    "torch_loads",
    "torch_video",
    "transform_with",
    "unbatched",
    "unlisted",
    "utils",
    "videohandler",
    "warn_and_continue",
    "warn_and_stop",
    "with_epoch",
    "with_length",
    "xdecode",
]


def __getattr__(name: str):
    """webdataset's submodules that `import webdataset as wds` reaches as attributes, loaded on
    first use (`wds.tenbin`; `wds.pytorch`, whose torch names import torch only when asked for)."""
    import importlib

    if name in ("tenbin", "pytorch"):
        return importlib.import_module(f"shardstream.{name}")
    raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
