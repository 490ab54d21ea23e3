"""Bad media: truncated files, wrong containers, empty and zero-length streams give clear errors
(naming URL, sample key and extension through the Decoder), go through the stage's handler, and
never take a pool thread down or hang."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import shardstream as wds
from shardstream._decode.mediaio import truncation

from mediagen import av, make_audio, make_video, video_params


def cut(data: bytes, fraction: float) -> bytes:
    return data[: max(1, int(len(data) * fraction))]


@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.9, 0.999])
@pytest.mark.parametrize("ext", video_params())
def test_truncated_video_is_a_clear_error(ext, fraction):
    data = make_video(ext, frames=20)
    with pytest.raises(ValueError, match=ext) as info:
        wds.videohandler()("." + ext, cut(data, fraction))
    assert "truncated" in str(info.value) or "cannot decode" in str(info.value)


@pytest.mark.parametrize("ext", ["wav", "flac", "m4a", "ogg"])
@pytest.mark.parametrize("fraction", [0.3, 0.9])
def test_truncated_audio_is_a_clear_error(ext, fraction):
    with pytest.raises(ValueError, match=ext):
        wds.audiohandler()("." + ext, cut(make_audio(ext, seconds=1.0), fraction))


def empty_container(fmt: str, codec: str, audio: bool = False) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=16000 if audio else 10)
        if audio:
            stream.layout = "mono"
        else:
            stream.width = stream.height = 32
            stream.pix_fmt = "yuv420p"
        container.start_encoding()  # headers, and not a single packet
    return buf.getvalue()


@pytest.mark.parametrize(
    "ext, data, message",
    [
        ("mp4", b"", "empty mp4"),
        ("mp4", b"\x00" * 64 + b"not a video at all" * 20, "cannot decode mp4"),
        ("mp4", "wav", "no video stream in this mp4"),
        ("webm", "empty-mkv", "cannot decode webm"),
        ("mkv", "empty-mp4", "no video stream in this mkv"),
    ],
)
def test_wrong_container_or_zero_length_video(ext, data, message):
    data = {
        "wav": lambda: make_audio("wav"),
        "empty-mkv": lambda: empty_container("webm", "libvpx"),
        "empty-mp4": lambda: empty_container("mp4", "mpeg4"),
    }.get(data, lambda: data)()
    with pytest.raises(ValueError, match=message):
        wds.videohandler()("." + ext, data)


@pytest.mark.parametrize(
    "ext, data, message",
    [
        ("wav", b"", "empty wav"),
        ("wav", "empty-wav", "zero-length stream"),
        ("flac", "empty-flac", "zero-length stream"),
        ("mp3", "mp4", "no audio stream in this mp3"),
        ("ogg", b"OggS" + bytes(100), "cannot decode ogg"),
    ],
)
def test_wrong_container_or_zero_length_audio(ext, data, message):
    data = {
        "empty-wav": lambda: empty_container("wav", "pcm_s16le", audio=True),
        "empty-flac": lambda: empty_container("flac", "flac", audio=True),
        "mp4": lambda: make_video("mp4"),
    }.get(data, lambda: data)()
    with pytest.raises(ValueError, match=message):
        wds.audiohandler()("." + ext, data)


def test_truncation_reads_the_containers_own_sizes():
    mp4, mkv, wav = make_video("mp4"), make_video("mkv"), make_audio("wav")
    assert truncation(mp4) is None and truncation(mkv) is None and truncation(wav) is None
    assert "box" in truncation(mp4[:-1]) and "Segment" in truncation(mkv[:-1])
    assert "RIFF" in truncation(wav[:-10])
    assert truncation(wav[:-1]) is None  # a missing pad byte is tolerated
    streaming = wav[:4] + b"\xff\xff\xff\xff" + wav[8:-100]  # a streaming writer's placeholder
    assert truncation(streaming) is None
    live = bytearray(mkv)  # a live Matroska stream: Segment size "unknown" (all ones)
    position = 4 + 1 + (live[4] & 0x7F)  # after the EBML header (a one-byte size in our files)
    assert live[position : position + 4] == b"\x18\x53\x80\x67"
    length = 9 - live[position + 4].bit_length()
    live[position + 4 : position + 4 + length] = bytes([0xFF >> (length - 1)]) + b"\xff" * (length - 1)
    assert truncation(bytes(live[:-100])) is None
    assert truncation(b"not media at all") is None and truncation(b"") is None


def shard_with_a_truncated_clip(path, count=6, bad=(1,)):
    good = make_video("mp4", frames=6)
    with wds.TarWriter(str(path)) as sink:
        for i in range(count):
            clip = cut(good, 0.5) if i in bad else good
            sink.write({"__key__": f"s{i}", "mp4": clip, "cls": str(i).encode()})
    return str(path)


def pipeline(url, **kw):
    return (
        wds.WebDataset(url, shardshuffle=False)
        .decode(wds.videohandler(uniform=2), **kw)
        .to_tuple("mp4", "cls")
    )


def test_truncated_clip_raises_naming_url_key_and_extension(tmp_path):
    url = shard_with_a_truncated_clip(tmp_path / "clips.tar")
    with pytest.raises(wds.DecodingError) as info:
        list(pipeline(url))
    error = info.value
    assert (error.key, error.k) == ("s1", "mp4") and error.url.endswith("clips.tar")
    message = str(error)
    assert "clips.tar" in message and "s1" in message and "truncated mp4 video" in message
    assert isinstance(error.__cause__, ValueError)


def test_truncated_clip_is_skipped_under_warn_and_continue(tmp_path):
    url = shard_with_a_truncated_clip(tmp_path / "clips.tar")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = list(pipeline(url, handler=wds.warn_and_continue))
    assert [int(cls) for _, cls in items] == [0, 2, 3, 4, 5]
    assert all(video.shape == (2, 32, 48, 3) for video, _ in items)
    text = " ".join(str(w.message) for w in caught)
    assert "s1" in text and "mp4" in text


def test_bad_media_never_takes_the_pool_down(tmp_path):
    bad = tuple(range(1, 40, 2))
    url = shard_with_a_truncated_clip(tmp_path / "many.tar", count=40, bad=bad)
    dataset = pipeline(url, handler=wds.ignore_and_continue).with_engine(threads=2)
    for _ in range(2):  # the same pool setup, twice: nothing was left broken
        labels = [int(cls) for _, cls in dataset]
        assert labels == [i for i in range(40) if i not in bad]
    assert np.asarray(next(iter(dataset))[0]).shape == (2, 32, 48, 3)
