"""Voice bundles: the zip a library or a visitor exports and imports, one folder per voice
(`<id>/voice.json`, `audio.wav`, `codes.npy` when encoded). Reading one trusts nothing: entry names and
types, sizes (declared and actual), JSON, audio format, codes and the content hash are all checked before
a voice is staged.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.audio import ReferenceAudioError
from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.voices.model import (ID_RE, MAX_DESCRIPTION, MAX_REFERENCE_SECONDS, MAX_TRANSCRIPT, Consent, Staged,
                                 VoiceError, VoiceImportError, check_codes, clean_name, clean_seed, clean_style,
                                 clean_text, content_hash)

# Import limits. A prepared reference is at most 30 s: 1.4 MB of 16-bit audio and 6 KB of codes.
MAX_IMPORT_BYTES = 256 * 2 ** 20
MAX_IMPORT_VOICES = 200
ENTRY_LIMITS = {"voice.json": 64 * 2 ** 10, "audio.wav": 4 * 2 ** 20, "codes.npy": 256 * 2 ** 10}
_ENTRY_RE = re.compile(r"(?:([A-Za-z0-9_-][A-Za-z0-9_.-]{0,63})/)?(voice\.json|audio\.wav|codes\.npy)")
_DIR_ENTRY_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}/")


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


def stage_zip(data: bytes | str | os.PathLike) -> list[Staged]:
    """Every voice of a bundle (its bytes, or the path of the file: its size is checked before a byte is
    read), checked and staged; any problem rejects the whole bundle with `VoiceImportError`."""
    if isinstance(data, (str, os.PathLike)):
        size = Path(data).stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise VoiceImportError(_too_big(size))
        data = Path(data).read_bytes()
    staged = []
    for folder, entries in sorted(read_bundle(data).items()):
        label = folder or "the bundle"
        if "voice.json" not in entries or "audio.wav" not in entries:
            raise VoiceImportError(f"{label} lacks voice.json or audio.wav.")
        try:
            staged.append(stage_bundle(entries))
        except (ValueError, ReferenceAudioError) as exc:
            raise VoiceImportError(f"{label}: {exc}") from None
    return staged


def stage_bundle(entries: dict[str, bytes]) -> Staged:
    """One folder of a bundle → a `Staged` voice, every field checked; raises `VoiceError` saying what is off."""
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
        codes = check_codes(raw, frames)
    notes = meta.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise VoiceError("voice.json 'notes' must be a list of text")
    created = meta.get("created")
    if not isinstance(created, str) or not created:
        raise VoiceError("voice.json has no 'created' time")
    record = {"name": clean_name(meta.get("name")),
              "transcript": clean_text(meta.get("transcript"), "transcript", MAX_TRANSCRIPT),
              "description": clean_text(meta.get("description"), "description", MAX_DESCRIPTION),
              "style": clean_style(meta.get("style")), "seed": clean_seed(meta.get("seed")),
              "consent": Consent.from_json(meta.get("consent")), "created": created, "frames": frames,
              "notes": tuple(clean_text(n, "note", MAX_DESCRIPTION) for n in notes[:20])}
    record["content_hash"] = content_hash(pcm, record["transcript"])
    if meta.get("content_hash") not in (None, record["content_hash"]):
        raise VoiceError("its audio and transcript do not match the recorded content hash (damaged or edited)")
    voice_id = meta.get("id")
    if voice_id is not None and (not isinstance(voice_id, str) or not ID_RE.fullmatch(voice_id)):
        raise VoiceError(f"voice.json has an invalid id {voice_id!r}")
    return Staged(record=record, pcm=pcm, codes=codes, voice_id=voice_id)



def _too_big(size: int) -> str:
    return (f"The voice bundle is {size / 2 ** 20:.1f} MB; the limit is {MAX_IMPORT_BYTES // 2 ** 20} MB. Export "
            "fewer voices at a time.")


def read_bundle(data: bytes) -> dict[str, dict[str, bytes]]:
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
