"""What each segment of a book is rendered from, and the key that names its render.

A key hashes everything the audio depends on: the text as spoken (style prefix and normalisation applied), the
voice's identity, the sampling settings, the seed and the checkpoint's identity. Edit one paragraph and only
its segments get new keys; the same sentence with the same voice and seed anywhere is one render.

The voice's identity is a saved voice's content hash; zero-shot, the book is anchored as a long take is
(engine/longtake.py): the first segment of each speaker (in the chapters not skipped) is generated with no
reference, and its codes around the speech become the reference of every later segment of that speaker, so
those keys hash the anchor's codes and are known once the anchor is rendered. The book's first segment is
also the loudness reference every other segment is matched to when the chapter is read (store.py keeps the
raw render; the joins are made on reading). Anchors and that reference are read from disk, never kept from
a previous step, so a job resumed after a kill reproduces what an uninterrupted one makes.

A segment's seed is the project's seed mixed with a hash of its text (not its position), so inserting a
paragraph does not move the seeds of the others; a seed chosen by hand (regenerate) replaces it.

The pronunciation dictionary (the owner's, then the project's: studio/text/pronounce.py) is applied here, when the
book is planned, not when it is stored: a segment row keeps its normalised text, and `spoken(text, voice)`
gives what the model reads and the fingerprint of the rules that fired on it. The key takes both, and the
fingerprint only when a rule fires, so a changed rule gives new keys to exactly the segments holding its word
(and the segments cloned from a zero-shot anchor that holds it); every other key stays as it was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.joins import anchor_frames
from engine.tokenizer import strip_tags
from engine.types import SEED_LIMIT

KEY_VERSION = 1  # bump when what a key covers changes: every render is then made again
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "repeat_guard", "max_frames")
ZERO_SHOT = "zero-shot"


@dataclass(frozen=True)
class Planned:
    """One segment of the book with what it is rendered from. `key` is None while its anchor is unrendered."""
    chapter_id: int
    chapter: int  # the chapter's position
    skip: bool  # the chapter is left out of the book
    position: int
    text: str
    source: str
    pause_after: float
    speaker: str | None
    voice_id: str | None  # the saved voice it is spoken in (None: zero-shot)
    seed: int
    key: str | None
    anchor_of: str | None  # the speaker whose zero-shot anchor this segment is ("" for plain text), else None
    anchored_on: str | None  # the key of the anchor it is cloned from (zero-shot, not the anchor itself)
    reference: bool  # the book's first segment: the loudness every other one is matched to
    rendered_key: str | None  # the key its row was last rendered under


def segment_seed(base_seed: int, text: str) -> int:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return (int(base_seed) + int.from_bytes(digest[:8], "big")) % SEED_LIMIT


def segment_key(*, text: str, voice: str, settings: dict, seed: int, checkpoint: dict, pronunciation: str = "") -> str:
    recipe = {"v": KEY_VERSION, "text": text, "voice": voice, "seed": int(seed), "checkpoint": checkpoint,
              "settings": {k: settings.get(k) for k in SAMPLING_FIELDS}}
    if pronunciation:  # only where a rule fires: a book without a dictionary keeps the keys it had
        recipe["pronunciation"] = pronunciation
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def anchor_identity(codes: np.ndarray, transcript: str) -> str:
    """The identity of a zero-shot anchor: its codes and the transcript it is given with."""
    h = hashlib.sha256(b"higgs-anchor\0")
    h.update(np.ascontiguousarray(codes, dtype="<i2").tobytes())
    h.update(transcript.encode("utf-8"))
    return h.hexdigest()


def anchor_of_render(audio: np.ndarray, codes: np.ndarray, text: str) -> tuple[np.ndarray, str]:
    """A zero-shot anchor from a rendered segment as stored: (codes around the speech, transcript)."""
    return codes[anchor_frames(audio, codes.shape[0])], strip_tags(text).strip()


def checkpoint_identity(info) -> dict:
    """What makes one engine's output differ from another's for the same prompt and seed (engine/types.py
    EngineInfo): the weights, their precision, and the path that runs them."""
    return {"checkpoint": info.checkpoint, "params": info.params, "precision": info.precision,
            "backend": info.backend, "device": info.device.split(":")[0]}


def plan_book(chapters, segments_of: Callable, settings: dict, checkpoint: dict, voice_identity: Callable,
              anchors: Callable, spoken: Callable | None = None) -> list[Planned]:
    """Every segment of the book in order with its seed and key. `segments_of(chapter_id)` lists a chapter's
    rows; `voice_identity(voice_id)` is a saved voice's content hash; `anchors(key)` is the identity of the
    anchor rendered under `key`, or None while it is not rendered; `spoken(text, voice_id)` is (the text the
    model reads, the pronunciation rules' fingerprint) (None: the text as planned, no rules). Skipped chapters
    are planned too (their segments keep keys), but they give the book neither its anchors nor its loudness
    reference."""
    default_voice = settings.get("voice") or None
    base_seed = int(settings["seed"])
    rows = [(chapter, row) for chapter in chapters for row in segments_of(chapter.id)]
    said = [spoken(row.text, row.voice if row.voice is not None else default_voice) if spoken else (row.text, "")
            for _, row in rows]

    def key_of(n: int, seed: int, identity: str) -> str:
        text, pronunciation = said[n]
        return segment_key(text=text, voice=identity, settings=settings, seed=seed, checkpoint=checkpoint,
                           pronunciation=pronunciation)

    def seed_of(row) -> int:
        return row.seed if row.seed is not None else segment_seed(base_seed, row.text)

    def voice_of(row) -> str | None:
        return row.voice if row.voice is not None else default_voice

    anchor_keys: dict[str, str] = {}  # speaker ("" for plain text) → the key of its anchor segment
    anchor_rows: set[int] = set()
    for n, (chapter, row) in enumerate(rows):
        speaker = row.speaker or ""
        if not chapter.skip and voice_of(row) is None and speaker not in anchor_keys:
            anchor_keys[speaker] = key_of(n, seed_of(row), ZERO_SHOT)
            anchor_rows.add(n)
    reference = next((n for n, (chapter, _) in enumerate(rows) if not chapter.skip), None)
    known: dict[str, str | None] = {}  # anchor key → its identity (one look-up per speaker)
    out: list[Planned] = []
    for n, (chapter, row) in enumerate(rows):
        voice_id, seed, speaker = voice_of(row), seed_of(row), row.speaker or ""
        anchored_on = None
        if voice_id is not None:
            key = key_of(n, seed, f"voice:{voice_identity(voice_id)}")
        elif n in anchor_rows:
            key = anchor_keys[speaker]
        else:
            anchored_on = anchor_keys.get(speaker)
            if anchored_on and anchored_on not in known:
                known[anchored_on] = anchors(anchored_on)
            anchor = known.get(anchored_on)
            key = key_of(n, seed, f"anchor:{anchor}") if anchor else None
        out.append(Planned(chapter.id, chapter.position, chapter.skip, row.position, said[n][0], row.source, row.pause_after,
                           row.speaker, voice_id, seed, key, speaker if n in anchor_rows else None, anchored_on,
                           n == reference, row.key))
    return out
