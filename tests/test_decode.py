"""Differential tests: shardstream.autodecode against webdataset 1.0.2's autodecode.

Every sample is built from real encoded payloads and decoded by both libraries; results must be
equal value by value (arrays and tensors with dtype and shape, PIL images with mode, size and
pixels). Pickle decoding is the one deliberate divergence: refused unless enabled.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import sys
import threading

import cbor2
import msgpack
import numpy as np
import PIL.Image
import pytest
import webdataset.autodecode as wa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webdataset import tenbin as wtenbin

import shardstream._decode.basic as _decode
import shardstream.autodecode as sa
from shardstream._decode import tenbin as _tenbin
from shardstream._base.errors import ShardStreamError, UsageError
from needs import needs_torch, optional

torch = optional("torch")

IMAGE_SPECS = sorted(wa.imagespecs)


# --- helpers --------------------------------------------------------------------------------------


def assert_same(ours, theirs, where="value"):
    """Assert two decoded values are equal, including dtypes, shapes and image modes."""
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), where
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        np.testing.assert_array_equal(ours, theirs, err_msg=where)
    elif torch is not None and isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), where
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert torch.equal(ours, theirs), where
    elif isinstance(theirs, PIL.Image.Image):
        assert isinstance(ours, PIL.Image.Image), where
        assert (ours.mode, ours.size) == (theirs.mode, theirs.size), where
        assert ours.tobytes() == theirs.tobytes(), where
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and sorted(ours) == sorted(theirs), where
        for k in theirs:
            assert_same(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert type(ours) is type(theirs), (where, type(ours), type(theirs))
        assert ours == theirs, where


def encode_image(array, fmt, mode=None, **opts):
    image = PIL.Image.fromarray(array, mode) if mode else PIL.Image.fromarray(array)
    with io.BytesIO() as stream:
        image.save(stream, format=fmt, **opts)
        return stream.getvalue()


def rng_image(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def palette_png():
    image = PIL.Image.fromarray(rng_image((9, 7), 3) % 16).convert("P")
    image.info["transparency"] = 0
    with io.BytesIO() as stream:
        image.save(stream, format="PNG", transparency=0)
        return stream.getvalue()


def npy_bytes(array):
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def npz_bytes(**arrays):
    stream = io.BytesIO()
    np.savez(stream, **arrays)
    return stream.getvalue()


IMAGES = {
    "jpg": encode_image(rng_image((17, 23, 3)), "JPEG", quality=90),
    "png": encode_image(rng_image((11, 13, 4), 1), "PNG"),  # RGBA
    "seg.png": encode_image(rng_image((8, 6), 2), "PNG"),  # grayscale, multi-dot key
    "pal.png": palette_png(),
    "i16.png": encode_image((rng_image((5, 4), 4).astype(np.uint16) * 200), "PNG"),
    "bmp": encode_image(rng_image((6, 5, 3), 5), "BMP"),
    "webp": encode_image(rng_image((6, 5, 3), 6), "WEBP", lossless=True),
    "ppm": encode_image(rng_image((6, 5, 3), 7), "PPM"),
    "tiff": encode_image(rng_image((6, 5, 3), 8), "TIFF"),
}

TEN = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, -2, 3], dtype=np.int16)]

BASIC = {
    "txt": "héllo wörld\n".encode("utf-8"),
    "text": b"plain",
    "transcript": b"spoken words",
    "cls": b"7",
    "cls2": b" 12\n",
    "index": b"3",
    "inx": b"4",
    "id": b"-5",
    "class": b"9",  # webdataset does not decode these two: they stay bytes
    "count": b"10",
    "json": json.dumps({"a": [1, 2.5, None], "b": "ü"}).encode("utf-8"),
    "jsn": b"[1, 2, 3]",
    "npy": npy_bytes(np.arange(24, dtype=np.float64).reshape(2, 3, 4)),
    "npz": npz_bytes(x=np.arange(5), y=np.eye(2, dtype=np.float32)),
    "mp": msgpack.packb({"k": [1, 2, b"raw"], "s": "str"}),
    "msg": msgpack.packb([1.5, "two"]),
    "ten": bytes(wtenbin.encode_buffer(TEN)),
    "tb": bytes(wtenbin.encode_buffer([np.ones((2, 2), dtype=np.uint8)])),
    "txt.gz": gzip.compress(b"compressed text"),
    "json.gz": gzip.compress(b'{"z": 1}'),
    "bin": b"\x00\x01opaque",
    "TXT": b"upper-case key: not a basic extension",
    "JPG": IMAGES["jpg"],
}


def full_sample():
    sample = {"__key__": b"dir/sample001", "__url__": "/data/shard-000.tar", "__local_path__": b"/x"}
    sample.update(IMAGES)
    sample.update(BASIC)
    return sample


def both(handlers_fn, sample, **kw):
    """Decode `sample` with a Decoder from each library; handlers_fn(module) builds handlers."""
    ours = sa.Decoder(handlers_fn(sa), **kw)(dict(sample))
    theirs = wa.Decoder(handlers_fn(wa), **kw)(dict(sample))
    return ours, theirs


@pytest.fixture(autouse=True)
def _pickle_defaults(monkeypatch):
    """Each test starts with pickle refused: no switch set, no environment variable."""
    monkeypatch.delenv("SHARDSTREAM_ALLOW_PICKLE", raising=False)
    previous = sa.allow_pickle(None)
    yield
    sa.allow_pickle(previous)


# --- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", IMAGE_SPECS)
@needs_torch
def test_every_image_spec_matches_webdataset(spec):
    ours, theirs = both(lambda m: [m.imagehandler(spec)], full_sample())
    assert_same(ours, theirs)
    # The decoded values really are images of the promised kind (not left as bytes).
    atype, etype, mode = wa.imagespecs[spec]
    value = ours["jpg"]
    if atype == "pil":
        assert value.mode == mode.upper()
    else:
        channels = {"l": None, "rgb": 3, "rgba": 4}[mode]
        shape = value.shape
        if channels is not None:
            assert channels in (shape[0] if atype == "torch" else shape[-1],)
        if etype == "float":
            assert float(value.max()) <= 1.0 and float(value.min()) >= 0.0


def test_image_spec_list_and_extensions_are_webdataset_s():
    assert sa.imagespecs == wa.imagespecs
    assert sa.IMAGE_EXTENSIONS == wa.IMAGE_EXTENSIONS


def test_unknown_image_spec_is_refused_like_webdataset():
    with pytest.raises(ValueError):
        wa.imagehandler("RGB8")
    with pytest.raises(ValueError):
        sa.imagehandler("RGB8")


def test_image_handler_with_own_extensions():
    sample = {"__key__": "k", "jpg": IMAGES["jpg"], "png": IMAGES["png"], "JPG": IMAGES["jpg"]}
    ours, theirs = both(lambda m: [m.ImageHandler("rgb8", extensions=["png"])], sample)
    assert_same(ours, theirs)
    assert isinstance(ours["jpg"], bytes) and isinstance(ours["png"], np.ndarray)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    height=st.integers(1, 12),
    width=st.integers(1, 12),
    mode=st.sampled_from(["L", "RGB", "RGBA", "LA", "P", "1"]),
    fmt=st.sampled_from(["PNG", "JPEG", "BMP"]),
    spec=st.sampled_from(IMAGE_SPECS),
    seed=st.integers(0, 1000),
)
@needs_torch
def test_random_images_match_webdataset(height, width, mode, fmt, spec, seed):
    image = PIL.Image.fromarray(rng_image((height, width, 3), seed)).convert(mode)
    if fmt != "PNG" and mode not in ("L", "RGB"):
        fmt = "PNG"  # JPEG and BMP cannot hold these modes
    with io.BytesIO() as stream:
        image.save(stream, format=fmt)
        data = stream.getvalue()
    ext = {"PNG": "png", "JPEG": "jpg", "BMP": "bmp"}[fmt]
    ours, theirs = both(lambda m: [m.imagehandler(spec)], {"__key__": "k", ext: data})
    assert_same(ours, theirs)


# --- JPEGs through simplejpeg (array specs) --------------------------------------------------------


def jpeg_kinds():
    """JPEGs of every kind the fast path meets or must leave to Pillow, from one smooth image of
    odd size (so that chroma subsampling has edges to get wrong)."""
    smooth = PIL.Image.fromarray(rng_image((4, 5, 3), 7)).resize((131, 97), PIL.Image.BICUBIC)
    exif = PIL.Image.Exif()
    exif[0x010F] = "shardstream"  # Make
    kinds = {}
    for name, image, opts in [
        ("ycbcr 4:4:4", smooth, {"subsampling": 0}), ("ycbcr 4:2:2", smooth, {"subsampling": 1}),
        ("ycbcr 4:2:0", smooth, {"subsampling": 2, "quality": 40}), ("progressive", smooth, {"progressive": True}),
        ("optimized", smooth, {"optimize": True, "quality": 95}), ("gray", smooth.convert("L"), {}),
        ("cmyk", smooth.convert("CMYK"), {}), ("with exif", smooth, {"exif": exif.tobytes()}),
    ]:
        with io.BytesIO() as stream:
            image.save(stream, format="JPEG", **opts)
            kinds[name] = stream.getvalue()
    whole = kinds["ycbcr 4:2:0"]
    kinds["truncated"] = whole[: len(whole) // 2]
    kinds["corrupt scan"] = whole[:-200] + bytes(190) + whole[-10:]
    kinds["header only"] = whole[:40]
    return kinds


def _decoded(handler, data):
    try:
        return handler("x.jpg", data)
    except Exception as exn:
        return ("raised", type(exn))


@pytest.mark.parametrize("spec", IMAGE_SPECS)
def test_jpegs_of_every_kind_match_webdataset(spec):
    """Bit for bit, with simplejpeg (where installed) decoding array specs of YCbCr and gray JPEGs: results,
    dtypes and shapes equal webdataset's (Pillow's), PIL images with their info, and what Pillow
    refuses (a cut-short or corrupt file) raises the same error type."""
    for kind, data in jpeg_kinds().items():
        ours, theirs = _decoded(sa.ImageHandler(spec), data), _decoded(wa.ImageHandler(spec), data)
        if isinstance(theirs, tuple):
            assert ours == theirs, (spec, kind)
        else:
            assert_same(ours, theirs, f"{spec} {kind}")
        if isinstance(theirs, PIL.Image.Image):  # what convert() of the loaded file gives, in full
            assert type(ours) is type(theirs) and ours.info == theirs.info, (spec, kind)
            assert (ours.format, ours.readonly) == (theirs.format, theirs.readonly), (spec, kind)


def test_array_specs_of_ycbcr_and_gray_jpegs_skip_pillows_decoder(monkeypatch):
    pytest.importorskip("simplejpeg")
    import PIL.ImageFile

    from shardstream._decode import image as _image

    opened, loaded = [], []
    real_open, real_load = PIL.Image.open, PIL.ImageFile.ImageFile.load
    monkeypatch.setattr(PIL.Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    monkeypatch.setattr(PIL.ImageFile.ImageFile, "load", lambda self: loaded.append(1) or real_load(self))
    kinds = jpeg_kinds()

    def pillow(spec, kind):
        """Whether Pillow opened the file, and whether it decoded it."""
        opened.clear(), loaded.clear()
        _decoded(sa.ImageHandler(spec), kinds[kind])
        return bool(opened), bool(loaded)

    for kind in ("ycbcr 4:4:4", "ycbcr 4:2:0", "progressive", "gray", "with exif"):
        for spec in ("rgb8", "rgb", "torchrgb8", "torchrgb", "torch"):
            assert pillow(spec, kind) == (False, False), (spec, kind)
        for spec in ("pil", "pilrgb"):  # a PIL image keeps the file's info (ICC, EXIF, DPI): Pillow's
            assert pillow(spec, kind) == (True, True), (spec, kind)
    for spec in ("l8", "torchl"):
        assert not pillow(spec, "gray")[1]
    assert pillow("l8", "ycbcr 4:2:0")[1]  # Pillow's luma of the RGB pixels, not the Y channel
    assert pillow("pill", "ycbcr 4:2:0")[1] and pillow("pilrgba", "ycbcr 4:2:0")[1]
    assert pillow("rgb8", "cmyk")[1] and pillow("pil", "cmyk")[1] and pillow("rgba8", "ycbcr 4:2:0")[1]
    assert pillow("rgb8", "truncated")[1] and pillow("pil", "corrupt scan")[1]  # Pillow decides
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 1000)  # over twice the limit: Pillow's decompression-bomb error
    assert pillow("rgb8", "gray")[0] and _decoded(sa.ImageHandler("rgb8"), kinds["gray"]) == (
        "raised", PIL.Image.DecompressionBombError)
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", None)
    assert not pillow("rgb8", "gray")[1]
    monkeypatch.setattr(_image, "_simplejpeg_module", None)  # SHARDSTREAM_SIMPLEJPEG=0, or not installed
    assert pillow("rgb8", "ycbcr 4:2:0")[1] and pillow("pil", "ycbcr 4:2:0")[1]


# --- basic handlers -------------------------------------------------------------------------------


def test_basic_handlers_match_webdataset():
    sample = {k: v for k, v in full_sample().items() if k not in IMAGES}
    ours, theirs = both(lambda m: [], sample)
    assert_same(ours, theirs)
    assert ours["txt"] == "héllo wörld\n" and ours["cls2"] == 12 and ours["txt.gz"] == "compressed text"
    assert ours["json.gz"] == {"z": 1} and ours["class"] == b"9"
    assert ours["__key__"] == "dir/sample001" and ours["__local_path__"] == "/x"


def test_default_decoder_and_basichandlers_directly():
    sample = {"__key__": "k", "cls": b"3", "json": b"{}"}
    assert_same(sa.default_decoder(dict(sample)), wa.default_decoder(dict(sample)))
    for key, data in BASIC.items():
        if key.endswith(".gz"):
            continue
        assert_same(sa.basichandlers("." + key, data), wa.basichandlers("." + key, data), key)
    assert sorted(sa.decoders) == sorted(wa.decoders)


def test_cbor_decodes_with_cbor2_where_webdataset_lacks_its_cbor_module():
    value = {"a": [1, 2.5, "x"], "b": b"raw"}
    decoded = sa.Decoder([])({"__key__": "k", "cbor": cbor2.dumps(value)})
    assert decoded["cbor"] == value
    try:
        import cbor  # noqa: F401
    except ImportError:
        with pytest.raises(wa.DecodingError):
            wa.Decoder([])({"__key__": "k", "cbor": cbor2.dumps(value)})


def test_npy_object_arrays_are_refused_like_webdataset():
    data = npy_bytes(np.array([{"a": 1}], dtype=object))
    with pytest.raises(wa.DecodingError):
        wa.Decoder([])({"npy": data})
    with pytest.raises(sa.DecodingError):
        sa.Decoder([])({"npy": data})


def test_gzfilter_matches_webdataset():
    data = gzip.compress(b"abc" * 100) + gzip.compress(b"second member")
    ours, theirs = sa.gzfilter(".txt.gz", data), wa.gzfilter(".txt.gz", data)
    assert (ours.key, ours.data) == (theirs.key, theirs.data)
    assert sa.gzfilter(".txt", data) is None


# --- tenbin -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arrays",
    [
        TEN,
        [np.zeros((0, 3), dtype=np.float64)],
        [
            np.arange(7, dtype=np.uint8),
            np.ones((2, 3, 4), dtype=np.float16),
            np.array([2**40], dtype=np.int64),
        ],
        [np.arange(6, dtype=np.int32).reshape(2, 3).T],  # non-contiguous
    ],
)
def test_tenbin_is_byte_identical_to_webdataset(arrays):
    ours = _tenbin.encode_buffer(arrays)
    if all(a.flags.c_contiguous for a in arrays):
        assert bytes(ours) == bytes(wtenbin.encode_buffer(arrays))
    assert_same(_tenbin.decode_buffer(bytes(ours)), [np.ascontiguousarray(a) for a in arrays])
    if all(a.flags.c_contiguous for a in arrays):
        assert_same(_tenbin.decode_buffer(bytes(ours)), wtenbin.decode_buffer(bytes(ours)))


def test_tenbin_handles_what_webdataset_cannot():
    for arrays in ([np.array([1, 2**31], dtype=np.uint32)], [np.array(3.5)]):
        assert_same(_tenbin.decode_buffer(_tenbin.encode_buffer(arrays)), arrays)
    with pytest.raises(ValueError):
        _tenbin.decode_buffer(b"not tenbin" + bytes(54))
    with pytest.raises(ValueError):
        _tenbin.encode_buffer([np.array(["s"])])
    arrays, infos = _tenbin.decode_buffer(_tenbin.encode_buffer(TEN, infos=["a", "bb"]), infos=True)
    assert infos == ["a", "bb"]


# --- Decoder semantics ------------------------------------------------------------------------------


def test_only_limits_decoding_like_webdataset():
    sample = full_sample()
    for only in ("jpg cls", ["json", "png"], {"txt.gz"}):
        ours, theirs = both(lambda m: [m.imagehandler("rgb8")], sample, only=only)
        assert_same(ours, theirs)
    ours = sa.Decoder([sa.imagehandler("rgb8")], only="jpg cls")(full_sample())
    assert isinstance(ours["png"], bytes) and isinstance(ours["jpg"], np.ndarray) and ours["cls"] == 7


def test_partial_passes_decoded_values_through():
    sample = {"__key__": "k", "cls": 5, "txt": b"x", "json": {"already": "decoded"}}
    ours, theirs = both(lambda m: [], sample, partial=True)
    assert_same(ours, theirs)
    with pytest.raises(sa.DecodingError):
        sa.Decoder([])(dict(sample))
    with pytest.raises(wa.DecodingError):
        wa.Decoder([])(dict(sample))


def test_none_value_is_an_error_in_both():
    with pytest.raises(sa.DecodingError):
        sa.Decoder([], partial=True)({"__key__": "k", "txt": None})
    with pytest.raises(wa.DecodingError):
        wa.Decoder([], partial=True)({"__key__": "k", "txt": None})


def test_custom_pre_and_post_handlers():
    def upper_pre(key, data):
        return data.upper() if key.endswith(".txt") else None

    def tag_post(key, data):
        return ("post", key, data)

    sample = {"__key__": "k", "txt": b"abc", "bin": b"zz", "cls": b"1", "txt.gz": gzip.compress(b"q")}
    options = [
        {"pre": [upper_pre]},
        {"post": [tag_post]},
        {"pre": [], "post": []},
        {"pre": [upper_pre], "post": [tag_post]},
    ]
    for kw in options:
        ours, theirs = both(lambda m: [], sample, **kw)
        assert_same(ours, theirs, str(kw))


def test_handler_precedence_first_non_none_wins():
    calls = {"ours": [], "theirs": []}

    def make(name, result, log):
        def handler(key, data):
            log.append((name, key))
            return result(key, data)

        return handler

    def handlers(m):
        log = calls["ours" if m is sa else "theirs"]
        return [
            make("none", lambda k, d: None, log),
            m.handle_extension("cls", lambda d: "first"),
            m.handle_extension("cls txt", lambda d: "second"),
            make("all", lambda k, d: "catch-all", log),
        ]

    sample = {"__key__": "k", "cls": b"1", "txt": b"t", "jpg": IMAGES["jpg"]}
    ours, theirs = both(handlers, sample)
    assert_same(ours, theirs)
    assert ours == {"__key__": "k", "cls": "first", "txt": "second", "jpg": "catch-all"}
    assert calls["ours"] == calls["theirs"]


def test_continue_runs_only_the_handlers_after_it():
    def handlers(m):
        def rename(key, data):
            if key.endswith(".weird"):
                return m.Continue(key[: -len(".weird")] + ".json", data)
            return None

        return [
            m.handle_extension("json", lambda d: "early json handler"),  # before: must not run
            rename,
            m.handle_extension("json", lambda d: ("late", json.loads(d))),
        ]

    sample = {"__key__": "k", "a.weird": b'{"x": 1}', "json": b"[]", "weird.gz": gzip.compress(b"{}")}
    ours, theirs = both(handlers, sample)
    assert_same(ours, theirs)
    assert ours["a.weird"] == ("late", {"x": 1})


def test_continue_without_a_match_returns_the_new_data():
    def handlers(m):
        return [lambda key, data: m.Continue(key + ".x", data + b"!") if not key.endswith(".x") else None]

    ours, theirs = both(handlers, {"__key__": "k", "bin": b"data"})
    assert_same(ours, theirs)
    assert ours["bin"] == b"data!"


def test_handle_extension_dotted_and_case_insensitive():
    def handlers(m):
        return [m.handle_extension("SEG.png", lambda d: "seg"), m.handle_extension("png", lambda d: "png")]

    sample = {"__key__": "k", "x.seg.png": b"", "seg.png": b"", "png": b"", "x.SEG.PNG": b"", "pngx": b""}
    ours, theirs = both(handlers, sample)
    assert_same(ours, theirs)
    assert ours["x.seg.png"] == "seg" and ours["png"] == "png" and ours["pngx"] == b""
    assert sa.call_extension_handler(".a.jpg", b"", lambda d: 1, ["jpg"]) == 1
    assert wa.call_extension_handler(".a.jpg", b"", lambda d: 1, ["jpg"]) == 1


def test_editing_handlers_after_first_use_takes_effect():
    decoder = sa.Decoder([])
    assert decoder({"bin": b"x"})["bin"] == b"x"
    decoder.handlers.insert(0, sa.handle_extension("bin", lambda d: "now decoded"))
    assert decoder({"bin": b"x"})["bin"] == "now decoded"
    decoder.handlers = [lambda k, d: "replaced"]
    assert decoder.decode1("bin", b"x") == "replaced"


def test_handlers_that_cannot_match_a_field_are_not_asked(monkeypatch):
    asked = []
    original = sa.ImageHandler.__call__

    def spy(self, key, data):
        asked.append(key)
        return original(self, key, data)

    monkeypatch.setattr(sa.ImageHandler, "__call__", spy)
    decoder = sa.Decoder([sa.imagehandler("rgb8")])
    sample = {"__key__": "k", "cls": b"1", "json": b"{}", "jpg": IMAGES["jpg"], "seg.png": IMAGES["seg.png"]}
    result = decoder(sample)
    assert sorted(asked) == [".jpg", ".seg.png"] and result["cls"] == 1


def test_decode1_matches_webdataset():
    ours = sa.Decoder([sa.imagehandler("l8")])
    theirs = wa.Decoder([wa.imagehandler("l8")])
    for key in ("jpg", "png", "seg.png", "txt.gz", "json.gz", "cls", "bin"):
        data = IMAGES.get(key) or BASIC[key]
        assert_same(ours.decode1(key, data), theirs.decode1(key, data), key)


def test_metadata_keys_pass_through_and_bad_utf8_stays_bytes():
    sample = {"__key__": b"\xff\xfe", "__url__": b"u", "__other__": 3, "txt": b"x"}
    ours, theirs = both(lambda m: [], sample)
    assert_same(ours, theirs)


def test_decoding_error_carries_the_sample_location():
    sample = {"__key__": "s1", "__url__": "https://user:pw@host/shard.tar", "json": b"{not json"}
    with pytest.raises(wa.DecodingError):
        wa.Decoder([])(dict(sample))
    with pytest.raises(sa.DecodingError) as info:
        sa.Decoder([])(dict(sample))
    error = info.value
    assert isinstance(error, ShardStreamError)
    assert (error.key, error.k, error.sample) == ("s1", "json", sample)
    assert error.url == "https://***@host/shard.tar" and "pw" not in str(error)
    assert isinstance(error.__cause__, json.JSONDecodeError)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.key, copy.k, copy.url) == (sa.DecodingError, "s1", "json", error.url)


def test_decoder_argument_checks_match_webdataset():
    for module in (sa, wa):
        with pytest.raises(AssertionError):
            module.Decoder("not a list")
        with pytest.raises(AssertionError):
            module.Decoder([3])


# --- pickle: refused by default, three ways to enable -----------------------------------------------


def pickled_sample():
    payload = {"list": [1, 2], "array": np.arange(3)}
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(4.0), "meta": {"a": 1}}, buffer)
    return {
        "__key__": "p",
        "pyd": pickle.dumps(payload),
        "pickle": pickle.dumps(("t", 1)),
        "pkl": pickle.dumps({1, 2}),
        "pth": buffer.getvalue(),
    }


@pytest.mark.parametrize("field", ["pyd", "pickle", "pkl", "pth"])
@needs_torch
def test_pickle_is_refused_by_default(field):
    sample = {"__key__": "p", field: pickled_sample()[field]}
    with pytest.raises(UsageError) as info:
        sa.Decoder([])(sample)
    message = str(info.value)
    assert "allow_pickle" in message and "SHARDSTREAM_ALLOW_PICKLE" in message
    assert info.value.member == f"p.{field}"
    with pytest.raises(UsageError):
        sa.basichandlers("." + field, sample[field])


@needs_torch
def test_pickle_enabled_by_switch_matches_webdataset():
    assert sa.allow_pickle(True) is None
    ours, theirs = both(lambda m: [], pickled_sample())
    assert_same(ours, theirs)
    assert sa.allow_pickle(False) is True
    with pytest.raises(UsageError):
        sa.Decoder([])(pickled_sample())


@needs_torch
def test_pickle_enabled_by_environment(monkeypatch):
    monkeypatch.setenv("SHARDSTREAM_ALLOW_PICKLE", "1")
    ours, theirs = both(lambda m: [], pickled_sample())
    assert_same(ours, theirs)
    monkeypatch.setenv("SHARDSTREAM_ALLOW_PICKLE", "0")
    with pytest.raises(UsageError):
        sa.Decoder([])(pickled_sample())


@needs_torch
def test_pickle_enabled_per_decoder_and_only_inside_it():
    ours = sa.Decoder([], allow_pickle=True)(pickled_sample())
    assert_same(ours, wa.Decoder([])(pickled_sample()))
    data = pickled_sample()["pyd"]
    assert_same(sa.Decoder([], allow_pickle=True).decode1("pyd", data), wa.Decoder([]).decode1("pyd", data))
    assert not sa.pickle_allowed()
    with pytest.raises(UsageError):
        sa.Decoder([])(pickled_sample())
    sa.allow_pickle(True)
    with pytest.raises(UsageError):  # an explicit False on the decoder wins over the switch
        sa.Decoder([], allow_pickle=False)(pickled_sample())


def test_per_decoder_permission_does_not_leak_across_threads():
    started, release, seen = threading.Event(), threading.Event(), []

    def slow(key, data):
        started.set()
        release.wait(5)
        return None

    allowed = sa.Decoder([slow], allow_pickle=True)
    thread = threading.Thread(target=lambda: allowed({"bin": b"x"}))
    thread.start()
    started.wait(5)
    seen.append(sa.pickle_allowed())
    release.set()
    thread.join()
    assert seen == [False]


@needs_torch
def test_weights_only_torch_load_needs_no_opt_in(monkeypatch):
    monkeypatch.setattr(_decode, "pytorch_weights_only", True)
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3)}, buffer)
    result = sa.Decoder([])({"pth": buffer.getvalue()})
    assert torch.equal(result["pth"]["w"], torch.arange(3))


# --- video and audio ----------------------------------------------------------------------------------


@needs_torch
def test_video_and_audio_handlers_exist_and_fail_clearly(monkeypatch):
    assert sa.torch_video(".txt", b"") is None and sa.torch_audio(".jpg", b"") is None
    # webdataset's extension lists, case-sensitive as there: other fields stay bytes.
    assert sa.torch_video(".mkv", b"x") is None and sa.torch_audio(".opus", b"x") is None
    assert sa.torch_video(".MP4", b"x") is None
    pytest.importorskip("av")
    with pytest.raises(ValueError, match="mp4"):
        sa.torch_video(".mp4", b"not media")
    with pytest.raises(ValueError, match="wav"):
        sa.torch_audio(".wav", b"not media")
    # Without PyAV (and without the old backends): a UsageError saying what to install.
    from shardstream._decode import torchmedia as _mediadecode

    monkeypatch.setattr(_mediadecode, "_have_av", lambda: False)
    for module in ("torchvision", "torchvision.io", "torchaudio"):
        monkeypatch.setitem(sys.modules, module, None)
    for handler, key in ((sa.torch_video, ".mp4"), (sa.torch_audio, ".wav")):
        with pytest.raises(UsageError, match="pip install av"):
            handler(key, b"not media")


def test_decoding_error_names_the_reason_and_keeps_it_across_pickling():
    sample = {"__key__": "s1", "__url__": "/data/shard.tar", "json": b"{not json"}
    with pytest.raises(sa.DecodingError) as info:
        sa.Decoder([])(dict(sample))
    error = info.value
    assert error.reason.startswith("JSONDecodeError:") and error.reason in str(error)
    assert "s1" in str(error) and "'json'" in str(error) and "/data/shard.tar" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.reason == error.reason and str(copy) == str(error)
    ours = sa.DecodingError("u", "k", "f")  # webdataset's positional form still fits ours
    assert (ours.url, ours.key, ours.k, ours.reason) == ("u", "k", "f", None)


@pytest.mark.parametrize("edit", ["replace", "in place"])
def test_a_handlers_extensions_edited_between_samples_take_effect(edit):
    """The decoder remembers which handlers may match each field name; webdataset asks every
    handler every time, so a handler whose `extensions` change must be asked again."""
    buffer = io.BytesIO()
    PIL.Image.new("RGB", (4, 3)).save(buffer, "JPEG")
    sample = {"__key__": "a", "jpg": buffer.getvalue()}
    results = []
    for module in (wa, sa):
        handler = module.ImageHandler("l8", ["png"])
        decoder = module.Decoder([handler])
        before = decoder(dict(sample))["jpg"]
        if edit == "replace":
            handler.extensions = {"jpg", "png"}
        else:
            handler.extensions.append("jpg") if isinstance(handler.extensions, list) else handler.extensions.add("jpg")
        results.append((type(before), type(decoder(dict(sample))["jpg"])))
    assert results[0] == results[1] == (bytes, np.ndarray)
