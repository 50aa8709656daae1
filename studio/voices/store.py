"""The voice library on disk: saved reference voices for cloning, shared by the studio page and the HTTP API.

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

Durability (`disk.py`). Every write goes to a temp directory or file inside `root`, is fsynced, then renamed into
place, so a crash leaves either the old state or the new one; leftovers are swept the next time a
library opens. A write of several voices (an import) is staged whole and marked committed before the
renames, so the next open after a crash completes it or removes it: all of the bundle or none.
Writers hold a process-wide lock and an `fcntl` lock on `<root>/.lock`, so threads and processes adding
voices at once all land. Readers take no lock (renames are atomic; while an import's voices are being
renamed into place a reader may see some of them for a moment).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.config import SAMPLES_PER_FRAME
from studio.files.durable import replace_file
from studio.voices.bundles import bundle_zip, preset_consent, stage_preset, stage_zip
from studio.voices.disk import npy_bytes, remove, root_lock, sweep, wav_bytes, write_voices
from studio.voices.model import (
    ID_RE,
    MAX_DESCRIPTION,
    MAX_NAME,
    MAX_TRANSCRIPT,
    Consent,
    Staged,
    Voice,
    VoiceError,
    VoiceImportError,
    VoiceNotFound,
    check_codes,
    clean_name,
    clean_seed,
    clean_style,
    clean_text,
    content_hash,
    record_json,
    stage_audio,
)

log = logging.getLogger(__name__)

SPACES_DATA = Path("/data")  # Hugging Face Spaces persistent storage
MAX_IMPORT_NAMES = 1000  # "Name (2)" … "Name (999)"


def studio_dir(env: str, name: str, *, cache: bool = False) -> Path:
    """`$<env>`, else `/data/higgs-studio/<name>` on a Space with persistent storage, else `<name>` in the
    user's data directory (or cache directory, with `cache`)."""
    if os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    if SPACES_DATA.is_dir() and os.access(SPACES_DATA, os.W_OK):
        return SPACES_DATA / "higgs-studio" / name
    import platformdirs

    base = platformdirs.user_cache_dir if cache else platformdirs.user_data_dir
    return Path(base("higgs-studio")) / name


def default_voices_dir() -> Path:
    """Where the voice library lives: `$HIGGS_VOICES_DIR`, /data on a Space, else the user's data directory."""
    return studio_dir("HIGGS_VOICES_DIR", "voices")


_UNSET: Any = object()


class VoiceLibrary:
    """Saved voices under `root` (default: `default_voices_dir()`). See the module docstring."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root is not None else default_voices_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()
        self._lock = root_lock(self.root)
        with self._lock.hold():
            sweep(self.root)

    # ------------------------------------------------------------------------------------ reading

    def list(self, *, visitor: bool = False) -> list[Voice]:
        """All voices, oldest first; for a `visitor` of a public page only the shared ones."""
        voices = []
        for entry in self.root.iterdir():
            if ID_RE.fullmatch(entry.name):
                voice = self._read(entry)
                if voice is not None and (voice.shared or not visitor):
                    voices.append(voice)
        return sorted(voices, key=lambda v: (v.created, v.name.casefold()))

    def get(self, id_or_name: str, *, visitor: bool = False) -> Voice:
        """A voice by id, or by name (case-insensitive). Raises `VoiceNotFound`, also for a `visitor` asking
        for a voice that is not shared (the same answer: a visitor learns nothing of private voices)."""
        key = str(id_or_name).strip()
        if ID_RE.fullmatch(key):
            voice = self._read(self.root / key)
            if voice is not None and (voice.shared or not visitor):
                return voice
        folded = " ".join(key.split()).casefold()
        for voice in self.list(visitor=visitor):
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
        staged = stage_audio(audio, name=name, transcript=transcript, description=description, style=style,
                             seed=seed, consent=consent, trim_long=trim_long)
        existing = self._by_content(staged.content_hash)
        if existing is None:
            # Unlocked, before the encode: a thread that saved this very content meanwhile is no clash
            # (`_commit` returns its voice); the check under the lock is `_commit`'s own.
            self._check_name_free(staged.record["name"], content=staged.content_hash)
            if encode is not None:
                staged.codes = check_codes(encode(staged.pcm.astype(np.float32) / 32768.0), len(staged.pcm)
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
            raw = (folder / "config.json").read_bytes()
        except FileNotFoundError:
            raise VoiceImportError(f"No config.json in {folder}; a Higgs preset folder holds config.json and "
                                   "the audio files it names.") from None

        def audio_file(name: str) -> Path:
            audio = (folder / name).resolve()
            if not audio.is_relative_to(folder) or not audio.is_file():
                raise VoiceImportError(f"{name!r} is not a file inside {folder}.")
            return audio

        staged = stage_preset(raw, audio_file, consent, max_voices=None)  # the owner's own folder: no count cap
        if encode is not None:
            for s in staged:
                if self._by_content(s.content_hash) is None:
                    s.codes = check_codes(encode(s.pcm.astype(np.float32) / 32768.0), len(s.pcm) // SAMPLES_PER_FRAME)
        return self._commit(staged, error=VoiceImportError)

    def ensure_codes(self, id_or_name: str, encode: Callable[[np.ndarray], Any]) -> np.ndarray:
        """The voice's codec codes (int64 [frames, 8]), encoding and storing them on first use."""
        voice = self.get(id_or_name)
        codes = voice.codes()
        if codes is not None:
            return codes
        codes = check_codes(encode(voice.wav()), voice.frames)
        with self._lock.hold():
            if not voice.path.is_dir():
                raise VoiceNotFound(f"The voice {voice.name!r} was deleted while it was being encoded.")
            if not voice.has_codes:
                replace_file(voice.path, voice.codes_path.name, npy_bytes(codes))
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
               style: str = _UNSET, seed: int | None = _UNSET, shared: bool = _UNSET) -> Voice:
        """Change a voice's metadata. The id and the codes stay; a transcript change updates `content_hash`.
        `shared` lists the voice to visitors of a public page and lets them use it."""
        with self._lock.hold():
            voice = self.get(id_or_name)
            changes: dict[str, Any] = {}
            if name is not _UNSET:
                changes["name"] = clean_name(name)
                self._check_name_free(changes["name"], besides=voice.id)
            if description is not _UNSET:
                changes["description"] = clean_text(description, "description", MAX_DESCRIPTION)
            if style is not _UNSET:
                changes["style"] = clean_style(style)
            if seed is not _UNSET:
                changes["seed"] = clean_seed(seed)
            if shared is not _UNSET:
                if not isinstance(shared, bool):
                    raise VoiceError(f"`shared` must be true or false (got {shared!r}).")
                changes["shared"] = shared
            if transcript is not _UNSET:
                changes["transcript"] = clean_text(transcript, "transcript", MAX_TRANSCRIPT)
                pcm, _ = sf.read(voice.audio_path, dtype="int16")
                changes["content_hash"] = content_hash(pcm, changes["transcript"])
                twin = self._by_content(changes["content_hash"])
                if twin is not None and twin.id != voice.id:
                    raise VoiceError(f"The voice {twin.name!r} already has this audio and transcript.")
            updated = replace(voice, **changes)
            replace_file(voice.path, "voice.json", _json_bytes(updated.to_json()))
            return self.get(voice.id)

    def rename(self, id_or_name: str, new_name: str) -> Voice:
        return self.update(id_or_name, name=new_name)

    def delete(self, id_or_name: str) -> None:
        """Remove a voice. It vanishes in one rename; its files are removed after."""
        with self._lock.hold():
            remove(self.root, self.get(id_or_name).path)

    # ------------------------------------------------------------------------------------ exchange

    def export_zip(self, ids: Iterable[str] | None = None) -> bytes:
        """A bundle (`bundles.py`) with one folder per voice. `ids` are ids or names; None exports every voice."""
        with self._lock.hold():
            voices = self.list() if ids is None else [self.get(i) for i in ids]
            return bundle_zip((v.id, v.to_json(), v.audio_path.read_bytes(),
                               v.codes_path.read_bytes() if v.has_codes else None) for v in voices)

    def import_zip(self, data: bytes | str | os.PathLike, *, keep_both: bool = False) -> list[Voice]:
        """Import voices exported by `export_zip` (its bytes, or the path of the file). Everything is checked
        first (`bundles.stage_zip`), and on any problem the whole import is rejected with `VoiceImportError`
        and the library is left as it was. Voices already saved (same content) are returned as they are. A zipped
        Higgs preset folder (`config.json` and its clips) is imported too, its clips prepared as new ones are.
        A different voice of a name (or id) already in the library is refused, or with `keep_both` imported
        beside it as "Name (2)" (under an id of its own): nothing saved is ever overwritten."""
        return self._commit(stage_zip(data, preset_consent=preset_consent()), error=VoiceImportError,
                            keep_both=keep_both)

    # ------------------------------------------------------------------------------------ internals

    def _commit(self, staged: list[Staged], *, error: type[VoiceError] = VoiceError,
                keep_both: bool = False) -> list[Voice]:
        """Write staged voices all-or-nothing; already-saved content is returned instead of written. A name or
        id clash is refused, or with `keep_both` the newcomer takes the next free "Name (n)" and id."""
        with self._lock.hold():
            existing = self.list()
            by_hash = {v.content_hash: v for v in existing}
            by_name = {v.name.casefold(): v for v in existing}
            results: list[Voice | str] = []
            new: dict[str, tuple[str, Staged]] = {}  # content hash → (id, staged)
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
                if keep_both and (key in by_name or key in names):
                    name = _free_name(name, {*by_name, *names})
                    s.record = {**s.record, "name": name}
                    key = name.casefold()
                if key in by_name:
                    raise error(f"A different voice is already called {by_name[key].name!r}; choose another name.")
                if key in names:
                    raise error(f"Two voices are called {name!r}; give each a different name.")
                voice_id = s.voice_id or self._free_id(h)
                taken = (self.root / voice_id).exists() or voice_id in {i for i, _ in new.values()}
                if taken and keep_both:
                    voice_id, taken = self._free_id(h), False
                if taken:
                    raise error(f"The id {voice_id} is taken by a different voice.")
                names[key] = voice_id
                new[h] = (voice_id, s)
                results.append(voice_id)
            write_voices(self.root, [(voice_id, _files(voice_id, s)) for voice_id, s in new.values()])
            return [r if isinstance(r, Voice) else self._read(self.root / r) for r in results]

    def _free_id(self, digest: str) -> str:
        # A voice whose transcript was edited keeps its original id, so the short id of this content may
        # be taken by different content; a longer prefix of the same hash then names it.
        for length in range(16, 65, 4):
            candidate = f"v_{digest[:length]}"
            if not (self.root / candidate).exists():
                return candidate
        raise VoiceError("Every id for this content is taken; the library is damaged.")

    def _by_content(self, digest: str) -> Voice | None:
        return next((v for v in self.list() if v.content_hash == digest), None)

    def _check_name_free(self, name: str, *, besides: str | None = None, content: str | None = None) -> None:
        key = name.casefold()
        for voice in self.list():
            if voice.name.casefold() == key and voice.id != besides and voice.content_hash != content:
                raise VoiceError(f"A different voice is already called {voice.name!r}; choose another name.")

    def _read(self, path: Path) -> Voice | None:
        try:
            meta = json.loads((path / "voice.json").read_text(encoding="utf-8"))
            return Voice(id=path.name, name=meta["name"], transcript=meta["transcript"],
                         description=meta["description"], style=meta["style"], seed=meta["seed"],
                         created=meta["created"], consent=Consent(**meta["consent"]),
                         content_hash=meta["content_hash"], frames=int(meta["frames"]),
                         notes=tuple(meta.get("notes", ())), path=path, shared=meta.get("shared") is True)
        except FileNotFoundError:
            return None  # deleted meanwhile, or not a voice directory
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping unreadable voice %s: %s", path, exc)
            return None


def _free_name(name: str, taken: set[str]) -> str:
    """`name (2)`, `name (3)` … : the first that no voice has (`taken` holds casefolded names)."""
    for n in range(2, MAX_IMPORT_NAMES):
        candidate = clean_name(f"{name[:MAX_NAME - 8]} ({n})")
        if candidate.casefold() not in taken:
            return candidate
    raise VoiceImportError(f"Too many voices are called {name!r}; rename some first.")


def _json_bytes(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, indent=1).encode("utf-8")


def _files(voice_id: str, staged: Staged) -> dict[str, bytes]:
    """A staged voice's bundle files (see the module docstring)."""
    files = {"audio.wav": wav_bytes(staged.pcm)}
    if staged.codes is not None:
        files["codes.npy"] = npy_bytes(staged.codes)
    files["voice.json"] = _json_bytes(record_json(voice_id, staged.record))
    return files
