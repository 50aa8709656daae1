"""The stateful streaming decoder (engine/codec/stream.py): equals the one-shot decode for any push pattern,
returns each frame's audio as soon as its look-ahead is complete, ends with exactly 960 samples per frame,
and does exactly the one-shot decode's conv and Snake work (the noise-free form of "streaming costs no
more than one-shot"; the wall-clock figures are in docs/PERFORMANCE.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from engine.codec import Codec, random_codec_state_dict, tiny_codec_config
from engine.codec.dac import Snake
from engine.codec.streaming_layers import StreamingConv1d, StreamingConvTranspose1d
from engine.config import SAMPLES_PER_FRAME
from engine.streaming import decode_streamed, push_sizes
from tests.helpers import random_codes

CODEC_PREFIX = "tied.embedding.modality_embeddings.0.model."
DECODE_ONLY = ("quantizer.", "fc2.", "acoustic_decoder.")


@pytest.fixture(scope="module")
def tiny():
    return Codec.from_state_dict(random_codec_state_dict(seed=0), tiny_codec_config())


def stream_all(codec: Codec, codes: torch.Tensor, sizes) -> np.ndarray:
    """Push `codes` in chunks of `sizes` (cycled), checking after each push that exactly the frames with a
    complete look-ahead have come out; return the concatenated stream."""
    stream, pieces, i, k = codec.stream(), [], 0, 0
    while i < len(codes):
        n = sizes[k % len(sizes)]
        pieces.append(stream.push(codes[i:i + n]))
        i, k = i + n, k + 1
        final = max(0, min(i, len(codes)) - stream.right)
        assert sum(map(len, pieces)) == final * SAMPLES_PER_FRAME
        assert stream.emitted == final and stream.buffered == min(i, len(codes)) - final <= stream.right
    pieces.append(stream.flush())
    return np.concatenate(pieces)


# ---------------------------------------------------------------- exactness

@pytest.mark.parametrize("pattern", [[1], [3], [7], [25], [2, 1, 9, 4, 13, 1, 30, 5], [0, 4, 0, 11], "engine"])
def test_stream_equals_one_shot(tiny, pattern):
    codes = random_codes(25 if pattern == [1] else 71, seed=2)
    sizes = push_sizes(len(codes), tiny.stream().right) if pattern == "engine" else pattern
    got, want = stream_all(tiny, codes, sizes), tiny.decode(codes)
    assert got.shape == want.shape == (len(codes) * SAMPLES_PER_FRAME,)
    assert np.abs(got - want).max() < 1e-5  # measured ~1e-6 (conv blocking rounding)


@pytest.mark.parametrize("frames", [1, 2, 10, 11, 23])
def test_short_utterances_flush_to_exact_length(tiny, frames):
    """Utterances shorter than the look-ahead come out entirely at flush, 960 samples per frame."""
    codes = random_codes(frames, seed=frames)
    got = stream_all(tiny, codes, [3])
    assert got.shape == (frames * SAMPLES_PER_FRAME,)
    assert np.abs(got - tiny.decode(codes)).max() < 1e-5


def test_empty_stream_flushes_to_nothing(tiny):
    stream = tiny.stream()
    assert stream.push(random_codes(0, 0)).size == 0
    assert stream.flush().size == 0


def test_stream_matches_reference(parity_dir):
    """The parity fixture's codes, streamed with the engine's schedule and others, against transformers'
    one-shot decode."""
    tensors = load_file(parity_dir / "tiny_checkpoint" / "model.safetensors")
    config = json.loads((parity_dir / "tiny_checkpoint" / "codec_config.json").read_text())
    codec = Codec.from_state_dict(
        {k[len(CODEC_PREFIX):]: v for k, v in tensors.items() if k.startswith(CODEC_PREFIX)}, config)
    codes = torch.from_numpy(np.load(parity_dir / "decode_codes.npy"))
    ref = np.load(parity_dir / "decode_wav.npy").reshape(-1)
    for sizes in (push_sizes(len(codes), codec.stream().right), [1], [7, 2, 30]):
        got = stream_all(codec, codes, sizes)
        assert got.shape == ref.shape
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4


def test_full_size_stream_equals_one_shot():
    sd = random_codec_state_dict(seed=0, size="full")
    codec = Codec.from_state_dict({k: v for k, v in sd.items() if k.startswith(DECODE_ONLY)})
    codes = random_codes(24, seed=4)
    got = stream_all(codec, codes, [2, 5, 1, 13])
    assert np.abs(got - codec.decode(codes)).max() < 1e-5


# ---------------------------------------------------------------- look-ahead and lifecycle

def test_right_is_the_receptive_field_and_tight(tiny):
    """`right` (what the engine waits for before its first push) is the decoder's right receptive field, and
    the layers really need all of it: their lag in samples is more than right − 1 frames."""
    stream = tiny.stream()
    assert stream.right == tiny.receptive_field_frames[1] == 10
    assert (stream.right - 1) * SAMPLES_PER_FRAME < stream.layers.lag <= stream.right * SAMPLES_PER_FRAME


def test_push_sizes_are_the_engines_schedule():
    """Look-ahead + 2 frames first, then 4, 8, 16 and one second (25 frames) at a time; the last push holds
    what is left."""
    assert push_sizes(100, 10) == [12, 4, 8, 16, 25, 25, 10]
    assert push_sizes(12, 10) == [12] and push_sizes(5, 10) == [5] and push_sizes(0, 10) == []
    assert push_sizes(13, 10) == [12, 1]


def test_push_after_flush_raises(tiny):
    stream = tiny.stream()
    assert stream.push(random_codes(3, 0)).size == 0  # all three held back as look-ahead
    assert stream.flush().size == 3 * SAMPLES_PER_FRAME
    with pytest.raises(ValueError, match="flushed"):
        stream.push(random_codes(1, 0))
    with pytest.raises(ValueError, match="flushed"):
        stream.flush()


def test_bad_codes_are_refused(tiny):
    with pytest.raises(ValueError, match="0..1023"):
        tiny.stream().push(torch.full((2, 8), 1025))


# ---------------------------------------------------------------- work: streaming computes what one-shot does

def one_shot_work(codec: Codec, codes: torch.Tensor) -> tuple[dict, dict]:
    """(conv MACs per conv module, Snake elements per Snake module) of a one-shot decode, via forward hooks."""
    macs, snake = {}, {}

    def count(module, inputs, output):
        (x,) = inputs
        if isinstance(module, Snake):
            snake[module] = snake.get(module, 0) + x.numel()
        elif isinstance(module, nn.ConvTranspose1d):  # each input sample contributes K outputs per channel pair
            macs[module] = x.shape[-1] * module.in_channels * module.out_channels * module.kernel_size[0]
        else:
            macs[module] = output.shape[-1] * module.in_channels * module.out_channels * module.kernel_size[0]

    handles = [m.register_forward_hook(count) for m in codec.acoustic_decoder.modules()
               if isinstance(m, (Snake, nn.Conv1d, nn.ConvTranspose1d))]
    try:
        codec.decode(codes)
    finally:
        for h in handles:
            h.remove()
    return macs, snake


def test_streaming_does_exactly_the_one_shot_work(tiny):
    """Every conv output (and every ConvTranspose input's K contributions) and every Snake sample is computed
    once: no re-decoded context, and the flush's zero padding is the same padding one-shot convolves."""
    codes = random_codes(71, seed=5)
    want_macs, want_snake = one_shot_work(tiny, codes)
    snake: dict = {}
    handles = [m.register_forward_hook(lambda m, i, o: snake.__setitem__(m, snake.get(m, 0) + i[0].numel()))
               for m in tiny.acoustic_decoder.modules() if isinstance(m, Snake)]
    stream = tiny.stream()
    try:
        decode_streamed(stream, codes)
    finally:
        for h in handles:
            h.remove()
    convs = list(stream.layers.convs())
    assert all(isinstance(c, (StreamingConv1d, StreamingConvTranspose1d)) for c in convs)
    assert len(convs) == len(want_macs) == 2 + 5 * (1 + 3 * 2)  # conv1, conv2; per block conv_t + 3 × 2
    # equal per layer, not just in total (the windowed decoder this replaced did 1.8–3× this work)
    assert {c.conv: c.macs for c in convs} == want_macs
    assert snake == want_snake
