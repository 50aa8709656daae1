"""The owner's preset voices: a read-only folder in the Higgs preset layout, shown to every visitor.

    <folder>/config.json   {"<name>": {"transcript": "...", "audio_file": "<file>.wav"}, ...}
    <folder>/<file>.wav

It comes from the Space's repository (`presets/voices/`), `--voices-presets DIR` or `HIGGS_VOICE_PRESETS`.
Each clip is prepared and encoded once: the voices are kept in a small library of their own (`store.py`),
in a cache folder named after a hash of the folder's content, so the next start finds them encoded, and an
edited folder gets a fresh cache. The folder itself is never written to.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from studio.voices.model import Consent, Voice, VoiceImportError
from studio.voices.store import VoiceLibrary, studio_dir

log = logging.getLogger(__name__)

PRESETS_CONSENT = Consent("the studio's owner", "Preset voices shipped by the studio's owner, who has the right "
                                                "to offer them.")


def folder_digest(folder: Path) -> str:
    """sha256 over config.json and every file beside it: any edit gives a new cache."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def default_cache_root() -> Path:
    """Where encoded presets are cached: `$HIGGS_PRESETS_CACHE`, /data on a Space, else the user's cache."""
    return studio_dir("HIGGS_PRESETS_CACHE", "preset-voices", cache=True)


class PresetVoices:
    """The preset folder's voices, encoded once and cached; read-only."""

    def __init__(self, folder: str | Path, *, encode: Callable[[np.ndarray], Any] | None,
                 cache_root: str | Path | None = None):
        self.folder = Path(folder).expanduser().resolve()
        if not (self.folder / "config.json").is_file():
            raise VoiceImportError(f"No config.json in {self.folder}; a preset folder holds config.json and the "
                                   "audio files it names.")
        root = Path(cache_root) if cache_root is not None else default_cache_root()
        self._library = VoiceLibrary(root / folder_digest(self.folder)[:24])
        # Content already in the cache is returned as it is, without calling `encode`.
        self._library.import_higgs_preset_dir(self.folder, consent=PRESETS_CONSENT, encode=encode)
        log.info("preset voices: %d from %s (cache %s)", len(self.list()), self.folder, self._library.root)

    def list(self) -> list[Voice]:
        return [replace(v, preset=True) for v in self._library.list()]

    def get(self, id_or_name: str) -> Voice:
        return replace(self._library.get(id_or_name), preset=True)

    def voice_ref(self, id_or_name: str, encode: Callable[[np.ndarray], Any]):
        return self._library.voice_ref(id_or_name, encode)
