"""Voices for cloning: the model (`model.py`), the library on disk (`store.py`) with its atomic writes
(`disk.py`), and voice bundles for export and import (`bundles.py`)."""

from studio.voices.bundles import ENTRY_LIMITS, MAX_IMPORT_BYTES, MAX_IMPORT_VOICES
from studio.voices.model import (
                                 DEFAULT_CONSENT_STATEMENT,
                                 Consent,
                                 Voice,
                                 VoiceError,
                                 VoiceImportError,
                                 VoiceNotFound,
                                 content_hash,
)
from studio.voices.store import VoiceLibrary, default_voices_dir

__all__ = ["DEFAULT_CONSENT_STATEMENT", "ENTRY_LIMITS", "MAX_IMPORT_BYTES", "MAX_IMPORT_VOICES", "Consent", "Voice",
           "VoiceError", "VoiceImportError", "VoiceLibrary", "VoiceNotFound", "content_hash", "default_voices_dir"]
