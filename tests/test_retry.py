"""Listen and retry (studio/audio/listen.py, engine/longtake.py's check, studio/projects/jobs.py): a fake ASR with the
interface of studio/audio/asr.py's `Transcriber` hears some segments right and others wrong (keyed by their text and
seed), so the segments heard wrong are generated again, the best attempt kept, and every attempt's seed and
WER lands in the recipe, which makes the same audio again with no retry. With ASR off: a note, no retry.

The engine is a fake with the real Engine's prompt interface (the demo checkpoint takes seconds per segment on
this machine and never ends a take on its own): its audio is noise seeded by the prompt and the seed, so a seed
picks a take, as on the real engine."""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from engine.attempts import Attempt, again, best
from engine.config import SAMPLES_PER_FRAME
from engine.longform import plan
from engine.longtake import LongTake
from engine.prompt import Prompt, VoiceRef
from engine.tokenizer import SPECIAL
from engine.types import Chunk, SamplingParams
from studio.audio.asr import Transcriber
from studio.audio.listen import Listener, wer, words
from studio.takes.longform import regenerate_segment, segment_rows
from studio.projects import importing
from studio.projects.importing import Limits
from studio.projects.jobs import JobRunner
from studio.projects.library import Projects
from studio.projects.recipes import anchor_of_render
from studio.projects.store import Store, as_stored
from studio.takes.service import StudioService, Order
from tests.fakes import FakeEngine
from tests.helpers import wait_job

PARAGRAPHS = ["The boat left the harbour at dawn, and the sea beyond the wall was calm and grey for many miles.",
              "Gulls followed it out past the lighthouse, crying over the wake, until the land was only a line.",
              "By noon the wind had turned to the west, and the crew reefed the sails and waited for the storm."]


def digest(audio: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(audio, dtype=np.float32).tobytes()).hexdigest()


@dataclass
class SpeakingEngine(FakeEngine):
    """tests/fakes.py's engine with the real Engine's prompt interface, as engine/longtake.py and the project
    worker call it: `build_prompt(text, voice=)` gives a real `Prompt` (the voice's transcript, then the
    text, one id per character), `generate_stream(prompt=, seed=, …)` streams `frames` frames of noise seeded
    by the prompt and the seed, ending "eoc" (or "max_frames" at the cap) with its codes. `spoken` maps each
    take's audio to the (text, seed) it was made from: what the fake ASR hears."""

    frames: int = 4
    spoken: dict = field(default_factory=dict)
    texts: dict = field(default_factory=dict)

    def build_prompt(self, text: str, *, voice=None) -> Prompt:
        if not isinstance(text, str) or not text.strip():
            raise ValueError("there is no text to speak; give a non-empty sentence")
        heard = [ord(c) for c in voice.transcript] if voice is not None else []
        prompt = Prompt([SPECIAL["<|tts|>"], *heard, SPECIAL["<|text|>"], *(ord(c) for c in text), SPECIAL["<|audio|>"]])
        self.texts[tuple(prompt.ids)] = text
        return prompt

    def generate_stream(self, text=None, *, prompt=None, voice=None, params=None, cancel=None, **options):
        params = SamplingParams.of(params, **options)
        if prompt is None:  # a single take hands the text, as the real Engine takes it
            prompt = self.build_prompt(text, voice=voice)
        text = self.texts[tuple(prompt.ids)]
        self.started.append(text)
        self.calls.append({"text": text, **params.as_dict()})
        rng = np.random.default_rng([params.seed, zlib.crc32(str(prompt.ids).encode())])
        frames = min(self.frames, params.max_frames or self.frames)
        audio = []
        for i in range(frames):
            if cancel is not None and cancel.is_set():
                yield Chunk(np.zeros(0, np.float32), self.metrics(i, params, "cancelled"), True)
                return
            audio.append((0.1 * rng.standard_normal(SAMPLES_PER_FRAME)).astype(np.float32))
            yield Chunk(audio[-1], self.metrics(i + 1, params), False)
        self.spoken[digest(np.concatenate(audio))] = (text, params.seed)
        codes = torch.from_numpy(rng.integers(0, 1024, (frames, 8)))
        reason = "max_frames" if frames < self.frames else "eoc"
        yield Chunk(np.zeros(0, np.float32), self.metrics(frames, params, reason), True, codes=codes)


class FakeTranscriber(Transcriber):
    """studio/audio/asr.py's `Transcriber` (the same class, so the same methods and return shapes) over a fake of
    transformers' ASR pipeline: it hears the take the engine made, word for word, except for the (text, seed)
    pairs in `wrong`, whose first n words it mishears."""

    def __init__(self, engine: SpeakingEngine, wrong: dict[tuple[str, int], int]):
        super().__init__("fake-whisper", make_pipeline=lambda model, device: self._hear)
        self.engine, self.wrong, self.heard = engine, wrong, []

    def _prepared(self, audio, sample_rate):
        self._audio = np.asarray(audio, dtype=np.float32)  # the take as made: the pipeline gets it at 16 kHz
        return super()._prepared(audio, sample_rate)

    def _hear(self, inputs: dict, return_timestamps=None) -> dict:
        assert inputs["sampling_rate"] == 16_000 and inputs["raw"].dtype == np.float32
        text, seed = self.engine.spoken.get(digest(self._audio), ("", None))
        said = text.split()
        n = self.wrong.get((text, seed), 0)
        heard = ["mumble"] * min(n, len(said)) + said[n:]
        self.heard.append((text, seed))
        out = {"text": " " + " ".join(heard)}
        if return_timestamps == "word":
            out["chunks"] = [{"text": f" {w}", "timestamp": (0.1 * i, 0.1 * i + 0.1)} for i, w in enumerate(heard)]
        return out


@pytest.fixture
def service():
    engine = SpeakingEngine()
    service = StudioService(engine, None, None)
    yield service
    service.close()


def test_the_wer_is_jiwer_s_over_normalised_words():
    assert words("<|emotion:happy|> It's 23 degrees—well-known, “Sir”!") == "it's twenty three degrees well known sir"
    assert wer("It was twenty-three degrees.", "it was 23 degrees") == 0.0
    assert wer("one two three four", "one two three") == 0.25
    assert wer("one two", "one two and more") == 1.0
    assert wer("<|emotion:happy|> …", "anything") is None  # nothing to compare with
    assert again([Attempt(1, "eoc", 0.3)], above=0.25, retries=2) and not again([Attempt(1, "eoc", 0.2)], above=0.25,
                                                                                 retries=2)
    assert again([Attempt(1, "max_frames")], above=0.25, retries=0)  # no verdict: a cut take's one retry
    assert best([Attempt(1, "eoc", 0.5), Attempt(2, "eoc", 0.5), Attempt(3, "max_frames", 0.5)]) == 0
    assert best([Attempt(1, "max_frames", 0.5), Attempt(2, "eoc", 0.5)]) == 1
    with pytest.raises(ValueError, match="--retry-wer"):
        Listener(None, above=-1)
    with pytest.raises(ValueError, match="--retry-max"):
        Listener(None, retries=11)


def _start(service, listener, seed=1000):
    request = Order(text="\n\n".join(PARAGRAPHS), params=SamplingParams(seed=seed), door="ui", long=True,
                    normalize=False, listen=True)
    handle = service.start(request, pieces=True, listener=listener)
    pieces = list(handle.stream())
    return handle, pieces[-1][0]


def test_segments_heard_wrong_are_made_again_and_the_best_is_kept(service):
    engine = service.engine
    segments = plan("\n\n".join(PARAGRAPHS), normalize=False)
    assert len(segments) == 3
    first, second, third = (s.text for s in segments)
    n1, n2 = len(second.split()), len(third.split())
    wrong = {(first, 1000): 99,  # the first segment is heard wrong too: it is made whole, then again
             (second, 1001): n1, (second, 1002): n1 // 2, (second, 1003): 3 * n1 // 4,  # best of three: 1002
             (third, 1002): n2}  # heard wrong, then right with the next seed
    asr = FakeTranscriber(engine, wrong)
    handle, take = _start(service, Listener(asr, above=0.25, retries=2))
    assert [s.text for s in take.segments] == [first, second, third]
    assert [c["seed"] for c in engine.calls] == [1000, 1001, 1001, 1002, 1003, 1002, 1003]
    assert take.seeds == [1001, 1002, 1003]
    recipe = take.recipe()
    half = wer(second, " ".join(["mumble"] * (n1 // 2) + second.split()[n1 // 2:]))
    assert [s["wer"] for s in recipe["segments"]] == [0.0, round(half, 4), 0.0] and half > 0.25
    assert [[(a["seed"], a["wer"]) for a in s["attempts"]] for s in recipe["segments"]] == [
        [(1000, 1.0), (1001, 0.0)],
        [(1001, 1.0), (1002, round(half, 4)), (1003, round(wer(second, " ".join(
            ["mumble"] * (3 * n1 // 4) + second.split()[3 * n1 // 4:])), 4))],
        [(1002, 1.0), (1003, 0.0)]]
    assert recipe["listen"] == {"above": 0.25, "retries": 2}
    rows = segment_rows(take)
    assert [r[5] for r in rows] == ["done (2 tries)", "heard wrong (3 tries)", "done (2 tries)"]
    assert [r[6] for r in rows] == [0.0, round(half, 2), 0.0]
    assert any("segments 2 (WER" in w and "after 2 retries" in w for w in handle.warnings)
    audio = take.assemble()

    # the recipe (through JSON) makes the same take again with its kept seeds: no retry, nothing transcribed
    calls, heard = len(engine.calls), len(asr.heard)
    again_take = LongTake.from_recipe(engine, json.loads(json.dumps(recipe)))
    assert np.array_equal(again_take.run(), audio)
    assert [c["seed"] for c in engine.calls[calls:]] == [1001, 1002, 1003] and len(asr.heard) == heard
    assert "listen" not in again_take.recipe()

    # a row generated again starts after the last seed its take tried (1003 was tried and not kept)
    regenerate_segment(service, take, 1)
    assert take.seeds[1] == 1004 and take.takes[1].wer == 0.0 and len(take.takes[1].attempts) == 1


def test_a_take_heard_right_is_made_once_and_without_asr_the_take_says_so(service):
    engine = service.engine
    asr = FakeTranscriber(engine, {})
    _, take = _start(service, Listener(asr), seed=50)
    assert [c["seed"] for c in engine.calls] == [50, 51, 52] and len(asr.heard) == 3
    assert [r[5:] for r in segment_rows(take)] == [["done", 0.0]] * 3

    engine.calls.clear()
    handle, take = _start(service, Listener(Transcriber.from_flag("none")), seed=50)
    assert [c["seed"] for c in engine.calls] == [50, 51, 52]
    assert "Listen and retry is off: automatic transcription is off (--asr none); segments are not checked." \
        in handle.warnings
    assert "listen" not in take.recipe() and [r[6] for r in segment_rows(take)] == [""] * 3
    handle, _ = _start(service, None, seed=50)  # a caller with no listener (the HTTP API): as before, silently
    assert not any("Listen" in w for w in handle.warnings)


def test_a_project_render_listens_retries_and_records_every_attempt(service, tmp_path):
    engine = service.engine
    store = Store(tmp_path / "projects")
    projects = Projects(store, service, limits=Limits(max_chars=5000, max_chapters=8, max_bytes=200_000))
    book = "# Book\n\n## One\n\n" + PARAGRAPHS[0] + "\n\n## Two\n\n" + PARAGRAPHS[1]
    project = projects.create("owner", importing.from_text(book, markdown=True), {"seed": 7})
    planned = projects.planned(project.id)
    assert len(planned) == 2
    bad = planned[1]  # its key is known once the first segment (its zero-shot anchor) is rendered
    n = len(bad.text.split())
    asr = FakeTranscriber(engine, {(bad.text, bad.seed): 99, (bad.text, bad.seed + 1): n // 2,
                                   (bad.text, bad.seed + 2): 3 * n // 4})  # the middle attempt is the best
    runner = JobRunner(projects, service, listener=Listener(asr, above=0.25, retries=2))
    runner.start()
    try:
        job = wait_job(runner, runner.render(project.id).id, timeout=30)
    finally:
        runner.stop()
    assert job["state"] == "done" and job["rendered"] == 2
    assert job["listen"] == {"on": True, "above": 0.25, "retries": 2, "note": None}
    assert [c["seed"] for c in engine.calls] == [planned[0].seed, bad.seed, bad.seed + 1, bad.seed + 2]
    rows = projects.chapter_view(project.id, 1)["segments"]
    half = round(n // 2 / n, 4)
    assert rows[0]["wer"] == half and rows[0]["seed"] == bad.seed + 1 and rows[0]["retried"]
    assert [(a["seed"], a["wer"]) for a in rows[0]["attempts"]] == [(bad.seed, 1.0), (bad.seed + 1, half),
                                                                    (bad.seed + 2, round(3 * n // 4 / n, 4))]
    render = store.render(rows[0]["key"])
    assert render.recipe["listen"]["kept"] == 1 and render.recipe["seed"] == render.seed == bad.seed + 1
    assert projects.chapter_view(project.id, 0)["segments"][0]["attempts"] == [
        {"seed": planned[0].seed, "stop_reason": "eoc", "wer": 0.0}]

    # the recipe's kept seed makes the stored audio again, with no retry
    anchor = store.render(projects.planned(project.id)[0].key)
    codes, transcript = anchor_of_render(store.read_audio(anchor.key), store.read_codes(anchor.key),
                                         anchor.recipe["text"])
    prompt = engine.build_prompt(render.recipe["text"], voice=VoiceRef(torch.from_numpy(codes), transcript))
    settings = {k: v for k, v in render.recipe["settings"].items() if v is not None}
    again_audio = np.concatenate([c.audio for c in engine.generate_stream(prompt=prompt, seed=render.seed,
                                                                          **settings)])
    assert np.array_equal(as_stored(again_audio), store.read_audio(render.key))

    projects.set_segment(project.id, 1, 0)  # regenerate: the seed after the last one tried, not a rejected one
    assert store.segments(store.chapters(project.id)[1].id)[0].seed == bad.seed + 3

    off = JobRunner(projects, service, listener=Listener(None))
    assert off.view(job["id"])["listen"]["on"] is False
    assert "Listen and retry is off" in off.view(job["id"])["listen"]["note"]
    store.close()


def test_the_speech_api_listens_to_a_long_input_that_asks_and_only_then(service):
    """`listen: true` on `POST /v1/audio/speech`: a long input's segments heard wrong are made again with the
    next seed; without it nothing is transcribed; a single take asked to listen says it cannot."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api

    engine = service.engine
    app = FastAPI()
    asr = FakeTranscriber(engine, {})
    api.register(app, service, listener=Listener(asr, above=0.25, retries=2))
    long_input = "\n\n".join(PARAGRAPHS * 2)  # long enough for the long form (~40 s of speech)
    body = {"model": "higgs-audio-v3", "input": long_input, "response_format": "wav", "seed": 1000}
    with TestClient(app) as client:
        plain = client.post("/v1/audio/speech", json=body)
        assert plain.status_code == 200, plain.text
        assert asr.heard == [] and [c["seed"] for c in engine.calls] == [1000 + i for i in range(6)]
        first = engine.calls[0]["text"]
        asr.wrong[(first, 1000)] = 99  # the first segment, as the engine was given it, is heard wrong
        engine.calls.clear()
        listened = client.post("/v1/audio/speech", json={**body, "listen": True})
        assert listened.status_code == 200, listened.text
        assert [c["seed"] for c in engine.calls] == [1000, 1001, *(1001 + i for i in range(5))]
        assert len(asr.heard) == 7
        assert listened.content != plain.content
        single = client.post("/v1/audio/speech", json={**body, "input": "Hello there.", "listen": True})
        assert single.status_code == 200 and "one take" in single.headers["X-Warnings"]
