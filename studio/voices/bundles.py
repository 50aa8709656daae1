"""Voice bundles: the zip a library or a visitor exports and imports, one folder per voice
(`<id>/voice.json`, `audio.wav`, `codes.npy` when encoded); the owner's library also imports a zipped Higgs
preset folder (`config.json` naming each voice's transcript and audio file, `stage_preset`). Reading one trusts nothing, and holds no more than
its caps: the directory's names, structure and voice count are checked before anything is inflated
(`studio/files/archive.py` reads the members, counting what they inflate to), then each voice is read and checked
in turn (JSON, audio format, codes, content hash) before it is staged.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.audio import ReferenceAudioError
from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.files.archive import KB, MB, Archive, ArchiveRefused, Caps
from studio.voices.model import (
    ID_RE,
    MAX_DESCRIPTION,
    MAX_REFERENCE_SECONDS,
    MAX_TRANSCRIPT,
    Consent,
    Staged,
    VoiceError,
    VoiceImportError,
    check_codes,
    clean_name,
    clean_seed,
    clean_style,
    clean_text,
    content_hash,
    stage_audio,
)

MAX_IMPORT_BYTES = 256 * MB  # the bundle file itself
MAX_IMPORT_VOICES = 200  # voices in one library import
# One member of each kind, inflated. A clip's cap fits 30 s at 48 kHz, 16-bit mono (2.9 MB); a prepared one is
# 24 kHz (1.44 MB), so other rates are refused by name rather than by size. 30 s of codes is 12 KB.
ENTRY_LIMITS = {"voice.json": 64 * KB, "audio.wav": 3 * MB, "codes.npy": 256 * KB}
ENTRY_KINDS = {"voice.json": "a voice's voice.json", "audio.wav": "a voice clip", "codes.npy": "a voice's codes"}
# Everything one voice inflates to, counted over the whole bundle: a 30 s clip at 24 kHz with its codes and JSON.
MAX_VOICE_INFLATED = 3 * MB // 2
# A preset folder's clips are not prepared yet: any rate and format, at most 30 s (48 kHz stereo 24-bit: 8.6 MB).
PRESET_AUDIO_LIMIT = 10 * MB
_ENTRY_RE = re.compile(r"(?:([A-Za-z0-9_-][A-Za-z0-9_.-]{0,63})/)?(voice\.json|audio\.wav|codes\.npy)")


def bundle_zip(voices: Iterable[tuple[str, dict, bytes, bytes | None]]) -> bytes:
    """A bundle from (id, voice.json record, audio.wav bytes, codes.npy bytes or None) per voice."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for voice_id, record, wav, codes in voices:
            zf.writestr(f"{voice_id}/voice.json", json.dumps(record, ensure_ascii=False, indent=1))
            zf.writestr(f"{voice_id}/audio.wav", wav)
            if codes is not None:
                zf.writestr(f"{voice_id}/codes.npy", codes)
    return buf.getvalue()


def stage_zip(data: bytes | str | os.PathLike, *, max_voices: int = MAX_IMPORT_VOICES,
              preset_consent: Consent | None = None) -> list[Staged]:
    """Every voice of a bundle (its bytes, or the path of the file: its size is checked before a byte is
    read), checked and staged; any problem rejects the whole bundle with `VoiceImportError`. At most
    `max_voices` voices, and `max_voices` × `MAX_VOICE_INFLATED` bytes inflated in all; nor a larger file, as
    a bundle is never larger packed than inflated, give or take its headers. With `preset_consent` (the
    owner's, who asserts it for every voice), a zipped Higgs preset folder is read too (`stage_preset`)."""
    inflated = max_voices * MAX_VOICE_INFLATED
    limit = min(MAX_IMPORT_BYTES, inflated)
    if isinstance(data, (str, os.PathLike)):
        size_on_disk = Path(data).stat().st_size
        if size_on_disk > limit:
            raise VoiceImportError(_too_big(size_on_disk, limit))
        data = Path(data).read_bytes()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise VoiceImportError("A voice bundle must be the bytes of a .zip file.")
    if len(data) > limit:
        raise VoiceImportError(_too_big(len(data), limit))
    if not zipfile.is_zipfile(io.BytesIO(data)):  # its end record only: say what to do instead
        raise VoiceImportError("The file is not a zip archive; export voices from Higgs Studio and import that "
                               "file.")
    caps = Caps(noun="voice bundle", members=MAX_IMPORT_VOICES * (len(ENTRY_LIMITS) + 1),
                total=inflated, member=max(*ENTRY_LIMITS.values(), PRESET_AUDIO_LIMIT))  # each read names its own
    try:
        with Archive(data, caps) as zf:
            config = _preset_config(zf.names)
            if config is not None:
                return _stage_preset_zip(zf, config, max_voices, preset_consent)
            folders = _folders(zf.names, max_voices)  # nothing inflated yet
            return [_stage_folder(zf, folder, names) for folder, names in sorted(folders.items())]
    except ArchiveRefused as exc:
        raise VoiceImportError(str(exc)) from None


def _preset_config(names: list[str]) -> str | None:
    """The member that makes a zip a Higgs preset folder: one `config.json`, at the top or in one folder."""
    found = [n for n in names if n.rsplit("/", 1)[-1] == "config.json" and n.count("/") <= 1]
    return found[0] if len(found) == 1 else None


def _stage_preset_zip(zf: Archive, config: str, max_voices: int, consent: Consent | None) -> list[Staged]:
    if consent is None:
        raise VoiceImportError("This zip is a Higgs preset folder (config.json). The studio's owner can import it "
                               "into the library in the Voices tab; here, import a bundle exported from Higgs "
                               "Studio.")
    folder = config[:-len("config.json")]

    def read_audio(file_name: str) -> bytes:
        member = folder + file_name
        if member not in zf:
            raise VoiceImportError(f"config.json names {file_name!r}, which is not in the zip beside it.")
        return zf.read(member, limit=PRESET_AUDIO_LIMIT, kind="a preset's audio file")

    raw = zf.read(config, limit=ENTRY_LIMITS["voice.json"], kind="a preset folder's config.json")
    return stage_preset(raw, read_audio, consent, max_voices=max_voices)


def stage_preset(raw: bytes, read_audio, consent: Consent | None, *,
                 max_voices: int | None = MAX_IMPORT_VOICES) -> list[Staged]:
    """A Higgs preset folder's voices, staged: `raw` is its config.json (`{"<name>": {"transcript": …,
    "audio_file": "<file>"}}`), `read_audio(file name)` gives that file's bytes or path. Every voice is checked
    (and its audio prepared as a new clip is) before anything is saved; `consent` is asserted for all of them."""
    try:
        config = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise VoiceImportError(f"config.json is not valid JSON ({exc}).") from None
    if not isinstance(config, dict) or not config:
        raise VoiceImportError("config.json must map each voice name to {\"transcript\", \"audio_file\"}.")
    if max_voices is not None and len(config) > max_voices:
        raise VoiceImportError(f"config.json names {len(config):,} voices; at most {max_voices} can be imported "
                               "at once.")
    staged = []
    for name, entry in config.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("audio_file"), str):
            raise VoiceImportError(f"Voice {name!r} in config.json needs an \"audio_file\".")
        try:
            staged.append(stage_audio(read_audio(entry["audio_file"]), name=name, transcript=entry.get("transcript"),
                                      description=entry.get("description", ""), style="", seed=None, consent=consent))
        except (ValueError, ReferenceAudioError) as exc:
            raise VoiceImportError(f"Voice {name!r}: {exc}") from None
    return staged


def preset_consent(by: str = "the studio's owner") -> Consent:
    """The consent record of voices imported from a preset folder: the owner asserts it for all of them."""
    return Consent(by, "Imported from a Higgs preset folder by the studio's owner, who has the right to use these "
                       "voices.")


def _folders(names: list[str], max_voices: int) -> dict[str, dict[str, str]]:
    """{folder: {file kind: member name}} from the directory alone: only a voice's files, one folder each, at
    most `max_voices` of them, each with its voice.json and audio.wav."""
    folders: dict[str, dict[str, str]] = {}
    for name in names:
        match = _ENTRY_RE.fullmatch(name)
        if match is None:
            raise VoiceImportError(f"{name!r} is not part of a voice bundle (only voice.json, audio.wav and "
                                   "codes.npy, one folder per voice).")
        folders.setdefault(match.group(1) or "", {})[match.group(2)] = name
    if not folders:
        raise VoiceImportError("The bundle holds no voices.")
    if len(folders) > max_voices:
        raise VoiceImportError(f"The bundle holds {len(folders):,} voices ({len(names):,} entries); at most "
                               f"{max_voices} voices can be imported at once.")
    for folder, files in folders.items():
        if "voice.json" not in files or "audio.wav" not in files:
            raise VoiceImportError(f"{folder or 'The bundle'} lacks voice.json or audio.wav.")
    return folders


def _stage_folder(zf: Archive, folder: str, names: Mapping[str, str]) -> Staged:
    """One folder's voice: its voice.json is read and every field checked before its audio is inflated."""
    try:
        meta = _meta(zf.read(names["voice.json"], limit=ENTRY_LIMITS["voice.json"], kind=ENTRY_KINDS["voice.json"]))
        record = _record(meta)
        files = {base: zf.read(name, limit=ENTRY_LIMITS[base], kind=ENTRY_KINDS[base])
                 for base, name in names.items() if base != "voice.json"}
        return _with_audio(meta, record, files)
    except ArchiveRefused:
        raise
    except (ValueError, ReferenceAudioError) as exc:
        raise VoiceImportError(f"{folder or 'the bundle'}: {exc}") from None


def stage_bundle(entries: Mapping[str, bytes]) -> Staged:
    """One folder of a bundle ({file name: bytes}) → a `Staged` voice, every field checked; raises `VoiceError`
    saying what is off."""
    meta = _meta(entries["voice.json"])
    return _with_audio(meta, _record(meta), entries)


def _meta(raw: bytes) -> dict:
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VoiceError(f"voice.json is not valid JSON ({exc})") from None
    except RecursionError:
        raise VoiceError("voice.json is not valid JSON (nested too deeply)") from None
    if not isinstance(meta, dict):
        raise VoiceError("voice.json must be a JSON object")
    return meta


def _record(meta: dict) -> dict:
    """voice.json's fields, checked; the audio's (frames, content hash) are added by `_with_audio`."""
    notes = meta.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise VoiceError("voice.json 'notes' must be a list of text")
    created = meta.get("created")
    if not isinstance(created, str) or not created:
        raise VoiceError("voice.json has no 'created' time")
    voice_id = meta.get("id")
    if voice_id is not None and (not isinstance(voice_id, str) or not ID_RE.fullmatch(voice_id)):
        raise VoiceError(f"voice.json has an invalid id {voice_id!r}")
    return {"name": clean_name(meta.get("name")),
            "transcript": clean_text(meta.get("transcript"), "transcript", MAX_TRANSCRIPT),
            "description": clean_text(meta.get("description"), "description", MAX_DESCRIPTION),
            "style": clean_style(meta.get("style")), "seed": clean_seed(meta.get("seed")),
            "consent": Consent.from_json(meta.get("consent")), "created": created,
            "notes": tuple(clean_text(n, "note", MAX_DESCRIPTION) for n in notes[:20])}


def _with_audio(meta: dict, record: dict, files: Mapping[str, bytes]) -> Staged:
    """The staged voice: `record` with its audio (and codes, when there are some) checked against it."""
    try:
        with sf.SoundFile(io.BytesIO(files["audio.wav"])) as f:
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
    if "codes.npy" in files:
        try:
            raw = np.load(io.BytesIO(files["codes.npy"]), allow_pickle=False)
        except Exception:  # noqa: BLE001 — any parse failure is a damaged file
            raise VoiceError("codes.npy is not a readable numpy array") from None
        codes = check_codes(raw, frames)
    record = {**record, "frames": frames, "content_hash": content_hash(pcm, record["transcript"])}
    if meta.get("content_hash") not in (None, record["content_hash"]):
        raise VoiceError("its audio and transcript do not match the recorded content hash (damaged or edited)")
    return Staged(record=record, pcm=pcm, codes=codes, voice_id=meta.get("id"))


def _too_big(n: int, limit: int) -> str:
    return f"The voice bundle is {n / MB:.1f} MB; the limit is {limit // MB} MB. Export fewer voices at a time."
