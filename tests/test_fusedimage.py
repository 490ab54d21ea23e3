"""The fused image path: geometry as torchvision's transforms, pixels within the documented
tolerance of the plain path, every spec and backend, and the plain path left untouched."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import pickle
import subprocess
import sys
import random

import numpy as np
import PIL.Image
import pytest
from PIL import ImageFilter

import shardstream as wds
from shardstream._decode.fusedimage import FusedImageHandler, center_box, random_box
from shardstream._decode.image import ImageHandler
from needs import needs_torch, optional, torch_attr

torch = optional("torch")

# The tolerance the README states (fused vs the plain path, same crop box, photo-like JPEGs
# decoded at 1/2..1/8 scale): mean absolute difference and 99th percentile, in levels of 255.
MEAN_TOLERANCE, P99_TOLERANCE = 3.0, 12

HAVE_SIMPLEJPEG = importlib.util.find_spec("simplejpeg") is not None
BACKENDS = ["pillow", pytest.param("simplejpeg", marks=pytest.mark.skipif(
    not HAVE_SIMPLEJPEG, reason="simplejpeg is not installed"))]
INSTALLED_BACKENDS = ["pillow", "simplejpeg"] if HAVE_SIMPLEJPEG else ["pillow"]
# (decoder, resizer) pairs: Pillow throughout, and the fast pair (simplejpeg + torch's kernels).
PAIRS = [("pillow", "pillow"), ("pillow", "torch"), pytest.param("simplejpeg", "torch", marks=pytest.mark.skipif(
    not HAVE_SIMPLEJPEG, reason="simplejpeg is not installed"))]


def photo(width: int, height: int, seed: int = 0, noise: float = 8.0) -> np.ndarray:
    """A photo-like RGB image: smooth colour field, blurred shapes, texture and noise."""
    rng = np.random.default_rng(seed)
    canvas = PIL.Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8)).resize((width, height), PIL.Image.BICUBIC)
    from PIL import ImageDraw

    draw = ImageDraw.Draw(canvas)
    for _ in range(6):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = [x, y, x + int(rng.integers(20, width // 2)), y + int(rng.integers(20, height // 2))]
        draw.ellipse(box, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    pixels = np.asarray(canvas.filter(ImageFilter.GaussianBlur(1.5)), dtype=np.float32)
    pixels += rng.normal(0, noise, pixels.shape).astype(np.float32)
    return pixels.clip(0, 255).astype(np.uint8)


def jpeg(pixels: np.ndarray, mode: str = "RGB", **options) -> bytes:
    buf = io.BytesIO()
    PIL.Image.fromarray(pixels).convert(mode).save(buf, format="JPEG", quality=90, **options)
    return buf.getvalue()


def encode(pixels: np.ndarray, fmt: str, mode: str) -> bytes:
    buf = io.BytesIO()
    PIL.Image.fromarray(pixels).convert(mode).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def small():  # ImageNet-like: too small for any DCT scaling towards 224
    return jpeg(photo(500, 375, seed=1))


PADDED = [(375, 500, (200, 320)), (500, 375, (320, 200))]  # (width, height, crop): crops wider or taller


def padded(width: int, height: int) -> bytes:
    return jpeg(photo(width, height, seed=4))


def webdataset_rgb(data: bytes) -> np.ndarray:
    import webdataset

    return np.asarray(webdataset.imagehandler("pil")(".jpg", data).convert("RGB"))


@pytest.fixture(scope="module")
def torchvision_results(small, tmp_path_factory):
    """webdataset's PIL decode of every image the tests compare against torchvision, through
    torchvision's eval transform: all in one run of the torchvision venv (each run imports its
    torch, ~5 s here)."""
    jobs = {"small": (webdataset_rgb(small), 256, 224)}
    for width, height, size in PADDED:
        jobs[(width, height, size)] = (webdataset_rgb(padded(width, height)), round(min(size) / 0.875), list(size))
    return dict(zip(jobs, torchvision_eval(list(jobs.values()), tmp_path_factory.mktemp("torchvision"))))


@pytest.fixture(scope="module")
def torchvision_small(torchvision_results):
    return torchvision_results["small"]


@pytest.fixture(scope="module")
def large():  # large enough for 1/4 and 1/8; the last one as noisy as the benchmark corpora
    return [jpeg(photo(1600, 1200, seed=2)), jpeg(photo(1024, 1536, seed=3)), jpeg(photo(1200, 900, 5, noise=28))]


# --- torchvision's transforms, on PIL images (the plain path) ------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIP_PYTHON = os.environ.get("OPENCLIP_PYTHON") or os.path.join(REPO, ".venv-clip", "bin", "python")
TORCHVISION_EVAL = """
import json, sys
import numpy as np
import PIL.Image
from torchvision import transforms
for source, result, resize, crop in json.loads(sys.argv[1]):
    image = PIL.Image.fromarray(np.load(source))
    np.save(result, np.asarray(transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(crop)])(image)))
"""


def torchvision_eval(jobs, tmp_path) -> list:
    """torchvision's own eval transform, Resize(resize) then CenterCrop(crop), of the RGB pixels
    of each (pixels, resize, crop) in `jobs`, run in the venv that has torchvision (`make test`
    builds it for OpenCLIP; torchvision does not load beside this venv's CPU torch)."""
    if not os.path.exists(CLIP_PYTHON):
        if os.environ.get("OPENCLIP_PYTHON"):
            pytest.fail(f"OPENCLIP_PYTHON={CLIP_PYTHON} does not exist")
        pytest.skip(f"no torchvision venv at {CLIP_PYTHON}: `make test` builds it (or set OPENCLIP_PYTHON)")
    args = []
    for i, (pixels, resize, crop) in enumerate(jobs):
        source, result = str(tmp_path / f"in{i}.npy"), str(tmp_path / f"out{i}.npy")
        np.save(source, pixels)
        args.append([source, result, resize, crop])
    subprocess.run([CLIP_PYTHON, "-c", TORCHVISION_EVAL, json.dumps(args)], check=True, timeout=120)
    return [np.load(result) for _, result, _, _ in args]


def plain(data: bytes, box, out, spec: str = "pil") -> np.ndarray:
    """The plain path with the same box: webdataset's full decode, then one resize of the box."""
    return np.asarray(ImageHandler(spec).decode(data).resize(out, PIL.Image.BILINEAR, box=box))


def difference(a: np.ndarray, b: np.ndarray):
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(diff.mean()), float(np.percentile(diff, 99))


# --- the webdataset form is unchanged -------------------------------------------------------------


def test_positional_form_is_webdatasets_image_handler(small):
    assert type(wds.imagehandler("rgb8")) is ImageHandler
    handler = wds.imagehandler("rgb8", ["jpg"])
    assert type(handler) is ImageHandler and handler.extensions == {"jpg"}
    assert type(wds.imagehandler("rgb8", size=8)) is FusedImageHandler
    import webdataset

    theirs = webdataset.imagehandler("rgb8")(".jpg", small)
    assert np.array_equal(wds.imagehandler("rgb8")(".jpg", small), theirs)


# --- geometry --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("resizer", ["pillow", "torch"])
@needs_torch
def test_center_crop_is_resize_then_center_crop(small, backend, resizer, torchvision_small):
    # No DCT scaling applies (328 px of crop for 224 of output): pixels as the plain eval transform
    # (torch: the crop box starts at 58.04 px, off the pixel grid, so it resizes from pixel 0).
    ours = wds.imagehandler("rgb8", size=224, crop="center", backend=backend, resizer=resizer)(".jpg", small)
    theirs = torchvision_small
    assert ours.shape == theirs.shape == (224, 224, 3) and ours.flags.c_contiguous
    assert np.abs(ours.astype(np.int16) - theirs).max() <= 1


@pytest.mark.parametrize("width, height, size", PADDED)
@needs_torch
def test_a_center_crop_larger_than_the_resized_image_is_padded_as_torchvision_pads(width, height, size,
                                                                                   torchvision_results):
    """A non-square crop wider (or taller) than the resized image: torchvision's CenterCrop pads
    it with zeros, (crop - size) // 2 before; the fused path used to stretch the image instead."""
    data = padded(width, height)
    theirs = torchvision_results[(width, height, size)]
    band = ~theirs.any(axis=2)  # the padding: zero in every channel
    band &= band.all(axis=0, keepdims=True) | band.all(axis=1, keepdims=True)  # whole columns or rows
    assert theirs.shape == (*size, 3) and 40 * min(size) < band.sum() < theirs.size // 3
    for backend, resizer in [("pillow", "pillow"), ("pillow", "torch")] + [("simplejpeg", "torch")] * HAVE_SIMPLEJPEG:
        ours = wds.imagehandler("rgb8", size=size, crop="center", backend=backend, resizer=resizer)(".jpg", data)
        assert ours.shape == theirs.shape and ours.flags.c_contiguous
        assert np.abs(ours.astype(np.int16) - theirs).max() <= 2, (backend, resizer)
        grey = wds.imagehandler("l8", size=size, crop="center", backend=backend, resizer=resizer)(".jpg", data)
        assert grey.shape == size and not grey[band].any() and grey[~band].mean() > 20
    tensor = wds.imagehandler("torchrgb8", size=size, crop="center")(".jpg", data)
    assert tuple(tensor.shape) == (3, *size) and np.abs(tensor.permute(1, 2, 0).numpy().astype(np.int16) - theirs).max() <= 2
    image = wds.imagehandler("pil", size=size, crop="center")(".jpg", data)
    assert image.size == size[::-1] and np.abs(np.asarray(image).astype(np.int16) - theirs).max() <= 2


@pytest.mark.parametrize("size", [224, (200, 240)])
@needs_torch
def test_torch_random_crop_is_crop_then_resize(small, size):
    # RandomResizedCrop crops whole pixels, then resizes the crop alone: what torch does too.
    handler = wds.imagehandler("rgb8", size=size, crop="random", resizer="torch", seed=7)
    boxes = wds.imagehandler("rgb8", size=size, crop="random", seed=7)
    image = ImageHandler("pil").decode(small)
    for _ in range(10):
        box, out = boxes.geometry(*image.size)
        theirs = np.asarray(image.crop(tuple(int(v) for v in box)).resize(out, PIL.Image.BILINEAR))
        ours = handler(".jpg", small)
        assert ours.shape == theirs.shape and ours.flags.c_contiguous
        # torch's AVX2 kernel keeps 16-bit weights (Pillow: 22-bit): a level or two apart
        assert np.abs(ours.astype(np.int16) - theirs).max() <= 2 and difference(ours, theirs)[0] < 0.5


def test_center_box_matches_torchvision_arithmetic():
    # Resize(256) of 500x375 gives 341x256; CenterCrop(224) starts at (58, 16) in it.
    box = center_box(500, 375, 224, 224, 0.875)
    scale = 500 / 341
    assert box == pytest.approx((58 * scale, 16 * 375 / 256, 282 * scale, 240 * 375 / 256))
    assert center_box(375, 500, 224, 224, 1.0)[0] == 0.0  # fraction 1: the whole shorter side


def test_random_box_follows_random_resized_crop():
    rng = random.Random(0)
    for _ in range(200):
        left, top, right, bottom = random_box(500, 375, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        w, h = right - left, bottom - top
        assert 0 <= left and right <= 500 and 0 <= top and bottom <= 375
        assert 0.07 <= w * h / (500 * 375) <= 1.0 and 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02
    # a strip no crop of the ratio fits: the fallback, a centred crop with the ratio clamped
    assert random_box(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3), rng) == (493.0, 0.0, 506.0, 10.0)


def test_random_crops_are_seeded_and_vary(small):
    first = [wds.imagehandler("rgb8", size=32, crop="random", seed=5)(".jpg", small) for _ in range(2)]
    again = wds.imagehandler("rgb8", size=32, crop="random", seed=5)
    assert np.array_equal(first[0], again(".jpg", small))
    assert not np.array_equal(again(".jpg", small), again(".jpg", small))


@pytest.mark.parametrize("size, shape", [(100, (100, 133)), ((60, 80), (60, 80))])
def test_no_crop_resizes_like_resize(small, size, shape):
    out = wds.imagehandler("rgb8", size=size)(".jpg", small)
    assert out.shape == (*shape, 3)


# --- tolerance against the plain path -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("resizer", ["pillow", "torch"])
@pytest.mark.parametrize("crop", ["center", "random", None])
@needs_torch
def test_dct_scaled_decode_stays_within_the_documented_tolerance(large, backend, resizer, crop):
    handler = wds.imagehandler("rgb8", size=224, crop=crop, backend=backend, resizer=resizer, seed=3)
    geometry = wds.imagehandler("rgb8", size=224, crop=crop, seed=3)  # draws the same boxes
    for data in large:
        width, height = PIL.Image.open(io.BytesIO(data)).size
        box, out = geometry.geometry(width, height)
        ours, theirs = handler(".jpg", data), plain(data, box, out)
        assert ours.shape == theirs.shape
        mean, p99 = difference(ours, theirs)
        assert mean <= MEAN_TOLERANCE and p99 <= P99_TOLERANCE, (mean, p99)


@needs_torch
def test_backends_agree(large):
    pytest.importorskip("simplejpeg")
    for data in large:
        a = wds.imagehandler("rgb8", size=224, crop="center")(".jpg", data)
        b = wds.imagehandler("rgb8", size=224, crop="center", backend="simplejpeg")(".jpg", data)
        c = wds.imagehandler("rgb8", size=224, crop="center", backend="simplejpeg", resizer="torch")(".jpg", data)
        assert difference(a, b)[0] <= 0.5 and difference(a, c)[0] <= 0.5


@pytest.mark.parametrize("backend", INSTALLED_BACKENDS)
@needs_torch
def test_torch_random_boxes_off_the_pixel_grid(large, backend):
    # Random boxes of JPEGs decoded at 1/2..1/4 mostly fall between pixels of the decoded image;
    # torch can't start there, so Pillow resamples them: the pixels of resizer="pillow".
    handler = wds.imagehandler("rgb8", size=224, crop="random", scale=(0.5, 1.0), backend=backend,
                               resizer="torch", seed=11)
    pillow = wds.imagehandler("rgb8", size=224, crop="random", scale=(0.5, 1.0), backend=backend, seed=11)
    same = 0
    for data in large:
        for _ in range(8):
            ours, theirs = handler(".jpg", data), pillow(".jpg", data)
            assert ours.shape == theirs.shape == (224, 224, 3)
            same += np.array_equal(ours, theirs)
    assert same == 24  # at this seed every box falls between decoded pixels: all went to Pillow


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
@pytest.mark.parametrize("crop", ["center", "random", None])
@needs_torch
def test_torch_resizer_matches_pillows_filters(small, resample, crop):
    # torch's antialiased uint8 kernels are a port of Pillow's (no DCT scaling at this size).
    ours = wds.imagehandler("rgb8", size=(200, 266), crop=crop, resample=resample, resizer="torch", seed=2)
    geometry = wds.imagehandler("rgb8", size=(200, 266), crop=crop, seed=2)
    box, out = geometry.geometry(500, 375)
    theirs = ImageHandler("pil").decode(small)
    if crop == "random":
        theirs = theirs.crop(tuple(int(v) for v in box)).resize(out, getattr(PIL.Image, resample.upper()))
    else:
        theirs = theirs.resize(out, getattr(PIL.Image, resample.upper()), box=box)
    assert np.abs(ours(".jpg", small).astype(np.int16) - np.asarray(theirs)).max() <= 2


# --- specs, modes and formats -------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, kind, shape, dtype",
    [
        ("rgb8", np.ndarray, (24, 24, 3), np.uint8),
        ("rgb", np.ndarray, (24, 24, 3), np.float32),
        ("l8", np.ndarray, (24, 24), np.uint8),
        ("rgba8", np.ndarray, (24, 24, 4), np.uint8),
        pytest.param("torchrgb8", torch_attr("Tensor"), (3, 24, 24), torch_attr("uint8"), marks=needs_torch),
        pytest.param("torchrgb", torch_attr("Tensor"), (3, 24, 24), torch_attr("float32"), marks=needs_torch),
        pytest.param("torchl", torch_attr("Tensor"), (24, 24), torch_attr("float32"), marks=needs_torch),
    ],
)
@pytest.mark.parametrize("source", ["jpeg-rgb", "jpeg-l", "png-rgba", "png-p", "png-l", "jpeg-cmyk"])
@pytest.mark.parametrize("backend, resizer", PAIRS)
@needs_torch
def test_every_spec_from_every_mode(spec, kind, shape, dtype, source, backend, resizer):
    fmt, mode = source.split("-")
    data = encode(photo(80, 60, seed=4), "JPEG" if fmt == "jpeg" else "PNG", mode.upper())
    handler = wds.imagehandler(spec, size=24, crop="center", backend=backend, resizer=resizer)
    out = handler(".x." + fmt, data)
    assert isinstance(out, kind) and tuple(out.shape) == shape and out.dtype == dtype
    # The plain spec's decode (its mode conversion), then the same box resized.
    target = wds.autodecode.imagespecs[spec][2]
    box, size = handler.geometry(80, 60)
    reference = plain(data, box, size, {"l": "pill", "rgb": "pil", "rgba": "pilrgba"}[target])
    array = out.numpy() if kind is not np.ndarray else out
    if array.ndim == 3 and kind is not np.ndarray:
        assert out.is_contiguous()  # CHW, as the plain spec gives
        array = array.transpose(1, 2, 0)
    else:
        assert array.flags.c_contiguous
    if array.dtype == np.float32:
        array = (array * 255).round()
    assert difference(array, reference)[0] <= MEAN_TOLERANCE  # 53 px of box for 24: drafted at 1/2


@pytest.mark.parametrize("resizer", ["pillow", "torch"])
@needs_torch
def test_pil_spec_gives_a_plain_image(small, resizer):
    image = wds.imagehandler("pil", size=(20, 30), crop="center", resizer=resizer)(".jpg", small)
    assert isinstance(image, PIL.Image.Image) and image.size == (30, 20) and image.mode == "RGB"


def test_a_truncated_jpeg_fails_as_in_the_plain_path(small):
    for backend in INSTALLED_BACKENDS:
        handler = wds.imagehandler("rgb8", size=32, crop="center", backend=backend)
        with pytest.raises(OSError):
            handler(".jpg", small[: len(small) // 2])


@needs_torch
def test_handler_skips_other_fields_and_pickles(small):
    handler = wds.imagehandler("rgb8", ["jpg"], size=16, crop="random")
    assert handler(".png", small) is None and handler.accepts(".a.jpg") and not handler.accepts(".txt")
    copy = pickle.loads(pickle.dumps(handler))
    assert copy(".jpg", small).shape == (16, 16, 3)
    fast = pickle.loads(pickle.dumps(wds.imagehandler("rgb8", size=16, crop="center", resizer="torch")))
    assert fast.resizer == "torch" and fast(".jpg", small).shape == (16, 16, 3)
    seeded = pickle.loads(pickle.dumps(wds.imagehandler("rgb8", size=16, crop="random", seed=1)))
    assert np.array_equal(seeded(".jpg", small), wds.imagehandler("rgb8", size=16, crop="random", seed=1)(".jpg", small))


@pytest.mark.parametrize(
    "options",
    [{"crop": "center"}, {"size": 0}, {"size": (1, 2, 3)}, {"size": 8, "crop": "middle"},
     {"size": 8, "backend": "turbo"}, {"size": 8, "resample": "sinc"}, {"size": 8, "crop_fraction": 0},
     {"size": 8, "resizer": "cv2"}, {"size": 8, "resizer": "torch", "resample": "lanczos"}],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError):
        wds.imagehandler("rgb8", **options)


@needs_torch
def test_in_a_pipeline(tmp_path, small):
    with wds.TarWriter(str(tmp_path / "i.tar")) as sink:
        for i in range(5):
            sink.write({"__key__": f"s{i}", "jpg": small, "cls": str(i).encode()})
    dataset = (
        wds.WebDataset(str(tmp_path / "i.tar"), shardshuffle=False)
        .decode(wds.imagehandler("torchrgb8", size=224, crop="center"))
        .to_tuple("jpg", "cls")
        .batched(5)
    )
    images, labels = next(iter(dataset))
    assert tuple(images.shape) == (5, 3, 224, 224) and list(labels) == [0, 1, 2, 3, 4]
    assert all(torch.equal(images[0], image) for image in images)  # the same JPEG five times


@needs_torch
def test_auto_picks_the_fastest_installed_pair_and_never_imports_torch():
    handler = wds.imagehandler("rgb8", size=224, crop="random")
    assert (handler.backend, handler.resizer) == ("simplejpeg", "torch")  # both installed, torch imported here
    assert wds.imagehandler("rgb8", size=224, resample="lanczos").resizer == "pillow"  # not a torch kernel
    assert pickle.loads(pickle.dumps(handler)).resizer == "torch"  # a worker's copy keeps the choice
    script = (
        "import sys, shardstream as wds\n"
        "h = wds.imagehandler('rgb8', size=224, crop='center')\n"
        "print(h.backend, h.resizer, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["simplejpeg", "pillow", "False"]


@needs_torch
def test_torch_resizer_uses_one_intra_op_thread_per_pool_thread_only(tmp_path, small):
    """Nested intra-op threads only oversubscribe the decode pool's cores: each pool thread gets
    one (OpenMP keeps it per thread); the caller's own setting is left alone."""
    with wds.TarWriter(str(tmp_path / "i.tar")) as sink:
        for i in range(8):
            sink.write({"__key__": f"s{i}", "jpg": small})
    before = torch.get_num_threads()
    if before == 1:
        pytest.skip("torch runs one intra-op thread here already: nothing to show")
    dataset = (
        wds.WebDataset(str(tmp_path / "i.tar"), shardshuffle=False)
        .decode(wds.imagehandler("rgb8", size=224, crop="center", resizer="torch"))
        .map(lambda sample: torch.get_num_threads())  # runs on the pool thread that decoded
        .with_engine(threads=2)
    )
    assert set(dataset) == {1}
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fused_path_keeps_pillows_decompression_bomb_limit(backend, monkeypatch):
    """An image over twice Pillow's MAX_IMAGE_PIXELS is refused as `.decode("rgb8")` refuses it:
    simplejpeg decoded such a JPEG (a 333-byte header claiming 65500x65500 cost ~1 s and 200 MB)
    where the plain path raised DecompressionBombError at once."""
    import PIL.Image

    data = encode(photo(80, 60, seed=1), "JPEG", "RGB")
    handler = wds.imagehandler("rgb8", size=24, crop="center", backend=backend)
    assert handler(".jpg", data).shape == (24, 24, 3)
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 1000)  # 4,800 pixels: over twice the limit
    with pytest.raises(PIL.Image.DecompressionBombError):
        handler(".jpg", data)
    with pytest.raises(PIL.Image.DecompressionBombError):
        wds.imagehandler("rgb8")(".jpg", data)  # (the plain path, the reference)
