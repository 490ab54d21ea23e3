"""videohandler: frame selection, resize, output specs and layouts, on clips made with PyAV."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

import shardstream as wds
from shardstream._decode.video import VideoOptions, decode_video

from mediagen import can_encode, level, make_video, video_params
from needs import needs_torch, optional, torch_attr

torch = optional("torch")


def indices(frames) -> list:
    """Which source frame each decoded frame is, from its grey level."""
    array = frames.numpy() if torch is not None and isinstance(frames, torch.Tensor) else np.asarray(frames)
    means = array.reshape(len(array), -1).astype(np.float64).mean(axis=1)
    return [int(round((m - 16) / 8)) for m in means]


@pytest.fixture(scope="module")
def clip():
    return make_video("mp4", frames=30, size=(32, 48), fps=10)  # 3 s


@pytest.mark.parametrize("ext", video_params())
def test_every_container_decodes_all_frames(ext):
    data = make_video(ext, frames=8)
    frames = wds.videohandler()("." + ext, data)
    assert frames.shape == (8, 32, 48, 3) and frames.dtype == np.uint8
    assert indices(frames) == list(range(8))


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"frames": 5}, [0, 1, 2, 3, 4]),
        ({"uniform": 4}, [0, 10, 19, 29]),
        ({"uniform": 3, "start": 1.0, "end": 2.0}, [10, 14, 19]),  # numpy rounds 4.5 to 4
        ({"start": 1.0, "end": 1.5}, [10, 11, 12, 13, 14]),
        ({"start": 2.5}, [25, 26, 27, 28, 29]),
        ({"fps": 2.5}, [0, 4, 8, 12, 16, 20, 24, 28]),
        ({"fps": 20, "frames": 6}, [0, 0, 1, 1, 2, 2]),
        ({"fps": 4, "start": 0.55, "end": 1.6}, [5, 8, 10, 13, 15]),
        ({"fps": 5, "frames": 3, "start": 2.0}, [20, 22, 24]),
    ],
)
def test_frame_selection(clip, options, expected):
    frames, info = decode_video(clip, VideoOptions(info=True, **options), "mp4")
    assert indices(frames) == expected
    assert len(info["pts"]) == len(expected) and info["fps"] == 10.0 and info["size"] == (32, 48)


@pytest.mark.parametrize("frames, rate, fps", [(12, 10, 10), (12, 10, 5), (30, 30, 30), (30, 30, 15), (24, 24, 24)])
def test_resampling_ends_with_the_clip(frames, rate, fps):
    """A clip of N frames at R fps asked for fps=F gives ceil(N / R * F) frames: no tick at the
    clip's very end (summed steps made it 1.2000000000000002 s, before the end, once)."""
    data = make_video("mp4", frames=frames, size=(32, 48), fps=rate)
    got = decode_video(data, VideoOptions(fps=fps), "mp4")
    assert len(got) == -(-frames * fps // rate)


def _mpeg_ps(frames: int = 25, rate: int = 25) -> bytes:
    """An MPEG program stream (`.mpg`): its first frame's timestamp is ~0.5 s, not 0."""
    av = pytest.importorskip("av")
    if can_encode("mpeg1video"):
        pytest.skip(str(can_encode("mpeg1video")))
    buf = io.BytesIO()
    with av.open(buf, "w", format="mpeg") as container:
        stream = container.add_stream("mpeg1video", rate=rate)
        stream.height, stream.width, stream.pix_fmt = 32, 48, "yuv420p"
        for i in range(frames):
            pixels = np.full((32, 48, 3), level(i), np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def test_windows_count_from_the_clips_first_frame_whatever_its_timestamp():
    data = _mpeg_ps()
    frames, info = decode_video(data, VideoOptions(info=True), "mpg")
    assert len(frames) == 25 and info["pts"][0] == 0.0
    assert indices(decode_video(data, VideoOptions(end=0.5), "mpg")) == list(range(13))
    assert indices(decode_video(data, VideoOptions(start=0.2, end=0.4), "mpg")) == [5, 6, 7, 8, 9]
    assert indices(decode_video(data, VideoOptions(fps=5), "mpg")) == [0, 5, 10, 15, 20]


def test_uniform_on_a_short_clip_repeats_frames(clip):
    frames = decode_video(make_video("mp4", frames=3), VideoOptions(uniform=5), "mp4")
    assert indices(frames) == [0, 0, 1, 2, 2]


def test_uniform_without_a_frame_count_spreads_over_what_is_decoded():
    frames = decode_video(make_video("webm", frames=10), VideoOptions(uniform=4), "webm")  # no count
    assert indices(frames) == [0, 3, 6, 9]


@pytest.mark.parametrize(
    "spec, layout, shape, dtype",
    [
        ("rgb8", None, (2, 32, 48, 3), np.uint8),
        ("rgb", None, (2, 32, 48, 3), np.float32),
        ("l8", None, (2, 32, 48), np.uint8),
        ("rgba8", None, (2, 32, 48, 4), np.uint8),
        pytest.param("torchrgb8", None, (2, 3, 32, 48), torch_attr("uint8"), marks=needs_torch),
        pytest.param("torchrgb", None, (2, 3, 32, 48), torch_attr("float32"), marks=needs_torch),
        pytest.param("torchrgb8", "THWC", (2, 32, 48, 3), torch_attr("uint8"), marks=needs_torch),
        pytest.param("torchrgb", "CTHW", (3, 2, 32, 48), torch_attr("float32"), marks=needs_torch),
        pytest.param("torchl8", None, (2, 32, 48), torch_attr("uint8"), marks=needs_torch),
    ],
)
def test_output_specs_and_layouts(clip, spec, layout, shape, dtype):
    frames = wds.videohandler(spec, frames=2, layout=layout)(".mp4", clip)
    assert tuple(frames.shape) == shape and frames.dtype == dtype
    channels_first = (layout or ("TCHW" if spec.startswith("torch") else "THWC")) != "THWC"
    first = frames[0, 0] if channels_first or frames.ndim == 3 else frames[0, ..., 0]  # red (or grey)
    value = float(first.max())
    expected = level(0) / 255.0 if dtype in (np.float32, torch_attr("float32")) else level(0)
    assert abs(value - expected) <= (2 / 255 if expected < 1 else 2)


def test_pil_spec_gives_a_list_of_images(clip):
    images = wds.videohandler("pil", frames=3)(".mp4", clip)
    assert [image.size for image in images] == [(48, 32)] * 3 and images[0].mode == "RGB"


@pytest.mark.parametrize("size, shape", [(16, (16, 24)), ((20, 10), (20, 10)), (64, (64, 96))])
def test_resize(clip, size, shape):
    frames = wds.videohandler(frames=2, size=size)(".mp4", clip)
    assert frames.shape == (2, *shape, 3)
    assert indices(frames) == [0, 1]  # flat frames stay flat through the scaler


def test_handler_ignores_other_fields_and_pickles(clip):
    handler = wds.videohandler(uniform=2, extensions=["clip"])
    assert handler(".mp4", clip) is None and handler.accepts(".a.clip") and not handler.accepts(".mp4")
    copy = pickle.loads(pickle.dumps(handler))
    assert indices(copy(".a.clip", clip)) == [0, 29]


@pytest.mark.parametrize(
    "options",
    [
        {"frames": 0},
        {"uniform": 2, "frames": 3},
        {"uniform": 2, "fps": 3},
        {"fps": 0},
        {"start": 2.0, "end": 1.0},
        {"start": -1.0},
        {"size": (1, 2, 3)},
        {"layout": "HWC"},
        {"spec": "RGB8"},
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError):
        wds.videohandler(**options)


def test_a_window_past_the_end_is_a_clear_error(clip):
    with pytest.raises(ValueError, match="time window"):
        decode_video(clip, VideoOptions(start=10.0), "mp4")


@needs_torch
def test_torch_video_has_read_video_layout():
    vframes, aframes, info = wds.torch_video(".mp4", make_video("mp4", frames=5, audio=True))
    assert vframes.shape == (5, 32, 48, 3) and vframes.dtype == torch.uint8
    assert aframes.dtype == torch.float32 and aframes.shape[0] == 1 and aframes.shape[1] >= 8000
    assert info == {"video_fps": 10.0, "audio_fps": 16000}
    vframes, aframes, info = wds.torch_video(".mp4", make_video("mp4", frames=2))
    assert aframes.shape == (1, 0) and info == {"video_fps": 10.0}


@needs_torch
def test_in_a_pipeline_with_images_alongside(tmp_path, clip):
    from PIL import Image
    import io

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(buf, format="PNG")
    with wds.TarWriter(str(tmp_path / "v.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"s{i}", "mp4": clip, "png": buf.getvalue(), "cls": str(i).encode()})
    dataset = (
        wds.WebDataset(str(tmp_path / "v.tar"), shardshuffle=False)
        .decode("rgb8", wds.videohandler("torchrgb8", uniform=4, size=16))
        .to_tuple("mp4", "png", "cls")
    )
    items = list(dataset)
    assert len(items) == 4
    for video, image, cls in items:
        assert tuple(video.shape) == (4, 3, 16, 24) and image.shape == (8, 8, 3)
