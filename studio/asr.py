"""Auto-transcription of reference clips: a Whisper model through transformers' ASR pipeline.

    asr = Transcriber.from_flag("auto")      # --asr / HIGGS_ASR: auto | none | <hub id or folder>
    text, note = asr.transcribe(samples, rate)
    words = asr.words(samples, rate)          # [WordTime(word, start, end)] for captions (studio/captions.py)

"auto" is `openai/whisper-large-v3-turbo` with a GPU and `openai/whisper-base` without one (large-v3-turbo
runs about 1x real time on two CPU cores; base is several times faster and good enough for a clear clip).
The model loads on first use (downloading it then, with the hub's progress in the server's log). Off, or
when the model cannot be loaded (offline without a cached copy), the transcript stays empty and `note`
says so in one line: never an error, since the user can always type the transcript.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np
import soxr

from engine.audio import load_audio
from engine.captions import WordTime

log = logging.getLogger(__name__)

GPU_MODEL = "openai/whisper-large-v3-turbo"
CPU_MODEL = "openai/whisper-base"
ASR_RATE = 16_000  # what Whisper's feature extractor takes
MAX_SECONDS = 30.0  # one Whisper window: a reference clip is at most this long


def _default_pipeline(model: str, device: str):
    from transformers import pipeline

    return pipeline("automatic-speech-recognition", model=model, device=device)


class Transcriber:
    """Loads the ASR pipeline once, on first use, and turns a clip into its transcript."""

    def __init__(self, model: str | None, *, device: str = "cpu",
                 make_pipeline: Callable[[str, str], Callable] = _default_pipeline):
        self.model = model  # None: off
        self.device = device
        self._make = make_pipeline
        self._pipe = None
        self._failed: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_flag(cls, flag: str | None) -> "Transcriber":
        """`none` turns it off; `auto` (or empty) picks by hardware; anything else names the model."""
        flag = (flag or "auto").strip()
        if flag.lower() == "none":
            return cls(None)
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if flag.lower() == "auto":
            flag = GPU_MODEL if device == "cuda" else CPU_MODEL
        return cls(flag, device=device)

    def _pipeline(self):
        with self._lock:
            if self._pipe is None and self._failed is None:
                try:
                    log.info("loading the transcription model %s on %s", self.model, self.device)
                    self._pipe = self._make(self.model, self.device)
                except Exception as exc:  # noqa: BLE001 — offline, no cached copy, a bad id: all mean "type it"
                    log.warning("transcription model %s unavailable: %s", self.model, exc)
                    self._failed = f"Automatic transcription is unavailable ({self.model} could not be loaded; " \
                                   "offline?): type the transcript."
            return self._pipe

    def _prepared(self, audio, sample_rate: int | None) -> np.ndarray:
        wav, rate = (np.asarray(audio, dtype=np.float32), int(sample_rate)) if sample_rate else load_audio(audio)
        wav = np.asarray(wav, dtype=np.float32)
        if wav.ndim > 1:
            wav = wav.mean(axis=1)
        if rate != ASR_RATE:
            wav = soxr.resample(wav, rate, ASR_RATE, quality="HQ").astype(np.float32)
        return wav[:int(MAX_SECONDS * ASR_RATE)]

    @property
    def off_note(self) -> str | None:
        """Why nothing can be transcribed (off, or the model failed to load), or None when it can."""
        if self.model is None:
            return "Automatic transcription is off (--asr none)."
        return None if self._pipeline() is not None else self._failed

    def words(self, audio, sample_rate: int) -> list[WordTime]:
        """The words heard in `audio` with their times in seconds from its start (transformers'
        `return_timestamps="word"`); the first MAX_SECONDS only, as one Whisper window. Check `off_note`
        first: with no model this returns no words."""
        pipe = self._pipeline() if self.model is not None else None
        if pipe is None:
            return []
        result = pipe({"raw": self._prepared(audio, sample_rate), "sampling_rate": ASR_RATE},
                      return_timestamps="word")
        out = []
        for chunk in result.get("chunks") or []:
            start, end = chunk.get("timestamp") or (None, None)
            word = str(chunk.get("text", "")).strip()
            if word and start is not None:
                out.append(WordTime(word, float(start), float(end if end is not None else start)))
        return out

    def transcribe(self, audio, sample_rate: int | None = None) -> tuple[str, str | None]:
        """(transcript, note): the clip (samples at `sample_rate`, or a path) as text, or "" and why not."""
        if self.model is None:
            return "", "Automatic transcription is off (--asr none): type the transcript."
        pipe = self._pipeline()
        if pipe is None:
            return "", self._failed
        result = pipe({"raw": self._prepared(audio, sample_rate), "sampling_rate": ASR_RATE})
        return " ".join(str(result.get("text", "")).split()), None
