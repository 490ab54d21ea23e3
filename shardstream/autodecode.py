"""webdataset's `autodecode` module: decoders, image specs and handlers, under the same names.

The implementation lives in `_decode/` (`decoder.py`, `basic.py`, `image.py`, `fusedimage.py`:
decode + crop + resize, `video.py`, `audio.py`, `torchmedia.py`: PyAV, from bytes). One deliberate
divergence: unpickling (`pyd`, `pickle`, `pkl`) and `torch.load` (`pth`) are refused unless
enabled with `allow_pickle()`, SHARDSTREAM_ALLOW_PICKLE=1 or `Decoder(..., allow_pickle=True)`.
`pytorch_weights_only` is read from WDS_PYTORCH_WEIGHTS_ONLY at import, as in webdataset; to change
it later, set `shardstream._decode.basic.pytorch_weights_only` (this module only holds a copy).
"""

from ._decode.audio import AudioHandler, audiohandler
from ._decode.decoder import IMAGE_EXTENSIONS, Continue, Decoder, DecodingError, ImageHandler, call_extension_handler, default_decoder, default_post_handlers, default_pre_handlers, gzfilter, handle_extension, imagehandler, imagespecs, torch_audio, torch_video
from ._decode.basic import allow_pickle, basichandlers, cbor_loads, decoders, msgpack_loads, npy_loads, npz_loads, pickle_allowed, pytorch_weights_only, tenbin_loads, torch_loads, unpickle_loads
from ._decode.fusedimage import FusedImageHandler
from ._decode.video import VideoHandler, videohandler

__all__ = [
    "AudioHandler",
    "Continue",
    "Decoder",
    "DecodingError",
    "FusedImageHandler",
    "IMAGE_EXTENSIONS",
    "ImageHandler",
    "VideoHandler",
    "allow_pickle",
    "audiohandler",
    "basichandlers",
    "call_extension_handler",
    "cbor_loads",
    "decoders",
    "default_decoder",
    "default_post_handlers",
    "default_pre_handlers",
    "gzfilter",
    "handle_extension",
    "imagehandler",
    "imagespecs",
    "msgpack_loads",
    "npy_loads",
    "npz_loads",
    "pickle_allowed",
    "pytorch_weights_only",
    "tenbin_loads",
    "torch_audio",
    "torch_loads",
    "torch_video",
    "unpickle_loads",
    "videohandler",
]
