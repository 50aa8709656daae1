"""Engines for the studio's tests, built from the real value types (`engine.types.Chunk`, `Metrics`,
`SamplingParams`) so the studio meets exactly what a real engine streams, and checked against the
`SpeechEngine` protocol (tests/test_service.py).

    engine = FakeEngine(frames=20, delay=0.01, max_batch=2)
    service = StudioService(engine, None, None)
    ...
    engine.started   # the texts in the order their takes began
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.types import Chunk, EngineInfo, Metrics, SamplingParams


def fake_info(**facts) -> EngineInfo:
    """What a fake engine says about itself: a tiny CPU checkpoint, `facts` overriding."""
    return EngineInfo(**{"checkpoint": "tiny", "device": "cpu", "precision": "fp32", "backend": "torch", "demo": True,
                         **facts})


@dataclass
class FakeEngine:
    """Yields `frames` chunks of one frame's samples (or `max_frames` when the take asks for fewer or more),
    `delay` seconds apart, then a final chunk, as the real engine does. It watches `cancel` every frame and
    logs the texts in the order their takes start (`started`) and end (`closed`), and each call's settings
    (`calls`). `max_batch` is how many takes the studio may run at once."""

    frames: int = 3
    delay: float = 0.0
    max_batch: int = 1
    level: float = 0.1  # every sample of a frame
    measured: dict = field(default_factory=dict)  # Metrics fields every chunk reports (ttfa_ms=, rtf=)
    started: list = field(default_factory=list)
    closed: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    is_remote = False

    @property
    def info(self) -> EngineInfo:
        return fake_info(max_batch=self.max_batch)

    def script(self, text: str, params: SamplingParams) -> tuple[int, float]:
        """(frames, seconds per frame) of the take of `text`."""
        return params.max_frames or self.frames, self.delay

    def metrics(self, frames: int, params: SamplingParams, stop_reason: str | None = None) -> Metrics:
        return Metrics.blank(frames=frames, rows=frames, seed=params.seed, stop_reason=stop_reason, **self.measured)

    def generate_stream(self, text: str, *, voice=None, params: SamplingParams | None = None,
                        cancel: threading.Event | None = None, **options):
        params = SamplingParams.of(params, **options)
        self.started.append(text)
        self.calls.append({"text": text, "voice": voice, **params.as_dict()})
        frames, delay = self.script(text, params)
        try:
            for i in range(frames):
                time.sleep(delay)
                if cancel is not None and cancel.is_set():  # the real engine checks every frame
                    yield Chunk(np.zeros(0, np.float32), self.metrics(i, params, "cancelled"), True)
                    return
                yield Chunk(np.full(SAMPLES_PER_FRAME, self.level, np.float32), self.metrics(i + 1, params), False)
            yield Chunk(np.zeros(0, np.float32), self.metrics(frames, params, "eoc"), True)
        finally:
            self.closed.append(text)

    def generate(self, text: str, **options) -> np.ndarray:
        return np.concatenate([c.audio for c in self.generate_stream(text, **options)])

    def encode_voice(self, wav, sample_rate: int | None, transcript: str | None = None):
        """A stand-in reference that says what it was made from: ("ref", samples, rate, transcript)."""
        return ("ref", len(wav), sample_rate, transcript)


LONG_FRAMES = 120  # the frames of ScriptedEngine's "long" take


@dataclass
class ScriptedEngine(FakeEngine):
    """The text picks the take: "crash" raises inside the engine, "slow" takes 0.1 s per frame for 100
    frames, "long" 0.02 s per frame for `LONG_FRAMES`; anything else is 3 quick frames (`max_frames`
    is not read)."""

    level: float = 0.25
    measured: dict = field(default_factory=lambda: {"ttfa_ms": 1.0, "rtf": 0.5})

    def script(self, text: str, params: SamplingParams) -> tuple[int, float]:
        if "crash" in text:
            raise RuntimeError("the engine fell over")
        return (100, 0.1) if "slow" in text else (LONG_FRAMES, 0.02) if "long" in text else (3, 0.0)


def add_voices(library, service, names_and_pitches) -> None:
    """Saved voices on `library` from speech-like clips (a pitch with a slow tremolo, 2 s), encoded by the real
    `service`: for the tests that clone through the demo engine."""
    from studio.voices import Consent

    from tests.helpers import tone

    for name, pitch in names_and_pitches:
        wav = tone(2.0, pitch=pitch, amplitude=0.3, tremolo=0.4)
        library.add((SAMPLE_RATE, wav), name=name, transcript=f"I am the {name.lower()}.",
                    consent=Consent("the test suite"), encode=service.encode_codes)


class AsrPipeline:
    """transformers' ASR pipeline as `studio.audio.asr.Transcriber` calls it (`make_pipeline=lambda m, d: pipe`):
    each call hears the next of `answers`, a transcript (`{"text"}`), or words with their start times, which
    `return_timestamps="word"` answers as text plus chunks of (start, start + 0.1). `calls` records each
    call's (samples, sampling rate, return_timestamps)."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, inputs, return_timestamps=None):
        self.calls.append((len(inputs["raw"]), inputs["sampling_rate"], return_timestamps))
        answer = self.answers.pop(0)
        if isinstance(answer, str):
            return {"text": answer}
        return {"text": " ".join(w for w, _ in answer),
                "chunks": [{"text": f" {w}", "timestamp": (t, t + 0.1)} for w, t in answer]}
