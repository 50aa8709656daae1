"""Every voice the studio can speak with, behind the library's interface: the owner's library (writable),
the owner's preset voices (read-only, `presets.py`) and the private voices of the pages open now
(`private.py`, by handle). `StudioService`, the API and the page hold one of these as their `voices`.

    catalog = VoiceCatalog(VoiceLibrary(root), presets=PresetVoices(folder, encode=...), private=PrivateVoices())
    catalog.list()            # the library's voices, then the presets (marked `preset`); never private ones
    catalog.get("Narrator")   # library, then presets; a `pv_…` handle finds a private voice
    catalog.list(visitor=True), catalog.get(key, visitor=True)   # what a public page's visitor may see and use:
                              # the library's voices the owner shared, the presets, the visitor's own handles
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from studio.voices.model import Voice, VoiceError, VoiceNotFound
from studio.voices.presets import PresetVoices
from studio.voices.private import HANDLE_PREFIX, PrivateVoices
from studio.voices.store import VoiceLibrary


class VoiceCatalog:
    """The library, the presets and the private voices as one read view; writes go to the library only."""

    def __init__(self, library: VoiceLibrary, *, presets: PresetVoices | None = None,
                 private: PrivateVoices | None = None):
        self.library = library
        self.presets = presets
        self.private = private

    @property
    def root(self):
        return self.library.root

    def list(self, *, visitor: bool = False) -> list[Voice]:
        return self.library.list(visitor=visitor) + (self.presets.list() if self.presets is not None else [])

    def get(self, id_or_name: str, *, visitor: bool = False):
        key = str(id_or_name).strip()
        if key.startswith(HANDLE_PREFIX) and self.private is not None:
            return self.private.get(key)
        try:
            return self.library.get(key, visitor=visitor)
        except VoiceNotFound:
            if self.presets is None:
                raise
        return self.presets.get(key)

    def voice_ref(self, id_or_name: str, encode: Callable[[np.ndarray], Any]):
        voice = self.get(id_or_name)
        if voice.preset:
            return self.presets.voice_ref(voice.id, encode)
        if not isinstance(voice, Voice):  # a private voice: its codes came with it
            import torch

            from engine.prompt import VoiceRef
            return VoiceRef(codes=torch.from_numpy(voice.codes()), transcript=voice.transcript or None)
        return self.library.voice_ref(voice.id, encode)

    def _writable(self, id_or_name: str) -> str:
        voice = self.get(id_or_name)
        if voice.preset or not isinstance(voice, Voice):
            raise VoiceError(f"{voice.name!r} is " + ("one of the studio's preset voices, which are read-only."
                                                      if voice.preset else "a visitor's private voice."))
        return voice.id

    def add(self, *args, **kwargs) -> Voice:
        return self.library.add(*args, **kwargs)

    def update(self, id_or_name: str, **changes) -> Voice:
        return self.library.update(self._writable(id_or_name), **changes)

    def rename(self, id_or_name: str, new_name: str) -> Voice:
        return self.update(id_or_name, name=new_name)

    def delete(self, id_or_name: str) -> None:
        self.library.delete(self._writable(id_or_name))

    def ensure_codes(self, id_or_name: str, encode: Callable[[np.ndarray], Any]) -> np.ndarray:
        return self.library.ensure_codes(self._writable(id_or_name), encode)

    def export_zip(self, ids=None) -> bytes:
        return self.library.export_zip(None if ids is None else [self._writable(i) for i in ids])

    def import_zip(self, data, *, keep_both: bool = False) -> list[Voice]:
        return self.library.import_zip(data, keep_both=keep_both)
