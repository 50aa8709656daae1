"""Voice cloning end to end on a tiny checkpoint in the real layout (written by engine.demo, so this runs
in a fresh clone): a spoken reference clip → codes → clone prompt equal to a hand-built expectation →
predict, and a second request with the same voice reuses the voice prefix bit-identically."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from engine import Engine
from engine.config import SAMPLES_PER_FRAME
from tests.helpers import espeak_clip

TTS, TEXT, AUDIO, REF_AUDIO, REF_TEXT = 151667, 151672, 151670, 151679, 151680
BOC, EOC = 1024, 1025


@pytest.fixture(scope="module")
def engine(shared_engine, tiny_checkpoint):
    return shared_engine(tiny_checkpoint, precision="fp32")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """About 1.5 s of synthetic speech from espeak-ng (22.05 kHz), or a voiced glide when it is absent."""
    if shutil.which("espeak-ng"):
        path = tmp_path_factory.mktemp("clip") / "ref.wav"
        wav, rate = sf.read(espeak_clip(path, "Hello from the reference speaker."), dtype="float32")
        return wav, rate
    rate = 16000
    t = np.arange(int(1.8 * rate)) / rate
    wav = 0.4 * np.sin(2 * np.pi * (120 + 40 * t) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return wav.astype(np.float32), rate


def delayed_by_hand(codes: list[list[int]]) -> list[list[int]]:
    """SPEC Part 2 §4, written out: D[r, c] = BOC if r < c; codes[r − c][c] if c ≤ r < c + T; EOC after."""
    frames = len(codes)
    return [[BOC if r < c else codes[r - c][c] if r < c + frames else EOC for c in range(8)]
            for r in range(frames + 7)]


def test_clip_to_clone_prompt_to_speech(engine, clip):
    wav, rate = clip
    voice = engine.encode_voice(wav, rate, transcript="Hello from the reference speaker.")
    codes = voice.codes
    assert codes.dtype == torch.long and codes.shape[1] == 8 and 25 <= codes.shape[0] <= 3 * 25
    assert int(codes.min()) >= 0 and int(codes.max()) < 1024

    prompt = engine.build_prompt("Now say this.", voice=voice)
    ref_ids = engine.tokenizer.encode("Hello from the reference speaker.")
    text_ids = engine.tokenizer.encode("Now say this.")
    frames = codes.shape[0]
    expected = [TTS, REF_TEXT, *ref_ids, REF_AUDIO, *([-100] * (frames + 7)), TEXT, *text_ids, AUDIO]
    assert prompt.ids == expected
    assert prompt.ref_rows.tolist() == delayed_by_hand(codes.tolist())

    audio = engine.generate("Now say this.", voice=voice, seed=4, max_frames=20)
    assert audio.dtype == np.float32 and len(audio) % SAMPLES_PER_FRAME == 0 and 0 < len(audio) <= 20 * 960
    assert np.isfinite(audio).all()


def test_second_request_with_the_voice_reuses_its_prefix(engine, tiny_checkpoint, clip):
    wav, rate = clip
    # A transcript no other test speaks: a voice whose prefix this engine has never computed (the engine keeps
    # the prefixes it has computed, engine/prefix.py).
    voice = engine.encode_voice(wav, rate, transcript="Hello again from the reference speaker.")
    options = dict(voice=voice, temperature=0.8, seed=9, max_frames=24, repeat_guard=None)

    engine.predict("Something else entirely.", seed=1, max_frames=4)  # another prefix in the cache
    first = list(engine.generate_stream("First line for this voice.", **options))[-1]
    second = list(engine.generate_stream("A second, different line.", **options))[-1]
    prompt = engine.build_prompt("A second, different line.", voice=voice)
    assert first.metrics.reused_tokens == 0
    # Everything up to and including <|text|> (the voice block) came from the cache.
    assert second.metrics.reused_tokens == prompt.prefix_len == prompt.ids.index(TEXT) + 1

    cold = Engine.load(tiny_checkpoint, device="cpu", precision="fp32")
    assert torch.equal(cold.prefill(prompt), engine.prefill(prompt))
    assert torch.equal(cold.predict("A second, different line.", **options), second.codes)


def test_encode_codes_covers_exactly_the_prepared_samples(engine, clip):
    """What the voice library stores is already prepared: encode_codes must not trim or pad it again."""
    from engine.audio import prepare_reference

    wav, rate = clip
    prepared = prepare_reference(wav, sample_rate=rate).wav
    codes = engine.encode_codes(prepared)
    assert codes.shape == (len(prepared) // SAMPLES_PER_FRAME, 8)
    assert torch.equal(codes, engine.encode_voice(wav, rate).codes)
