"""audiohandler: formats, resampling, channels, windows and outputs, on sounds made with PyAV."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import shardstream as wds
from shardstream._decode.audio import AudioOptions, decode_audio

from mediagen import AUDIO_FORMATS, audio_params, can_encode, make_audio
from needs import needs_torch, optional

torch = optional("torch")


def peak_frequency(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples[0] * np.hanning(samples.shape[1])))
    return float(np.fft.rfftfreq(samples.shape[1], 1 / rate)[spectrum.argmax()])


@pytest.mark.parametrize("ext", audio_params())
def test_every_format_decodes_to_float32_with_its_rate(ext):
    samples, rate = wds.audiohandler()("." + ext, make_audio(ext, seconds=0.5, channels=2))
    assert rate == AUDIO_FORMATS[ext][2]
    assert samples.dtype == np.float32 and samples.shape[0] == 2
    # lossy codecs add priming/padding: about half a second, give or take a frame or two
    assert abs(samples.shape[1] - rate // 2) <= 2100
    assert 0.4 < float(np.abs(samples).max()) < 0.6
    assert abs(peak_frequency(samples, rate) - 440) < 10


def test_resample_and_mix_down():
    data = make_audio("wav", seconds=1.0, channels=2, rate=44100)
    samples, rate = wds.audiohandler(sample_rate=16000, channels=1)(".wav", data)
    assert rate == 16000 and samples.shape == (1, 16000)
    assert abs(float(np.abs(samples).max()) - 0.5) < 0.01  # mono is the mean, not a -3 dB mix
    assert abs(peak_frequency(samples, rate) - 440) < 5


def test_mono_to_stereo_copies_the_channel():
    samples, _ = wds.audiohandler(channels="stereo")(".flac", make_audio("flac", channels=1))
    assert samples.shape[0] == 2 and np.array_equal(samples[0], samples[1])
    assert abs(float(np.abs(samples).max()) - 0.5) < 0.01


def test_time_window():
    data = make_audio("wav", seconds=1.0)
    whole, rate = decode_audio(data, AudioOptions(), "wav")
    part, _ = decode_audio(data, AudioOptions(start=0.25, end=0.5), "wav")
    assert part.shape == (1, rate // 4)
    np.testing.assert_array_equal(part, whole[:, rate // 4 : rate // 2])
    tail, _ = decode_audio(data, AudioOptions(start=0.75), "wav")
    np.testing.assert_array_equal(tail, whole[:, 3 * rate // 4 :])
    with pytest.raises(ValueError, match="time window"):
        decode_audio(data, AudioOptions(start=5.0), "wav")


@pytest.mark.skipif(can_encode("libmp3lame") is not None, reason=str(can_encode("libmp3lame")))
def test_a_window_counts_from_the_first_sample_whatever_its_timestamp():
    """An mp3's first frame says ~0.07 s (the encoder's delay, which FFmpeg drops): the window
    is still seconds from the first decoded sample, as for wav."""
    data = make_audio("mp3", seconds=1.0)
    whole, rate = decode_audio(data, AudioOptions(), "mp3")
    part, _ = decode_audio(data, AudioOptions(start=0.25, end=0.5), "mp3")
    np.testing.assert_array_equal(part, whole[:, rate // 4 : rate // 2])
    head, _ = decode_audio(data, AudioOptions(end=0.5), "mp3")
    np.testing.assert_array_equal(head, whole[:, : rate // 2])


@needs_torch
def test_torch_output_and_layout():
    samples, rate = wds.audiohandler("torch", layout="TC")(".wav", make_audio("wav", channels=2))
    assert isinstance(samples, torch.Tensor) and samples.dtype == torch.float32
    assert samples.shape == (rate // 2, 2)


@needs_torch
def test_torch_audio_has_torchaudio_load_layout():
    waveform, rate = wds.torch_audio(".wav", make_audio("wav", channels=2))
    assert isinstance(waveform, torch.Tensor) and waveform.dtype == torch.float32
    assert waveform.shape == (2, rate // 2) and rate == 16000


def test_handler_ignores_other_fields_and_pickles():
    handler = wds.audiohandler(extensions=["sound"])
    data = make_audio("wav")
    assert handler(".wav", data) is None and handler.accepts(".x.sound")
    samples, rate = pickle.loads(pickle.dumps(handler))(".x.sound", data)
    assert samples.shape == (1, 8000) and rate == 16000


@pytest.mark.parametrize(
    "options",
    [{"output": "pil"}, {"sample_rate": 0}, {"channels": 3}, {"start": 1.0, "end": 0.5}, {"layout": "NC"}],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError):
        wds.audiohandler(**options)
