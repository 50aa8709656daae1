"""Auto-transcription of reference clips: a Whisper model through transformers' ASR pipeline.

    asr = Transcriber.from_flag("auto")      # --asr / HIGGS_ASR: auto | none | <hub id or folder>
    text, note = asr.transcribe(samples, rate)
    words = asr.words(samples, rate)          # [WordTime(word, start, end)] for captions (studio/audio/captions.py)

"auto" is `openai/whisper-large-v3-turbo` with a GPU and `openai/whisper-base` without one (large-v3-turbo
runs about 1x real time on two CPU cores; base is several times faster and good enough for a clear clip).
The model loads on first use (downloading it then, with the hub's progress in the server's log). Off, or
when the model cannot be loaded (offline without a cached copy), the transcript stays empty and `note`
says so in one line: never an error, since the user can always type the transcript.

One call runs at a time (the pipeline is not safe to share between threads): the page's reference clips, the
captions and listen-and-retry all use the same transcriber. Whisper hears one 30 s window per call:
`transcribe` hears a clip's first 30 s (a reference clip is no longer), `words` cuts longer audio into windows
of at most 30 s, each ending at its quietest 20 ms in its last 5 s, and shifts each window's word times by
its start. On a ZeroGPU Space the model runs on the CPU: the GPU is attached only inside the engine's
decorated calls (studio/takes/zerogpu.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np
import soxr

from engine.audio import load_audio, quiet_cut
from engine.captions import WordTime

log = logging.getLogger(__name__)

GPU_MODEL = "openai/whisper-large-v3-turbo"
CPU_MODEL = "openai/whisper-base"
ASR_RATE = 16_000  # what Whisper's feature extractor takes
MAX_SECONDS = 30.0  # one Whisper window: a reference clip is at most this long
CUT_SEARCH_SECONDS = 5.0  # a long audio's window ends at the quietest 20 ms of its last 5 s


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
        self._lock = threading.Lock()  # loading
        self._run_lock = threading.Lock()  # one transcription at a time

    @classmethod
    def from_flag(cls, flag: str | None, *, zerogpu: bool = False) -> Transcriber:
        """`none` turns it off; `auto` (or empty) picks by hardware; anything else names the model. On ZeroGPU
        (`zerogpu`: studio/takes/zerogpu.py `active()`) it runs on the CPU: the GPU is attached only inside
        decorated calls."""
        flag = (flag or "auto").strip()
        if flag.lower() == "none":
            return cls(None)
        import torch

        device = "cpu" if zerogpu else "cuda" if torch.cuda.is_available() else "cpu"
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
        """`audio` (samples at `sample_rate`, or a path) as mono float32 at ASR_RATE."""
        wav, rate = (np.asarray(audio, dtype=np.float32), int(sample_rate)) if sample_rate else load_audio(audio)
        wav = np.asarray(wav, dtype=np.float32)
        if wav.ndim > 1:
            wav = wav.mean(axis=1)
        if rate != ASR_RATE:
            wav = soxr.resample(wav, rate, ASR_RATE, quality="HQ").astype(np.float32)
        return wav

    def _heard(self, pipe, wav: np.ndarray, **options) -> dict:
        with self._run_lock:
            return pipe({"raw": wav, "sampling_rate": ASR_RATE}, **options)

    @property
    def off_note(self) -> str | None:
        """Why nothing can be transcribed (off, or the model failed to load), or None when it can."""
        if self.model is None:
            return "Automatic transcription is off (--asr none)."
        return None if self._pipeline() is not None else self._failed

    def words(self, audio, sample_rate: int) -> list[WordTime]:
        """The words heard in `audio` with their times in seconds from its start (transformers'
        `return_timestamps="word"`), window by window for audio longer than one Whisper window. Check
        `off_note` first: with no model this returns no words."""
        pipe = self._pipeline() if self.model is not None else None
        if pipe is None:
            return []
        wav = self._prepared(audio, sample_rate)
        out = []
        for start, end in windows(wav):
            result = self._heard(pipe, wav[start:end], return_timestamps="word")
            offset = start / ASR_RATE
            for chunk in result.get("chunks") or []:
                begin, finish = chunk.get("timestamp") or (None, None)
                word = str(chunk.get("text", "")).strip()
                if word and begin is not None:
                    finish = begin if finish is None else finish
                    out.append(WordTime(word, offset + float(begin), offset + float(finish)))
        return out

    def through(self, run: Callable) -> LinedTranscriber:
        """This transcriber with each call made by `run(fn, *args)`: the GPU line's `run_exclusive`
        (studio/takes/service.py `transcriber_for`), so that a caption's transcription takes its turn with takes."""
        return LinedTranscriber(self, run)

    def transcribe(self, audio, sample_rate: int | None = None) -> tuple[str, str | None]:
        """(transcript, note): the clip (samples at `sample_rate`, or a path) as text, or "" and why not."""
        if self.model is None:
            return "", "Automatic transcription is off (--asr none): type the transcript."
        pipe = self._pipeline()
        if pipe is None:
            return "", self._failed
        result = self._heard(pipe, self._prepared(audio, sample_rate)[:int(MAX_SECONDS * ASR_RATE)])
        return " ".join(str(result.get("text", "")).split()), None


class LinedTranscriber:
    """A Transcriber whose calls go through `run` (see `Transcriber.through`); its off note is the transcriber's.
    `run` may raise TimeoutError (the line's ServiceBusy) when no slot came free in time."""

    def __init__(self, transcriber: Transcriber, run: Callable):
        self.transcriber, self.run = transcriber, run

    @property
    def off_note(self) -> str | None:
        return self.transcriber.off_note

    def words(self, audio, sample_rate: int) -> list[WordTime]:
        return self.run(self.transcriber.words, audio, sample_rate)

    def transcribe(self, audio, sample_rate: int | None = None) -> tuple[str, str | None]:
        return self.run(self.transcriber.transcribe, audio, sample_rate)

    def through(self, run: Callable) -> LinedTranscriber:
        return LinedTranscriber(self.transcriber, run)


def windows(wav: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) sample ranges of 16 kHz `wav` that cover it, each at most MAX_SECONDS long and, where
    the audio goes on, ending at the quietest 20 ms of its last CUT_SEARCH_SECONDS (a pause, with speech)."""
    limit = int(MAX_SECONDS * ASR_RATE)
    out, start = [], 0
    while len(wav) - start > limit:
        end = start + quiet_cut(wav[start:], ASR_RATE, limit, search_s=CUT_SEARCH_SECONDS)
        out.append((start, end))
        start = end
    if len(wav) > start or not out:
        out.append((start, len(wav)))
    return out
