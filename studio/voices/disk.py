"""The voice library's durable writes: fsynced files renamed into place, the root's lock, and the staged
all-or-nothing write of several voices with the sweep that finishes or removes one a crash interrupted.
One-file writes and the file lock come from studio/files/durable.py.

    with root_lock(root).hold():
        replace_file(voice_dir, "voice.json", data)        # one file, atomically
        write_voices(root, [(voice_id, files), ...])        # several voices: all of them or none
    sweep(root)                                             # on open: complete or drop interrupted writes

A write of several voices is staged whole in `<root>/.stage-<hex>/` and marked committed (`COMMIT`, the ids)
before the renames, so the next open after a crash completes it (a mark) or removes it (no mark).
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.config import SAMPLE_RATE
from studio.files.durable import file_lock, fsync_dir, write_file
from studio.voices.model import ID_RE

log = logging.getLogger(__name__)

STAGE_PREFIX = ".stage-"  # a write in progress: one directory per voice, then COMMIT_MARK, then renames
COMMIT_MARK = "COMMIT"


def wav_bytes(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def npy_bytes(codes: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, codes, allow_pickle=False)
    return buf.getvalue()


class RootLock:
    """Process-wide re-entrant lock for one library root, plus an `fcntl` lock for other processes."""

    def __init__(self, root: Path):
        self._lockfile = root / ".lock"
        self._rlock = threading.RLock()
        self._depth = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._rlock, (file_lock(self._lockfile) if self._depth == 0 else nullcontext()):
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1


_ROOT_LOCKS: dict[Path, RootLock] = {}
_ROOT_LOCKS_GUARD = threading.Lock()


def root_lock(root: Path) -> RootLock:
    """The one lock of `root` in this process (every library opened on it shares it)."""
    with _ROOT_LOCKS_GUARD:
        return _ROOT_LOCKS.setdefault(root, RootLock(root))


def remove(root: Path, path: Path) -> None:
    """Take `path` away in one rename, then delete its files."""
    trash = root / f".trash-{uuid.uuid4().hex}"
    os.rename(path, trash)
    fsync_dir(root)
    shutil.rmtree(trash, ignore_errors=True)


def write_voices(root: Path, items: list[tuple[str, Mapping[str, bytes]]]) -> None:
    """Write voices (id, {file name: bytes}) all-or-nothing, even across a kill: every voice is written and
    fsynced into one staging directory, then a `COMMIT` mark makes the set durable, then each voice is
    renamed into place. A crash before the mark leaves a stage that the next open deletes; after it, the
    next open finishes the renames (`sweep`)."""
    stage = root / f"{STAGE_PREFIX}{uuid.uuid4().hex}"
    placed: list[Path] = []
    committed = False
    try:
        stage.mkdir()
        for voice_id, files in items:
            tmp = stage / voice_id
            tmp.mkdir()
            for name, data in files.items():
                write_file(tmp / name, data)
            fsync_dir(tmp)
        write_file(stage / COMMIT_MARK, "\n".join(v for v, _ in items).encode())
        fsync_dir(stage)
        committed = True
        for voice_id, _ in items:
            os.rename(stage / voice_id, root / voice_id)
            placed.append(root / voice_id)
        fsync_dir(root)
    except BaseException:
        if committed:  # un-commit first, so a crash during the roll-back does not roll forward
            (stage / COMMIT_MARK).unlink(missing_ok=True)
            fsync_dir(stage)
        for path in placed:  # all or nothing: take back what was already renamed into place
            trash = root / f".trash-{uuid.uuid4().hex}"
            try:
                os.rename(path, trash)
            except OSError:
                log.exception("could not roll back %s", path)
                continue
            shutil.rmtree(trash, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _roll_forward(root: Path, stage: Path) -> None:
    """Finish a committed write that a crash interrupted: move the voices still staged into place."""
    for voice_id in (stage / COMMIT_MARK).read_text().split():
        staged = stage / voice_id
        if ID_RE.fullmatch(voice_id) and staged.is_dir() and not (root / voice_id).exists():
            os.rename(staged, root / voice_id)
    fsync_dir(root)
    log.info("completed an interrupted write of voices (%s)", stage.name)


def sweep(root: Path) -> None:
    """Remove what an interrupted write left behind (only ever names no reader looks at), after finishing a
    committed one. Call it holding the root's lock."""
    for entry in root.iterdir():
        if entry.name.startswith(STAGE_PREFIX) and (entry / COMMIT_MARK).is_file():
            _roll_forward(root, entry)
        if entry.name.startswith((".tmp-", ".trash-", STAGE_PREFIX)) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif ID_RE.fullmatch(entry.name) and entry.is_dir():
            for leftover in entry.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)
