"""Voice library: saved reference voices for cloning, shared by the studio page and the HTTP API.

A voice is a bundle in its own directory `<root>/<id>/`:
    voice.json   name, transcript, description, default style tags, default seed, created time,
                 consent record, content hash, preparation notes
    audio.wav    the prepared reference (engine.audio.prepare_reference), 24 kHz mono 16-bit PCM,
                 a whole number of 960-sample frames
    codes.npy    its codec codes [frames, 8] (int16), stored once so the engine never re-encodes

Identity. The content hash is sha256 over the 16-bit samples and the transcript; a new voice's id is
`v_` + its first 16 hex digits, so adding the same prepared audio with the same transcript returns the
voice already saved (dedupe). The id is then fixed for the voice's life: editing the transcript
updates `content_hash` (so prompt caches keyed on it see new content) but keeps the id (so clients
holding it keep working) and keeps the codes, which depend on the audio alone. Names are free user
text, unique case-insensitively, and never touch the file system.

Durability. Every write goes to a temp directory or file inside `root`, is fsynced, then renamed into
place, so a crash leaves either the old state or the new one; leftovers are swept the next time a
library opens. A write of several voices (an import) is staged whole and marked committed before the
renames, so the next open after a crash completes it or removes it: all of the bundle or none.
Writers hold a process-wide lock and an `fcntl` lock on `<root>/.lock`, so threads and processes adding
voices at once all land. Readers take no lock (renames are atomic; while an import's voices are being
renamed into place a reader may see some of them for a moment).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import stat
import threading
import unicodedata
import uuid
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.audio import ReferenceAudioError, prepare_reference
from engine.config import FULL_SIZE, SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.presets import check_style_prefix

log = logging.getLogger(__name__)

VOICE_FORMAT = "higgs-studio-voice/1"
SPACES_DATA = Path("/data")  # Hugging Face Spaces persistent storage
ID_RE = re.compile(r"v_[0-9a-f]{16,64}")
MAX_NAME = 64
MAX_TRANSCRIPT = 2000
MAX_DESCRIPTION = 500
MAX_CONSENT_FIELD = 500
SEED_LIMIT = 2 ** 63  # seeds are 63-bit (SPEC D6)
MAX_REFERENCE_SECONDS = 30.0

# Import limits. A prepared reference is at most 30 s: 1.4 MB of 16-bit audio and 6 KB of codes.
MAX_IMPORT_BYTES = 256 * 2 ** 20
MAX_IMPORT_VOICES = 200
ENTRY_LIMITS = {"voice.json": 64 * 2 ** 10, "audio.wav": 4 * 2 ** 20, "codes.npy": 256 * 2 ** 10}
_ENTRY_RE = re.compile(r"(?:([A-Za-z0-9_-][A-Za-z0-9_.-]{0,63})/)?(voice\.json|audio\.wav|codes\.npy)")
STAGE_PREFIX = ".stage-"  # a write in progress: one directory per voice, then COMMIT_MARK, then renames
COMMIT_MARK = "COMMIT"
_DIR_ENTRY_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}/")

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


def _clean(value: Any, what: str, limit: int, *, required: bool = False) -> str:
    """User text → one line without control characters, NFC, trimmed; checked for length."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise VoiceError(f"The {what} must be text.")
    value = unicodedata.normalize("NFC", value)
    value = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in value)
    value = " ".join(value.split())
    if required and not value:
        raise VoiceError(f"The {what} is empty.")
    if len(value) > limit:
        raise VoiceError(f"The {what} is {len(value)} characters long; the limit is {limit}.")
    return value


def clean_name(name: Any) -> str:
    name = _clean(name, "voice name", MAX_NAME, required=True)
    if ID_RE.fullmatch(name.lower()):
        raise VoiceError(f"{name!r} looks like a voice id; choose a name that does not start with 'v_' + hex digits.")
    return name


def _clean_style(style: Any) -> str:
    try:
        return check_style_prefix(style or "")
    except ValueError as exc:
        raise VoiceError(f"Default style: {exc}") from None


def _clean_seed(seed: Any) -> int | None:
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
        asserted_by = _clean(self.asserted_by, "consent's 'asserted by'", MAX_CONSENT_FIELD)
        statement = _clean(self.statement, "consent statement", MAX_CONSENT_FIELD)
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
class Voice:
    """One saved voice, as read from its directory. `seconds` and `frames` describe the prepared audio."""

    id: str
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
    path: Path

    @property
    def seconds(self) -> float:
        return self.frames * SAMPLES_PER_FRAME / SAMPLE_RATE

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
                "sample_rate": SAMPLE_RATE, "frames": self.frames, "notes": list(self.notes)}


def content_hash(pcm: np.ndarray, transcript: str) -> str:
    """sha256 over the 16-bit samples and the transcript (the voice's content, as the engine sees it)."""
    audio = hashlib.sha256(np.ascontiguousarray(pcm, dtype="<i2").tobytes()).digest()
    return hashlib.sha256(b"higgs-studio-voice\0" + audio + transcript.encode("utf-8")).hexdigest()


def default_voices_dir() -> Path:
    """`$HIGGS_VOICES_DIR`, else `/data/higgs-studio/voices` on a Space with persistent storage, else the
    user's data directory."""
    env = os.environ.get("HIGGS_VOICES_DIR")
    if env:
        return Path(env).expanduser()
    if SPACES_DATA.is_dir() and os.access(SPACES_DATA, os.W_OK):
        return SPACES_DATA / "higgs-studio" / "voices"
    import platformdirs

    return Path(platformdirs.user_data_dir("higgs-studio")) / "voices"


def _check_codes(codes: Any, frames: int) -> np.ndarray:
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _wav_bytes(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _npy_bytes(codes: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, codes, allow_pickle=False)
    return buf.getvalue()


@dataclass
class _Staged:
    """A validated voice not yet on disk."""

    record: dict  # voice.json without `id`
    pcm: np.ndarray  # int16
    codes: np.ndarray | None
    voice_id: str | None = None  # an imported bundle keeps its id

    @property
    def content_hash(self) -> str:
        return self.record["content_hash"]


class _RootLock:
    """Process-wide re-entrant lock for one library root, plus an `fcntl` lock for other processes."""

    def __init__(self, root: Path):
        self._lockfile = root / ".lock"
        self._rlock = threading.RLock()
        self._depth = 0
        self._fd = -1

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._rlock:
            if self._depth == 0:
                fd = os.open(self._lockfile, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    os.close(self._fd)  # closing releases the flock
                    self._fd = -1


_ROOT_LOCKS: dict[Path, _RootLock] = {}
_ROOT_LOCKS_GUARD = threading.Lock()


def _root_lock(root: Path) -> _RootLock:
    with _ROOT_LOCKS_GUARD:
        return _ROOT_LOCKS.setdefault(root, _RootLock(root))


_UNSET: Any = object()


class VoiceLibrary:
    """Saved voices under `root` (default: `default_voices_dir()`). See the module docstring."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root is not None else default_voices_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()
        self._lock = _root_lock(self.root)
        with self._lock.hold():
            self._sweep()

    # ------------------------------------------------------------------------------------ reading

    def list(self) -> list[Voice]:
        """All voices, oldest first."""
        voices = []
        for entry in self.root.iterdir():
            if ID_RE.fullmatch(entry.name):
                voice = self._read(entry)
                if voice is not None:
                    voices.append(voice)
        return sorted(voices, key=lambda v: (v.created, v.name.casefold()))

    def get(self, id_or_name: str) -> Voice:
        """A voice by id, or by name (case-insensitive). Raises `VoiceNotFound`."""
        key = str(id_or_name).strip()
        if ID_RE.fullmatch(key):
            voice = self._read(self.root / key)
            if voice is not None:
                return voice
        folded = " ".join(key.split()).casefold()
        for voice in self.list():
            if voice.name.casefold() == folded:
                return voice
        raise VoiceNotFound(f"No saved voice called {key!r}; check the voice list.")

    # ------------------------------------------------------------------------------------ adding

    def add(self, audio, *, name: str, transcript: str | None = None, description: str = "", style: str = "",
            seed: int | None = None, consent: Consent | None, encode: Callable[[np.ndarray], Any] | None = None,
            trim_long: bool = False) -> Voice:
        """Prepare `audio` (anything `engine.audio.prepare_reference` takes) and save it as a voice.

        `encode(wav24k) -> codes[T, 8]` stores the codec codes now; without it they are computed on first
        use by `ensure_codes`. Adding content that is already saved returns the saved voice (whatever
        `name` says). Raises `ReferenceAudioError` for unusable audio and `VoiceError` for the rest; on any
        error nothing is stored."""
        staged = self._stage(audio, name=name, transcript=transcript, description=description, style=style,
                             seed=seed, consent=consent, trim_long=trim_long)
        existing = self._by_content(staged.content_hash)
        if existing is None:
            self._check_name_free(staged.record["name"])
            if encode is not None:
                staged.codes = _check_codes(encode(staged.pcm.astype(np.float32) / 32768.0), len(staged.pcm)
                                            // SAMPLES_PER_FRAME)
            return self._commit([staged])[0]
        if encode is not None and not existing.has_codes:
            self.ensure_codes(existing.id, encode)
        return existing

    def import_higgs_preset_dir(self, path: str | Path, *, consent: Consent | None,
                                encode: Callable[[np.ndarray], Any] | None = None) -> list[Voice]:
        """Import the Higgs voice-preset layout: `config.json` = `{"<name>": {"transcript": …, "audio_file":
        "<file>.wav"}}` beside the audio files. All entries are checked before anything is saved; the
        caller asserts consent for all of them."""
        folder = Path(path).resolve()
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise VoiceImportError(f"No config.json in {folder}; a Higgs preset folder holds config.json and "
                                   "the audio files it names.") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VoiceImportError(f"{folder / 'config.json'} is not valid JSON ({exc}).") from None
        if not isinstance(config, dict) or not config:
            raise VoiceImportError("config.json must map each voice name to {\"transcript\", \"audio_file\"}.")
        staged = []
        for name, entry in config.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("audio_file"), str):
                raise VoiceImportError(f"Voice {name!r} in config.json needs an \"audio_file\".")
            audio = (folder / entry["audio_file"]).resolve()
            if not audio.is_relative_to(folder) or not audio.is_file():
                raise VoiceImportError(f"Voice {name!r}: {entry['audio_file']!r} is not a file inside {folder}.")
            try:
                staged.append(self._stage(audio, name=name, transcript=entry.get("transcript"),
                                          description=entry.get("description", ""), style="", seed=None,
                                          consent=consent))
            except ValueError as exc:
                raise VoiceImportError(f"Voice {name!r}: {exc}") from None
        if encode is not None:
            for s in staged:
                if self._by_content(s.content_hash) is None:
                    s.codes = _check_codes(encode(s.pcm.astype(np.float32) / 32768.0), len(s.pcm) // SAMPLES_PER_FRAME)
        return self._commit(staged, error=VoiceImportError)

    def ensure_codes(self, id_or_name: str, encode: Callable[[np.ndarray], Any]) -> np.ndarray:
        """The voice's codec codes (int64 [frames, 8]), encoding and storing them on first use."""
        voice = self.get(id_or_name)
        codes = voice.codes()
        if codes is not None:
            return codes
        codes = _check_codes(encode(voice.wav()), voice.frames)
        with self._lock.hold():
            if not voice.path.is_dir():
                raise VoiceNotFound(f"The voice {voice.name!r} was deleted while it was being encoded.")
            if not voice.has_codes:
                tmp = voice.path / f".codes-{uuid.uuid4().hex}.tmp"
                try:
                    _write_file(tmp, _npy_bytes(codes))
                    os.replace(tmp, voice.codes_path)
                finally:
                    tmp.unlink(missing_ok=True)
                _fsync_dir(voice.path)
        return self.get(voice.id).codes()

    def voice_ref(self, id_or_name: str, encode: Callable[[np.ndarray], Any]):
        """The engine's `VoiceRef` (codes + transcript) for a saved voice, encoding it on first use."""
        import torch

        from engine.prompt import VoiceRef

        voice = self.get(id_or_name)
        codes = self.ensure_codes(voice.id, encode)
        return VoiceRef(codes=torch.from_numpy(codes), transcript=voice.transcript or None)

    # ------------------------------------------------------------------------------------ editing

    def update(self, id_or_name: str, *, name: str = _UNSET, description: str = _UNSET, transcript: str = _UNSET,
               style: str = _UNSET, seed: int | None = _UNSET) -> Voice:
        """Change a voice's metadata. The id and the codes stay; a transcript change updates `content_hash`."""
        with self._lock.hold():
            voice = self.get(id_or_name)
            changes: dict[str, Any] = {}
            if name is not _UNSET:
                changes["name"] = clean_name(name)
                self._check_name_free(changes["name"], besides=voice.id)
            if description is not _UNSET:
                changes["description"] = _clean(description, "description", MAX_DESCRIPTION)
            if style is not _UNSET:
                changes["style"] = _clean_style(style)
            if seed is not _UNSET:
                changes["seed"] = _clean_seed(seed)
            if transcript is not _UNSET:
                changes["transcript"] = _clean(transcript, "transcript", MAX_TRANSCRIPT)
                pcm, _ = sf.read(voice.audio_path, dtype="int16")
                changes["content_hash"] = content_hash(pcm, changes["transcript"])
                twin = self._by_content(changes["content_hash"])
                if twin is not None and twin.id != voice.id:
                    raise VoiceError(f"The voice {twin.name!r} already has this audio and transcript.")
            updated = replace(voice, **changes)
            tmp = voice.path / f".voice-{uuid.uuid4().hex}.tmp"
            try:
                _write_file(tmp, json.dumps(updated.to_json(), ensure_ascii=False, indent=1).encode("utf-8"))
                os.replace(tmp, voice.path / "voice.json")
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(voice.path)
            return self.get(voice.id)

    def rename(self, id_or_name: str, new_name: str) -> Voice:
        return self.update(id_or_name, name=new_name)

    def delete(self, id_or_name: str) -> None:
        """Remove a voice. It vanishes in one rename; its files are removed after."""
        with self._lock.hold():
            voice = self.get(id_or_name)
            trash = self.root / f".trash-{uuid.uuid4().hex}"
            os.rename(voice.path, trash)
            _fsync_dir(self.root)
            shutil.rmtree(trash, ignore_errors=True)

    # ------------------------------------------------------------------------------------ exchange

    def export_zip(self, ids: Iterable[str] | None = None) -> bytes:
        """A zip with one folder per voice (`<id>/voice.json`, `audio.wav`, `codes.npy` when encoded).
        `ids` are ids or names; None exports every voice."""
        with self._lock.hold():
            voices = self.list() if ids is None else [self.get(i) for i in ids]
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                for voice in voices:
                    zf.writestr(f"{voice.id}/voice.json", json.dumps(voice.to_json(), ensure_ascii=False, indent=1))
                    zf.write(voice.audio_path, f"{voice.id}/audio.wav")
                    if voice.has_codes:
                        zf.write(voice.codes_path, f"{voice.id}/codes.npy")
            return buf.getvalue()

    def import_zip(self, data: bytes | str | os.PathLike) -> list[Voice]:
        """Import voices exported by `export_zip` (its bytes, or the path of the file: its size is checked
        before a byte is read). Everything is checked first — entry names and types, sizes, JSON, audio,
        codes, consent, name clashes — and on any problem the whole import is rejected with
        `VoiceImportError` and the library is left as it was. Voices already saved (same content) are
        returned as they are."""
        if isinstance(data, (str, os.PathLike)):
            size = Path(data).stat().st_size
            if size > MAX_IMPORT_BYTES:
                raise VoiceImportError(_too_big(size))
            data = Path(data).read_bytes()
        files = _read_bundle(data)
        staged = []
        for folder, entries in sorted(files.items()):
            label = folder or "the bundle"
            if "voice.json" not in entries or "audio.wav" not in entries:
                raise VoiceImportError(f"{label} lacks voice.json or audio.wav.")
            try:
                staged.append(self._stage_bundle(entries))
            except (ValueError, ReferenceAudioError) as exc:
                raise VoiceImportError(f"{label}: {exc}") from None
        return self._commit(staged, error=VoiceImportError)

    # ------------------------------------------------------------------------------------ internals

    def _stage(self, audio, *, name, transcript, description, style, seed, consent, trim_long=False) -> _Staged:
        if not isinstance(consent, Consent):
            raise VoiceError("Saving a voice needs a consent record: confirm that you have the right to clone "
                             "this voice (it is yours, or its speaker agreed).")
        record = {"name": clean_name(name), "transcript": _clean(transcript, "transcript", MAX_TRANSCRIPT),
                  "description": _clean(description, "description", MAX_DESCRIPTION), "style": _clean_style(style),
                  "seed": _clean_seed(seed), "consent": consent.checked()}
        prepared = prepare_reference(audio, max_seconds=MAX_REFERENCE_SECONDS, trim_long=trim_long)
        # 16-bit is what we store; hash and encode exactly those samples (peak ≤ 0.95, so no clipping).
        pcm = np.round(prepared.wav * 32768.0).clip(-32768, 32767).astype(np.int16)
        record.update(created=_now(), content_hash=content_hash(pcm, record["transcript"]),
                      frames=len(pcm) // SAMPLES_PER_FRAME, notes=tuple(prepared.notes))
        return _Staged(record=record, pcm=pcm, codes=None)

    def _stage_bundle(self, entries: dict[str, bytes]) -> _Staged:
        try:
            meta = json.loads(entries["voice.json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VoiceError(f"voice.json is not valid JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise VoiceError("voice.json must be a JSON object")
        try:
            with sf.SoundFile(io.BytesIO(entries["audio.wav"])) as f:
                if f.format != "WAV" or f.samplerate != SAMPLE_RATE or f.channels != 1:
                    raise VoiceError(f"audio.wav must be {SAMPLE_RATE} Hz mono WAV (got {f.format}, {f.samplerate} Hz, "
                                     f"{f.channels} channels)")
                pcm = f.read(dtype="int16")
        except VoiceError:
            raise
        except Exception:  # noqa: BLE001 — libsndfile's errors all mean "not a readable WAV"
            raise VoiceError("audio.wav is not readable audio") from None
        if not len(pcm) or len(pcm) % SAMPLES_PER_FRAME or len(pcm) > MAX_REFERENCE_SECONDS * SAMPLE_RATE:
            raise VoiceError(f"audio.wav must hold whole {SAMPLES_PER_FRAME}-sample frames, at most "
                             f"{MAX_REFERENCE_SECONDS:g} s (got {len(pcm)} samples)")
        frames = len(pcm) // SAMPLES_PER_FRAME
        codes = None
        if "codes.npy" in entries:
            try:
                raw = np.load(io.BytesIO(entries["codes.npy"]), allow_pickle=False)
            except Exception:  # noqa: BLE001 — any parse failure is a damaged file
                raise VoiceError("codes.npy is not a readable numpy array") from None
            codes = _check_codes(raw, frames)
        notes = meta.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise VoiceError("voice.json 'notes' must be a list of text")
        created = meta.get("created")
        if not isinstance(created, str) or not created:
            raise VoiceError("voice.json has no 'created' time")
        record = {"name": clean_name(meta.get("name")),
                  "transcript": _clean(meta.get("transcript"), "transcript", MAX_TRANSCRIPT),
                  "description": _clean(meta.get("description"), "description", MAX_DESCRIPTION),
                  "style": _clean_style(meta.get("style")), "seed": _clean_seed(meta.get("seed")),
                  "consent": Consent.from_json(meta.get("consent")), "created": created, "frames": frames,
                  "notes": tuple(_clean(n, "note", MAX_DESCRIPTION) for n in notes[:20])}
        record["content_hash"] = content_hash(pcm, record["transcript"])
        if meta.get("content_hash") not in (None, record["content_hash"]):
            raise VoiceError("its audio and transcript do not match the recorded content hash (damaged or edited)")
        voice_id = meta.get("id")
        if voice_id is not None and (not isinstance(voice_id, str) or not ID_RE.fullmatch(voice_id)):
            raise VoiceError(f"voice.json has an invalid id {voice_id!r}")
        return _Staged(record=record, pcm=pcm, codes=codes, voice_id=voice_id)

    def _commit(self, staged: list[_Staged], *, error: type[VoiceError] = VoiceError) -> list[Voice]:
        """Write staged voices all-or-nothing; already-saved content is returned instead of written."""
        with self._lock.hold():
            existing = self.list()
            by_hash = {v.content_hash: v for v in existing}
            by_name = {v.name.casefold(): v for v in existing}
            results: list[Voice | str] = []
            new: dict[str, tuple[str, _Staged]] = {}  # content hash → (id, staged)
            names: dict[str, str] = {}
            for s in staged:
                h, name = s.content_hash, s.record["name"]
                if h in by_hash:
                    results.append(by_hash[h])
                    continue
                if h in new:
                    results.append(new[h][0])
                    continue
                key = name.casefold()
                if key in by_name:
                    raise error(f"A different voice is already called {by_name[key].name!r}; choose another name.")
                if key in names:
                    raise error(f"Two voices are called {name!r}; give each a different name.")
                voice_id = s.voice_id or self._free_id(h)
                if (self.root / voice_id).exists() or voice_id in {i for i, _ in new.values()}:
                    raise error(f"The id {voice_id} is taken by a different voice.")
                names[key] = voice_id
                new[h] = (voice_id, s)
                results.append(voice_id)
            self._write_all(list(new.values()))
            return [r if isinstance(r, Voice) else self._read(self.root / r) for r in results]

    def _free_id(self, digest: str) -> str:
        # A voice whose transcript was edited keeps its original id, so the short id of this content may
        # be taken by different content; a longer prefix of the same hash then names it.
        for length in range(16, 65, 4):
            candidate = f"v_{digest[:length]}"
            if not (self.root / candidate).exists():
                return candidate
        raise VoiceError("Every id for this content is taken; the library is damaged.")

    def _write_all(self, items: list[tuple[str, _Staged]]) -> None:
        """Write voices all-or-nothing, even across a kill: every voice is written and fsynced into one staging
        directory, then a `COMMIT` mark makes the set durable, then each voice is renamed into place. A
        crash before the mark leaves a stage that the next open deletes; after it, the next open finishes
        the renames (`_sweep`)."""
        stage = self.root / f"{STAGE_PREFIX}{uuid.uuid4().hex}"
        placed: list[Path] = []
        committed = False
        try:
            stage.mkdir()
            for voice_id, s in items:
                tmp = stage / voice_id
                tmp.mkdir()
                record = {"format": VOICE_FORMAT, "id": voice_id, **s.record,
                          "consent": s.record["consent"].to_json(), "sample_rate": SAMPLE_RATE,
                          "notes": list(s.record["notes"])}
                _write_file(tmp / "audio.wav", _wav_bytes(s.pcm))
                if s.codes is not None:
                    _write_file(tmp / "codes.npy", _npy_bytes(s.codes))
                _write_file(tmp / "voice.json", json.dumps(record, ensure_ascii=False, indent=1).encode("utf-8"))
                _fsync_dir(tmp)
            _write_file(stage / COMMIT_MARK, "\n".join(v for v, _ in items).encode())
            _fsync_dir(stage)
            committed = True
            for voice_id, _ in items:
                os.rename(stage / voice_id, self.root / voice_id)
                placed.append(self.root / voice_id)
            _fsync_dir(self.root)
        except BaseException:
            if committed:  # un-commit first, so a crash during the roll-back does not roll forward
                (stage / COMMIT_MARK).unlink(missing_ok=True)
                _fsync_dir(stage)
            for path in placed:  # all or nothing: take back what was already renamed into place
                trash = self.root / f".trash-{uuid.uuid4().hex}"
                try:
                    os.rename(path, trash)
                except OSError:
                    log.exception("could not roll back %s", path)
                    continue
                shutil.rmtree(trash, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _by_content(self, digest: str) -> Voice | None:
        return next((v for v in self.list() if v.content_hash == digest), None)

    def _check_name_free(self, name: str, *, besides: str | None = None) -> None:
        key = name.casefold()
        for voice in self.list():
            if voice.name.casefold() == key and voice.id != besides:
                raise VoiceError(f"A different voice is already called {voice.name!r}; choose another name.")

    def _read(self, path: Path) -> Voice | None:
        try:
            meta = json.loads((path / "voice.json").read_text(encoding="utf-8"))
            return Voice(id=path.name, name=meta["name"], transcript=meta["transcript"],
                         description=meta["description"], style=meta["style"], seed=meta["seed"],
                         created=meta["created"], consent=Consent(**meta["consent"]),
                         content_hash=meta["content_hash"], frames=int(meta["frames"]),
                         notes=tuple(meta.get("notes", ())), path=path)
        except FileNotFoundError:
            return None  # deleted meanwhile, or not a voice directory
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping unreadable voice %s: %s", path, exc)
            return None

    def _roll_forward(self, stage: Path) -> None:
        """Finish a committed write that a crash interrupted: move the voices still staged into place."""
        for voice_id in (stage / COMMIT_MARK).read_text().split():
            staged = stage / voice_id
            if ID_RE.fullmatch(voice_id) and staged.is_dir() and not (self.root / voice_id).exists():
                os.rename(staged, self.root / voice_id)
        _fsync_dir(self.root)
        log.info("completed an interrupted write of voices (%s)", stage.name)

    def _sweep(self) -> None:
        """Remove what an interrupted write left behind (only ever names no reader looks at)."""
        for entry in self.root.iterdir():
            if entry.name.startswith(STAGE_PREFIX) and (entry / COMMIT_MARK).is_file():
                self._roll_forward(entry)
            if entry.name.startswith((".tmp-", ".trash-", STAGE_PREFIX)) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            elif ID_RE.fullmatch(entry.name) and entry.is_dir():
                for leftover in entry.glob(".*.tmp"):
                    leftover.unlink(missing_ok=True)


def _too_big(size: int) -> str:
    return (f"The voice bundle is {size / 2 ** 20:.1f} MB; the limit is {MAX_IMPORT_BYTES // 2 ** 20} MB. Export "
            "fewer voices at a time.")


def _read_bundle(data: bytes) -> dict[str, dict[str, bytes]]:
    """Validate a voice zip and return {folder: {file name: bytes}}; raises VoiceImportError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise VoiceImportError("A voice bundle must be the bytes of a .zip file.")
    if len(data) > MAX_IMPORT_BYTES:
        raise VoiceImportError(_too_big(len(data)))
    try:
        zf = zipfile.ZipFile(io.BytesIO(bytes(data)))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError):
        raise VoiceImportError("The file is not a zip archive; export voices from Higgs Studio and import that "
                               "file.") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_IMPORT_VOICES * (len(ENTRY_LIMITS) + 1):
            raise VoiceImportError(f"The bundle has {len(infos)} entries; at most {MAX_IMPORT_VOICES} voices can "
                                   "be imported at once.")
        files: dict[str, dict[str, bytes]] = {}
        for info in infos:
            name = info.filename
            mode = info.external_attr >> 16
            if info.flag_bits & 0x1:
                raise VoiceImportError(f"{name!r} is encrypted; voice bundles are not.")
            if stat.S_ISLNK(mode):
                raise VoiceImportError(f"{name!r} is a symbolic link; voice bundles hold only plain files.")
            if name.startswith("/") or "\\" in name or re.match(r"[A-Za-z]:", name) or \
                    any(part in ("..", ".") for part in name.split("/")):
                raise VoiceImportError(f"{name!r} is an unsafe path; voice bundles hold only <folder>/<file>.")
            if info.is_dir():
                if not _DIR_ENTRY_RE.fullmatch(name):
                    raise VoiceImportError(f"{name!r} is not an expected folder in a voice bundle.")
                continue
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: the archiver recorded no file type
                raise VoiceImportError(f"{name!r} is not a plain file.")
            match = _ENTRY_RE.fullmatch(name)
            if match is None:
                raise VoiceImportError(f"{name!r} is not part of a voice bundle (only voice.json, audio.wav and "
                                       "codes.npy, one folder per voice).")
            folder, base = match.group(1) or "", match.group(2)
            limit = ENTRY_LIMITS[base]
            if info.file_size > limit:
                raise VoiceImportError(f"{name!r} is {info.file_size} bytes; the limit for {base} is {limit}.")
            if base in files.setdefault(folder, {}):
                raise VoiceImportError(f"{name!r} appears twice in the bundle.")
            try:
                with zf.open(info) as f:
                    blob = f.read(limit + 1)  # never trust the declared size: read at most the limit
            except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, OSError, EOFError) as exc:
                raise VoiceImportError(f"{name!r} cannot be extracted ({exc}).") from None
            if len(blob) > limit:
                raise VoiceImportError(f"{name!r} is larger than the {limit}-byte limit for {base}.")
            files[folder][base] = blob
        files = {k: v for k, v in files.items() if v}
        if not files:
            raise VoiceImportError("The bundle holds no voices.")
        if len(files) > MAX_IMPORT_VOICES:
            raise VoiceImportError(f"At most {MAX_IMPORT_VOICES} voices can be imported at once.")
        return files
