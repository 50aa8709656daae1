"""Saved voices start their takes from kept prompt prefixes (engine/prefix.py): at studio start and when a voice
is saved, its prefix (the clip's codes and transcript) is computed once in the background and kept in memory
and on disk, so a take with it does not prefill its clip again, in this process or after a restart."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from .store import studio_dir

log = logging.getLogger(__name__)


def prefixes_dir() -> Path:
    """Where kept prefixes live: `$HIGGS_STUDIO_PREFIXES`, else the studio's cache directory."""
    return studio_dir("HIGGS_STUDIO_PREFIXES", "prefixes", cache=True)


def warm_voices(service, ids=None, *, directory: str | Path | None = None) -> threading.Thread | None:
    """Warm the saved voices `ids` (None: every voice whose codes are stored; one that still needs encoding
    is left for its first take) one after another in a background thread, and return it. The engine runs each
    warm-up chunk by chunk after the chunks of real takes, so the first take never waits for it. An engine
    that keeps no prefixes (remote, GPU kernels) is left alone."""
    engine = service.engine
    if getattr(engine, "is_remote", True) or not hasattr(engine, "warm_voice"):
        return None
    engine.keep_prefixes(directory if directory is not None else prefixes_dir())

    def run():
        for voice in service.voices.list() if ids is None else [service.voices.get(i) for i in ids]:
            try:
                if voice.codes() is None:
                    continue
                engine.warm_voice(service.voices.voice_ref(voice.id, encode=None))
            except Exception as exc:  # noqa: BLE001 (a voice that cannot warm is simply warmed by its first take)
                log.info("voice %s not warmed: %s", getattr(voice, "name", voice), exc)

    thread = threading.Thread(target=run, name="warm-voices", daemon=True)
    thread.start()
    return thread


__all__ = ["prefixes_dir", "warm_voices"]
