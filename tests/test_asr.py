"""Auto-transcription (studio/audio/asr.py) wired into the clone panel, with a tiny random Whisper built here (no
download): the pipeline gets the clip prepared at 16 kHz, and whatever it says fills the empty transcript box.
Off (`--asr none`) or offline, the box stays empty and a one-line note says why."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from studio.audio.asr import ASR_RATE, Transcriber
from studio.views.page import Page
from studio.takes.service import StudioService
from tests.fakes import FakeEngine

SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|translate|>",
           "<|notimestamps|>", "<|nocaptions|>", "<|startofprev|>", "<|startoflm|>"]


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory):
    """A randomly initialised one-layer Whisper with a 27-letter vocabulary, and its ASR pipeline."""
    from transformers import (WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                              WhisperTokenizer, pipeline)

    d = tmp_path_factory.mktemp("tiny-whisper")
    (d / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate([*"abcdefghijklmnopqrstuvwxyz", "Ġ"])}))
    (d / "merges.txt").write_text("#version: 0.2\n")
    tok = WhisperTokenizer(str(d / "vocab.json"), str(d / "merges.txt"), unk_token=SPECIAL[0], bos_token=SPECIAL[0],
                           eos_token=SPECIAL[0])
    tok.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    eos, start = tok.convert_tokens_to_ids(SPECIAL[0]), tok.convert_tokens_to_ids(SPECIAL[1])
    cfg = WhisperConfig(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=80,
                        max_target_positions=32, decoder_start_token_id=start, pad_token_id=eos, eos_token_id=eos,
                        bos_token_id=eos, begin_suppress_tokens=None, suppress_tokens=None)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg).eval()
    gen = model.generation_config
    gen.decoder_start_token_id, gen.eos_token_id, gen.pad_token_id, gen.max_length = start, eos, eos, 12
    gen.forced_decoder_ids = None
    return pipeline("automatic-speech-recognition", model=model, tokenizer=tok,
                    feature_extractor=WhisperFeatureExtractor(feature_size=80), device="cpu")


@pytest.fixture
def clip(tmp_path):
    """1.5 s at 44.1 kHz stereo: the transcriber must make it 16 kHz mono."""
    t = np.arange(int(1.5 * 44100)) / 44100
    mono = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    path = tmp_path / "clip.wav"
    sf.write(path, np.stack([mono, mono], axis=1), 44100)
    return path, mono


def page_with(transcriber):
    return Page(StudioService(FakeEngine()), transcriber=transcriber)


def test_an_uploaded_clip_fills_an_empty_transcript_box(tiny_whisper, clip):
    path, mono = clip
    calls = []

    def recording(inputs):
        calls.append({k: np.array(v) if k == "raw" else v for k, v in inputs.items()})  # the pipeline pops keys
        return tiny_whisper(inputs)

    made = []
    page = page_with(Transcriber("tiny", make_pipeline=lambda model, device: made.append(model) or recording))
    try:
        text, note = page.studio._transcribe(str(path), "")
        assert made == ["tiny"] and len(calls) == 1
        (inputs,) = calls
        assert inputs["sampling_rate"] == ASR_RATE == 16_000
        expected_input = soxr.resample(mono, 44100, ASR_RATE, quality="HQ")
        np.testing.assert_allclose(inputs["raw"], expected_input, atol=1e-4)
        said = " ".join(tiny_whisper({"raw": expected_input, "sampling_rate": ASR_RATE})["text"].split())
        assert said and text == said and note == ""
        # A transcript the user typed is never replaced; the model is loaded once.
        assert page.studio._transcribe(str(path), "My own words.")[0] is not None and len(calls) == 1
        assert page.studio._transcribe(str(path), "")[0] == said and made == ["tiny"]
    finally:
        page.service.close()


def test_off_or_offline_leaves_the_box_empty_with_a_one_line_note(clip, tmp_path, monkeypatch):
    path, _ = clip
    for transcriber, why in [(Transcriber.from_flag("none"), "off (--asr none)"),
                             (Transcriber("openai/whisper-base"), "unavailable")]:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline, and no cached copy in this empty hub cache
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hub"))
        # huggingface_hub reads HF_HUB_OFFLINE once, when imported (Gradio imported it already): without this
        # the load asks the network and retries for ~23 s before it gives up.
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        page = page_with(transcriber)
        try:
            text, note = page.studio._transcribe(str(path), "")
        finally:
            page.service.close()
        assert text is not None and not isinstance(text, str)  # gr.skip(): the box is left as it is (empty)
        assert why in note and "type the transcript" in note and "\n" not in note


@pytest.fixture(scope="module")
def voices_api(tmp_path_factory, shared_engine):
    """The HTTP API on the demo engine with a voice library, built per transcriber."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api
    from studio.voices import VoiceLibrary

    engine = shared_engine()
    services = []

    def make(transcriber):
        service = StudioService(engine, VoiceLibrary(tmp_path_factory.mktemp("voices")))
        services.append(service)
        app = FastAPI()
        api.register(app, service, transcriber=transcriber)
        return TestClient(app)

    yield make
    for service in services:
        service.close()


def post_voice(client, path, name, **fields):
    with open(path, "rb") as f:
        return client.post("/v1/audio/voices", data={"name": name, "consent": "true", **fields},
                           files={"audio_sample": ("clip.wav", f.read(), "audio/wav")})


def test_an_api_voice_without_ref_text_is_transcribed_like_the_page_does(voices_api, tiny_whisper, clip):
    path, mono = clip
    calls = []
    client = voices_api(Transcriber("tiny", make_pipeline=lambda model, device: lambda x: calls.append(1) or
                                    tiny_whisper(x)))
    r = post_voice(client, path, "Heard")
    assert r.status_code == 201, r.text
    said = " ".join(tiny_whisper({"raw": soxr.resample(np.stack([mono, mono], 1).mean(1), 44100, ASR_RATE,
                                                       quality="HQ"), "sampling_rate": ASR_RATE})["text"].split())
    assert said and r.json()["ref_text"] == said and r.json()["ref_text_source"] == "asr" and len(calls) == 1
    # A transcript the client sends is kept as it is, and nothing is transcribed.
    r = post_voice(client, path, "Typed", ref_text="My own words.")
    assert r.status_code == 201 and r.json()["ref_text"] == "My own words." and "ref_text_source" not in r.json()
    assert len(calls) == 1


def test_an_api_voice_without_ref_text_and_no_transcriber_says_so(voices_api, clip):
    path, _ = clip
    for transcriber in (None, Transcriber.from_flag("none")):
        r = post_voice(voices_api(transcriber), path, "Unheard")
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["ref_text"] is None and "ref_text_source" not in body and "ref_text" in body["warning"]
    broken = Transcriber("x", make_pipeline=lambda model, device: lambda x: 1 / 0)
    r = post_voice(voices_api(broken), path, "Broken")
    assert r.status_code == 201 and "transcription failed" in r.json()["warning"]


def test_word_times_come_from_the_real_pipelines_word_timestamps(tiny_whisper, clip, monkeypatch):
    """`Transcriber.words` (captions, studio/audio/captions.py) asks the real pipeline for word timestamps (which
    need the model's cross-attention alignment heads) and keeps each word with its (start, end)."""
    gen = tiny_whisper.model.generation_config
    monkeypatch.setattr(gen, "alignment_heads", [[0, 0], [0, 1]], raising=False)
    monkeypatch.setattr(gen, "no_timestamps_token_id", tiny_whisper.tokenizer.convert_tokens_to_ids("<|notimestamps|>"),
                        raising=False)
    _, mono = clip
    words = Transcriber("tiny", make_pipeline=lambda model, device: tiny_whisper).words(mono, 44100)
    assert words and all(w.word.strip() == w.word and w.word for w in words)
    assert all(0.0 <= w.start <= w.end <= 1.5 + 0.02 for w in words)  # inside the 1.5 s clip (20 ms frames)
    assert Transcriber(None).words(mono, 44100) == [] and "--asr none" in Transcriber(None).off_note
