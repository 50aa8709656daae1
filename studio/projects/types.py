"""The values that pass between a project's store, its render jobs and its exports."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ChapterAudio:
    """One chapter's audio as the export reads it: float32 mono 24 kHz blocks, in order, that add up to
    `samples`. `blocks` is a function so an export can read the chapter from disk more than once, a block
    at a time, without holding a book in memory."""
    title: str
    samples: int
    blocks: Callable[[], Iterator[np.ndarray]]
    recipe: dict = field(default_factory=dict)  # the chapter's segments: text as spoken, voice, settings, seeds
    spans: tuple[tuple[int, int], ...] = ()  # each segment's [start, end) in these samples (its pause after it)

    def whole(self) -> np.ndarray:
        """The chapter's samples in one array, for what is measured over the whole chapter (loudness, the ACX
        check, heard words); one chapter at a time, never the book."""
        return np.concatenate([np.asarray(b, dtype=np.float32) for b in self.blocks()] or [np.zeros(0, np.float32)])


@dataclass(frozen=True)
class BookMeta:
    """What an audiobook file says about itself."""
    title: str
    author: str = ""
    language: str = ""
    cover: bytes | None = None  # JPEG or PNG bytes
    cover_type: str = "image/jpeg"
    extra: dict = field(default_factory=dict)  # e.g. {"isbn": ..., "narrator": ..., "year": ...}
