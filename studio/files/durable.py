"""Durable one-file writes and the cross-process file lock, shared by the studio's stores (the voice library,
style presets, the pronunciation dictionary).

    with file_lock(folder / "presets.json.lock"):
        replace_file(folder, "presets.json", data)    # fsynced, renamed into place: old file or new, never half
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_file(folder: Path, name: str, data: bytes) -> None:
    """`folder/name` becomes `data` in one rename: a crash leaves the old file or the new one."""
    tmp = folder / f".{Path(name).stem}-{uuid.uuid4().hex}.tmp"
    try:
        write_file(tmp, data)
        os.replace(tmp, folder / name)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(folder)


@contextmanager
def file_lock(lockfile: Path) -> Iterator[None]:
    """An exclusive `fcntl` lock on `lockfile` (created if absent) for the block. Each call opens its own
    descriptor, so it orders threads of one process as well as processes."""
    fd = os.open(lockfile, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
