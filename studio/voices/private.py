"""A visitor's private voices: kept in the visitor's own browser, never on the server's disk (docs/SPACES.md).

On a public Space every visitor would otherwise share one library, so one visitor's cloned voice would be
offered to every other. Here a visitor's voices live in their browser's `localStorage` (Gradio's
`BrowserState`), one entry per voice:

    {"voice": <voice.json, as in a bundle>, "audio": <FLAC of the prepared clip, base64>,
     "codes": <codes.npy, base64>}

The codes (15 s: 375 × 8 int16, about 6 KB) are what generation needs; the lossless clip is what makes the
voice exportable as an ordinary bundle (`bundles.py`), which the owner's library or another visitor can
import. Everything that comes back from a browser is checked exactly like an imported bundle.

While a visitor's page is open the server holds their voices' codes in memory (`PrivateVoices`), under
handles `pv_<random>_<id>` that only that page knows; generation resolves a handle like any voice id. The
handles die with the page (Gradio's unload event), and nothing is written to disk but the bundle a visitor
exports, for minutes (`exports.py`).
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from engine.config import SAMPLE_RATE
from studio.voices.bundles import bundle_zip, stage_bundle
from studio.voices.disk import npy_bytes, wav_bytes
from studio.voices.model import Staged, VoiceError, VoiceNotFound, VoiceRecord, check_codes, record_json

HANDLE_PREFIX = "pv_"
BROWSER_KEY = "higgs-studio-private-voices"  # the localStorage key
MAX_PRIVATE_VOICES = 12
# Browsers give a site about 5 MB of localStorage, which Gradio fills with AES-encrypted base64 (x1.33) of
# our JSON; 3 MB of JSON stays under it. A 15 s voice is about 0.5 MB (FLAC ~0.35 MB + codes, base64).
MAX_BROWSER_CHARS = 3 * 2 ** 20


@dataclass(frozen=True, slots=True)
class PrivateVoice(VoiceRecord):
    """A visitor's voice as the service sees it: the record and its codes in memory."""

    id: str  # the page's handle, pv_<random>_<voice id>
    voice_id: str
    codes_array: np.ndarray
    preset = False
    has_codes = True

    def codes(self) -> np.ndarray:
        return self.codes_array.astype(np.int64)

    def wav(self) -> np.ndarray:
        raise VoiceError("A private voice lives in its visitor's browser; this studio keeps only its codes. Use it "
                         "with a local engine, or export it and import it into the owner's library.")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def to_browser(voice_id: str, staged: Staged) -> dict:
    """The browser's entry for a staged voice that has its codes."""
    if staged.codes is None:
        raise VoiceError("A private voice needs its codes; encode it before saving.")
    flac = io.BytesIO()
    sf.write(flac, staged.pcm, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    return {"voice": record_json(voice_id, staged.record), "audio": _b64(flac.getvalue()),
            "codes": _b64(npy_bytes(staged.codes))}


def from_browser(entry) -> tuple[str, Staged]:
    """(voice id, staged voice) from a browser entry, checked as an imported bundle is; raises VoiceError."""
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("audio", "codes")):
        raise VoiceError("a stored voice must have its audio and codes")
    if len(entry["audio"]) + len(entry["codes"]) > MAX_BROWSER_CHARS:  # before a byte of it is decoded
        raise VoiceError("a stored voice is larger than a browser keeps (about 3 MB)")
    try:
        pcm, rate = sf.read(io.BytesIO(base64.b64decode(entry["audio"], validate=True)), dtype="int16")
        codes = base64.b64decode(entry["codes"], validate=True)
    except Exception:  # noqa: BLE001 — any decoding failure means a damaged entry
        raise VoiceError("a stored voice's audio or codes are damaged") from None
    if rate != SAMPLE_RATE or pcm.ndim != 1:
        raise VoiceError(f"a stored voice's audio must be {SAMPLE_RATE} Hz mono")
    staged = stage_bundle({"voice.json": json.dumps(entry.get("voice")).encode(), "audio.wav": wav_bytes(pcm),
                           "codes.npy": codes})
    if staged.codes is None:
        raise VoiceError("a stored voice has no codes")
    return staged.voice_id or f"v_{staged.content_hash[:16]}", staged


def export_bundle(entries: list[dict]) -> bytes:
    """A bundle of browser entries, importable anywhere a bundle is: as many voices as a browser keeps."""
    if not isinstance(entries, list):
        raise VoiceError("The page sent no list of voices to export; reload it and export again.")
    if len(entries) > MAX_PRIVATE_VOICES:
        raise VoiceError(f"An export holds at most {MAX_PRIVATE_VOICES} voices, as many as a browser keeps; this "
                         f"page sent {len(entries)}. Reload the page and export again.")
    items = []
    for entry in entries:
        voice_id, staged = from_browser(entry)
        items.append((voice_id, record_json(voice_id, staged.record), wav_bytes(staged.pcm), npy_bytes(staged.codes)))
    return bundle_zip(items)


def add_entries(entries: list[dict], new: Iterable[Staged]) -> tuple[list[dict], list[str]]:
    """`entries` with `new` voices added (each already encoded): same content is kept once, a name may
    belong to one voice only, and the browser's budget holds. Returns (entries, names added)."""
    entries = list(entries or [])
    known = {e["voice"]["content_hash"]: e for e in entries}
    names = {e["voice"]["name"].casefold(): e["voice"]["name"] for e in entries}
    added = []
    for staged in new:
        if staged.content_hash in known:
            continue
        name = staged.record["name"]
        if name.casefold() in names:
            raise VoiceError(f"You already have a voice called {names[name.casefold()]!r}; choose another name.")
        staged.codes = check_codes(staged.codes, staged.record["frames"])
        entry = to_browser(staged.voice_id or f"v_{staged.content_hash[:16]}", staged)
        entries.append(entry)
        known[staged.content_hash] = entry
        names[name.casefold()] = name
        added.append(name)
    if len(entries) > MAX_PRIVATE_VOICES:
        raise VoiceError(f"This browser keeps up to {MAX_PRIVATE_VOICES} voices. Export your voices, then delete "
                         "some.")
    if len(json.dumps(entries)) > MAX_BROWSER_CHARS:
        raise VoiceError("Your voices would not fit in this browser's storage (about 3 MB). Export them, then "
                         "delete some or use shorter clips.")
    return entries, added


class PrivateVoices:
    """The private voices of the pages open now, in memory, by handle. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}  # page session → its handles' random part
        self._voices: dict[str, dict[str, PrivateVoice]] = {}  # token → {handle: voice}

    def register(self, session: str, entries: list | None) -> tuple[list[dict], list[PrivateVoice]]:
        """Take a page's stored entries: (the entries that passed the checks, their voices with handles).
        A damaged entry is dropped rather than failing the page: it came from the visitor's own storage."""
        with self._lock:
            token = self._tokens.setdefault(session, secrets.token_hex(12))
        kept, voices = [], []
        # What a page sends is the browser's store as that browser says it is: no more voices than it keeps.
        for entry in (entries if isinstance(entries, list) else [])[:MAX_PRIVATE_VOICES]:
            try:
                voice_id, staged = from_browser(entry)
            except VoiceError:
                continue
            r = staged.record
            kept.append(entry)
            voices.append(PrivateVoice(
                id=f"{HANDLE_PREFIX}{token}_{voice_id}", voice_id=voice_id, name=r["name"], transcript=r["transcript"],
                description=r["description"], style=r["style"], seed=r["seed"], created=r["created"],
                consent=r["consent"], content_hash=staged.content_hash, frames=r["frames"], notes=r["notes"],
                codes_array=staged.codes))
        with self._lock:
            if self._tokens.get(session) == token:  # not dropped meanwhile
                self._voices[token] = {v.id: v for v in voices}
        return kept, voices

    def get(self, handle: str) -> PrivateVoice:
        token = handle[len(HANDLE_PREFIX):].partition("_")[0]
        with self._lock:
            voice = self._voices.get(token, {}).get(handle)
        if voice is None:
            raise VoiceNotFound("That private voice is not loaded: reload the page (your voices live in your "
                                "browser).")
        return voice

    def drop(self, session: str) -> None:
        with self._lock:
            token = self._tokens.pop(session, None)
            self._voices.pop(token, None)

    def sessions(self) -> int:
        with self._lock:
            return len(self._tokens)
