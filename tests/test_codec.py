"""Codec: parity with transformers' HiggsAudioV2TokenizerModel on the fixture, streaming equals one-shot,
the measured receptive field, the tiny random codec other tests build on, and input validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.codec import Codec, random_codec_state_dict, tiny_codec_config
from engine.config import SAMPLES_PER_FRAME
from tests.helpers import random_codes

CODEC_PREFIX = "tied.embedding.modality_embeddings.0.model."
DECODE_ONLY = ("quantizer.", "fc2.", "acoustic_decoder.")


def rel_l2(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def parity_sd(parity_dir):
    tensors = load_file(parity_dir / "tiny_checkpoint" / "model.safetensors")
    return {k[len(CODEC_PREFIX):]: v for k, v in tensors.items() if k.startswith(CODEC_PREFIX)}


@pytest.fixture(scope="module")
def parity_codec(parity_dir, parity_sd):
    config = json.loads((parity_dir / "tiny_checkpoint" / "codec_config.json").read_text())
    return Codec.from_state_dict(parity_sd, config)


@pytest.fixture(scope="module")
def tiny_sd():
    return random_codec_state_dict(seed=0)


@pytest.fixture(scope="module")
def tiny(tiny_sd):
    return Codec.from_state_dict(tiny_sd, tiny_codec_config())


# ---------------------------------------------------------------- parity with the reference

@pytest.mark.parametrize("name", ["decode", "decode_random"])
def test_decode_matches_reference(parity_dir, parity_codec, name):
    codes = np.load(parity_dir / f"{name}_codes.npy")
    ref = np.load(parity_dir / f"{name}_wav.npy")
    wav = parity_codec.decode(torch.from_numpy(codes))
    assert wav.dtype == np.float32 and wav.shape == (SAMPLES_PER_FRAME * codes.shape[0],)
    assert rel_l2(wav, ref) < 1e-4  # measured: 0.0 (bit-equal) on torch 2.13 CPU


@pytest.mark.parametrize("samples", [48000, 36000, 53760])
def test_encode_matches_reference_exactly(parity_dir, parity_codec, samples):
    """36000 = 37.5 frames takes transformers' re-pad path (acoustic branch padded 480 each side)."""
    wav = np.load(parity_dir / f"encode_{samples}.npy")
    ref = np.load(parity_dir / f"encode_{samples}_codes.npy")
    codes = parity_codec.encode(wav)
    assert codes.dtype == torch.long and codes.shape == ref.shape == (parity_codec.frames_for(samples), 8)
    np.testing.assert_array_equal(codes.numpy(), ref)


def test_stream_matches_reference(parity_dir, parity_codec):
    codes = torch.from_numpy(np.load(parity_dir / "decode_codes.npy"))
    ref = np.load(parity_dir / "decode_wav.npy")
    stream = parity_codec.stream()
    out = [stream.push(codes[i:i + 20]) for i in range(0, len(codes), 20)] + [stream.flush()]
    assert rel_l2(np.concatenate(out), ref) < 1e-4


def test_random_codec_has_the_checkpoint_layout(parity_sd, tiny_sd):
    assert {k: tuple(v.shape) for k, v in tiny_sd.items()} == {k: tuple(v.shape) for k, v in parity_sd.items()}
    assert all(v.dtype == torch.float32 for v in tiny_sd.values())


# ---------------------------------------------------------------- receptive field and streaming

def test_receptive_field_is_measured_tight(tiny):
    """Changing frame c changes exactly the output frames [c − right, c + left]: the structural field is
    neither too small (streaming would differ) nor padded."""
    left, right = tiny.receptive_field_frames
    assert (left, right) == (10, 10)  # DAC strides 8·5·4·2·3, dilations 1/3/9, k7 convs
    codes = random_codes(60, seed=1)
    changed = codes.clone()
    c = 30
    changed[c] = (changed[c] + 517) % 1024
    diff = np.abs(tiny.decode(changed) - tiny.decode(codes)).reshape(60, SAMPLES_PER_FRAME).max(axis=1)
    touched = np.flatnonzero(diff > 0)
    assert touched.min() == c - right and touched.max() == c + left


@pytest.mark.parametrize("pattern", [[1], [3], [7], [25], [2, 1, 9, 4, 13, 1, 30, 5]])
def test_stream_equals_one_shot(tiny, pattern):
    codes = random_codes(37 if pattern == [1] else 71, seed=2)
    want = tiny.decode(codes)
    stream, pieces, i, k = tiny.stream(), [], 0, 0
    left, right = tiny.receptive_field_frames
    while i < len(codes):
        n = pattern[k % len(pattern)]
        piece = stream.push(codes[i:i + n])
        i, k = i + n, k + 1
        assert len(piece) % SAMPLES_PER_FRAME == 0
        assert stream.emitted == max(0, stream.received - right)  # final frames come out at once
        assert stream.buffered <= left + right  # bounded window: no re-decode of the history
        pieces.append(piece)
    pieces.append(stream.flush())
    got = np.concatenate(pieces)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5


# ---------------------------------------------------------------- tiny random codec, loading rules

def test_random_codec_decodes_and_encodes(tiny):
    wav = tiny.decode(random_codes(40, seed=4))
    assert np.isfinite(wav).all() and 0.1 <= wav.std() <= 1.0 and np.abs(wav).max() < 5
    clip = np.random.default_rng(0).standard_normal(25 * SAMPLES_PER_FRAME).astype(np.float32) * 0.1
    codes = tiny.encode(clip)
    assert codes.shape == (25, 8) and int(codes.min()) >= 0 and int(codes.max()) < 1024
    assert len(set(codes[:, 0].tolist())) > 1


def test_random_codec_is_deterministic():
    a, b = random_codec_state_dict(seed=5), random_codec_state_dict(seed=5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc2.weight"], random_codec_state_dict(seed=6)["fc2.weight"])


def test_decode_only_state_dict(tiny_sd, tiny):
    sd = {k: v for k, v in tiny_sd.items() if k.startswith(DECODE_ONLY)}
    codec = Codec.from_state_dict(sd)
    codes = random_codes(12, seed=7)
    np.testing.assert_array_equal(codec.decode(codes), tiny.decode(codes))
    with pytest.raises(ValueError, match="decode-only"):
        codec.encode(np.zeros(9600, np.float32))


def test_weight_g_weight_v_spelling_loads(tiny_sd, tiny):
    pos = "semantic_model.encoder.pos_conv_embed.conv."
    sd = dict(tiny_sd)
    sd[pos + "weight_g"] = sd.pop(pos + "parametrizations.weight.original0")
    sd[pos + "weight_v"] = sd.pop(pos + "parametrizations.weight.original1")
    clip = np.sin(np.arange(9600, dtype=np.float32) * 0.05) * 0.3
    assert torch.equal(Codec.from_state_dict(sd, tiny_codec_config()).encode(clip), tiny.encode(clip))


def test_missing_and_unexpected_keys_are_named(tiny_sd):
    sd = dict(tiny_sd)
    del sd["acoustic_decoder.block.2.res_unit3.conv1.bias"]
    with pytest.raises(ValueError, match=r"missing 1 key.*block\.2\.res_unit3\.conv1\.bias"):
        Codec.from_state_dict(sd, tiny_codec_config())
    sd = dict(tiny_sd, **{"acoustic_decoder.extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"unexpected 1 key.*acoustic_decoder\.extra\.weight"):
        Codec.from_state_dict(sd, tiny_codec_config())
    with pytest.raises(ValueError, match="missing 'fc2.weight'"):
        Codec.from_state_dict({k: v for k, v in tiny_sd.items() if not k.startswith("fc2.")})


def test_head_count_comes_from_config_else_hidden_over_64(tiny_sd):
    assert Codec.from_state_dict(tiny_sd, tiny_codec_config()).semantic_model.config.num_attention_heads == 2
    # 32 // 64 = 0 heads cannot be built: without a config the tiny HuBERT is refused, not guessed.
    with pytest.raises(ValueError, match="attention heads"):
        Codec.from_state_dict(tiny_sd)


@pytest.mark.parametrize("codes, match", [
    (torch.zeros(8, dtype=torch.long), r"shape \[frames, 8\]"),
    (torch.zeros(4, 7, dtype=torch.long), r"shape \[frames, 8\]"),
    (torch.full((4, 8), 1024), r"0\.\.1023"),
    (torch.full((4, 8), -1), r"0\.\.1023"),
    (torch.zeros(4, 8), "integers"),
])
def test_bad_codes_are_refused(tiny, codes, match):
    with pytest.raises(ValueError, match=match):
        tiny.decode(codes)


def test_empty_codes_decode_to_nothing(tiny):
    assert tiny.decode(torch.zeros(0, 8, dtype=torch.long)).shape == (0,)


@pytest.mark.parametrize("wav, match", [
    (np.zeros((2, 9600), np.float32), "1-D"),
    (np.zeros(9600, np.int16), "1-D float"),
    (np.zeros(500, np.float32), "too short"),
    (np.full(9600, np.nan, np.float32), "NaN"),
])
def test_bad_reference_audio_is_refused(tiny, wav, match):
    with pytest.raises(ValueError, match=match):
        tiny.encode(wav)


@pytest.mark.slow
def test_full_size_layout():
    """The real widths (SPEC Part 2 §2.3 shapes; 527 entries as transformers' model has)."""
    sd = random_codec_state_dict(size="full")
    assert len(sd) == 527
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    assert shapes["quantizer.quantizers.7.codebook.embed"] == (1024, 64)
    assert shapes["quantizer.quantizers.0.project_in.weight"] == (64, 1024)
    assert shapes["fc.weight"] == (1024, 1024) and shapes["fc1.weight"] == (768, 1024)
    assert shapes["fc2.weight"] == (256, 1024)
    assert shapes["acoustic_decoder.conv1.weight"] == (1024, 256, 7)
    assert [shapes[f"acoustic_decoder.block.{i}.conv_t1.weight"] for i in range(5)] == [
        (1024, 512, 16), (512, 256, 10), (256, 128, 8), (128, 64, 4), (64, 32, 6)]
    assert shapes["acoustic_decoder.conv2.weight"] == (1, 32, 7)
    assert shapes["acoustic_encoder.conv1.weight"] == (64, 1, 7)
    assert shapes["acoustic_encoder.block.0.conv1.weight"] == (128, 64, 16)
    assert shapes["acoustic_encoder.block.4.conv1.weight"] == (2048, 1024, 6)
    assert shapes["acoustic_encoder.conv2.weight"] == (256, 2048, 3)
    assert shapes["semantic_model.encoder.pos_conv_embed.conv.parametrizations.weight.original1"] == (768, 48, 128)
    hubert = Codec.from_state_dict(sd).semantic_model.config
    assert (hubert.hidden_size, hubert.num_hidden_layers, hubert.num_attention_heads, hubert.intermediate_size,
            hubert.num_conv_pos_embedding_groups) == (768, 12, 12, 3072, 16)


@pytest.mark.parametrize("samples", [960, 24_118, 24_119, 25_079, 25_920])
def test_frames_for_predicts_encode(tiny, samples):
    """SPEC §6.2 length rule: L = 960k + r gives k frames for r ≤ 118, else more (re-pad path, no failure)."""
    clip = np.random.default_rng(samples).standard_normal(samples).astype(np.float32) * 0.1
    assert tiny.encode(clip).shape == (tiny.frames_for(samples), 8)
    assert tiny.frames_for(24_118) == 25 and tiny.frames_for(24_119) == 26
