"""A saved voice as data: `Voice`, its `Consent` record, the rules for its fields, and its content hash.

Shared by the on-disk library (`store.py`), voice bundles (`bundles.py`) and visitors' private voices
(`private.py`). Nothing here touches the file system except `Voice`'s readers of its own files.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.audio import prepare_reference
from engine.config import FULL_SIZE, SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.types import SEED_LIMIT
from studio.text import clean_line
from studio.text.presets import check_style_prefix

VOICE_FORMAT = "higgs-studio-voice/1"
ID_RE = re.compile(r"v_[0-9a-f]{16,64}")
MAX_NAME = 64
MAX_TRANSCRIPT = 2000
MAX_DESCRIPTION = 500
MAX_CONSENT_FIELD = 500
MAX_REFERENCE_SECONDS = 30.0

DEFAULT_CONSENT_STATEMENT = ("I have the right to clone this voice: it is my own, or its speaker has given "
                             "permission for this use.")


class VoiceError(ValueError):
    """A request the library refuses; the message says why and what to do."""


class VoiceImportError(VoiceError):
    """An import was rejected as a whole; nothing was changed."""


class VoiceNotFound(KeyError, ValueError):
    """No voice with that id or name. (A KeyError for lookups, a ValueError for the API's 4xx mapping.)"""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "voice not found"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def clean_text(value: Any, what: str, limit: int, *, required: bool = False) -> str:
    """User text → one line (`studio.text.clean_line`), refused with a `VoiceError`."""
    return clean_line(value, what, limit, required=required, error=VoiceError)


def clean_name(name: Any) -> str:
    name = clean_text(name, "voice name", MAX_NAME, required=True)
    if ID_RE.fullmatch(name.lower()):
        raise VoiceError(f"{name!r} looks like a voice id; choose a name that does not start with 'v_' + hex digits.")
    return name


def clean_style(style: Any) -> str:
    try:
        return check_style_prefix(style or "")
    except ValueError as exc:
        raise VoiceError(f"Default style: {exc}") from None


def clean_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < SEED_LIMIT:
        raise VoiceError(f"The default seed must be a whole number from 0 to 2**63 - 1 (got {seed!r}).")
    return int(seed)


@dataclass(frozen=True, slots=True)
class Consent:
    """Who asserted the right to clone this voice, what they asserted, and when."""

    asserted_by: str
    statement: str = DEFAULT_CONSENT_STATEMENT
    at: str = field(default_factory=_now)

    def checked(self) -> "Consent":
        asserted_by = clean_text(self.asserted_by, "consent's 'asserted by'", MAX_CONSENT_FIELD)
        statement = clean_text(self.statement, "consent statement", MAX_CONSENT_FIELD)
        if not asserted_by or not statement:
            raise VoiceError("Saving a voice needs a consent record: who confirms the right to clone this voice, "
                             "and the statement they confirmed.")
        if not isinstance(self.at, str) or not self.at:
            raise VoiceError("The consent record needs the time it was given.")
        return Consent(asserted_by, statement, self.at)

    def to_json(self) -> dict:
        return {"asserted_by": self.asserted_by, "statement": self.statement, "at": self.at}

    @classmethod
    def from_json(cls, data: Any) -> "Consent":
        if not isinstance(data, dict):
            raise VoiceError("The voice has no consent record.")
        return cls(data.get("asserted_by"), data.get("statement"), data.get("at")).checked()


@dataclass(frozen=True, slots=True)
class VoiceRecord:
    """What every voice has wherever it is kept (the owner's library on disk, a visitor's browser): the
    fields of voice.json. `seconds` and `frames` describe the prepared audio."""

    name: str
    transcript: str
    description: str
    style: str
    seed: int | None
    created: str
    consent: Consent
    content_hash: str
    frames: int
    notes: tuple[str, ...]

    @property
    def seconds(self) -> float:
        return self.frames * SAMPLES_PER_FRAME / SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class Voice(VoiceRecord):
    """One saved voice, as read from its directory."""

    id: str
    path: Path
    preset: bool = False  # one of the owner's preset voices: read-only, shown to every visitor
    # Listed to and usable by visitors of a public page. Off for every voice saved or imported, and for
    # libraries written before the field existed: the owner shares a voice on purpose.
    shared: bool = False

    @property
    def audio_path(self) -> Path:
        return self.path / "audio.wav"

    @property
    def codes_path(self) -> Path:
        return self.path / "codes.npy"

    @property
    def has_codes(self) -> bool:
        return self.codes_path.is_file()

    def wav(self) -> np.ndarray:
        """The prepared reference, float32 mono 24 kHz (exactly the samples the content hash covers)."""
        data, _ = sf.read(self.audio_path, dtype="float32")
        return data

    def codes(self) -> np.ndarray | None:
        """Stored codec codes [frames, 8] as int64, or None when not encoded yet."""
        try:
            return np.load(self.codes_path, allow_pickle=False).astype(np.int64)
        except FileNotFoundError:
            return None

    def to_json(self) -> dict:
        return {"format": VOICE_FORMAT, "id": self.id, "name": self.name, "transcript": self.transcript,
                "description": self.description, "style": self.style, "seed": self.seed, "created": self.created,
                "consent": self.consent.to_json(), "content_hash": self.content_hash,
                "sample_rate": SAMPLE_RATE, "frames": self.frames, "notes": list(self.notes), "shared": self.shared}


def content_hash(pcm: np.ndarray, transcript: str) -> str:
    """sha256 over the 16-bit samples and the transcript (the voice's content, as the engine sees it)."""
    audio = hashlib.sha256(np.ascontiguousarray(pcm, dtype="<i2").tobytes()).digest()
    return hashlib.sha256(b"higgs-studio-voice\0" + audio + transcript.encode("utf-8")).hexdigest()


def check_codes(codes: Any, frames: int) -> np.ndarray:
    """An encoder's output → int16 [frames, codebooks], or a VoiceError saying what is off."""
    if hasattr(codes, "detach"):  # a torch tensor, possibly on the GPU
        codes = codes.detach().cpu().numpy()
    codes = np.asarray(codes)
    expected = (frames, FULL_SIZE.codebooks)
    if codes.shape != expected:
        raise VoiceError(f"The voice codes have shape {codes.shape}; expected {expected} "
                         f"({frames} frames of {SAMPLES_PER_FRAME} samples, {FULL_SIZE.codebooks} codebooks).")
    if not np.issubdtype(codes.dtype, np.integer):
        raise VoiceError(f"The voice codes must be integers (got {codes.dtype}).")
    if codes.size and (codes.min() < 0 or codes.max() >= FULL_SIZE.codebook_size):
        raise VoiceError(f"The voice codes must lie in [0, {FULL_SIZE.codebook_size}).")
    return codes.astype(np.int16)


def record_json(voice_id: str, record: dict) -> dict:
    """voice.json for a staged voice's `record` under `voice_id`."""
    return {"format": VOICE_FORMAT, "id": voice_id, **record, "consent": record["consent"].to_json(),
            "sample_rate": SAMPLE_RATE, "notes": list(record["notes"])}


@dataclass
class Staged:
    """A validated voice not yet on disk."""

    record: dict  # voice.json without `id`
    pcm: np.ndarray  # int16
    codes: np.ndarray | None
    voice_id: str | None = None  # an imported bundle keeps its id

    @property
    def content_hash(self) -> str:
        return self.record["content_hash"]


def stage_audio(audio, *, name, transcript, description="", style="", seed=None, consent, trim_long=False) -> Staged:
    """Check a new voice's fields and prepare its audio (`engine.audio.prepare_reference`): a `Staged` voice
    with its content hash, not yet stored anywhere. Raises `VoiceError` / `ReferenceAudioError`."""
    if not isinstance(consent, Consent):
        raise VoiceError("Saving a voice needs a consent record: confirm that you have the right to clone "
                         "this voice (it is yours, or its speaker agreed).")
    record = {"name": clean_name(name), "transcript": clean_text(transcript, "transcript", MAX_TRANSCRIPT),
              "description": clean_text(description, "description", MAX_DESCRIPTION), "style": clean_style(style),
              "seed": clean_seed(seed), "consent": consent.checked()}
    prepared = prepare_reference(audio, max_seconds=MAX_REFERENCE_SECONDS, trim_long=trim_long)
    # 16-bit is what we store; hash and encode exactly those samples (peak ≤ 0.95, so no clipping).
    pcm = np.round(prepared.wav * 32768.0).clip(-32768, 32767).astype(np.int16)
    record.update(created=_now(), content_hash=content_hash(pcm, record["transcript"]),
                  frames=len(pcm) // SAMPLES_PER_FRAME, notes=tuple(prepared.notes))
    return Staged(record=record, pcm=pcm, codes=None)
